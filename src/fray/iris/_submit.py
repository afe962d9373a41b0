"""Submitting one Fray job, or one actor group, to Iris: the request mapped onto ``iris.client.IrisClient.submit``.

Jobs and actor groups take the same path: an actor group is one Iris job whose tasks are its
members (``replicas=count``, each task serving one member on its ``actor`` port), so the
resources, constraints, image, container profile and environment of both are mapped once
(:mod:`fray.iris.mapping`). Iris's refusals become Fray's errors here.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from iris.client import JobAlreadyExists as IrisJobAlreadyExists
from iris.cluster.types import Entrypoint as IrisEntrypoint

from fray.errors import ConfigError, FrayError, JobAlreadyExists
from fray.iris import _task
from fray.iris.entrypoints import check_processes_per_task, wrap_multiprocess, wrap_nsys
from fray.iris.job import forget_terminated
from fray.iris.mapping import environment_spec, group_coscheduling, iris_timeout, placement
from fray.job import EnvironmentConfig, JobInfo, JobRequest
from fray.job_info import replica_env
from fray.resources import GpuConfig

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib

__all__ = ["ACTOR_PORT", "IN_TASK_SPEC", "submit"]

#: The spec jobs get in ``FRAY_CLIENT_SPEC``: "the Iris cluster this task runs in", found
#: from the task's Iris context (the controller address seen from inside the cluster may
#: differ from the one the submitter used).
IN_TASK_SPEC = "iris"
#: The port Iris allocates to each task of an actor group, on which its member serves.
ACTOR_PORT = "actor"


def submit(
    iris: IrisLib,
    request: JobRequest,
    entrypoint: IrisEntrypoint,
    *,
    workspace: str | None,
    in_task: bool,
    actors: bool = False,
) -> Any:
    """Submit ``request`` to Iris as ``entrypoint``; Iris's ``Job`` for it.

    ``actors``: the job is an actor group, one member per task. Its tasks get the actor port,
    GPU members share a leafgroup, and a member that fails does not end the others (Iris's
    job-wide failure allowance is one less than the members; the job fails once all ended and
    one failed). Iris's refusals become Fray's errors: a live job of the same name
    ``JobAlreadyExists``, a request Iris finds invalid ``ConfigError``, anything else ``FrayError``.
    """
    place = placement(request.resources, request.replicas)
    env_cfg = request.environment or EnvironmentConfig()
    info = JobInfo(job_id="", name=request.name, replica_count=request.replicas, priority_band=request.priority)
    env = replica_env(info, IN_TASK_SPEC, env_cfg.env_vars)
    env[_task.HOSTS_ENV] = str(place.hosts_per_replica)
    processes = request.processes_per_task
    if processes > 1 and isinstance(request.resources.device, GpuConfig):
        # GPUs: Iris's own supervisor (its processes find their GPUs the way Iris's JAX set-up reads them).
        check_processes_per_task(processes, place.resources, request.name)
        entrypoint = wrap_multiprocess(entrypoint, place.resources, processes)
    elif processes > 1:
        env[_task.RANKS_ENV] = shlex.join(_task.ranks_args(processes))  # Fray's supervisor, inside the task
    entrypoint = wrap_nsys(entrypoint)
    environment, image = environment_spec(
        env_cfg, env, workspace=workspace, in_task=in_task, device=request.resources.device
    )
    if actors:
        coscheduling = group_coscheduling(request.resources, place.replicas)
        task_failures = place.replicas - 1
    else:
        coscheduling = place.coscheduling
        # Fray's failure budget is per job; Iris's job-wide allowance of failed attempts matches it.
        task_failures = request.max_retries_failure
    try:
        job = iris.submit(
            entrypoint,
            request.name,
            place.resources,
            environment=environment,
            ports=[ACTOR_PORT] if actors else None,
            # None, not []: inside a task an empty list would drop the parent's constraints.
            constraints=place.constraints or None,
            coscheduling=coscheduling,
            replicas=place.replicas,
            max_retries_failure=request.max_retries_failure,
            max_retries_preemption=request.max_retries_preemption,
            max_task_failures=task_failures,
            timeout=iris_timeout(request.timeout),
            priority_band=request.priority,  # Fray's bands are Iris's numbers (fray.job.PriorityBand)
            task_image=image,
            container_profile=place.container_profile,
        )
    except IrisJobAlreadyExists as exc:
        raise JobAlreadyExists(
            request.name,
            reason=f"an Iris job with this name is still live here ({exc}); "
            "Iris names are unique among live jobs: pick another name or terminate it first",
        ) from exc
    except ConnectError as exc:
        if exc.code in (Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.OUT_OF_RANGE):
            raise ConfigError(f"Iris refused job {request.name!r}: {exc.message}") from exc
        raise FrayError(f"Iris did not accept job {request.name!r}: {exc.code.name}: {exc.message}") from exc
    except ValueError as exc:
        raise ConfigError(f"Iris refused job {request.name!r}: {exc}") from exc
    forget_terminated(str(job.job_id))
    return job
