"""Actor groups on Iris: :class:`IrisActorGroup`, one Iris job whose tasks are the members.

``create_actor_group(cls, name=N, count=C)`` submits one Iris job named ``N`` with ``C`` tasks
(``replicas=C``); task ``i`` serves member ``i`` and registers it as ``{job id}/{N}-{i}``. The
group finds its members serving with one ``list_endpoints`` query for the prefix
``{job id}/{N}-`` (a whole group at a time, not one lookup per member) and resolves them with
one resolver for its job; members whose task ended before they served die with their task's
failure. ``create_actor`` is a group of one whose member is named as the actor.

It is a :class:`fray.actor.ActorGroup`: ``wait_ready``, ``discover_new``, ``handles``,
``jobs`` (a job per member: its task, :class:`~fray.iris.members.IrisMemberJob`), ``statuses``
work as on every backend. ``shutdown()`` cancels the one job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iris.cluster.types import JobName

from fray.actor import ActorGroup, ActorHandle
from fray.errors import ActorUnavailableError
from fray.iris._seams import seam
from fray.iris.actor import READY_POLL, ActorInfo, IrisActorHandle
from fray.iris.job import IrisJobHandle, mark_terminated
from fray.iris.mapping import member_status
from fray.iris.members import IrisMemberJob
from fray.job import JobStatus

if TYPE_CHECKING:
    from iris.actor.resolver import Resolver
    from iris.client import IrisClient as IrisLib

__all__ = ["GroupSpec", "IrisActorGroup", "member_endpoint"]


def member_endpoint(job_id: str, prefix: str, index: int) -> str:
    """The registry name of member ``index`` of the group ``prefix`` served by job ``job_id``."""
    return f"{job_id}/{prefix}-{index}"


@dataclass(frozen=True)
class GroupSpec:
    """What Fray knows of a group's members beyond their job: how to build and call their handles."""

    actor_class: type | None = None
    max_concurrency: int = 1
    max_task_retries: int = 0
    hosts: int = 1  #: Iris tasks per member (the hosts of a multi-host TPU slice)
    single: bool = False  #: one actor of ``create_actor``, named as the group


def _rebuild(name: str, count: int, job: IrisJobHandle, spec: GroupSpec) -> IrisActorGroup:
    return IrisActorGroup._of_job(name, count, job, None, spec)


