"""The cluster's records and the state machines of its tasks and workers.

Plain frozen values that the store returns and the controller, the workers and the
CLI pass around: none of them touches SQLite. A job's own state machine is the one
every backend shares (:data:`fray.core._lifecycle.TRANSITIONS`); tasks and workers, which
only the cluster has, are defined here::

    task:  PENDING  -> ASSIGNED | KILLED
           ASSIGNED -> RUNNING | SUCCEEDED | FAILED | LOST | KILLED
           RUNNING  -> SUCCEEDED | FAILED | LOST | KILLED

    worker: ALIVE -> LOST -> ALIVE (re-registration)
            ALIVE -> LOST -> STOPPED -> ALIVE (it left: drained, or its VM was scaled down)
            ALIVE -> LOST -> REVOKED -> ALIVE (a join with a token made since)

An illegal change raises :class:`~fray.errors.IllegalTransition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
from fray.errors import IllegalTransition
from fray.job import JobStatus
from fray.resources import ResourceConfig

if TYPE_CHECKING:  # the scheduler is the server's: a client reading records does not load it
    from fray.cluster.server.scheduler import PendingJob, RunningTask

__all__ = [
    "TASK_TRANSITIONS",
    "WORKER_TRANSITIONS",
    "Effects",
    "Endpoint",
    "JobRecord",
    "JobShape",
    "KillOrder",
    "LogLine",
    "SchedulerInput",
    "TaskKey",
    "TaskRecord",
    "TaskState",
    "WorkerRecord",
    "WorkerState",
    "check_task_transition",
    "check_worker_transition",
]


class TaskState(StrEnum):
    """Where one task attempt is in its life."""

    PENDING = "pending"
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    KILLED = "killed"

    @property
    def finished(self) -> bool:
        """True once the task can no longer change state."""
        return self in _TASK_FINAL

    @property
    def active(self) -> bool:
        """True while the task holds capacity on a worker (assigned or running)."""
        return self in (TaskState.ASSIGNED, TaskState.RUNNING)


_TASK_FINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.LOST, TaskState.KILLED})


class WorkerState(StrEnum):
    """Whether the controller currently counts a worker as part of the cluster."""

    ALIVE = "alive"
    LOST = "lost"
    #: Its credential was revoked (``fray worker revoke``): lost, and back only by joining with a new token.
    REVOKED = "revoked"
    #: It left on purpose: it drained (SIGTERM/SIGINT) and said so, or its VM was scaled down. Not a crash.
    STOPPED = "stopped"


TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.ASSIGNED, TaskState.KILLED}),
    # A worker may report a short task's exit before its start report is processed,
    # hence ASSIGNED -> SUCCEEDED / FAILED.
    TaskState.ASSIGNED: frozenset(
        {TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.LOST, TaskState.KILLED}
    ),
    TaskState.RUNNING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.LOST, TaskState.KILLED}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.LOST: frozenset(),
    TaskState.KILLED: frozenset(),
}
"""For each task state, the states it may move to."""

WORKER_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    WorkerState.ALIVE: frozenset({WorkerState.ALIVE, WorkerState.LOST}),
    WorkerState.LOST: frozenset({WorkerState.ALIVE, WorkerState.REVOKED, WorkerState.STOPPED}),
    WorkerState.REVOKED: frozenset({WorkerState.ALIVE, WorkerState.REVOKED}),
    WorkerState.STOPPED: frozenset({WorkerState.ALIVE, WorkerState.REVOKED}),
}
"""For each worker state, the states it may move to (ALIVE -> ALIVE is a re-registration)."""


def check_task_transition(old: TaskState, new: TaskState) -> None:
    """Raise :class:`IllegalTransition` unless a task may go from ``old`` to ``new``."""
    if new not in TASK_TRANSITIONS[old]:
        raise IllegalTransition(f"a task cannot go from {old.value} to {new.value}")


def check_worker_transition(old: WorkerState, new: WorkerState) -> None:
    """Raise :class:`IllegalTransition` unless a worker may go from ``old`` to ``new``."""
    if new not in WORKER_TRANSITIONS[old]:
        raise IllegalTransition(f"a worker cannot go from {old.value} to {new.value}")


@dataclass(frozen=True, order=True)
class TaskKey:
    """Names one attempt of one task: ``task_index`` of job ``job_id`` in attempt ``attempt``."""

    job_id: str
    task_index: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.job_id}[{self.task_index}]@{self.attempt}"


@dataclass(frozen=True)
class JobRecord:
    """A job as stored (without its request bytes: see :meth:`ClusterStore.job_request`)."""

    job_id: str
    parent_id: str | None
    name: str
    user: str
    namespace: str
    state: JobStatus
    resources: TaskResources
    replicas: int
    max_retries_failure: int
    max_retries_preemption: int
    failure_count: int
    preemption_count: int
    attempt: int
    pending_reason: str
    error: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    band: int = 2  #: the job's priority band (1 production, 2 interactive, 3 batch)

    @property
    def task_count(self) -> int:
        """Tasks per attempt: replicas, times hosts per slice for a TPU job."""
        return self.replicas * self.resources.hosts_per_replica


@dataclass(frozen=True)
class TaskRecord:
    """One attempt of one task as stored."""

    job_id: str
    task_index: int
    attempt: int
    replica_index: int
    host_index: int
    state: TaskState
    worker_id: str | None
    exit_code: int | None
    error: str
    created_at: float
    assigned_at: float | None
    started_at: float | None
    finished_at: float | None
    pending_reason: str = ""

    @property
    def key(self) -> TaskKey:
        """The task's :class:`TaskKey`."""
        return TaskKey(self.job_id, self.task_index, self.attempt)


