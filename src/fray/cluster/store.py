"""The controller's durable state: jobs, tasks, workers, endpoints, credit and logs in one SQLite file.

:class:`ClusterStore` keeps everything the controller knows in a SQLite database in
WAL mode. Every public method that changes state runs in exactly one transaction,
so a controller killed at any moment reopens the file to exactly the state of its
last completed call: running tasks are still recorded as running on their workers,
pending jobs are still pending, and job ids handed to clients still resolve.

State machines (checked on every change; an illegal change raises
:class:`IllegalTransition`)::

    job:   PENDING -> RUNNING            (all tasks assigned at once)
           RUNNING -> PENDING            (gang retry after a failure or a loss)
           RUNNING -> SUCCEEDED          (every task exited 0)
           RUNNING -> FAILED             (a retry budget is exhausted)
           PENDING | RUNNING -> STOPPED  (terminated, or its parent ended)

    task:  PENDING  -> ASSIGNED | KILLED
           ASSIGNED -> RUNNING | SUCCEEDED | FAILED | LOST | KILLED
           RUNNING  -> SUCCEEDED | FAILED | LOST | KILLED

    worker: ALIVE -> LOST -> ALIVE (re-registration)

A job's tasks belong to *attempts*: a gang retry ends every task of the current
attempt and creates fresh PENDING tasks under ``attempt + 1``. Reports about tasks
of an older attempt, or about tasks that already ended, are stale and ignored
(the methods say so in their return value) rather than raising, because they are
normal races between workers and the controller.

Times are floats supplied by the caller (``now``), on the controller's wall clock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fray.cluster.credit import CreditPolicy, settle, task_rate
from fray.cluster.scheduler import (
    Device,
    PendingJob,
    RunningTask,
    SchedulingDecision,
    TaskResources,
    WorkerInfo,
)
from fray.errors import FrayError
from fray.job import JobRequest, JobStatus, validate_name

__all__ = [
    "JOB_TRANSITIONS",
    "SCHEMA_VERSION",
    "TASK_TRANSITIONS",
    "WORKER_TRANSITIONS",
    "ClusterStore",
    "Effects",
    "Endpoint",
    "IllegalTransition",
    "JobRecord",
    "KillOrder",
    "LogLine",
    "NotFound",
    "SchedulerInput",
    "StoreError",
    "TaskKey",
    "TaskRecord",
    "TaskState",
    "WorkerRecord",
    "WorkerState",
    "check_job_transition",
    "check_task_transition",
    "check_worker_transition",
]

SCHEMA_VERSION = 1


class StoreError(FrayError):
    """The store refused an operation (see the message for why)."""


class IllegalTransition(StoreError):
    """A state change that the job, task or worker state machine does not allow."""


class NotFound(StoreError, KeyError):
    """No job, task or worker with that id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


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


JOB_TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.RUNNING, JobStatus.STOPPED}),
    JobStatus.RUNNING: frozenset({JobStatus.PENDING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.STOPPED: frozenset(),
}
"""For each job state, the states it may move to."""

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
    WorkerState.LOST: frozenset({WorkerState.ALIVE}),
}
"""For each worker state, the states it may move to (ALIVE -> ALIVE is a re-registration)."""


def check_job_transition(old: JobStatus, new: JobStatus) -> None:
    """Raise :class:`IllegalTransition` unless a job may go from ``old`` to ``new``."""
    if new not in JOB_TRANSITIONS[old]:
        raise IllegalTransition(f"a job cannot go from {old.value} to {new.value}")


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
    """A registered worker: what it offers and what the controller last heard from it."""

    info: WorkerInfo
    address: str
    state: WorkerState
    registered_at: float
    last_heartbeat: float


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
    """One consistent snapshot of what :func:`fray.cluster.scheduler.schedule` needs."""

    pending: tuple[PendingJob, ...]
    workers: tuple[WorkerInfo, ...]
    running: tuple[RunningTask, ...]
    credits: Mapping[str, float]


class _Fx:
    """Collects effects during one transaction."""

    def __init__(self) -> None:
        self.kill: list[KillOrder] = []
        self.finished: dict[str, JobStatus] = {}
        self.retried: list[str] = []
        self.lost_workers: list[str] = []
        # Tasks on these workers are recorded as LOST instead of KILLED and need no kill order.
        self.dead_workers: set[str] = set()

    def freeze(self) -> Effects:
        return Effects(True, tuple(self.kill), dict(self.finished), tuple(self.retried), tuple(self.lost_workers))


_STALE = Effects(applied=False)

