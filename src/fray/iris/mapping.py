"""How Fray's values map onto Iris's: resources, placement, coscheduling, environment, job and task states.

Every translation between the two vocabularies lives here, as plain functions over Iris's own
types, so the client, the actor groups and the task-side code share one table and the mapping
can be tested without a cluster (``docs/iris.md`` has the same table). The public names are
marin's (``fray.iris_backend`` re-exports them) with marin's meaning; how a Fray job's
entrypoint becomes Iris's is in :mod:`fray.iris.entrypoints`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from iris.cluster.constraints import (
    CLUSTER_CONSTRAINT_KEY,
    Constraint,
    ConstraintOp,
    any_region_constraint,
    device_variant_constraint,
    preemptible_constraint,
    region_constraint,
    zone_constraint,
)
from iris.cluster.platforms.k8s.coreweave_topology import COSCHEDULE_LEAFGROUP, gpu_gang_coscheduling_level
from iris.cluster.types import CoschedulingConfig, EnvironmentSpec, ResourceSpec, gpu_device, tpu_device
from iris.resources.state import JobState, TaskState
from iris.rpc import job_pb2
from rigging.secrets import SecretBehavior as IrisSecretBehavior
from rigging.timing import Duration

from fray.errors import ConfigError
from fray.job import EnvironmentConfig, JobStatus
from fray.resources import ANY_REGION, CpuConfig, DeviceConfig, GpuConfig, ResourceConfig, TpuConfig

__all__ = [
    "ANY_REGION",
    "CLUSTER_CONSTRAINT_KEY",
    "COSCHEDULE_LEAFGROUP",
    "COSCHEDULE_TPU",
    "JOB_STATES",
    "TASK_STATES",
    "IrisPlacement",
    "convert_constraints",
    "convert_container_profile",
    "convert_environment",
    "convert_resources",
    "device_env",
    "environment_spec",
    "fray_status",
    "group_coscheduling",
    "iris_timeout",
    "map_iris_job_state",
    "member_status",
    "placement",
    "resolve_coscheduling",
]

#: Coscheduling of the hosts of one multi-host TPU slice: Iris's workers of a slice share its name.
COSCHEDULE_TPU = "tpu-name"

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

#: Iris task state -> the Fray status of the actor-group member that task hosts (a member's
#: "job" is its task). ASSIGNED has a host but has not started; PREEMPTED and MISSING are
#: reported only until Iris retries the task or ends it, so they count as not running yet.
TASK_STATES: dict[TaskState, JobStatus] = {
    TaskState.UNSPECIFIED: JobStatus.PENDING,
    TaskState.PENDING: JobStatus.PENDING,
    TaskState.ASSIGNED: JobStatus.PENDING,
    TaskState.PREEMPTED: JobStatus.PENDING,
    TaskState.MISSING: JobStatus.PENDING,
    TaskState.BUILDING: JobStatus.RUNNING,
    TaskState.RUNNING: JobStatus.RUNNING,
    TaskState.SUCCEEDED: JobStatus.SUCCEEDED,
    TaskState.FAILED: JobStatus.FAILED,
    TaskState.WORKER_FAILED: JobStatus.FAILED,
    TaskState.UNSCHEDULABLE: JobStatus.FAILED,
    TaskState.COSCHED_FAILED: JobStatus.FAILED,
    TaskState.KILLED: JobStatus.STOPPED,
}


def fray_status(state: JobState | str) -> JobStatus:
    """The Fray status of an Iris job state (see :data:`JOB_STATES`)."""
    return JOB_STATES[JobState(state)]


def map_iris_job_state(iris_state: JobState) -> JobStatus:
    """Map an Iris workload state to Fray's smaller lifecycle (marin's name for :func:`fray_status`)."""
    return fray_status(iris_state)


def member_status(state: TaskState | str) -> JobStatus:
    """The Fray status of an actor-group member whose task is in ``state`` (see :data:`TASK_STATES`)."""
    return TASK_STATES[TaskState(state)]


# ----- resources and placement --------------------------------------------------------------------


def _device(device: DeviceConfig) -> Any:
    if isinstance(device, GpuConfig):
        return gpu_device(device.type, device.count)
    if isinstance(device, TpuConfig):
        return tpu_device(device.type, device.slice.chips_per_host)
    return None


def convert_resources(resources: ResourceConfig) -> ResourceSpec:
    """Iris's ``ResourceSpec`` for one task: cpu, ram as memory, disk (bytes) and the device.

    A multi-host TPU slice is one task per host; the task count is given to Iris's submit
    separately (:func:`placement`).
    """
    return ResourceSpec(
        cpu=float(resources.cpu),
        memory=resources.ram_bytes,
        disk=resources.disk_bytes,
        device=_device(resources.device),
    )


def _variant(device: DeviceConfig) -> str:
    return device.type if isinstance(device, GpuConfig | TpuConfig) else "cpu"


def _region_constraints(regions: tuple[str, ...]) -> list[Constraint]:
    if ANY_REGION in regions:
        if len(regions) > 1:
            raise ConfigError(
                f"ResourceConfig(regions={list(regions)!r}): ANY_REGION cannot be combined with named regions; "
                "give [ANY_REGION] for anywhere, or the regions alone"
            )
        # Said explicitly: anywhere, not the parent job's region, which an Iris child inherits otherwise.
        return [any_region_constraint()]
    return [region_constraint(list(regions))]


def convert_constraints(resources: ResourceConfig) -> list[Constraint]:
    """Iris's placement constraints for ``resources``.

    ``preemptible=False`` is a hard constraint on the workers' ``preemptible`` attribute;
    ``regions`` one region constraint (EQ for one, IN for several; ``[ANY_REGION]`` Iris's
    "anywhere" marker, so a child job does not inherit its parent's region; unset: nothing, so it
    does); ``zone`` a zone constraint; ``target_cluster`` Iris's ``cluster`` routing directive;
    a choice of devices (``device_alternatives``) one ``device-variant`` constraint listing
    every variant. Iris chooses among variants of one kind (TPU types, GPU types); a choice
    between kinds (a GPU or the CPU) cannot be placed by one Iris job and is a ConfigError.
    """
    constraints: list[Constraint] = []
    if not resources.preemptible:
        constraints.append(preemptible_constraint(False))
    if resources.regions:
        constraints += _region_constraints(tuple(resources.regions))
    if resources.zone:
        constraints.append(zone_constraint(resources.zone))
    if resources.target_cluster:
        constraints.append(
            Constraint.create(key=CLUSTER_CONSTRAINT_KEY, op=ConstraintOp.EQ, value=resources.target_cluster)
        )
    choices = resources.device_choices
    if len(choices) > 1:
        kinds = {type(device) for device in choices}
        if len(kinds) > 1 or CpuConfig in kinds:
            raise ConfigError(
                f"ResourceConfig(device_alternatives={[_variant(d) for d in choices]!r}): Iris places a job on "
                "one kind of device and chooses among its variants (TPU types, or GPU types); a choice between "
                "kinds cannot be placed by one Iris job: give variants of one kind"
            )
        constraints.append(device_variant_constraint([_variant(device) for device in choices]))
    return constraints


def _hosts(resources: ResourceConfig) -> int:
    return resources.device.slice.hosts if isinstance(resources.device, TpuConfig) else 1


def resolve_coscheduling(resources: ResourceConfig, replicas: int) -> CoschedulingConfig | None:
    """How Iris should coschedule the ``replicas`` tasks of a job with ``resources`` (None: not at all).

    The hosts of multi-host TPU slices go together by slice name. A multi-node GPU gang binds to
    the topology level Iris's CoreWeave table gives its GPU type and size (``leafgroup``, or one
    NVLink domain for NVL72 racks); every device choice must agree on it, and a gang that no rack
    layout can hold is a ConfigError with Iris's reason.
    """
    if replicas <= 1:
        return None
    device = resources.device
    if isinstance(device, TpuConfig):
        return CoschedulingConfig(group_by=COSCHEDULE_TPU) if _hosts(resources) > 1 else None
    if not isinstance(device, GpuConfig):
        return None
    levels: dict[str, str] = {}
    for choice in resources.device_choices:
        if not isinstance(choice, GpuConfig):
            continue
        try:
            levels[choice.type] = gpu_gang_coscheduling_level(choice.type, choice.count, replicas)
        except ValueError as exc:
            raise ConfigError(
                f"a gang of {replicas} {choice.type} x{choice.count} nodes cannot be placed: {exc}"
            ) from exc
    if len(set(levels.values())) > 1:
        found = ", ".join(f"{variant}={level}" for variant, level in levels.items())
        raise ConfigError(
            f"the device choices of a gang of {replicas} nodes need different topologies ({found}); "
            "give choices that coschedule alike"
        )
    return CoschedulingConfig(group_by=next(iter(levels.values())))


def group_coscheduling(resources: ResourceConfig, tasks: int) -> CoschedulingConfig | None:
    """How Iris coschedules the tasks of an actor group: GPU members share a leafgroup, a TPU slice its hosts.

    Actors talk to each other but are no NCCL gang, so GPU members ask only for Iris's soft
    network colocation, whatever their number.
    """
    if tasks > 1 and isinstance(resources.device, GpuConfig):
        return CoschedulingConfig(group_by=COSCHEDULE_LEAFGROUP)
    return resolve_coscheduling(resources, tasks)


def convert_container_profile(resources: ResourceConfig) -> int:
    """The Iris profile enum value for ``resources.container_profile``, UNSPECIFIED when unset.

    Iris's names (``"CONTAINER_PROFILE_PRIVILEGED"``) and their short forms (``"privileged"``)
    are accepted; anything else is a ConfigError listing them.
    """
    profile = resources.container_profile
    if profile is None:
        return int(job_pb2.CONTAINER_PROFILE_UNSPECIFIED)
    name = str(profile).upper()
    if not name.startswith("CONTAINER_PROFILE_"):
        name = f"CONTAINER_PROFILE_{name}"
    names = list(job_pb2.ContainerProfile.keys())
    if name not in names:
        known = [key.removeprefix("CONTAINER_PROFILE_").lower() for key in names]
        raise ConfigError(f"ResourceConfig(container_profile={profile!r}) is not one of Iris's profiles: {known}")
    return int(job_pb2.ContainerProfile.Value(name))


@dataclass(frozen=True)
class IrisPlacement:
    """What Iris's ``submit`` needs to place one Fray job: per-task resources, constraints, task count."""

    resources: ResourceSpec
    constraints: list[Constraint]
    replicas: int  #: Iris tasks: one per Fray replica, or one per host of each TPU slice
    hosts_per_replica: int  #: 1, or the hosts of a multi-host TPU slice
    coscheduling: CoschedulingConfig | None
    container_profile: int


