"""Fray's actor RPC layer: serve any Python object, call it from other processes and hosts.

* :class:`ActorServer` serves objects registered under names;
* :class:`ActorClient` is a handle resolving a name through a :class:`Resolver`;
* :class:`FixedResolver`, :class:`ClusterResolver` (backed by the
  :class:`EndpointRegistry`) and :class:`GceResolver` find actors;
* namespaces (``FRAY_NAMESPACE``) keep runs apart; ``FRAY_TOKEN`` authenticates peers.

The errors re-exported here live in :mod:`fray.errors`. The wire format is
documented in ``docs/protocol.md``.
"""

from fray.cluster.rpc.client import ActorClient, RpcOptions, list_actors, list_methods
from fray.cluster.rpc.namespace import DEFAULT_NAMESPACE, GLOBAL_NAMESPACE, default_namespace
from fray.cluster.rpc.protocol import ActorInfo, MethodInfo, parse_actor_url
from fray.cluster.rpc.registry import (
    REGISTRY_ACTOR_NAME,
    SYSTEM_NAMESPACE,
    ClusterResolver,
    EndpointRegistry,
    RegistryClient,
    serve_registry,
)
from fray.cluster.rpc.resolver import GCE_METADATA_KEY, FixedResolver, GceResolver, Resolver
from fray.cluster.rpc.server import ActorServer, NameMapping
from fray.cluster.rpc.wire import PROTOCOL_VERSION
from fray.errors import AuthenticationError, CallNotSentError, ProtocolError, RpcTimeoutError

__all__ = [
    "DEFAULT_NAMESPACE",
    "GCE_METADATA_KEY",
    "GLOBAL_NAMESPACE",
    "PROTOCOL_VERSION",
    "REGISTRY_ACTOR_NAME",
    "SYSTEM_NAMESPACE",
    "ActorClient",
    "ActorInfo",
    "ActorServer",
    "AuthenticationError",
    "CallNotSentError",
    "ClusterResolver",
    "EndpointRegistry",
    "FixedResolver",
    "GceResolver",
    "MethodInfo",
    "NameMapping",
    "ProtocolError",
    "RegistryClient",
    "Resolver",
    "RpcOptions",
    "RpcTimeoutError",
    "default_namespace",
    "list_actors",
    "list_methods",
    "parse_actor_url",
    "serve_registry",
]
