"""marin's ``fray.iris_backend``: Fray's Iris backend under marin's module path (needs ``fray[iris]``, Python >= 3.12).

Every name here *is* Fray's Iris backend, not a second one beside it: ``FrayIrisClient`` is
:class:`fray.iris.client.IrisClient`, ``IrisJobHandle``/``IrisActorHandle``/``IrisActorGroup``
are the handles and groups it returns, ``OperationFuture`` the future of ``.submit()`` on an
actor method, and the ``convert_*`` functions, ``resolve_coscheduling`` and the wrappers are the
mapping it submits with (``fray.iris.mapping``, ``fray.iris.entrypoints``). The Iris and Fray
names marin's module re-exports are re-exported too.

**Seams.** ``ActorClient``, ``ActorServer``, ``iris_ctx`` and ``get_job_info`` are the Iris names
Fray's Iris code reaches Iris through, and it looks each up *on this module* when it uses it,
rather than importing it once: marin's own tests replace them here
(``monkeypatch.setattr(iris_backend, "ActorClient", fake)``) to stand in for a cluster, and a
replacement must take effect in Fray's real code path.
"""

from __future__ import annotations

from concurrent.futures import Future

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from iris.actor.client import ActorClient
from iris.actor.resolver import Resolver
from iris.actor.server import ActorServer
from iris.client.client import IrisClient as IrisClientLib
from iris.client.client import Job as IrisJob
from iris.client.client import JobAlreadyExists as IrisJobAlreadyExists
from iris.client.client import get_iris_ctx, iris_ctx
from iris.cluster.client.job_info import get_job_info
from iris.cluster.constraints import (
    Constraint,
    ConstraintOp,
    any_region_constraint,
    device_variant_constraint,
    preemptible_constraint,
    region_constraint,
    zone_constraint,
)
from iris.cluster.platforms.k8s.coreweave_topology import gpu_gang_coscheduling_level
from iris.cluster.types import CoschedulingConfig, EnvironmentSpec, ResourceSpec, tpu_device
from iris.cluster.types import Entrypoint as IrisEntrypoint
from iris.jax.multigpu import build_multigpu_hook
from iris.resources.state import JobState as IrisJobState
from iris.resources.state import is_job_finished
from iris.rpc.errors import is_retryable_error
from rigging.secrets import SecretBehavior
from rigging.timing import ExponentialBackoff

from fray.actor import ActorFuture, ActorHandle, ActorUnavailableError, HostedActor
from fray.actor_config import ActorConfig
from fray.actor_context import ActorContext
from fray.actor_context import _reset_current_actor as _reset_current_actor
from fray.actor_context import _set_current_actor as _set_current_actor
from fray.errors import JobAlreadyExists as FrayJobAlreadyExists
from fray.iris._actor_host import _host_actor as _host_actor
from fray.iris.actor import IrisActorHandle
from fray.iris.actor import _IrisActorMethod as _IrisActorMethod
from fray.iris.client import IrisClient as FrayIrisClient
from fray.iris.entrypoints import NSYS_TASKS_ENV, convert_entrypoint, wrap_multiprocess, wrap_nsys
from fray.iris.group import IrisActorGroup
from fray.iris.job import IrisJobHandle
from fray.iris.mapping import (
    ANY_REGION,
    CLUSTER_CONSTRAINT_KEY,
    COSCHEDULE_LEAFGROUP,
    convert_constraints,
    convert_container_profile,
    convert_environment,
    convert_resources,
    map_iris_job_state,
    resolve_coscheduling,
)
from fray.iris.operation import OperationFuture
from fray.job import EnvironmentConfig, JobRequest, JobStatus
from fray.resources import CpuConfig, GpuConfig, ResourceConfig, TpuConfig
from fray.types import Entrypoint as FrayEntrypoint

# The public names marin's module has; its private ones its tests use (``_host_actor``,
# ``_set_current_actor``, ``_reset_current_actor``, ``_IrisActorMethod``) are imported above
# with redundant aliases, which re-export them.
__all__ = [
    "ANY_REGION",
    "CLUSTER_CONSTRAINT_KEY",
    "COSCHEDULE_LEAFGROUP",
    "NSYS_TASKS_ENV",
    "ActorClient",
    "ActorConfig",
    "ActorContext",
    "ActorFuture",
    "ActorHandle",
    "ActorServer",
    "ActorUnavailableError",
    "Code",
    "ConnectError",
    "Constraint",
    "ConstraintOp",
    "CoschedulingConfig",
    "CpuConfig",
    "EnvironmentConfig",
    "EnvironmentSpec",
    "ExponentialBackoff",
    "FrayEntrypoint",
    "FrayIrisClient",
    "FrayJobAlreadyExists",
    "Future",
    "GpuConfig",
    "HostedActor",
    "IrisActorGroup",
    "IrisActorHandle",
    "IrisClientLib",
    "IrisEntrypoint",
    "IrisJob",
    "IrisJobAlreadyExists",
    "IrisJobHandle",
    "IrisJobState",
    "JobRequest",
    "JobStatus",
    "OperationFuture",
    "Resolver",
    "ResourceConfig",
    "ResourceSpec",
    "SecretBehavior",
    "TpuConfig",
    "any_region_constraint",
    "build_multigpu_hook",
    "convert_constraints",
    "convert_container_profile",
    "convert_entrypoint",
    "convert_environment",
    "convert_resources",
    "device_variant_constraint",
    "get_iris_ctx",
    "get_job_info",
    "gpu_gang_coscheduling_level",
    "iris_ctx",
    "is_job_finished",
    "is_retryable_error",
    "map_iris_job_state",
    "preemptible_constraint",
    "region_constraint",
    "resolve_coscheduling",
    "tpu_device",
    "wrap_multiprocess",
    "wrap_nsys",
    "zone_constraint",
]