def placement(resources: ResourceConfig, replicas: int) -> IrisPlacement:
    """Map one replica's :class:`ResourceConfig` and the replica count onto Iris's submit arguments.

    A TPU replica is a whole slice: Iris runs one task per host, so a job of ``N`` multi-host
    slices is ``N * hosts`` Iris tasks, coscheduled on hosts of one slice.
    """
    hosts = _hosts(resources)
    tasks = replicas * hosts
    return IrisPlacement(
        convert_resources(resources),
        convert_constraints(resources),
        tasks,
        hosts,
        resolve_coscheduling(resources, tasks),
        convert_container_profile(resources),
    )


def iris_timeout(timeout: Any) -> Duration | None:
    """``JobRequest.timeout`` (seconds, or a duration with ``to_seconds()``) as Iris's per-task ``Duration``."""
    if timeout is None:
        return None
    seconds = timeout.to_seconds() if hasattr(timeout, "to_seconds") else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ConfigError(f"JobRequest(timeout={timeout!r}) must be a positive number of seconds or a Duration")
    return Duration.from_seconds(float(seconds))


# ----- environment --------------------------------------------------------------------------------

#: What JAX finds by default on each kind of device (marin's defaults): the CPU backend on a CPU
#: host, the accelerator's own elsewhere, and the TPU runtime's scoped VMEM limit.
_TPU_ENV = {"JAX_PLATFORMS": "", "LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=50000"}
_GPU_ENV = {"JAX_PLATFORMS": ""}
_CPU_ENV = {"JAX_PLATFORMS": "cpu"}


