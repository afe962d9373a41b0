"""Resolvers: map an actor name to the URLs (``actor://host:port/name``) where it is served.

* :class:`FixedResolver` -- a static map, for tests and hand-wired deployments.
* :class:`~fray.cluster.rpc.registry.ClusterResolver` -- asks the endpoint registry; it needs
  an RPC client, so it lives above the client, in :mod:`fray.cluster.rpc.registry`.
* :class:`GceResolver` -- reads endpoints that VMs advertise in their GCE instance
  metadata, through the GCE metadata server and the Compute API.

Every resolver has a ``namespace``: the client sends it with each call and the
server only answers for actors of that namespace, so a URL leaked across
namespaces still does not reach the actor.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from fray.cluster.rpc.namespace import resolve_namespace
from fray.errors import ConfigError

__all__ = ["FixedResolver", "GceResolver", "Resolver"]


@runtime_checkable
class Resolver(Protocol):
    """Finds where a named actor is served."""

    def resolve(self, name: str) -> list[str]:
        """The URLs of ``name`` (best first); empty when it is not (yet) registered."""
        ...


class FixedResolver:
    """A static ``name -> URL(s)`` map."""

    def __init__(self, endpoints: Mapping[str, str | Sequence[str]], *, namespace: str | None = None) -> None:
        self.namespace = resolve_namespace(namespace)
        self._endpoints: dict[str, list[str]] = {
            name: [urls] if isinstance(urls, str) else list(urls) for name, urls in endpoints.items()
        }

    def resolve(self, name: str) -> list[str]:
        """The configured URLs of ``name``, or an empty list."""
        return list(self._endpoints.get(name, ()))

    def __repr__(self) -> str:
        return f"FixedResolver({self._endpoints!r}, namespace={self.namespace!r})"


#: The metadata item in which a VM advertises its actors to :class:`GceResolver`.
GCE_METADATA_KEY = "fray-endpoints"
_GCE_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
_GCE_COMPUTE_URL = "https://compute.googleapis.com/compute/v1"


class GceResolver:
    """Resolves names from endpoints advertised in GCE instance metadata.

    A VM advertises actors in its metadata item ``fray-endpoints``: a JSON object
    mapping ``"<namespace>/<name>"`` to either a full ``actor://`` URL or a port
    number (meaning ``actor://<the VM's internal IP>:<port>/<name>``). The resolver
    asks the metadata server for the project and an access token, lists the
    project's running instances through the Compute API, and caches the answer for
    ``cache_seconds``.

    ``metadata_url`` defaults to ``$GCE_METADATA_HOST`` when set (as Google's own
    libraries do), else the real metadata server; both URLs can point at a stand-in.
    """

    def __init__(
        self,
        *,
        namespace: str | None = None,
        project: str | None = None,
        metadata_url: str | None = None,
        compute_url: str = _GCE_COMPUTE_URL,
        cache_seconds: float = 5.0,
        http_timeout: float = 5.0,
    ) -> None:
        if metadata_url is None:
            host = os.environ.get("GCE_METADATA_HOST")
            metadata_url = f"http://{host}/computeMetadata/v1" if host else _GCE_METADATA_URL
        self.namespace = resolve_namespace(namespace)
        self.project = project
        self.metadata_url = metadata_url.rstrip("/")
        self.compute_url = compute_url.rstrip("/")
        self.cache_seconds = cache_seconds
        self.http_timeout = http_timeout
        self._lock = threading.Lock()
        self._cache: tuple[float, dict[str, list[str]]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The lock and the cache stay behind; the settings travel.
        state = dict(self.__dict__)
        del state["_lock"], state["_cache"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._cache = None

    def resolve(self, name: str) -> list[str]:
        """The URLs advertised for ``name`` in this resolver's namespace by running instances."""
        return list(self._endpoints().get(f"{self.namespace}/{name}", ()))

    def _endpoints(self) -> dict[str, list[str]]:
        with self._lock:
            if self._cache is not None and time.monotonic() - self._cache[0] < self.cache_seconds:
                return self._cache[1]
        endpoints = self._fetch()
        with self._lock:
            self._cache = (time.monotonic(), endpoints)
        return endpoints

    def _metadata(self, path: str) -> str:
        request = urllib.request.Request(f"{self.metadata_url}/{path}", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=self.http_timeout) as response:
            if response.headers.get("Metadata-Flavor") != "Google":
                raise ConfigError(f"{self.metadata_url} is not a GCE metadata server")
            return str(response.read().decode())

    def _fetch(self) -> dict[str, list[str]]:
        project = self.project or self._metadata("project/project-id").strip()
        token = json.loads(self._metadata("instance/service-accounts/default/token"))["access_token"]
        query = urllib.parse.urlencode({"filter": 'status = "RUNNING"'})
        endpoints: dict[str, list[str]] = {}
        page_token = ""
        while True:
            url = f"{self.compute_url}/projects/{project}/aggregated/instances?{query}"
            if page_token:
                url += "&" + urllib.parse.urlencode({"pageToken": page_token})
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=self.http_timeout) as response:
                page = json.loads(response.read())
            for scope in page.get("items", {}).values():
                for instance in scope.get("instances", ()):
                    for key, url_value in _instance_endpoints(instance):
                        endpoints.setdefault(key, []).append(url_value)
            page_token = page.get("nextPageToken", "")
            if not page_token:
                return endpoints


def _instance_endpoints(instance: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``(namespace/name, url)`` pairs one instance advertises; malformed entries are skipped."""
    items = instance.get("metadata", {}).get("items", ())
    raw = next((item.get("value") for item in items if item.get("key") == GCE_METADATA_KEY), None)
    if not raw:
        return []
    try:
        advertised = json.loads(raw)
    except ValueError:
        return []
    interfaces = instance.get("networkInterfaces") or [{}]
    ip = interfaces[0].get("networkIP")
    pairs = []
    for key, value in advertised.items() if isinstance(advertised, dict) else ():
        name = key.rsplit("/", 1)[-1]
        if isinstance(value, str) and value.startswith("actor://"):
            pairs.append((key, value))
        elif isinstance(value, int) and not isinstance(value, bool) and ip:
            pairs.append((key, f"actor://{ip}:{value}/{name}"))
    return pairs
