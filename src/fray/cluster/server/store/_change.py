"""One state-changing transaction of the cluster store: the moves of jobs, tasks and workers.

A :class:`Change` wraps the cursor of one transaction of
:class:`~fray.cluster.server.store.ClusterStore`. Its methods move tasks, jobs and workers
through their state machines (checking every move) and collect what the controller
must act on afterwards (kill orders, finished and retried jobs, lost workers), which
:meth:`Change.effects` hands back as :class:`~fray.cluster.protocol.records.Effects`.

A failed attempt is charged and worded by :meth:`fray.core._lifecycle.RetryBudget.decide`,
the same as on every backend; only the counts live here, in the job's row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from fray.cluster.protocol.records import (
    Effects,
    JobRecord,
    KillOrder,
    TaskKey,
    TaskRecord,
    TaskState,
    WorkerState,
    check_task_transition,
    check_worker_transition,
)
from fray.cluster.server.credit import CreditPolicy, task_rate
from fray.cluster.server.scheduler import SchedulingDecision
from fray.cluster.server.store._schema import active_keys_on, read_job, read_task, read_tasks
from fray.core._lifecycle import Failure, RetryBudget, check_transition
from fray.errors import FrayError, StoreError
from fray.job import JobStatus, replicas_to_preempt

__all__ = ["STALE", "Change", "reported_failure"]

#: What a stale report (about a task that already ended, or an older attempt) causes: nothing.
STALE = Effects(applied=False)


class Change:
    """The cursor of one transaction, the time ``now``, and the effects collected so far."""

    def __init__(self, cur: sqlite3.Cursor, now: float, policy: CreditPolicy) -> None:
        self.cur = cur
        self.now = now
        self._policy = policy
        self._kill: list[KillOrder] = []
        self._finished: dict[str, JobStatus] = {}
        self._retried: list[str] = []
        self._lost_workers: list[str] = []
        # Tasks on these workers are recorded as LOST instead of KILLED and need no kill order.
        self._dead_workers: set[str] = set()

    def effects(self) -> Effects:
        """What this transaction caused, for the controller to act on once it committed."""
        return Effects(True, tuple(self._kill), dict(self._finished), tuple(self._retried), tuple(self._lost_workers))

    # -- tasks -------------------------------------------------------------------------------------

    def create_tasks(self, job: JobRecord, attempt: int) -> None:
        """The PENDING tasks of ``job``'s ``attempt``: one per replica and host."""
        hosts = job.resources.hosts_per_replica
        self.cur.executemany(
            "INSERT INTO tasks (job_id, attempt, task_index, replica_index, host_index, state, created_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?)",
            [(job.job_id, attempt, i, i // hosts, i % hosts, self.now) for i in range(job.task_count)],
        )

    def start_task(self, task: TaskRecord) -> None:
        """Move the ASSIGNED ``task`` to RUNNING: its worker started it, and billing starts now."""
        check_task_transition(task.state, TaskState.RUNNING)
        self.cur.execute(
            "UPDATE tasks SET state = 'running', started_at = ?, charged_until = ? "
            "WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (self.now, self.now, task.job_id, task.attempt, task.task_index),
        )

    def _charge(self, job: JobRecord, key: TaskKey) -> None:
        """Bill a running task's usage since it was last billed, up to now."""
        row = self.cur.execute(
            "SELECT charged_until FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (key.job_id, key.attempt, key.task_index),
        ).fetchone()
        if row is None or row[0] is None:
            return
        r = job.resources
        rate = task_rate(r.cpu_millis, r.ram_bytes, r.device_kind, r.device_count, self._policy)
        self.cur.execute(
            "UPDATE users SET balance = balance - ? WHERE name = ?", (rate * max(0.0, self.now - row[0]), job.user)
        )
        self.cur.execute(
            "UPDATE tasks SET charged_until = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (self.now, key.job_id, key.attempt, key.task_index),
        )

    def end_task(
        self,
        job: JobRecord,
        task: TaskRecord,
        state: TaskState,
        *,
        exit_code: int | None = None,
        error: str = "",
        failure: Failure | None = None,
    ) -> None:
        """Move ``task`` to the final ``state``, bill it, drop its endpoints, order a kill if needed."""
        if state == TaskState.KILLED and task.worker_id in self._dead_workers:
            state = TaskState.LOST  # its worker is gone: nothing to kill, the task is simply lost
        check_task_transition(task.state, state)
        if task.state == TaskState.RUNNING:
            self._charge(job, task.key)
        self.cur.execute(
            "UPDATE tasks SET state = ?, exit_code = ?, error = ?, failure = ?, finished_at = ? "
            "WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (
                state.value,
                exit_code,
                error,
                None if failure is None else sqlite3.Binary(failure.encode()),
                self.now,
                task.job_id,
                task.attempt,
                task.task_index,
            ),
        )
        self.cur.execute(
            "DELETE FROM endpoints WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (task.job_id, task.attempt, task.task_index),
        )
        if state == TaskState.KILLED and task.state.active and task.worker_id is not None:
            self._kill.append(KillOrder(task.key, task.worker_id))

    # -- jobs --------------------------------------------------------------------------------------

    def set_job_state(self, job: JobRecord, state: JobStatus, **columns: object) -> None:
        """Move ``job`` to ``state`` (checked against the shared job state machine) and set ``columns``."""
        check_transition(job.state, state, f"job {job.job_id!r}")
        names = ["state = ?", *(f"{name} = ?" for name in columns)]
        self.cur.execute(
            f"UPDATE jobs SET {', '.join(names)} WHERE id = ?", (state.value, *columns.values(), job.job_id)
        )

    def finish_job(self, job: JobRecord, state: JobStatus, error: str = "", failure: Failure | None = None) -> None:
        """End ``job`` in ``state``: kill its unfinished tasks, then stop its unfinished children.

        A FAILED job keeps its final ``failure`` (encoded) for clients to raise.
        """
        for task in read_tasks(self.cur, job.job_id, job.attempt):
            if not task.state.finished:
                self.end_task(job, task, TaskState.KILLED, error=error or f"job {state.value}")
        encoded = None if failure is None else sqlite3.Binary(failure.encode())
        # A job that succeeded on a retry has no error: the failed attempt's stays in its task's record
        # (the job's history), not on the job, where listings would show a succeeded job with an error.
        kept = "" if state == JobStatus.SUCCEEDED else job.error
        self.set_job_state(job, state, finished_at=self.now, pending_reason="", error=error or kept, failure=encoded)
        self._finished[job.job_id] = state
        children = self.cur.execute(
            "SELECT id FROM jobs WHERE parent_id = ? AND state IN ('pending', 'running') ORDER BY seq",
            (job.job_id,),
        ).fetchall()
        for (child_id,) in children:
            child = read_job(self.cur, child_id)
            self.finish_job(child, JobStatus.STOPPED, error=f"parent job {job.job_id} {state.value}")

    def gang_fail(
        self, job: JobRecord, task: TaskRecord, state: TaskState, failure: Failure, *, exit_code: int | None = None
    ) -> None:
        """One task of a running gang failed (FAILED) or was lost (LOST): retry the whole gang, or fail the job."""
        failure = failure.in_replica(task.replica_index, job.replicas)
        self.end_task(job, task, state, exit_code=exit_code, error=failure.message, failure=failure)
        budget = RetryBudget(
            job.max_retries_failure, job.max_retries_preemption, job.failure_count, job.preemption_count
        )
        budget, final, reason = budget.decide(failure)
        self.cur.execute(
            "UPDATE jobs SET failure_count = ?, preemption_count = ? WHERE id = ?",
            (budget.failures, budget.preemptions, job.job_id),
        )
        if final is not None:
            self.finish_job(job, JobStatus.FAILED, error=final.message, failure=final)
            return
        for other in read_tasks(self.cur, job.job_id, job.attempt):
            if other.state.active:
                self.end_task(job, other, TaskState.KILLED, error=f"gang retry after: {failure.message}")
        attempt = job.attempt + 1
        self.set_job_state(
            job,
            JobStatus.PENDING,
            attempt=attempt,
            error=failure.message,
            started_at=None,
            pending_reason=reason,
        )
        self.create_tasks(job, attempt)
        self._retried.append(job.job_id)

    def lose_task(self, job: JobRecord, task: TaskRecord, reason: str) -> None:
        """The task was preempted or vanished (``reason``): retry the gang under the preemption budget."""
        self.gang_fail(job, task, TaskState.LOST, Failure.lost(f"task {task.task_index} lost: {reason}"))

    def preempt(self, job_id: str, replica: int | None, reason: str = "preempted (fray.testing.preempt)") -> None:
        """The host of ``replica``'s task (any task if None) is lost while its worker lives, for ``reason``.

        ``fray.testing.preempt``, and the scheduler's preemption of a worse band (whose ``reason``
        names the better job). The gang is retried under the preemption budget (or the job
        fails), as for any lost task; the worker is also told to kill the task's process, which
        still runs there. Raises FrayError for a job with nothing running, ConfigError for a
        replica it lacks.
        """
        job = read_job(self.cur, job_id)
        wanted = set(replicas_to_preempt(job_id, job.replicas, replica))
        tasks = [t for t in read_tasks(self.cur, job_id, job.attempt) if t.state.active and t.replica_index in wanted]
        if job.state != JobStatus.RUNNING or not tasks:
            raise FrayError(f"job {job_id!r} is {job.state.value} with no attempt running: nothing to preempt")
        task = tasks[0]
        self.lose_task(job, task, reason)
        if task.worker_id is not None:
            self._kill.append(KillOrder(task.key, task.worker_id))

    def record_exit(self, current: tuple[JobRecord, TaskRecord] | None, exit_code: int, failure: bytes | None) -> bool:
        """Record a task's exit: success (the job's too once all its tasks succeeded) or a gang failure.

        ``current`` is the job and task the report is about, None when the report is
        stale; then nothing changes and the answer is False.
        """
        if current is None:
            return False
        job, task = current
        if exit_code != 0:
            reason = reported_failure(failure, task.task_index, exit_code)
            self.gang_fail(job, task, TaskState.FAILED, reason, exit_code=exit_code)
            return True
        self.end_task(job, task, TaskState.SUCCEEDED, exit_code=0)
        left = self.cur.execute(
            "SELECT COUNT(*) FROM tasks WHERE job_id = ? AND attempt = ? AND state != 'succeeded'",
            (job.job_id, job.attempt),
        ).fetchone()[0]
        if left == 0:
            self.finish_job(job, JobStatus.SUCCEEDED)
        return True

    # -- scheduling --------------------------------------------------------------------------------

    def assign(self, decision: SchedulingDecision, reasons: Mapping[str, str] | None) -> list[TaskRecord]:
        """Record a scheduling pass; return the newly ASSIGNED tasks (see ``ClusterStore.apply_decision``)."""
        cur, now = self.cur, self.now
        assigned: list[TaskRecord] = []
        alive = {r[0] for r in cur.execute("SELECT id FROM workers WHERE state = 'alive'")}
        for assignment in decision.assignments:
            job = read_job(cur, assignment.job_id)
            if job.state != JobStatus.PENDING or not set(assignment.worker_ids) <= alive:
                continue
            if len(assignment.worker_ids) != job.task_count:
                raise StoreError(
                    f"assignment for {job.job_id} names {len(assignment.worker_ids)} workers; "
                    f"the job has {job.task_count} tasks"
                )
            for task in read_tasks(cur, job.job_id, job.attempt):
                check_task_transition(task.state, TaskState.ASSIGNED)
            cur.executemany(
                "UPDATE tasks SET state = 'assigned', worker_id = ?, assigned_at = ? "
                "WHERE job_id = ? AND attempt = ? AND task_index = ?",
                [(w, now, job.job_id, job.attempt, i) for i, w in enumerate(assignment.worker_ids)],
            )
            self.set_job_state(job, JobStatus.RUNNING, started_at=now, pending_reason="")
            # A job's timeout counts from its first start: a retry does not move the deadline.
            cur.execute(
                "UPDATE jobs SET deadline = ? + timeout WHERE id = ? AND timeout IS NOT NULL AND deadline IS NULL",
                (now, job.job_id),
            )
            assigned.extend(read_tasks(cur, job.job_id, job.attempt))
        if reasons is None:
            reasons = {job_id: r.message for job_id, r in decision.pending.items()}
        cur.executemany(
            "UPDATE jobs SET pending_reason = ? WHERE id = ? AND state = 'pending' AND pending_reason != ?",
            [(message, job_id, message) for job_id, message in reasons.items()],
        )
        return assigned

    # -- workers -----------------------------------------------------------------------------------

    def lose_worker(self, worker_id: str, reason: str) -> None:
        """Declare ``worker_id`` lost: every gang with a task on it is retried (preemption budget)."""
        row = self.cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
        check_worker_transition(WorkerState(row[0]), WorkerState.LOST)
        self.cur.execute("UPDATE workers SET state = 'lost' WHERE id = ?", (worker_id,))
        self._dead_workers.add(worker_id)
        self._lost_workers.append(worker_id)
        for key in active_keys_on(self.cur, worker_id):
            task = read_task(self.cur, key)
            if task.state.active:  # an earlier gang retry in this loop may have ended it
                job = read_job(self.cur, key.job_id)
                self.gang_fail(job, task, TaskState.LOST, Failure.lost(f"worker {worker_id} lost: {reason}"))

    def reconcile(self, worker_id: str, running: set[TaskKey]) -> None:
        """Compare the tasks a worker runs with what the store expects there; see ``register_worker``."""
        for key in active_keys_on(self.cur, worker_id):
            if key in running:
                continue
            task = read_task(self.cur, key)
            if task.state == TaskState.RUNNING:
                job = read_job(self.cur, key.job_id)
                lost = Failure.lost(f"worker {worker_id} no longer runs the task")
                self.gang_fail(job, task, TaskState.LOST, lost)
        for key in sorted(running):
            row = self.cur.execute(
                "SELECT state, worker_id FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
                (key.job_id, key.attempt, key.task_index),
            ).fetchone()
            if row is None or row[1] != worker_id or row[0] not in ("assigned", "running"):
                self._kill.append(KillOrder(key, worker_id))


def reported_failure(data: bytes | None, task_index: int, exit_code: int) -> Failure:
    """Why a task exited non-zero: the failure it reported (encoded), else its bare exit code."""
    if data is not None:
        try:
            return Failure.decode(data)
        except (ValueError, KeyError, TypeError):
            pass  # not a failure report: fall back to what is certain
    return Failure.from_exit(f"task {task_index}", exit_code)