@dataclass(frozen=True)
class WorkerRecord:
    """A registered worker: what it offers and what the controller last heard from it.

    ``epoch`` counts its registrations: reports and polls must name the current one.
    ``health`` is empty while the worker can run tasks; otherwise it says why it cannot,
    and the scheduler gives it nothing new until the worker reports it has recovered.
    """

    info: WorkerInfo
    address: str
    state: WorkerState
    registered_at: float
    last_heartbeat: float
    epoch: int = 0
    health: str = ""


@dataclass(frozen=True)
class Endpoint:
    """A named address registered by a running task, visible to jobs in ``namespace``."""

    namespace: str
    name: str
    address: str
    task: TaskKey
    registered_at: float


@dataclass(frozen=True)
class LogLine:
    """One stored output line; ``line_id`` grows with every line the store ever stored."""

    line_id: int
    task_index: int
    attempt: int
    line: str


@dataclass(frozen=True)
class KillOrder:
    """Tell worker ``worker_id`` to stop task ``task``."""

    task: TaskKey
    worker_id: str


@dataclass(frozen=True)
class Effects:
    """What a state change caused that the controller must act on.

    ``applied`` is False when the call was stale and changed nothing (for example a
    report about a task that had already been killed). ``kill`` are the tasks that
    workers must stop; ``finished`` the jobs that reached a final state, with it;
    ``retried`` the jobs sent back to PENDING for a gang retry; ``lost_workers`` the
    workers that were declared lost.
    """

    applied: bool = True
    kill: tuple[KillOrder, ...] = ()
    finished: Mapping[str, JobStatus] = field(default_factory=dict)
    retried: tuple[str, ...] = ()
    lost_workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SchedulerInput:
    """One consistent snapshot of what :func:`fray.cluster.server.scheduler.schedule` needs."""

    pending: tuple[PendingJob, ...]
    workers: tuple[WorkerInfo, ...]
    running: tuple[RunningTask, ...]
    credits: Mapping[str, float]


class JobShape(Protocol):
    """What the store takes from a submitted job: a :class:`~fray.job.JobRequest` has it, and so has a JobSpec."""

    @property
    def name(self) -> str: ...
    @property
    def resources(self) -> ResourceConfig | TaskResources: ...
    @property
    def replicas(self) -> int: ...
    @property
    def max_retries_failure(self) -> int: ...
    @property
    def timeout_seconds(self) -> float | None: ...
    @property
    def max_retries_preemption(self) -> int: ...
    @property
    def priority(self) -> int: ...
