"""Fray: one explicit, testable API for distributed work on several engines.

The whole public surface is re-exported here; see ``docs/architecture.md`` for where
each concept lives.
"""

from fray.actor import ActorFuture, ActorGroup, ActorHandle, ActorMethod
from fray.actor_config import ActorConfig
from fray.actor_context import ActorContext, current_actor
from fray.client import Client, client_from_spec, current_client, set_current_client
from fray.errors import (
    ActorContextError,
    ActorDiedError,
    ActorUnavailableError,
    AuthenticationError,
    CallNotSentError,
    ConfigError,
    FrayError,
    IllegalTransition,
    JobAlreadyExists,
    JobFailed,
    JobTerminated,
    NotFound,
    PermissionDenied,
    ProtocolError,
    RemoteError,
    RpcTimeoutError,
    SerializationError,
    StorageError,
    StoreError,
)
from fray.job import (
    BinaryEntrypoint,
    CallableEntrypoint,
    Entrypoint,
    EnvironmentConfig,
    JobHandle,
    JobInfo,
    JobRequest,
    JobStatus,
    current_job,
    wait_all,
)
from fray.resources import (
    GPU_TYPES,
    TPU_TOPOLOGIES,
    CpuConfig,
    DeviceConfig,
    GpuConfig,
    ResourceConfig,
    TpuConfig,
    TpuTopology,
    parse_size,
)

__version__ = "0.1.0"

__all__ = [
    "GPU_TYPES",
    "TPU_TOPOLOGIES",
    "ActorConfig",
    "ActorContext",
    "ActorContextError",
    "ActorDiedError",
    "ActorFuture",
    "ActorGroup",
    "ActorHandle",
    "ActorMethod",
    "ActorUnavailableError",
    "AuthenticationError",
    "BinaryEntrypoint",
    "CallNotSentError",
    "CallableEntrypoint",
    "Client",
    "ConfigError",
    "CpuConfig",
    "DeviceConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "FrayError",
    "GpuConfig",
    "IllegalTransition",
    "JobAlreadyExists",
    "JobFailed",
    "JobHandle",
    "JobInfo",
    "JobRequest",
    "JobStatus",
    "JobTerminated",
    "NotFound",
    "PermissionDenied",
    "ProtocolError",
    "RemoteError",
    "ResourceConfig",
    "RpcTimeoutError",
    "SerializationError",
    "StorageError",
    "StoreError",
    "TpuConfig",
    "TpuTopology",
    "client_from_spec",
    "current_actor",
    "current_client",
    "current_job",
    "parse_size",
    "set_current_client",
    "wait_all",
]
