"""Fray's :class:`~fray.client.Client` on an Iris cluster, wrapping Iris's own client (``iris.client.IrisClient``).

Jobs are Iris jobs (one task per replica, gang-submitted as Iris ``replicas``); an actor
group is one Iris job whose tasks serve its members with Iris's actor server
(``fray.iris.group``), and an actor of ``create_actor`` is a group of one; everything about a
job after submit -- status, retries, logs, cancel -- is Iris's. This module only translates:
``fray.iris.mapping`` holds the field-by-field table. It is marin's ``FrayIrisClient``
(``fray.iris_backend``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

from iris.cluster.types import Entrypoint as IrisEntrypoint

from fray.actor import ActorGroup
from fray.core._client_core import ActorStart, ClientCore
from fray.core._driver_exit import ExitNotice
from fray.core._owned import OwnedWork
from fray.errors import ConfigError
from fray.iris import _connect
from fray.iris._actor_host import host_actor
from fray.iris._submit import IN_TASK_SPEC, submit
from fray.iris.actor import IrisActorHandle
from fray.iris.entrypoints import iris_entrypoint, pickled
from fray.iris.group import GroupSpec, IrisActorGroup
from fray.iris.job import IrisJobHandle, JobMeta
from fray.iris.mapping import placement
from fray.job import CallableEntrypoint, JobHandle, JobRequest
from fray.joblevel._local_context import LocalJobContext
from fray.resources import TpuConfig

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib

    from fray.client import ClientSpec

__all__ = ["IN_TASK_SPEC", "IrisClient"]


class IrisClient(ClientCore["IrisJobHandle", "IrisActorHandle"]):
    """A Fray client of the Iris cluster whose controller is at ``controller_address`` (``HOST:PORT`` or a URL).

    ``controller_address=None`` means the cluster the calling Iris task runs in (what
    ``current_client()`` picks inside a task). ``workspace`` is a directory Iris bundles and
    ships to the workers with every job, ``bundle_id`` a bundle Iris has already (Iris's
    ``IrisClient.remote(workspace=, bundle_id=)``); :meth:`from_iris_client` wraps an Iris
    client instead. Inside a task, jobs and actors are children of the task's job, in its namespace.

    A job outlives the script unless submitted with ``detached=False``, which stops it
    when the script exits (the driver-exit rule, :mod:`fray.core._driver_exit`); inside an
    Iris task, jobs are children of the task's job and end with it. marin's job fields are
    honoured: ``timeout`` (Iris's per-task timeout), ``processes_per_task`` (Iris's multi-GPU
    supervisor on GPUs, Fray's rank supervisor elsewhere), ``target_cluster``,
    ``container_profile``, the image, and the environment's secrets and setup scripts (Iris's
    own); extras and dependency groups are refused by name (Iris installs them only from the
    client's workspace bundle, which Fray does not read). An actor group is one
    Iris job, and every :class:`~fray.actor_config.ActorConfig` field is honoured:
    ``max_concurrency`` by Iris's actor server threads, ``max_restarts`` by a supervisor inside
    the member's task that starts a new instance when the actor's process dies
    (``fray.iris._actor_host``), ``max_task_retries`` by the handles, and ``lifetime``.
    Queues are refused (no queue with leases of its own yet): keep one in an actor with
    ``fray.queue.actor_queue(client, name)``.
    """

    BACKEND = "Iris"
    ACTORS_END_AT_EXIT = True  # each group is an Iris job, which would outlive the script
    HONOURS = frozenset(
        {
            "JobRequest.processes_per_task",
            "JobRequest.priority",
            "JobRequest.timeout",
            "ResourceConfig.target_cluster",
            "ResourceConfig.container_profile",
            "ResourceConfig.image",  # for actors too: a group's task_image
            "EnvironmentConfig.secrets",
            "EnvironmentConfig.secret_behavior",
            "EnvironmentConfig.setup_scripts",
        }
    )

    def __init__(
        self,
        controller_address: str | None = None,
        workspace: str | Path | None = None,
        bundle_id: str | None = None,
    ) -> None:
        in_task = _connect.in_task()
        if controller_address is None and not in_task:
            raise ConfigError(
                "IrisClient() without an address works only inside an Iris task; "
                "elsewhere give the controller's HOST:PORT (FRAY_CLIENT_SPEC=iris://HOST:PORT)"
            )
        folder = str(Path(workspace).resolve()) if workspace else None
        if folder is None and bundle_id is None:
            iris = _connect.iris_client(controller_address)
        else:
            from iris.client import IrisClient as IrisLib

            url = _connect.controller_url(controller_address or _connect.task_controller() or "")
            iris = IrisLib.remote(url, workspace=Path(folder) if folder else None, bundle_id=bundle_id)
        self._setup(iris, controller_address or _connect.task_controller(), folder, in_task)

    @classmethod
    def from_iris_client(cls, iris_client: IrisLib) -> Self:
        """A client wrapping an existing Iris client (e.g. the one of the running task's Iris context).

        Nothing is asked of ``iris_client`` until the client is used.
        """
        client = cls.__new__(cls)
        client._setup(iris_client, _connect.task_controller(), None, _connect.in_task())
        return client

    def _setup(self, iris: IrisLib, address: str | None, workspace: str | None, in_task: bool) -> None:
        super().__init__()
        self.address: str | None = address
        self.workspace = workspace
        self._in_task = in_task
        self._iris = iris
        # (job, is an actor group)
        self._owned: OwnedWork[tuple[IrisJobHandle, bool]] = OwnedWork(lambda owned: self._known_finished(owned[0]))

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> IrisClient:
        """Build from ``iris://HOST:PORT[?workspace=PATH]``, or ``iris`` inside an Iris task."""
        workspace = spec.only("iris://", "workspace").get("workspace") or None
        if spec.address is None and not _connect.in_task():
            raise spec.invalid("'iris' names the Iris cluster of the task it runs in; outside one use iris://HOST:PORT")
        return cls(spec.address, workspace=workspace)

    def __repr__(self) -> str:
        return f"IrisClient({self.address!r})"

    @property
    def iris(self) -> IrisLib:
        """The wrapped ``iris.client.IrisClient``."""
        return self._iris

    # ----- jobs ---------------------------------------------------------------------------------------

    def _start_job(self, request: JobRequest, detached: bool) -> IrisJobHandle:
        entrypoint = iris_entrypoint(request.entrypoint, f"job {request.name!r}")
        job = self._launch(request, entrypoint, actors=False)
        binary = not isinstance(request.entrypoint, CallableEntrypoint)
        handle = IrisJobHandle(job, _meta(request, _label(request), binary), address=self.address)
        self._own(handle, actor=False)
        return handle

    def _known_finished(self, job: IrisJobHandle) -> bool:
        return job._known_finished()

    def _exit_notice(self) -> ExitNotice | None:
        # Inside a task Iris ends its children with it, and its log is no place for advice.
        if self._in_task:
            return None
        return ExitNotice(f"the Iris cluster at {self.address}" if self.address else "the Iris cluster")

    def _outlives_script(self, job: IrisJobHandle) -> bool:
        return True

    def _launch(self, request: JobRequest, entrypoint: IrisEntrypoint, *, actors: bool) -> Any:
        if self._closed:
            raise self._shut_down()
        return submit(self._iris, request, entrypoint, workspace=self.workspace, in_task=self._in_task, actors=actors)

    def _live_job(self, request: JobRequest) -> IrisJobHandle | None:
        """The live Iris job a submit of ``request`` from here would clash with, if any.

        Iris names are unique among live jobs: a top-level job named ``x`` is
        ``/{user}/x`` (Iris's own rule for the user), one submitted inside a task is a child
        of the task's job. What the handle must know of the job (its command, replicas,
        budgets) is taken from ``request``, which names the same job.
        """
        from iris.cluster.client.job_info import get_job_info, resolve_job_user
        from iris.cluster.types import JobName

        info = get_job_info() if self._in_task else None
        wanted = info.job_id.child(request.name) if info is not None else JobName.root(resolve_job_user(), request.name)
        wire = wanted.to_wire()
        if wire not in {name.to_wire() for name in self._iris.active_job_names_for_prefix(wire)}:
            return None
        binary = not isinstance(request.entrypoint, CallableEntrypoint)
        return IrisJobHandle(self._iris.job(wanted), _meta(request, _label(request), binary), address=self.address)

    # ----- actors -------------------------------------------------------------------------------------

    def _create_actor(self, start: ActorStart) -> tuple[IrisActorHandle, JobHandle]:
        """One actor: a group of one, named as the actor."""
        group = self._start_group(start.name, [start], single=True)
        return cast(IrisActorHandle, group.handles[0]), group.jobs[0]

    def _create_group(self, name: str, starts: list[ActorStart]) -> ActorGroup:
        return self._start_group(name, starts, single=False)

    def _start_group(self, name: str, starts: list[ActorStart], *, single: bool) -> IrisActorGroup:
        """Submit one Iris job whose tasks serve the members ``starts`` (all of one class, arguments and config)."""
        start = starts[0]
        config = start.config
        hosts = start.resources.device.slice.hosts if isinstance(start.resources.device, TpuConfig) else 1
        payload = pickled(f"actor {name!r}", start.actor_class, start.args, start.kwargs, "the class")
        options: dict[str, Any] = {
            "max_concurrency": config.max_concurrency,
            "max_restarts": config.max_restarts,
            "max_task_retries": config.max_task_retries,
            "address": self.address,
            "hosts": hosts,
            "single": single,
        }
        request = JobRequest(
            name,
            CallableEntrypoint(host_actor, (payload, name, options)),
            start.resources,
            replicas=len(starts),
            priority=config.priority,
        )
        entrypoint = IrisEntrypoint.from_callable(host_actor, payload, name, options)
        job = self._launch(request, entrypoint, actors=True)
        handle = IrisJobHandle(job, _meta(request, start.actor_class.__qualname__, False), address=self.address)
        if not config.detached:  # a detached actor outlives this client: nothing here stops it
            self._own(handle, actor=True)
        spec = GroupSpec(start.actor_class, config.max_concurrency, config.max_task_retries, hosts, single)
        return IrisActorGroup._of_job(name, len(starts), handle, job.job_id, spec, client=self._iris)

    # ----- the job level ------------------------------------------------------------------------------

    def _make_job_context(self) -> LocalJobContext:
        """The job context inside an Iris job: tasks on threads of the job's process."""
        return LocalJobContext(client=self)

    # ----- shutdown -----------------------------------------------------------------------------------

    def _own(self, job: IrisJobHandle, *, actor: bool) -> None:
        with self._lock:
            self._owned.add(job.job_id, (job, actor))

    def _owned_work(self) -> tuple[list[IrisJobHandle], list[IrisJobHandle]]:
        with self._lock:
            owned = self._owned.values()
        return [job for job, actor in owned if not actor], [job for job, actor in owned if actor]


def _label(request: JobRequest) -> str:
    """What the job runs, for its failure's wording: the command, or the callable's qualified name."""
    entry = request.entrypoint
    if isinstance(entry, CallableEntrypoint):
        return getattr(entry.callable, "__qualname__", None) or repr(entry.callable)
    return entry.command


def _meta(request: JobRequest, label: str, binary: bool) -> JobMeta:
    return JobMeta(
        name=request.name,
        label=label,
        binary=binary,
        replicas=request.replicas,
        hosts_per_replica=placement(request.resources, request.replicas).hosts_per_replica,
        max_retries_failure=request.max_retries_failure,
        max_retries_preemption=request.max_retries_preemption,
        timeout=request.timeout_seconds,
    )