def device_env(device: DeviceConfig | None) -> dict[str, str]:
    """The variables a task on ``device`` gets by default (the job's own variables override them)."""
    if isinstance(device, TpuConfig):
        return dict(_TPU_ENV)
    if isinstance(device, GpuConfig):
        return dict(_GPU_ENV)
    return dict(_CPU_ENV) if device is not None else {}


def _spec(env: EnvironmentConfig, env_vars: dict[str, str], setup_scripts: list[str] | None) -> EnvironmentSpec:
    return EnvironmentSpec(
        pip_packages=list(env.pip_packages) or None,
        env_vars=env_vars,
        secrets=dict(env.secrets),
        secret_behavior=IrisSecretBehavior(env.secret_behavior.value),
        extras=list(env.extras) or None,
        setup_scripts=setup_scripts,
        sync_packages=list(env.sync_packages) or None,
    )


def convert_environment(env: EnvironmentConfig | None, device: DeviceConfig | None = None) -> EnvironmentSpec | None:
    """Convert an :class:`EnvironmentConfig` to Iris's ``EnvironmentSpec`` (None when neither is given).

    The variables are ``device``'s defaults (:func:`device_env`) under the environment's own;
    pip packages, extras, dependency groups (``sync_packages``), secrets and setup scripts are
    Iris's fields of the same names. ``docker_image`` is Iris's ``task_image``, given to submit
    separately.
    """
    if env is None and device is None:
        return None
    env = env or EnvironmentConfig()
    scripts = None if env.setup_scripts is None else list(env.setup_scripts)
    return _spec(env, {**device_env(device), **env.env_vars}, scripts)


