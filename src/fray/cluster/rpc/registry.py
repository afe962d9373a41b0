"""The endpoint registry: which URL serves which actor name, per namespace.

:class:`EndpointRegistry` is a plain thread-safe object; :func:`serve_registry`
serves it as an actor on an :class:`~fray.cluster.rpc.server.ActorServer` (the Fray cluster
controller hosts one), :class:`RegistryClient` talks to it from anywhere, and
:class:`ClusterResolver` resolves actor names through it.
Both implement :class:`~fray.cluster.rpc.server.NameMapping`, so either can be given to an
``ActorServer(registry=...)`` to publish its actors.

A name has at most one URL: registering it again (an actor restarted elsewhere)
replaces the old URL, and unregistering only removes the URL it names, so a late
unregister from a dead server cannot remove its successor.
"""

from __future__ import annotations

import threading
from typing import Any

from fray.cluster.rpc.client import ActorClient, RpcOptions
from fray.cluster.rpc.namespace import resolve_namespace
from fray.cluster.rpc.resolver import FixedResolver
from fray.cluster.rpc.server import ActorServer

__all__ = [
    "REGISTRY_ACTOR_NAME",
    "SYSTEM_NAMESPACE",
    "ClusterResolver",
    "EndpointRegistry",
    "RegistryClient",
    "serve_registry",
]

#: The actor name under which the registry is served.
REGISTRY_ACTOR_NAME = "fray-endpoint-registry"
#: The namespace of Fray's own actors; user namespaces cannot reach them by accident.
SYSTEM_NAMESPACE = "fray-system"


class EndpointRegistry:
    """An in-memory map ``(namespace, name) -> url``; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[tuple[str, str], str] = {}

    def register(self, namespace: str, name: str, url: str) -> None:
        """Make ``url`` the endpoint of ``name`` in ``namespace``, replacing any previous one."""
        with self._lock:
            self._endpoints[(resolve_namespace(namespace), name)] = url

    def unregister(self, namespace: str, name: str, url: str) -> None:
        """Remove ``name`` if its endpoint is still ``url``."""
        key = (resolve_namespace(namespace), name)
        with self._lock:
            if self._endpoints.get(key) == url:
                del self._endpoints[key]

    def resolve(self, namespace: str, name: str) -> list[str]:
        """The endpoint of ``name`` in ``namespace`` as a list (empty when unknown)."""
        with self._lock:
            url = self._endpoints.get((namespace, name))
        return [] if url is None else [url]

    def list(self, namespace: str) -> dict[str, str]:
        """Every ``name -> url`` in ``namespace``."""
        with self._lock:
            return {name: url for (ns, name), url in self._endpoints.items() if ns == namespace}


def serve_registry(server: ActorServer, registry: EndpointRegistry | None = None) -> EndpointRegistry:
    """Serve ``registry`` (a new one by default) on ``server``; return it.

    Clients reach it with :class:`RegistryClient` (or a :class:`~fray.cluster.rpc.resolver.ClusterResolver`)
    at ``server.address``.
    """
    registry = EndpointRegistry() if registry is None else registry
    # The registry locks internally, so calls from many servers and resolvers may overlap.
    server.register(REGISTRY_ACTOR_NAME, registry, namespace=SYSTEM_NAMESPACE, max_concurrency=8)
    return registry


class RegistryClient:
    """A remote :class:`EndpointRegistry` at ``address`` (``host:port``), with the same methods."""

    def __init__(self, address: str, *, token: str | bytes | None = None, options: RpcOptions | None = None) -> None:
        self.address = address
        resolver = FixedResolver(
            {REGISTRY_ACTOR_NAME: f"actor://{address}/{REGISTRY_ACTOR_NAME}"}, namespace=SYSTEM_NAMESPACE
        )
        # Registry calls are idempotent, but retries only ever cover calls that were not sent.
        options = RpcOptions(timeout=30.0, retries=3) if options is None else options
        self._client: ActorClient[EndpointRegistry] = ActorClient(
            resolver, REGISTRY_ACTOR_NAME, options, cls=EndpointRegistry, token=token
        )

    def register(self, namespace: str, name: str, url: str) -> None:
        """See :meth:`EndpointRegistry.register`."""
        self._client.register(namespace, name, url)

    def unregister(self, namespace: str, name: str, url: str) -> None:
        """See :meth:`EndpointRegistry.unregister`."""
        self._client.unregister(namespace, name, url)

    def resolve(self, namespace: str, name: str) -> list[str]:
        """See :meth:`EndpointRegistry.resolve`."""
        return list(self._client.resolve(namespace, name))

    def list(self, namespace: str) -> dict[str, str]:
        """See :meth:`EndpointRegistry.list`."""
        return dict(self._client.list(namespace))

    def close(self) -> None:
        """Close the connection to the registry."""
        self._client.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (RegistryClient, (self.address,))


class ClusterResolver:
    """Resolves names through the endpoint registry at ``address`` (``host:port``).

    ``namespace`` defaults to the process's (``FRAY_NAMESPACE`` / ``FRAY_JOB_ID``);
    pass :data:`~fray.cluster.rpc.namespace.GLOBAL_NAMESPACE` to share actors across runs.
    Picklable: it keeps the address and namespace, never the token or connection.
    """

    def __init__(self, address: str, *, namespace: str | None = None, token: str | bytes | None = None) -> None:
        self.address = address
        self.namespace = resolve_namespace(namespace)
        self._token = token
        self._client: RegistryClient | None = None
        self._lock = threading.Lock()

    def _registry(self) -> RegistryClient:
        with self._lock:
            if self._client is None:
                self._client = RegistryClient(self.address, token=self._token)
            return self._client

    def resolve(self, name: str) -> list[str]:
        """The URLs registered for ``name`` in this resolver's namespace."""
        return self._registry().resolve(self.namespace, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClusterResolver, (self.address,), {"namespace": self.namespace})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.namespace = state["namespace"]

    def __repr__(self) -> str:
        return f"ClusterResolver({self.address!r}, namespace={self.namespace!r})"
