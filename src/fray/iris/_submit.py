"""Submitting one Fray job to Iris: the request mapped onto ``iris.client.IrisClient.submit``, and its refusals."""

from __future__ import annotations

from typing import TYPE_CHECKING

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from iris.client import JobAlreadyExists as IrisJobAlreadyExists
from iris.cluster.types import Entrypoint as IrisEntrypoint

from fray.errors import ConfigError, FrayError, JobAlreadyExists
from fray.iris import _task
from fray.iris.job import forget_terminated
from fray.iris.mapping import environment_spec, placement
from fray.job import EnvironmentConfig, JobInfo, JobRequest, replica_env

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib

__all__ = ["IN_TASK_SPEC", "submit"]

#: The spec jobs get in ``FRAY_CLIENT_SPEC``: "the Iris cluster this task runs in", found
#: from the task's Iris context (the controller address seen from inside the cluster may
#: differ from the one the submitter used).
IN_TASK_SPEC = "iris"


def submit(
    iris: IrisLib,
    request: JobRequest,
    entrypoint: IrisEntrypoint,
    *,
    ports: list[str] | None,
    workspace: str | None,
    in_task: bool,
) -> str:
    """Submit ``request`` to Iris as ``entrypoint``; the Iris job's id (its wire name).

    Iris's refusals become Fray's errors: a live job of the same name ``JobAlreadyExists``,
    a request Iris finds invalid ``ConfigError``, anything else ``FrayError``.
    """
    place = placement(request.resources, request.replicas)
    env_cfg = request.environment or EnvironmentConfig()
    info = JobInfo(job_id="", name=request.name, replica_count=request.replicas)
    env = replica_env(info, IN_TASK_SPEC, env_cfg.env_vars)
    env[_task.HOSTS_ENV] = str(place.hosts_per_replica)
    environment, image = environment_spec(env_cfg, env, workspace=workspace, in_task=in_task)
    try:
        job = iris.submit(
            entrypoint,
            request.name,
            place.resources,
            environment=environment,
            ports=ports,
            # None, not []: inside a task an empty list would drop the parent's constraints.
            constraints=place.constraints or None,
            coscheduling=place.coscheduling,
            replicas=place.replicas,
            max_retries_failure=request.max_retries_failure,
            max_retries_preemption=request.max_retries_preemption,
            # Fray's failure budget is per job; Iris's job-wide allowance of failed attempts matches it.
            max_task_failures=request.max_retries_failure,
            task_image=image,
        )
    except IrisJobAlreadyExists as exc:
        raise JobAlreadyExists(
            f"{request.name!r}: an Iris job with this name is still live here ({exc}); "
            "Iris names are unique among live jobs: pick another name or terminate it first"
        ) from exc
    except ConnectError as exc:
        if exc.code in (Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.OUT_OF_RANGE):
            raise ConfigError(f"Iris refused job {request.name!r}: {exc.message}") from exc
        raise FrayError(f"Iris did not accept job {request.name!r}: {exc.code.name}: {exc.message}") from exc
    except ValueError as exc:
        raise ConfigError(f"Iris refused job {request.name!r}: {exc}") from exc
    job_id: str = job.job_id.to_wire()
    forget_terminated(job_id)
    return job_id