class IrisActorGroup(ActorGroup):
    """``count`` actors ``{name}-0`` ... served by the tasks of Iris job ``job_id`` (marin's constructor).

    ``client`` is the ``iris.client.IrisClient`` that finds them; without one (a group
    unpickled inside an Iris task) the task's Iris context is used. Members become ready
    independently; see the module docstring.
    """

    def __init__(self, name: str, count: int, job_id: Any, client: IrisLib | None = None) -> None:
        iris = client if client is not None else _task_client()
        job = IrisJobHandle(iris.job(JobName.from_wire(str(job_id))))
        self._setup(name, count, job, job_id, client, GroupSpec())

    @classmethod
    def _of_job(
        cls, name: str, count: int, job: IrisJobHandle, iris_job_id: Any, spec: GroupSpec, client: Any = None
    ) -> IrisActorGroup:
        """The group Fray started as ``job`` (``iris_job_id``: the id as Iris's ``Job`` gave it, None: the handle's)."""
        group = cls.__new__(cls)
        job_id = iris_job_id if iris_job_id is not None else JobName.from_wire(job.job_id)
        group._setup(name, count, job, job_id, client, spec)
        return group

    def _setup(self, name: str, count: int, job: IrisJobHandle, job_id: Any, client: Any, spec: GroupSpec) -> None:
        self._count = count
        self._job = job
        self._job_id = job_id  # as Iris gave it (a JobName), for resolver_for_job
        self._client = client
        self._spec = spec
        self._probe_lock = threading.Lock()
        self._watch_lock = threading.Lock()
        self._watching = False
        self._resolver_lock = threading.Lock()
        self._found_resolver: Resolver | None = None
        wire = str(job_id)
        self._prefix = f"{wire}/{name}-"
        self._endpoints = [member_endpoint(wire, name, i) for i in range(count)]
        handles = []
        jobs: list[IrisJobHandle | IrisMemberJob] = []
        for index, endpoint in enumerate(self._endpoints):
            member: IrisJobHandle | IrisMemberJob = (
                job if spec.single else IrisMemberJob(job, index, endpoint, count, spec.hosts)
            )
            info = ActorInfo(
                name if spec.single else f"{name}-{index}",
                spec.actor_class,
                member,
                spec.max_concurrency,
                spec.max_task_retries,
            )
            handles.append(IrisActorHandle._of_actor(endpoint, info, group=self))
            jobs.append(member)
        self._members: list[IrisActorHandle] = handles
        super().__init__(handles, jobs, name)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self._name, self._count, self._job, self._spec))

    def __repr__(self) -> str:
        return f"IrisActorGroup({self._name!r}, job={self._job.job_id!r}, {self.ready_count} of {self._count} ready)"

    @property
    def job(self) -> IrisJobHandle:
        """The group's one Iris job."""
        return self._job

    # ----- Iris ---------------------------------------------------------------------------------------

    def _get_client(self) -> IrisLib:
        """The Iris client that created the group, else the job's (reconnected), else the Iris task's."""
        if self._client is not None:
            client: IrisLib = self._client
            return client
        return self._job._iris()

    def _resolver(self) -> Resolver:
        """The one resolver of the group's members (``resolver_for_job`` of its job), made once."""
        with self._resolver_lock:
            if self._found_resolver is None:
                self._found_resolver = self._get_client().resolver_for_job(self._job_id)
            return self._found_resolver

    # ----- finding members serving --------------------------------------------------------------------

    def _pending(self) -> list[int]:
        return [i for i, handle in enumerate(self._members) if not handle._calls.ready.done()]

    def _probe(self) -> None:
        """One look at the registry: members listed and answering serve; members whose task ended die."""
        with self._probe_lock:
            pending = self._pending()
            if not pending:
                return
            listed = {endpoint.name for endpoint in self._get_client().list_endpoints(self._prefix)}
            for index in pending:
                if self._endpoints[index] in listed:
                    handle = self._members[index]
                    instance = handle._ask_instance()
                    if instance is not None:
                        handle._serving(instance)
            still = [index for index in pending if not self._members[index]._calls.ready.done()]
            if still:
                self._bury(still)

    def _bury(self, pending: Sequence[int]) -> None:
        """Fail the waiting calls of pending members whose task already ended (one task listing)."""
        if self._job._terminated_here():
            for index in pending:
                handle = self._members[index]
                handle._calls.die(handle._death(JobStatus.STOPPED))
            return
        states = {task.task_id.task_index: task.state for task in self._get_client().list_tasks(self._job._name())}
        for index in pending:
            state = states.get(index * self._spec.hosts)
            if state is None:
                continue
            status = member_status(state)
            if status.finished:
                handle = self._members[index]
                if handle._terminated():
                    status = JobStatus.STOPPED
                handle._calls.die(handle._death(status))

    def _watch(self) -> None:
        """Look for the members that do not serve yet, on one thread, until each serves or died."""
        with self._watch_lock:
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._watch_members, name=f"fray-iris-group-{self._name}", daemon=True).start()

    def _watch_members(self) -> None:
        delay = 0.02
        try:
            while self._pending():
                try:
                    self._probe()
                except Exception as exc:  # the controller is unreachable: say so rather than wait forever
                    error = ActorUnavailableError(f"actor group {self._name!r}: cannot reach Iris: {exc}")
                    for index in self._pending():
                        self._members[index]._calls.die(error)
                    return
                time.sleep(delay)
                delay = min(delay * 1.5, READY_POLL)
        finally:
            with self._watch_lock:
                self._watching = False

    # ----- marin's ActorGroup -------------------------------------------------------------------------

    def wait_ready(
        self, count: int | None = None, timeout: float | None = 900.0, *, progress: bool = False
    ) -> list[ActorHandle]:
        """Block until ``count`` members (default: all) serve; exactly ``count`` handles (see ActorGroup).

        Looks at the registry at once first, so a member already serving counts even with
        ``timeout=0``; with ``count=1`` it returns as soon as the first member serves, and
        :meth:`discover_new` picks up the others later.
        """
        self._probe()
        return super().wait_ready(count, timeout, progress=progress)

    def discover_new(self, target: int | None = None) -> list[ActorHandle]:
        """The members serving now that no earlier ``wait_ready``/``discover_new`` handed out; never blocks.

        ``target``: hand out members only until this many were handed out in all.
        """
        self._probe()
        with self._lock:
            fresh = sorted(set(self._order) - self._handed_out)
            if target is not None:
                fresh = fresh[: max(0, target - len(self._handed_out))]
            self._handed_out.update(fresh)
        return [self._handles[i] for i in fresh]

    def is_done(self) -> bool:
        """True once the group's Iris job has finished (every member ended)."""
        return bool(self._job.status().finished)

    def shutdown(self) -> None:
        """Terminate the actor job: every member, at once."""
        mark_terminated(*self._endpoints)
        self._job.terminate()


def _task_client() -> IrisLib:
    client: IrisLib = seam("iris_ctx")().client
    return client