_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE users (
    name TEXT PRIMARY KEY,
    balance REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    parent_id TEXT,
    name TEXT NOT NULL,
    user_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    request BLOB NOT NULL,
    state TEXT NOT NULL,
    replicas INTEGER NOT NULL,
    cpu_millis INTEGER NOT NULL,
    ram_bytes INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    device_kind TEXT NOT NULL,
    device_type TEXT NOT NULL,
    device_count INTEGER NOT NULL,
    preemptible INTEGER NOT NULL,
    regions TEXT,
    max_retries_failure INTEGER NOT NULL,
    max_retries_preemption INTEGER NOT NULL,
    failure_count INTEGER NOT NULL DEFAULT 0,
    preemption_count INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    pending_reason TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    label TEXT NOT NULL DEFAULT '',
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_parent ON jobs (parent_id);
CREATE INDEX jobs_by_label ON jobs (namespace, label, state);
CREATE TABLE tasks (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    task_index INTEGER NOT NULL,
    replica_index INTEGER NOT NULL,
    host_index INTEGER NOT NULL,
    state TEXT NOT NULL,
    worker_id TEXT,
    exit_code INTEGER,
    error TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    assigned_at REAL,
    started_at REAL,
    finished_at REAL,
    charged_until REAL,
    log_lines INTEGER NOT NULL DEFAULT 0,
    failure BLOB,
    PRIMARY KEY (job_id, attempt, task_index)
) WITHOUT ROWID;
CREATE INDEX tasks_by_state ON tasks (state);
CREATE INDEX tasks_by_worker ON tasks (worker_id, state);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    cpu_millis INTEGER NOT NULL,
    ram_bytes INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    devices TEXT NOT NULL,
    attributes TEXT NOT NULL,
    state TEXT NOT NULL,
    registered_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL
);
CREATE TABLE endpoints (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    job_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    address TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (namespace, name, job_id, task_index)
);
CREATE INDEX endpoints_by_task ON endpoints (job_id, attempt, task_index);
CREATE TABLE logs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    task_index INTEGER NOT NULL,
    line TEXT NOT NULL
);
CREATE INDEX logs_by_job ON logs (job_id, id);
CREATE INDEX logs_by_task ON logs (job_id, attempt, task_index, id);
"""

_RES_COLS = "cpu_millis, ram_bytes, disk_bytes, device_kind, device_type, device_count, preemptible, regions"
_JOB_COLS = (
    "id, parent_id, name, user_name, namespace, state, replicas, " + _RES_COLS + ", max_retries_failure, "
    "max_retries_preemption, failure_count, preemption_count, attempt, pending_reason, error, submitted_at, "
    "started_at, finished_at"
)
_TASK_COLS = (
    "job_id, task_index, attempt, replica_index, host_index, state, worker_id, exit_code, error, created_at, "
    "assigned_at, started_at, finished_at"
)
_ACTIVE = ("assigned", "running")


def _resources_from(row: Sequence[Any]) -> TaskResources:
    """Build TaskResources from the 8 columns of ``_RES_COLS``."""
    cpu, ram, disk, kind, dtype, count, preemptible, regions = row
    return TaskResources(
        cpu_millis=int(cpu),
        ram_bytes=int(ram),
        disk_bytes=int(disk),
        device_kind=str(kind),
        device_type=str(dtype),
        device_count=int(count),
        preemptible=bool(preemptible),
        regions=tuple(json.loads(regions)) if regions is not None else None,
    )


def _resources_params(r: TaskResources) -> tuple[object, ...]:
    regions = json.dumps(list(r.regions)) if r.regions is not None else None
    return (
        r.cpu_millis,
        r.ram_bytes,
        r.disk_bytes,
        r.device_kind,
        r.device_type,
        r.device_count,
        int(r.preemptible),
        regions,
    )


def _job_from(row: Sequence[Any]) -> JobRecord:
    (job_id, parent_id, name, user, namespace, state, replicas) = row[:7]
    resources = _resources_from(row[7:15])
    (mrf, mrp, fc, pc, attempt, reason, error, submitted, started, finished) = row[15:]
    return JobRecord(
        job_id=str(job_id),
        parent_id=parent_id,
        name=str(name),
        user=str(user),
        namespace=str(namespace),
        state=JobStatus(str(state)),
        resources=resources,
        replicas=int(replicas),
        max_retries_failure=int(mrf),
        max_retries_preemption=int(mrp),
        failure_count=int(fc),
        preemption_count=int(pc),
        attempt=int(attempt),
        pending_reason=str(reason),
        error=str(error),
        submitted_at=float(submitted),
        started_at=started,
        finished_at=finished,
    )


def _task_from(row: Sequence[Any]) -> TaskRecord:
    (job_id, index, attempt, replica, host, state, worker, exit_code, error, created, assigned, started, finished) = row
    return TaskRecord(
        job_id=str(job_id),
        task_index=int(index),
        attempt=int(attempt),
        replica_index=int(replica),
        host_index=int(host),
        state=TaskState(str(state)),
        worker_id=worker,
        exit_code=exit_code,
        error=str(error),
        created_at=float(created),
        assigned_at=assigned,
        started_at=started,
        finished_at=finished,
    )


def _with_reason(task: TaskRecord, job: JobRecord) -> TaskRecord:
    if task.state == TaskState.PENDING and task.attempt == job.attempt and job.pending_reason:
        return dataclasses.replace(task, pending_reason=job.pending_reason)
    return task


def _worker_from(row: Sequence[Any]) -> WorkerRecord:
    wid, address, cpu, ram, disk, devices, attributes, state, registered, heartbeat = row
    info = WorkerInfo(
        worker_id=str(wid),
        cpu_millis=int(cpu),
        ram_bytes=int(ram),
        disk_bytes=int(disk),
        devices=tuple(Device(d[0], d[1], int(d[2])) for d in json.loads(str(devices))),
        attributes=json.loads(str(attributes)),
        alive=state == WorkerState.ALIVE.value,
    )
    return WorkerRecord(info, str(address), WorkerState(state), float(registered), float(heartbeat))


class ClusterStore:
    """All controller state in one SQLite file (WAL mode); safe to share between threads.

    ``credit_policy`` sets each new user's initial credit and the cost of running
    work; ``max_log_lines_per_task`` bounds the stored output of each task attempt
    (the oldest lines go first). ``synchronous="NORMAL"`` (the default) survives a
    crash of the controller process; ``"FULL"`` also survives a power loss, at the
    price of an fsync per transaction.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        credit_policy: CreditPolicy | None = None,
        max_log_lines_per_task: int = 10_000,
        synchronous: str = "NORMAL",
    ) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"synchronous={synchronous!r}: use 'NORMAL', 'FULL' or 'EXTRA'")
        if max_log_lines_per_task < 1:
            raise StoreError(f"max_log_lines_per_task={max_log_lines_per_task!r} must be >= 1")
        self.path = os.fspath(path)
        self.credit_policy = credit_policy or CreditPolicy()
        self.max_log_lines_per_task = max_log_lines_per_task
        # One connection, serialized by a lock: SQLite allows one writer anyway, and this
        # keeps every method's transaction from interleaving with another thread's.
        self._lock = threading.RLock()
        self._in_batch = False
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: could not switch the database to WAL mode (got {mode!r})")
        self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._init_schema()

    # -- plumbing -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ClusterStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction: everything inside commits together or not at all.

        Inside :meth:`batch` it is a savepoint instead, so that each call stays atomic
        (a call that raises leaves no trace) while the batch commits once.
        """
        with self._lock:
            cur = self._conn.cursor()
            if self._in_batch:
                cur.execute("SAVEPOINT call")
                try:
                    yield cur
                except BaseException:
                    cur.execute("ROLLBACK TO call")
                    cur.execute("RELEASE call")
                    raise
                cur.execute("RELEASE call")
                return
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        """A read transaction: several SELECTs see one snapshot."""
        with self._lock:
            cur = self._conn.cursor()
            if self._in_batch:
                yield cur
                return
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                cur.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run several calls as one transaction: one commit for, say, all reports of one worker heartbeat.

        Each call inside stays atomic on its own (a call that raises is undone, and the
        batch goes on if the caller catches the error); the batch commits when the
        block ends normally and is rolled back entirely if an exception leaves it.
        Other threads wait until the batch ends. Batches do not nest.
        """
        with self._lock:
            if self._in_batch:
                raise StoreError("ClusterStore.batch() does not nest")
            self._conn.execute("BEGIN IMMEDIATE")
            self._in_batch = True
            try:
                yield
            except BaseException:
                self._in_batch = False
                self._conn.execute("ROLLBACK")
                raise
            self._in_batch = False
            self._conn.execute("COMMIT")

    def _init_schema(self) -> None:
        with self._txn() as cur:
            exists = cur.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
            ).fetchone()
            if exists is None:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        cur.execute(statement)
                cur.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                return
            row = cur.execute("SELECT version FROM schema_version").fetchone()
            version = row[0] if row else None
            if version != SCHEMA_VERSION:
                # Future schema changes migrate here, one version at a time.
                raise StoreError(f"{self.path} has schema version {version}; this Fray reads version {SCHEMA_VERSION}")

    @property
    def schema_version(self) -> int:
        """The schema version stored in the file."""
        with self._lock:
            return int(self._conn.execute("SELECT version FROM schema_version").fetchone()[0])

    # -- helpers inside a transaction -----------------------------------------------------

    @staticmethod
    def _job(cur: sqlite3.Cursor, job_id: str) -> JobRecord:
        row = cur.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return _job_from(row)

    @staticmethod
    def _task(cur: sqlite3.Cursor, key: TaskKey) -> TaskRecord:
        row = cur.execute(
            f"SELECT {_TASK_COLS} FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (key.job_id, key.attempt, key.task_index),
        ).fetchone()
        if row is None:
            raise NotFound(f"no task {key}")
        return _task_from(row)

    @staticmethod
    def _tasks(cur: sqlite3.Cursor, job_id: str, attempt: int) -> list[TaskRecord]:
        rows = cur.execute(
            f"SELECT {_TASK_COLS} FROM tasks WHERE job_id = ? AND attempt = ? ORDER BY task_index",
            (job_id, attempt),
        ).fetchall()
        return [_task_from(r) for r in rows]

    @staticmethod
    def _create_tasks(cur: sqlite3.Cursor, job: JobRecord, attempt: int, now: float) -> None:
        hosts = job.resources.hosts_per_replica
        cur.executemany(
            "INSERT INTO tasks (job_id, attempt, task_index, replica_index, host_index, state, created_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?)",
            [(job.job_id, attempt, i, i // hosts, i % hosts, now) for i in range(job.task_count)],
        )

    def _ensure_user(self, cur: sqlite3.Cursor, user: str, now: float) -> None:
        cur.execute(
            "INSERT OR IGNORE INTO users (name, balance, updated_at) VALUES (?, ?, ?)",
            (user, self.credit_policy.initial_credit, now),
        )

    def _charge(self, cur: sqlite3.Cursor, job: JobRecord, key: TaskKey, now: float) -> None:
        """Bill a running task's usage since it was last billed, up to ``now``."""
        row = cur.execute(
            "SELECT charged_until FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (key.job_id, key.attempt, key.task_index),
        ).fetchone()
        if row is None or row[0] is None:
            return
        r = job.resources
        used = task_rate(r.cpu_millis, r.ram_bytes, r.device_kind, r.device_count, self.credit_policy) * max(
            0.0, now - row[0]
        )
        cur.execute("UPDATE users SET balance = balance - ? WHERE name = ?", (used, job.user))
        cur.execute(
            "UPDATE tasks SET charged_until = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (now, key.job_id, key.attempt, key.task_index),
        )

    def _end_task(
        self,
        cur: sqlite3.Cursor,
        job: JobRecord,
        task: TaskRecord,
        state: TaskState,
        now: float,
        fx: _Fx,
        *,
        exit_code: int | None = None,
        error: str = "",
    ) -> None:
        """Move ``task`` to the final ``state``, bill it, drop its endpoints, order a kill if needed."""
        if state == TaskState.KILLED and task.worker_id in fx.dead_workers:
            state = TaskState.LOST  # its worker is gone: nothing to kill, the task is simply lost
        check_task_transition(task.state, state)
        if task.state == TaskState.RUNNING:
            self._charge(cur, job, task.key, now)
        cur.execute(
            "UPDATE tasks SET state = ?, exit_code = ?, error = ?, finished_at = ? "
            "WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (state.value, exit_code, error, now, task.job_id, task.attempt, task.task_index),
        )
        cur.execute(
            "DELETE FROM endpoints WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (task.job_id, task.attempt, task.task_index),
        )
        if state == TaskState.KILLED and task.state.active and task.worker_id is not None:
            fx.kill.append(KillOrder(task.key, task.worker_id))

    def _set_job_state(self, cur: sqlite3.Cursor, job: JobRecord, state: JobStatus, **columns: object) -> None:
        check_job_transition(job.state, state)
        names = ["state = ?", *(f"{name} = ?" for name in columns)]
        cur.execute(f"UPDATE jobs SET {', '.join(names)} WHERE id = ?", (state.value, *columns.values(), job.job_id))

    def _finish_job(
        self, cur: sqlite3.Cursor, job: JobRecord, state: JobStatus, now: float, fx: _Fx, error: str = ""
    ) -> None:
        """End ``job`` in ``state``: kill its unfinished tasks, then stop its unfinished children."""
        for task in self._tasks(cur, job.job_id, job.attempt):
            if not task.state.finished:
                self._end_task(cur, job, task, TaskState.KILLED, now, fx, error=error or f"job {state.value}")
        self._set_job_state(cur, job, state, finished_at=now, pending_reason="", error=error or job.error)
        fx.finished[job.job_id] = state
        children = cur.execute(
            "SELECT id FROM jobs WHERE parent_id = ? AND state IN ('pending', 'running') ORDER BY seq",
            (job.job_id,),
        ).fetchall()
        for (child_id,) in children:
            child = self._job(cur, child_id)
            self._finish_job(cur, child, JobStatus.STOPPED, now, fx, error=f"parent job {job.job_id} {state.value}")

    def _gang_fail(
        self,
        cur: sqlite3.Cursor,
        job: JobRecord,
        task: TaskRecord,
        state: TaskState,
        now: float,
        fx: _Fx,
        *,
        error: str,
        exit_code: int | None = None,
    ) -> None:
        """One task of a running gang failed or was lost: retry the whole gang, or fail the job."""
        self._end_task(cur, job, task, state, now, fx, exit_code=exit_code, error=error)
        preemption = state == TaskState.LOST
        kind = "preemption" if preemption else "failure"
        count = (job.preemption_count if preemption else job.failure_count) + 1
        budget = job.max_retries_preemption if preemption else job.max_retries_failure
        column = "preemption_count" if preemption else "failure_count"
        cur.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (count, job.job_id))
        if count > budget:
            message = f"{error} (no {kind} retries left: {budget} allowed)"
            self._finish_job(cur, job, JobStatus.FAILED, now, fx, error=message)
            return
        for other in self._tasks(cur, job.job_id, job.attempt):
            if other.state.active:
                self._end_task(cur, job, other, TaskState.KILLED, now, fx, error=f"gang retry after: {error}")
        attempt = job.attempt + 1
        self._set_job_state(
            cur,
            job,
            JobStatus.PENDING,
            attempt=attempt,
            error=error,
            started_at=None,
            pending_reason=f"retrying after {kind} {count} of {budget} allowed: {error}",
        )
        self._create_tasks(cur, job, attempt, now)
        fx.retried.append(job.job_id)

    def _lose_worker(self, cur: sqlite3.Cursor, worker_id: str, now: float, reason: str, fx: _Fx) -> None:
        row = cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
        check_worker_transition(WorkerState(row[0]), WorkerState.LOST)
        cur.execute("UPDATE workers SET state = 'lost' WHERE id = ?", (worker_id,))
        fx.dead_workers.add(worker_id)
        fx.lost_workers.append(worker_id)
        for key in self._active_keys_on(cur, worker_id):
            task = self._task(cur, key)
            if task.state.active:  # an earlier gang retry in this loop may have ended it
                job = self._job(cur, key.job_id)
                self._gang_fail(cur, job, task, TaskState.LOST, now, fx, error=f"worker {worker_id} lost: {reason}")

    @staticmethod
    def _active_keys_on(cur: sqlite3.Cursor, worker_id: str) -> list[TaskKey]:
        rows = cur.execute(
            "SELECT job_id, task_index, attempt FROM tasks WHERE worker_id = ? AND state IN (?, ?) "
            "ORDER BY job_id, attempt, task_index",
            (worker_id, *_ACTIVE),
        ).fetchall()
        return [TaskKey(r[0], r[1], r[2]) for r in rows]

    # -- jobs ------------------------------------------------------------------------------

    def submit_job(
        self,
        *,
        name: str,
        user: str,
        request: bytes,
        resources: TaskResources,
        now: float,
        replicas: int = 1,
        max_retries_failure: int = 0,
        max_retries_preemption: int = 100,
        parent_id: str | None = None,
        namespace: str | None = None,
        label: str = "",
    ) -> JobRecord:
        """Record a new PENDING job with its first attempt's PENDING tasks; return it.

        The id is ``name-xxxx`` (``xxxx`` random hex), or ``<parent_id>/name-xxxx`` for
        a job submitted from inside job ``parent_id``. The namespace defaults to the
        parent's, and for a top-level job to its own id. ``request`` is stored as opaque
        bytes (the pickled :class:`~fray.job.JobRequest`). ``label`` is a free tag (the
        controller puts an actor's name there, see :meth:`live_job_with_label`).
        """
        validate_name(name)
        if not user:
            raise StoreError("a job needs a non-empty user")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise StoreError(f"replicas={replicas!r} must be a whole number >= 1")
        with self._txn() as cur:
            if parent_id is not None:
                parent = self._job(cur, parent_id)
                if parent.state.finished:
                    raise StoreError(
                        f"cannot submit {name!r} as a child of job {parent_id!r}: it has already {parent.state.value}"
                    )
                base = f"{parent_id}/{name}"
                namespace = namespace if namespace is not None else parent.namespace
            else:
                base = name
            job_id = ""
            for size in (2, 2, 2, 4, 4, 8):
                candidate = f"{base}-{secrets.token_hex(size)}"
                if cur.execute("SELECT 1 FROM jobs WHERE id = ?", (candidate,)).fetchone() is None:
                    job_id = candidate
                    break
            if not job_id:  # pragma: no cover - needs six random collisions in a row
                raise StoreError(f"could not find a free id for job {name!r}")
            namespace = namespace if namespace is not None else job_id
            self._ensure_user(cur, user, now)
            cur.execute(
                f"INSERT INTO jobs (id, parent_id, name, user_name, namespace, request, state, replicas, {_RES_COLS}, "
                "max_retries_failure, max_retries_preemption, submitted_at, label) "
                "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    parent_id,
                    name,
                    user,
                    namespace,
                    sqlite3.Binary(request),
                    replicas,
                    *_resources_params(resources),
                    max_retries_failure,
                    max_retries_preemption,
                    now,
                    label,
                ),
            )
            job = self._job(cur, job_id)
            self._create_tasks(cur, job, 0, now)
            return job

    def submit_request(
        self,
        request: JobRequest,
        request_bytes: bytes,
        *,
        user: str,
        now: float,
        parent_id: str | None = None,
        namespace: str | None = None,
    ) -> JobRecord:
        """:meth:`submit_job` with the name, resources, replicas and retry budgets taken from ``request``."""
        return self.submit_job(
            name=request.name,
            user=user,
            request=request_bytes,
            resources=TaskResources.from_config(request.resources),
            now=now,
            replicas=request.replicas,
            max_retries_failure=request.max_retries_failure,
            max_retries_preemption=request.max_retries_preemption,
            parent_id=parent_id,
            namespace=namespace,
        )

    def get_job(self, job_id: str) -> JobRecord:
        """The job ``job_id``; raises :class:`NotFound`."""
        with self._lock:
            return self._job(self._conn.cursor(), job_id)

    def job_request(self, job_id: str) -> bytes:
        """The opaque request bytes given at submission."""
        with self._lock:
            row = self._conn.execute("SELECT request FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return bytes(row[0])

    def list_jobs(
        self,
        *,
        states: Iterable[JobStatus] | None = None,
        parent_id: str | None = None,
        user: str | None = None,
    ) -> list[JobRecord]:
        """Jobs in submission order, optionally only those in ``states``, children of ``parent_id``, of ``user``."""
        clauses: list[str] = []
        params: list[object] = []
        if states is not None:
            values = [JobStatus(s).value for s in states]
            clauses.append(f"state IN ({', '.join('?' * len(values))})" if values else "0")
            params.extend(values)
        if parent_id is not None:
            clauses.append("parent_id = ?")
            params.append(parent_id)
        if user is not None:
            clauses.append("user_name = ?")
            params.append(user)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            rows = self._conn.execute(f"SELECT {_JOB_COLS} FROM jobs {where} ORDER BY seq", params).fetchall()
        return [_job_from(r) for r in rows]

    def get_tasks(self, job_id: str, attempt: int | None = None) -> list[TaskRecord]:
        """The tasks of ``job_id`` in ``attempt`` (default: the current attempt), by task index.

        A PENDING task carries its job's pending reason: a gang is placed as a unit, so
        all its tasks wait for the same reason.
        """
        with self._read() as cur:
            job = self._job(cur, job_id)
            return [_with_reason(t, job) for t in self._tasks(cur, job_id, job.attempt if attempt is None else attempt)]

    def get_task(self, key: TaskKey) -> TaskRecord:
        """One task attempt (with its pending reason, see :meth:`get_tasks`); raises :class:`NotFound`."""
        with self._read() as cur:
            return _with_reason(self._task(cur, key), self._job(cur, key.job_id))

    def terminate_job(self, job_id: str, now: float, reason: str = "terminated") -> Effects:
        """Stop ``job_id`` and all its unfinished descendants; a no-op (not applied) on a finished job."""
        with self._txn() as cur:
            job = self._job(cur, job_id)
            if job.state.finished:
                return _STALE
            fx = _Fx()
            self._finish_job(cur, job, JobStatus.STOPPED, now, fx, error=reason)
            return fx.freeze()

    # -- scheduling ------------------------------------------------------------------------

    def scheduler_input(self) -> SchedulerInput:
        """Pending jobs, alive workers, capacity-holding tasks and balances, from one snapshot."""
        with self._read() as cur:
            pending = tuple(
                PendingJob(row[0], row[1], row[2], _resources_from(row[3:11]), row[11])
                for row in cur.execute(
                    f"SELECT id, user_name, replicas, {_RES_COLS}, submitted_at FROM jobs "
                    "WHERE state = 'pending' ORDER BY seq"
                )
            )
            workers = tuple(
                _worker_from(row).info
                for row in cur.execute(
                    "SELECT id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, "
                    "registered_at, last_heartbeat FROM workers WHERE state = 'alive' ORDER BY id"
                )
            )
            cols = ", ".join(f"j.{c.strip()}" for c in _RES_COLS.split(","))
            running = tuple(
                RunningTask(row[0], row[1], _resources_from(row[2:10]))
                for row in cur.execute(
                    f"SELECT t.worker_id, j.user_name, {cols} FROM tasks t JOIN jobs j ON j.id = t.job_id "
                    "WHERE t.state IN (?, ?)",
                    _ACTIVE,
                )
            )
            credits = {name: balance for name, balance in cur.execute("SELECT name, balance FROM users")}
            return SchedulerInput(pending, workers, running, credits)

    def apply_decision(self, decision: SchedulingDecision, now: float) -> list[TaskRecord]:
        """Record a scheduling pass in one transaction; return the newly ASSIGNED tasks.

        An assignment is skipped (left for the next pass) if its job is no longer
        pending or one of its workers is no longer alive, since either may have
        changed after the snapshot the decision was computed from. Pending reasons
        are written only where they changed.
        """
        assigned: list[TaskRecord] = []
        with self._txn() as cur:
            alive = {r[0] for r in cur.execute("SELECT id FROM workers WHERE state = 'alive'")}
            for assignment in decision.assignments:
                job = self._job(cur, assignment.job_id)
                if job.state != JobStatus.PENDING or not set(assignment.worker_ids) <= alive:
                    continue
                if len(assignment.worker_ids) != job.task_count:
                    raise StoreError(
                        f"assignment for {job.job_id} names {len(assignment.worker_ids)} workers; "
                        f"the job has {job.task_count} tasks"
                    )
                tasks = self._tasks(cur, job.job_id, job.attempt)
                for task in tasks:
                    check_task_transition(task.state, TaskState.ASSIGNED)
                cur.executemany(
                    "UPDATE tasks SET state = 'assigned', worker_id = ?, assigned_at = ? "
                    "WHERE job_id = ? AND attempt = ? AND task_index = ?",
                    [(w, now, job.job_id, job.attempt, i) for i, w in enumerate(assignment.worker_ids)],
                )
                self._set_job_state(cur, job, JobStatus.RUNNING, started_at=now, pending_reason="")
                assigned.extend(self._tasks(cur, job.job_id, job.attempt))
            cur.executemany(
                "UPDATE jobs SET pending_reason = ? WHERE id = ? AND state = 'pending' AND pending_reason != ?",
                [(r.message, job_id, r.message) for job_id, r in decision.pending.items()],
            )
        return assigned

    # -- task reports ----------------------------------------------------------------------

    def _current(self, cur: sqlite3.Cursor, key: TaskKey) -> tuple[JobRecord, TaskRecord] | None:
        """The job and task for a report, or None if the report is stale."""
        task = self._task(cur, key)
        job = self._job(cur, key.job_id)
        if task.state.finished or task.attempt != job.attempt or job.state != JobStatus.RUNNING:
            return None
        return job, task

    def mark_task_running(self, key: TaskKey, now: float) -> bool:
        """The worker started ``key``. False if the report is stale (the task already ended or was retried).

        Repeating the report is harmless. Billing of the task's usage starts now.
        """
        with self._txn() as cur:
            current = self._current(cur, key)
            if current is None:
                return False
            _, task = current
            if task.state == TaskState.RUNNING:
                return True
            check_task_transition(task.state, TaskState.RUNNING)
            cur.execute(
                "UPDATE tasks SET state = 'running', started_at = ?, charged_until = ? "
                "WHERE job_id = ? AND attempt = ? AND task_index = ?",
                (now, now, key.job_id, key.attempt, key.task_index),
            )
            return True

    def mark_task_exited(
        self, key: TaskKey, exit_code: int, now: float, error: str = "", failure: bytes | None = None
    ) -> Effects:
        """The task's process exited with ``exit_code``; ``failure`` is an opaque report of why (kept for clients).

        0: the task SUCCEEDED, and the job too once all its tasks have. Anything else:
        the task FAILED and the gang is retried under the failure budget (or the job
        FAILS when that is used up). Stale reports return ``Effects(applied=False)``.
        """
        with self._txn() as cur:
            current = self._current(cur, key)
            if current is None:
                return _STALE
            job, task = current
            fx = _Fx()
            if exit_code == 0:
                self._end_task(cur, job, task, TaskState.SUCCEEDED, now, fx, exit_code=0)
                left = cur.execute(
                    "SELECT COUNT(*) FROM tasks WHERE job_id = ? AND attempt = ? AND state != 'succeeded'",
                    (job.job_id, job.attempt),
                ).fetchone()[0]
                if left == 0:
                    self._finish_job(cur, job, JobStatus.SUCCEEDED, now, fx)
            else:
                message = error or f"task {key.task_index} exited with code {exit_code}"
                self._gang_fail(cur, job, task, TaskState.FAILED, now, fx, error=message, exit_code=exit_code)
                if failure is not None:
                    cur.execute(
                        "UPDATE tasks SET failure = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
                        (sqlite3.Binary(failure), key.job_id, key.attempt, key.task_index),
                    )
            return fx.freeze()

    def job_failure(self, job_id: str) -> tuple[int | None, bytes | None]:
        """The exit code and failure report of the job's most recently failed task ``(None, None)`` if none."""
        with self._lock:
            row = self._conn.execute(
                "SELECT exit_code, failure FROM tasks WHERE job_id = ? AND state = 'failed' "
                "ORDER BY finished_at DESC, attempt DESC LIMIT 1",
                (job_id,),
            ).fetchone()
        if row is None:
            return None, None
        return row[0], None if row[1] is None else bytes(row[1])

    def live_job_with_label(self, namespace: str, label: str) -> str | None:
        """The id of an unfinished job in ``namespace`` whose label is ``label``, if there is one."""
        with self._lock:
            row = self._conn.execute(
                "SELECT id FROM jobs WHERE namespace = ? AND label = ? AND state IN ('pending', 'running') LIMIT 1",
                (namespace, label),
            ).fetchone()
        return None if row is None else str(row[0])

    def mark_task_lost(self, key: TaskKey, now: float, reason: str = "preempted") -> Effects:
        """The task was preempted or vanished: retry the gang under the preemption budget."""
        with self._txn() as cur:
            current = self._current(cur, key)
            if current is None:
                return _STALE
            job, task = current
            fx = _Fx()
            self._gang_fail(cur, job, task, TaskState.LOST, now, fx, error=f"task {key.task_index} lost: {reason}")
            return fx.freeze()

    # -- workers ---------------------------------------------------------------------------

    def register_worker(self, info: WorkerInfo, address: str, now: float, running: Iterable[TaskKey] = ()) -> Effects:
        """A worker (re)joined, reporting the tasks it is running; reconcile with what the store expects.

        Tasks the worker runs but the store does not expect there (they were lost,
        retried or killed while it was away) get kill orders. Tasks the store has as
        RUNNING there but the worker does not report are lost (gang retry). ASSIGNED
        tasks it does not report are left alone: the controller should resend them.
        """
        with self._txn() as cur:
            row = cur.execute("SELECT state, registered_at FROM workers WHERE id = ?", (info.worker_id,)).fetchone()
            if row is not None:
                check_worker_transition(WorkerState(row[0]), WorkerState.ALIVE)
            devices = json.dumps([[d.kind, d.type, d.count] for d in info.devices])
            cur.execute(
                "INSERT INTO workers (id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, "
                "registered_at, last_heartbeat) VALUES (?, ?, ?, ?, ?, ?, ?, 'alive', ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET address = excluded.address, cpu_millis = excluded.cpu_millis, "
                "ram_bytes = excluded.ram_bytes, disk_bytes = excluded.disk_bytes, devices = excluded.devices, "
                "attributes = excluded.attributes, state = 'alive', last_heartbeat = excluded.last_heartbeat",
                (
                    info.worker_id,
                    address,
                    info.cpu_millis,
                    info.ram_bytes,
                    info.disk_bytes,
                    devices,
                    json.dumps(dict(info.attributes), sort_keys=True),
                    now,
                    now,
                ),
            )
            fx = _Fx()
            self._reconcile(cur, info.worker_id, set(running), now, fx)
            return fx.freeze()

    def reconcile_worker(self, worker_id: str, running: Iterable[TaskKey], now: float) -> Effects:
        """Compare an alive worker's list of running tasks with the store (see :meth:`register_worker`)."""
        with self._txn() as cur:
            row = cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
            if row is None:
                raise NotFound(f"no worker {worker_id!r}")
            if row[0] != WorkerState.ALIVE.value:
                return _STALE
            fx = _Fx()
            self._reconcile(cur, worker_id, set(running), now, fx)
            return fx.freeze()

    def _reconcile(self, cur: sqlite3.Cursor, worker_id: str, running: set[TaskKey], now: float, fx: _Fx) -> None:
        for key in self._active_keys_on(cur, worker_id):
            if key in running:
                continue
            task = self._task(cur, key)
            if task.state == TaskState.RUNNING:
                job = self._job(cur, key.job_id)
                self._gang_fail(
                    cur, job, task, TaskState.LOST, now, fx, error=f"worker {worker_id} no longer runs the task"
                )
        for key in sorted(running):
            row = cur.execute(
                "SELECT state, worker_id FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
                (key.job_id, key.attempt, key.task_index),
            ).fetchone()
            if row is None or row[1] != worker_id or row[0] not in _ACTIVE:
                fx.kill.append(KillOrder(key, worker_id))

    def heartbeat(self, worker_id: str, now: float) -> bool:
        """Record that ``worker_id`` is alive. False if it is unknown or was declared lost (it must re-register)."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE workers SET last_heartbeat = ? WHERE id = ? AND state = 'alive'", (now, worker_id)
            )
            return cur.rowcount == 1

    def expire_workers(self, now: float, timeout: float) -> Effects:
        """Declare lost every alive worker not heard from for more than ``timeout`` seconds; retry their gangs."""
        with self._txn() as cur:
            stale = [
                r[0]
                for r in cur.execute(
                    "SELECT id FROM workers WHERE state = 'alive' AND last_heartbeat < ? ORDER BY id", (now - timeout,)
                ).fetchall()
            ]
            if not stale:
                return Effects()
            fx = _Fx()
            for worker_id in stale:
                self._lose_worker(cur, worker_id, now, f"no heartbeat for more than {timeout:g}s", fx)
            return fx.freeze()

    def lose_worker(self, worker_id: str, now: float, reason: str = "preempted") -> Effects:
        """Declare ``worker_id`` lost now (e.g. on a preemption notice); not applied if it is not alive."""
        with self._txn() as cur:
            row = cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
            if row is None:
                raise NotFound(f"no worker {worker_id!r}")
            if row[0] != WorkerState.ALIVE.value:
                return _STALE
            fx = _Fx()
            self._lose_worker(cur, worker_id, now, reason, fx)
            return fx.freeze()

    def refresh_heartbeats(self, now: float) -> int:
        """Set every alive worker's last heartbeat to ``now``; return how many.

        Call once when the controller starts on an existing file, so that workers get a
        full timeout to reconnect instead of being expired for the controller's downtime.
        """
        with self._txn() as cur:
            return cur.execute("UPDATE workers SET last_heartbeat = ? WHERE state = 'alive'", (now,)).rowcount

    def list_workers(self, *, alive_only: bool = False) -> list[WorkerRecord]:
        """Registered workers by id."""
        where = "WHERE state = 'alive'" if alive_only else ""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, registered_at, "
                f"last_heartbeat FROM workers {where} ORDER BY id"
            ).fetchall()
        return [_worker_from(r) for r in rows]

    def get_worker(self, worker_id: str) -> WorkerRecord:
        """The worker ``worker_id`` (alive or lost); raises :class:`NotFound`."""
        with self._lock:
            row = self._conn.execute(
                "SELECT id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, registered_at, "
                "last_heartbeat FROM workers WHERE id = ?",
                (worker_id,),
            ).fetchone()
        if row is None:
            raise NotFound(f"no worker {worker_id!r}")
        return _worker_from(row)

    def tasks_on_worker(self, worker_id: str) -> list[TaskRecord]:
        """The tasks currently assigned to or running on ``worker_id``."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_TASK_COLS} FROM tasks WHERE worker_id = ? AND state IN (?, ?) "
                "ORDER BY job_id, attempt, task_index",
                (worker_id, *_ACTIVE),
            ).fetchall()
        return [_task_from(r) for r in rows]

    # -- endpoints -------------------------------------------------------------------------

    def register_endpoint(self, namespace: str, name: str, address: str, task: TaskKey, now: float) -> bool:
        """Publish ``name`` -> ``address`` in ``namespace`` for as long as ``task`` runs.

        Re-registering the same name from the same task replaces the address. Several
        tasks may register the same name. False (nothing stored) if the task has
        already ended, so an endpoint never outlives its task.
        """
        with self._txn() as cur:
            current = self._current(cur, task)
            if current is None:
                return False
            cur.execute(
                "INSERT INTO endpoints (namespace, name, job_id, task_index, attempt, address, registered_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, name, job_id, task_index) DO UPDATE SET "
                "attempt = excluded.attempt, address = excluded.address, registered_at = excluded.registered_at",
                (namespace, name, task.job_id, task.task_index, task.attempt, address, now),
            )
            return True

    def list_endpoints(self, namespace: str, prefix: str = "") -> list[Endpoint]:
        """Endpoints in ``namespace`` whose name starts with ``prefix``, by name then registration."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT namespace, name, address, job_id, task_index, attempt, registered_at FROM endpoints "
                "WHERE namespace = ? AND substr(name, 1, ?) = ? ORDER BY name, registered_at, job_id, task_index",
                (namespace, len(prefix), prefix),
            ).fetchall()
        return [Endpoint(r[0], r[1], r[2], TaskKey(r[3], r[4], r[5]), r[6]) for r in rows]

    def remove_endpoint(self, namespace: str, name: str, task: TaskKey | None = None) -> int:
        """Remove ``name`` from ``namespace`` (only ``task``'s registration if given); return how many."""
        with self._txn() as cur:
            if task is None:
                cur.execute("DELETE FROM endpoints WHERE namespace = ? AND name = ?", (namespace, name))
            else:
                cur.execute(
                    "DELETE FROM endpoints WHERE namespace = ? AND name = ? AND job_id = ? AND task_index = ? "
                    "AND attempt = ?",
                    (namespace, name, task.job_id, task.task_index, task.attempt),
                )
            return cur.rowcount

    # -- logs ------------------------------------------------------------------------------

    def append_logs(self, task: TaskKey, lines: Sequence[str]) -> None:
        """Append output lines of ``task``; beyond ``max_log_lines_per_task`` the oldest are dropped."""
        if not lines:
            return
        with self._txn() as cur:
            cur.execute(
                "UPDATE tasks SET log_lines = log_lines + ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
                (len(lines), task.job_id, task.attempt, task.task_index),
            )
            if cur.rowcount != 1:
                raise NotFound(f"no task {task}")
            cur.executemany(
                "INSERT INTO logs (job_id, attempt, task_index, line) VALUES (?, ?, ?, ?)",
                [(task.job_id, task.attempt, task.task_index, line) for line in lines],
            )
            count = cur.execute(
                "SELECT log_lines FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
                (task.job_id, task.attempt, task.task_index),
            ).fetchone()[0]
            excess = count - self.max_log_lines_per_task
            if excess > 0:
                cur.execute(
                    "DELETE FROM logs WHERE id IN (SELECT id FROM logs WHERE job_id = ? AND attempt = ? "
                    "AND task_index = ? ORDER BY id LIMIT ?)",
                    (task.job_id, task.attempt, task.task_index, excess),
                )
                cur.execute(
                    "UPDATE tasks SET log_lines = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
                    (self.max_log_lines_per_task, task.job_id, task.attempt, task.task_index),
                )

    def read_logs(self, job_id: str, *, after_id: int = 0, last: int | None = None) -> list[LogLine]:
        """Stored lines of every task of ``job_id`` with id > ``after_id``, oldest first (only the ``last`` n if given).

        Pass the last ``line_id`` seen as ``after_id`` to follow the output.
        """
        with self._lock:
            if last is None:
                rows = self._conn.execute(
                    "SELECT id, task_index, attempt, line FROM logs WHERE job_id = ? AND id > ? ORDER BY id",
                    (job_id, after_id),
                ).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT id, task_index, attempt, line FROM logs WHERE job_id = ? AND id > ? "
                    "ORDER BY id DESC LIMIT ?",
                    (job_id, after_id, max(0, last)),
                ).fetchall()
                rows.reverse()
        return [LogLine(r[0], r[1], r[2], r[3]) for r in rows]

    # -- credit ----------------------------------------------------------------------------

    def credits(self) -> dict[str, float]:
        """Every known user's current balance (as of the last :meth:`accrue_credits`)."""
        with self._lock:
            return {name: balance for name, balance in self._conn.execute("SELECT name, balance FROM users")}

    def set_credit(self, user: str, balance: float, now: float) -> None:
        """Set ``user``'s balance (an operator's grant or correction)."""
        with self._txn() as cur:
            self._ensure_user(cur, user, now)
            cur.execute("UPDATE users SET balance = ?, updated_at = ? WHERE name = ?", (balance, now, user))

    def accrue_credits(self, now: float) -> dict[str, float]:
        """Bill running tasks up to ``now``, regenerate balances, and return the new balances.

        Call it periodically (e.g. once per scheduling pass); a task that ends is
        billed to its end at once.
        """
        policy = self.credit_policy
        with self._txn() as cur:
            rows = cur.execute(
                "SELECT t.job_id, t.attempt, t.task_index, t.charged_until, j.user_name, j.cpu_millis, "
                "j.ram_bytes, j.device_kind, j.device_count FROM tasks t JOIN jobs j ON j.id = t.job_id "
                "WHERE t.state = 'running'"
            ).fetchall()
            used: dict[str, float] = {}
            for _, _, _, since, user, cpu, ram, kind, count in rows:
                if since is not None:
                    used[user] = used.get(user, 0.0) + task_rate(cpu, ram, kind, count, policy) * max(0.0, now - since)
            cur.executemany(
                "UPDATE tasks SET charged_until = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
                [(now, r[0], r[1], r[2]) for r in rows],
            )
            balances: dict[str, float] = {}
            for name, balance, updated in cur.execute("SELECT name, balance, updated_at FROM users").fetchall():
                balances[name] = settle(balance, now - updated, used.get(name, 0.0), policy)
            cur.executemany(
                "UPDATE users SET balance = ?, updated_at = ? WHERE name = ?",
                [(b, now, name) for name, b in balances.items()],
            )
            return balances

    # -- checking ----------------------------------------------------------------------------

    def check_invariants(self) -> list[str]:
        """Cross-check the stored state; return a description of every inconsistency (empty if none).

        Cheap enough to run once at controller start-up; the tests run it after every step.
        """
        problems: list[str] = []
        with self._read() as cur:
            integrity = cur.execute("PRAGMA integrity_check").fetchone()[0]
            if integrity != "ok":
                problems.append(f"sqlite integrity_check: {integrity}")
            alive = {r[0] for r in cur.execute("SELECT id FROM workers WHERE state = 'alive'")}
            jobs = [_job_from(r) for r in cur.execute(f"SELECT {_JOB_COLS} FROM jobs ORDER BY seq").fetchall()]
            by_id = {j.job_id: j for j in jobs}
            for job in jobs:
                tasks = self._tasks(cur, job.job_id, job.attempt)
                states = {t.state for t in tasks}
                if len(tasks) != job.task_count:
                    problems.append(
                        f"{job.job_id}: {len(tasks)} tasks in attempt {job.attempt}, expected {job.task_count}"
                    )
                if job.state == JobStatus.PENDING and states - {TaskState.PENDING}:
                    problems.append(f"{job.job_id}: pending job has tasks in {sorted(states)}")
                if job.state == JobStatus.RUNNING:
                    if states - {TaskState.ASSIGNED, TaskState.RUNNING, TaskState.SUCCEEDED}:
                        problems.append(f"{job.job_id}: running job has tasks in {sorted(states)}")
                    if not states & {TaskState.ASSIGNED, TaskState.RUNNING}:
                        problems.append(f"{job.job_id}: running job has no active task")
                    for t in tasks:
                        if t.state.active and t.worker_id not in alive:
                            problems.append(f"{t.key}: active on worker {t.worker_id!r}, which is not alive")
                if job.state.finished and states & {TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING}:
                    problems.append(f"{job.job_id}: {job.state.value} job has unfinished tasks")
                if job.state == JobStatus.SUCCEEDED and states != {TaskState.SUCCEEDED}:
                    problems.append(f"{job.job_id}: succeeded job has tasks in {sorted(states)}")
                parent = by_id.get(job.parent_id) if job.parent_id else None
                if job.parent_id and parent is None:
                    problems.append(f"{job.job_id}: parent {job.parent_id} does not exist")
                if parent is not None and parent.state.finished and not job.state.finished:
                    problems.append(f"{job.job_id}: still {job.state.value} after its parent ended")
                if job.parent_id and not job.job_id.startswith(job.parent_id + "/"):
                    problems.append(f"{job.job_id}: id does not extend its parent's id {job.parent_id}")
            old_active = cur.execute(
                "SELECT t.job_id, t.attempt, t.task_index FROM tasks t JOIN jobs j ON j.id = t.job_id "
                "WHERE t.attempt != j.attempt AND t.state IN ('pending', 'assigned', 'running')"
            ).fetchall()
            problems.extend(f"{TaskKey(r[0], r[2], r[1])}: unfinished task of an old attempt" for r in old_active)
            orphans = cur.execute(
                "SELECT e.namespace, e.name FROM endpoints e LEFT JOIN tasks t ON t.job_id = e.job_id "
                "AND t.attempt = e.attempt AND t.task_index = e.task_index "
                "WHERE t.state IS NULL OR t.state NOT IN ('assigned', 'running')"
            ).fetchall()
            problems.extend(f"endpoint {ns}/{name}: its task is not active" for ns, name in orphans)
        return problems