def environment_spec(
    environment: EnvironmentConfig,
    env_vars: Mapping[str, str],
    *,
    workspace: str | None,
    in_task: bool,
    device: DeviceConfig | None = None,
) -> tuple[EnvironmentSpec, str | None]:
    """A Fray job's Iris ``EnvironmentSpec`` and task image (:func:`convert_environment`, and Fray's rules).

    ``env_vars`` is the full environment of a replica (Fray's variables and the user's); the
    device's defaults go under it. Iris builds a task's environment with its setup scripts
    (``uv sync`` of the workspace bundle, with the extras and dependency groups, then
    ``pip_packages``); without a bundle there is nothing to sync, so no setup runs and the task
    image (or, in Iris's local mode, the worker's own environment) is used as it is, and what only
    setup installs is refused by name. A child job inside a task inherits its parent's setup.
    """
    if environment.workspace is not None and environment.workspace != workspace:
        raise ConfigError(
            f"EnvironmentConfig(workspace={environment.workspace!r}): an Iris client ships one workspace bundle; "
            f"this client's is {workspace!r}. Create the client with iris://HOST:PORT?workspace=PATH instead"
        )
    syncs = in_task or workspace is not None
    installs = {
        "pip_packages": list(environment.pip_packages),
        "extras": list(environment.extras),
        "sync_packages": list(environment.sync_packages),
    }
    wanted = {name: value for name, value in installs.items() if value}
    if wanted and not syncs:
        given = ", ".join(f"{name}={value!r}" for name, value in wanted.items())
        raise ConfigError(
            f"EnvironmentConfig({given}): Iris installs these into the environment it syncs from a workspace "
            "bundle; create the client with iris://HOST:PORT?workspace=PATH"
        )
    scripts = None if environment.setup_scripts is None else list(environment.setup_scripts)
    if scripts is None and not syncs:
        scripts = []  # nothing to sync: Iris's default setup would fail without a bundle
    return _spec(environment, {**device_env(device), **env_vars}, scripts), environment.docker_image
