"""Fray's :class:`~fray.client.Client` on an Iris cluster, wrapping Iris's own client (``iris.client.IrisClient``).

Jobs are Iris jobs (one task per replica, gang-submitted as Iris ``replicas``), actors
are Iris jobs serving with Iris's actor server (``fray.iris.actor``), and everything
about a job after submit -- status, retries, logs, cancel -- is Iris's. This module
only translates: ``fray.iris.mapping`` holds the field-by-field table.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from iris.cluster.types import Entrypoint as IrisEntrypoint

from fray.core._client_core import ActorStart, ClientCore
from fray.core._codepickle import dumps
from fray.core._driver_exit import ExitNotice
from fray.core._owned import OwnedWork
from fray.core._serialization import call_parts, check_picklable
from fray.errors import ConfigError, SerializationError
from fray.iris import _connect, _task
from fray.iris._actor_host import host_actor
from fray.iris._submit import IN_TASK_SPEC, submit
from fray.iris.actor import IrisActorHandle
from fray.iris.job import IrisJobHandle, JobMeta
from fray.iris.mapping import placement
from fray.job import (
    CallableEntrypoint,
    JobRequest,
)
from fray.joblevel._local_context import LocalJobContext

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib

    from fray.client import ClientSpec

__all__ = ["IN_TASK_SPEC", "IrisClient"]


class IrisClient(ClientCore["IrisJobHandle", "IrisActorHandle"]):
    """A Fray client of the Iris cluster whose controller is at ``address`` (``HOST:PORT``).

    ``address=None`` means the cluster the calling Iris task runs in (what
    ``current_client()`` picks inside a task). ``workspace`` is a directory Iris bundles
    and ships to the workers with every job (Iris's ``IrisClient.remote(workspace=...)``).
    Inside a task, jobs and actors are children of the task's job, in its namespace.

    A job outlives the script unless submitted with ``detached=False``, which stops it
    when the script exits (the driver-exit rule, :mod:`fray.core._driver_exit`); inside an
    Iris task, jobs are children of the task's job and end with it. Actors are Iris jobs, and
    every :class:`~fray.actor_config.ActorConfig` field is honoured: ``max_concurrency`` by
    Iris's actor server threads, ``max_restarts`` by a supervisor inside the actor's task that
    starts a new instance when the actor's process dies (``fray.iris._actor_host``),
    ``max_task_retries`` by the handles, and ``lifetime``.
    Queues are refused (no queue with leases of its own yet): keep one in an actor with
    ``fray.queue.actor_queue(client, name)``.
    """

    BACKEND = "Iris"
    ACTORS_END_AT_EXIT = True  # each is an Iris job, which would outlive the script

    def __init__(self, address: str | None = None, *, workspace: str | None = None) -> None:
        super().__init__()
        in_task = _connect.in_task()
        if address is None and not in_task:
            raise ConfigError(
                "IrisClient() without an address works only inside an Iris task; "
                "elsewhere give the controller's HOST:PORT (FRAY_CLIENT_SPEC=iris://HOST:PORT)"
            )
        self.address: str | None = address or _connect.task_controller()
        self.workspace = str(Path(workspace).resolve()) if workspace else None
        self._in_task = in_task
        if self.workspace is None:
            self._iris: IrisLib = _connect.iris_client(address)
        else:
            from iris.client import IrisClient as IrisLib

            self._iris = IrisLib.remote(_connect.controller_url(self.address or ""), workspace=Path(self.workspace))
        # (job, is an actor)
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
        entry = request.entrypoint
        if isinstance(entry, CallableEntrypoint):
            payload = _pickled(f"job {request.name!r}", entry.callable, entry.args, dict(entry.kwargs))
            entrypoint = IrisEntrypoint.from_callable(_task.run_callable, payload)
        else:
            entrypoint = IrisEntrypoint.from_command(*_task.binary_command(entry.argv))
        handle = self._launch(request, entrypoint, _label(request), binary=not isinstance(entry, CallableEntrypoint))
        self._own(handle, actor=False)
        return handle

    def _known_finished(self, job: IrisJobHandle) -> bool:
        return job._known_finished()

    def _exit_notice(self) -> ExitNotice | None:
        # Inside a task Iris ends its children with it, and its log is no place for advice.
        return None if self._in_task else ExitNotice(f"the Iris cluster at {self.address}")

    def _outlives_script(self, job: IrisJobHandle) -> bool:
        return True

    def _launch(
        self, request: JobRequest, entrypoint: IrisEntrypoint, label: str, *, binary: bool, actor: bool = False
    ) -> IrisJobHandle:
        if self._closed:
            raise self._shut_down()
        ports = ["actor"] if actor else None
        job_id = submit(self._iris, request, entrypoint, ports=ports, workspace=self.workspace, in_task=self._in_task)
        return IrisJobHandle(job_id, _meta(request, label, binary), self.address, self._iris)

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
        return IrisJobHandle(wire, _meta(request, _label(request), binary), self.address, self._iris)

    # ----- actors -------------------------------------------------------------------------------------

    def _create_actor(self, start: ActorStart) -> tuple[IrisActorHandle, IrisJobHandle]:
        name, config = start.name, start.config
        payload = _pickled(f"actor {name!r}", start.actor_class, start.args, start.kwargs, "the class")
        options: dict[str, Any] = {
            "max_concurrency": config.max_concurrency,
            "max_restarts": config.max_restarts,
            "max_task_retries": config.max_task_retries,
            "address": self.address,
        }
        if start.group is not None:
            options.update(group=start.group[0], index=start.group[1])
        request = JobRequest(name, CallableEntrypoint(host_actor, (payload, name, options)), start.resources)
        entrypoint = IrisEntrypoint.from_callable(host_actor, payload, name, options)
        job = self._launch(request, entrypoint, start.actor_class.__qualname__, binary=False, actor=True)
        if not config.detached:  # a detached actor outlives this client: nothing here stops it
            self._own(job, actor=True)
        handle = IrisActorHandle(
            name, job, start.actor_class, self.address, self._iris, config.max_concurrency, config.max_task_retries
        )
        return handle, job

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
    )


def _pickled(what: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str = "the callable") -> bytes:
    """``(fn, args, kwargs)`` cloudpickled; a piece that cannot be is named in a SerializationError."""
    try:
        return dumps((fn, args, kwargs))
    except Exception as exc:
        check_picklable(what, call_parts(fn, args, kwargs, label))
        raise SerializationError(f"{what}: cannot be pickled ({type(exc).__name__}: {exc})") from exc
