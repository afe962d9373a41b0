"""How Fray's values map onto Iris's: resources, placement constraints, environment, job states.

Every translation between the two vocabularies lives here, as plain functions over
Iris's own types, so the client and the task-side code share one table and the
mapping can be tested without a cluster (``docs/iris.md`` has the same table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from iris.cluster.constraints import Constraint, preemptible_constraint, region_constraint, zone_constraint
from iris.cluster.types import CoschedulingConfig, EnvironmentSpec, ResourceSpec, gpu_device, tpu_device
from iris.resources.state import JobState

from fray.errors import ConfigError
from fray.job import EnvironmentConfig, JobStatus
from fray.resources import GpuConfig, ResourceConfig, TpuConfig

__all__ = [
    "JOB_STATES",
    "IrisPlacement",
    "environment_spec",
    "fray_status",
    "placement",
]

#: Iris job state -> Fray job status. BUILDING means the task has a host and is setting
#: up or starting (Iris keeps a started task BUILDING until its monitor confirms it),
#: so it already counts as RUNNING; every way of not finishing well is FAILED except
#: KILLED, which is what ``terminate()`` (Iris's cancel) leads to.
JOB_STATES: dict[JobState, JobStatus] = {
    JobState.UNSPECIFIED: JobStatus.PENDING,
    JobState.PENDING: JobStatus.PENDING,
    JobState.BUILDING: JobStatus.RUNNING,
    JobState.RUNNING: JobStatus.RUNNING,
    JobState.SUCCEEDED: JobStatus.SUCCEEDED,
    JobState.FAILED: JobStatus.FAILED,
    JobState.KILLED: JobStatus.STOPPED,
    JobState.WORKER_FAILED: JobStatus.FAILED,
    JobState.UNSCHEDULABLE: JobStatus.FAILED,
}


def fray_status(state: JobState | str) -> JobStatus:
    """The Fray status of an Iris job state (see :data:`JOB_STATES`)."""
    return JOB_STATES[JobState(state)]


@dataclass(frozen=True)
class IrisPlacement:
    """What Iris's ``submit`` needs to place one Fray job: per-task resources, constraints, task count."""

    resources: ResourceSpec
    constraints: list[Constraint]
    replicas: int  #: Iris tasks: one per Fray replica, or one per host of each TPU slice
    hosts_per_replica: int  #: 1, or the hosts of a multi-host TPU slice
    coscheduling: CoschedulingConfig | None


def _device(resources: ResourceConfig) -> Any:
    device = resources.device
    if isinstance(device, GpuConfig):
        return gpu_device(device.type, device.count)
    if isinstance(device, TpuConfig):
        return tpu_device(device.type, device.slice.chips_per_host)
    return None


def _constraints(resources: ResourceConfig) -> list[Constraint]:
    constraints: list[Constraint] = []
    if not resources.preemptible:
        # Iris's own helper: a hard constraint on the workers' ``preemptible`` attribute.
        constraints.append(preemptible_constraint(False))
    if resources.regions:
        constraints.append(region_constraint(list(resources.regions)))
    if resources.zone:
        constraints.append(zone_constraint(resources.zone))
    return constraints


def placement(resources: ResourceConfig, replicas: int) -> IrisPlacement:
    """Map one replica's :class:`ResourceConfig` and the replica count onto Iris's submit arguments.

    A TPU replica is a whole slice: Iris runs one task per host, so a job of ``N``
    multi-host slices is ``N * hosts`` Iris tasks, coscheduled on hosts of one slice.
    A choice of devices (``device_alternatives``) is refused by name: Fray does not map
    it onto Iris's device variants yet.
    """
    if resources.device_alternatives and len(resources.device_alternatives) > 1:
        raise ConfigError(
            f"ResourceConfig(device_alternatives={list(resources.device_alternatives)!r}) cannot be honoured by the "
            "Iris backend yet; give one device, or use the Ray or Fray cluster backend"
        )
    spec = ResourceSpec(
        cpu=float(resources.cpu), memory=resources.ram_bytes, disk=resources.disk_bytes, device=_device(resources)
    )
    hosts = resources.device.slice.hosts if isinstance(resources.device, TpuConfig) else 1
    cosched = CoschedulingConfig(group_by="tpu-name") if hosts > 1 else None
    return IrisPlacement(spec, _constraints(resources), replicas * hosts, hosts, cosched)


def environment_spec(
    environment: EnvironmentConfig, env_vars: Mapping[str, str], *, workspace: str | None, in_task: bool
) -> tuple[EnvironmentSpec, str | None]:
    """Map an :class:`EnvironmentConfig` onto Iris's ``EnvironmentSpec`` and task image.

    ``env_vars`` is the full environment of a replica (Fray's variables and the user's).
    Iris builds a task's environment with its setup scripts (``uv sync`` of the
    workspace bundle, then ``pip_packages``); without a bundle there is nothing to sync,
    so no setup runs and the task image (or, in Iris's local mode, the worker's own
    environment) is used as it is. A child job inside a task inherits its parent's setup.
    """
    if environment.workspace is not None and environment.workspace != workspace:
        raise ConfigError(
            f"EnvironmentConfig(workspace={environment.workspace!r}): an Iris client ships one workspace bundle; "
            f"this client's is {workspace!r}. Create the client with iris://HOST:PORT?workspace=PATH instead"
        )
    packages: Sequence[str] = tuple(environment.pip_packages)
    if packages and workspace is None and not in_task:
        raise ConfigError(
            f"EnvironmentConfig(pip_packages={list(packages)!r}): Iris installs packages into the environment it "
            "syncs from a workspace bundle; create the client with iris://HOST:PORT?workspace=PATH"
        )
    syncs = in_task or workspace is not None
    spec = EnvironmentSpec(
        pip_packages=list(packages) or None,
        env_vars=dict(env_vars),
        setup_scripts=None if syncs else [],
    )
    return spec, environment.docker_image
