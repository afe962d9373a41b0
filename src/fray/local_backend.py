"""marin's ``fray.local_backend``: the embedded local backend under marin's module path.

``LocalClient`` and ``LocalJobHandle`` are :mod:`fray.local`'s own classes;
``LocalJobHandle(job_id, future)`` wraps a :class:`concurrent.futures.Future` as a job.
The other names are those marin's module offers too, each Fray's own: the local actor
handle, the one :class:`~fray.actor.ActorGroup` class every backend returns
(``LocalActorGroup``) and the one :class:`~fray.actor.RemoteMethod` (``LocalActorMethod``),
and the request and actor values.
"""

from __future__ import annotations

from fray.actor import ActorContext, ActorFuture, ActorGroup, ActorHandle, HostedActor, RemoteMethod
from fray.actor_config import ActorConfig

# marin's private hooks, re-exported here as marin's module does (redundant aliases: re-exported).
from fray.actor_context import _reset_current_actor as _reset_current_actor
from fray.actor_context import _set_current_actor as _set_current_actor
from fray.errors import ActorUnavailableError
from fray.job import BinaryEntrypoint, CallableEntrypoint, EnvironmentConfig, JobRequest, JobStatus
from fray.local import MarinLocalClient as LocalClient
from fray.local._local_actor import LocalActorHandle
from fray.local._local_job import LocalJobHandle
from fray.resources import ResourceConfig

#: marin's name for the actor group the local backend returns: Fray has one class for every backend.
LocalActorGroup = ActorGroup
#: marin's name for a local actor's method object: Fray has one class for every backend.
LocalActorMethod = RemoteMethod

__all__ = [
    "ActorConfig",
    "ActorContext",
    "ActorFuture",
    "ActorGroup",
    "ActorHandle",
    "ActorUnavailableError",
    "BinaryEntrypoint",
    "CallableEntrypoint",
    "EnvironmentConfig",
    "HostedActor",
    "JobRequest",
    "JobStatus",
    "LocalActorGroup",
    "LocalActorHandle",
    "LocalActorMethod",
    "LocalClient",
    "LocalJobHandle",
    "ResourceConfig",
]
