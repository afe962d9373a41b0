"""Fray: one explicit, testable API for distributed work on several engines.

The whole public surface is re-exported here; see ``docs/architecture.md`` for where
each concept lives.
"""

from fray._local_context import LocalJobContext
from fray._process_context import ProcessJobContext
from fray.actor import ActorFuture, ActorGroup, ActorHandle, ActorMethod
from fray.actor_config import ActorConfig
from fray.actor_context import ActorContext, current_actor
from fray.client import Client, client_from_spec, current_client, set_current_client
from fray.context import JobContext, ObjectRef, clear_job_context, get_job_context, set_job_context
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
    LeaseError,
    LeaseExpired,
    NotFound,
    ObjectLostError,
    PermissionDenied,
    ProtocolError,
    QueueAlreadyExists,
    RemoteError,
    RpcTimeoutError,
    SerializationError,
    StorageError,
    StoreError,
    TaskLostError,
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
from fray.pool import WorkerPool
from fray.queue import Lease, Queue, QueueCounts
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
    "JobContext",
    "JobFailed",
    "JobHandle",
    "JobInfo",
    "JobRequest",
    "JobStatus",
    "JobTerminated",
    "Lease",
    "LeaseError",
    "LeaseExpired",
    "LocalJobContext",
    "NotFound",
    "ObjectLostError",
    "ObjectRef",
    "PermissionDenied",
    "ProcessJobContext",
    "ProtocolError",
    "Queue",
    "QueueAlreadyExists",
    "QueueCounts",
    "RemoteError",
    "ResourceConfig",
    "RpcTimeoutError",
    "SerializationError",
    "StorageError",
    "StoreError",
    "TaskLostError",
    "TpuConfig",
    "TpuTopology",
    "WorkerPool",
    "clear_job_context",
    "client_from_spec",
    "current_actor",
    "current_client",
    "current_job",
    "get_job_context",
    "parse_size",
    "set_current_client",
    "set_job_context",
    "wait_all",
]
