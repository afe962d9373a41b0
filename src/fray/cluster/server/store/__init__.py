"""The controller's durable state: jobs, tasks, workers, endpoints, credit and logs in one SQLite file.

:class:`ClusterStore` keeps everything the controller knows in a SQLite database in
WAL mode. Every public method that changes state runs in exactly one transaction,
so a controller killed at any moment reopens the file to exactly the state of its
last completed call: running tasks are still recorded as running on their workers,
pending jobs are still pending, and job ids handed to clients still resolve.

Every change of state is checked: a job's against the state machine every backend
shares (:func:`fray.core._lifecycle.check_transition`; the gang retry is RUNNING ->
PENDING), a task's and a worker's against theirs (:mod:`fray.cluster.protocol.records`). A
failed attempt is charged to the job's retry budgets through
:meth:`fray.core._lifecycle.RetryBudget.decide`, which also words the pending reason and
the final error, as on every backend; the counts themselves live in the job's row.

A job's tasks belong to *attempts*: a gang retry ends every task of the current
attempt and creates fresh PENDING tasks under ``attempt + 1``. Reports about tasks
of an older attempt, or about tasks that already ended, are stale and ignored
(the methods say so in their return value) rather than raising, because they are
normal races between workers and the controller.

The layout of the file is in :mod:`fray.cluster.server.store._schema`; endpoints, logs, credit and
the consistency check are in :mod:`fray.cluster.server.store._tables`; the jobs' and workers' rows in
:mod:`fray.cluster.server.store._job_rows` and :mod:`fray.cluster.server.store._worker_rows`. Times are floats
supplied by the caller (``now``), on the controller's wall clock.

The package is the controller's durable layer: besides :class:`ClusterStore` it holds
the SQLite plumbing, schema, row functions, state-changing transactions, blobs and the
read models for operators.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
from fray.cluster.protocol.credentials import Issued
from fray.cluster.protocol.records import (
    Effects,
    Endpoint,
    JobRecord,
    JobShape,
    LogLine,
    SchedulerInput,
    TaskKey,
    TaskRecord,
    TaskState,
    WorkerRecord,
    WorkerState,
)
from fray.cluster.server.credit import CreditPolicy
from fray.cluster.server.scheduler import PendingJob, SchedulingDecision
from fray.cluster.server.store import _job_rows, _tables, _worker_rows
from fray.cluster.server.store._change import STALE, Change
from fray.cluster.server.store._database import Database
from fray.cluster.server.store._schema import (
    create_or_migrate,
    read_job,
    read_pending,
    read_scheduler_input,
    read_task,
    read_tasks,
    with_reason,
)
from fray.core._lifecycle import Failure
from fray.errors import NotFound, StoreError
from fray.job import JobStatus

__all__ = ["ClusterStore"]

_T = TypeVar("_T")


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
        self._db = Database(self.path, synchronous)
        self._init_schema()
        self._db.make_private()

    # -- plumbing -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def __enter__(self) -> ClusterStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch(self) -> AbstractContextManager[None]:
        """Run several calls as one transaction (see :meth:`Database.batch`)."""
        return self._db.batch()

    def _init_schema(self) -> None:
        with self._db.txn() as cur:
            create_or_migrate(cur, self.path)

    @property
    def schema_version(self) -> int:
        """The schema version stored in the file."""
        with self._db.locked():
            return int(self._db.conn.execute("SELECT version FROM schema_version").fetchone()[0])

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
        timeout: float | None = None,
        band: int = 2,
    ) -> JobRecord:
        """Record a new PENDING job with its first attempt's PENDING tasks; return it.

        The id is ``name-xxxx`` (``xxxx`` random hex), or ``<parent_id>/name-xxxx`` for
        a job submitted from inside job ``parent_id``. The namespace defaults to the
        parent's, and for a top-level job to its own id. ``request`` is stored as opaque
        bytes (the pickled :class:`~fray.job.JobRequest`). ``label`` is a free tag (the
        controller puts an actor's name there, see :meth:`live_job_with_label`). ``timeout``
        (seconds) fails the job that long after it first started (:meth:`time_out_jobs`).
        ``band`` is its priority band (1 production, 2 interactive, 3 batch).
        """
        with self._db.txn() as cur:
            return _job_rows.submit_job(
                self._change(cur, now),
                name=name,
                user=user,
                request=request,
                resources=resources,
                replicas=replicas,
                max_retries_failure=max_retries_failure,
                max_retries_preemption=max_retries_preemption,
                parent_id=parent_id,
                namespace=namespace,
                label=label,
                initial_credit=self.credit_policy.initial_credit,
                timeout=timeout,
                band=band,
            )

    def submit_request(
        self,
        request: JobShape,
        request_bytes: bytes,
        *,
        user: str,
        now: float,
        parent_id: str | None = None,
        namespace: str | None = None,
        label: str = "",
    ) -> JobRecord:
        """:meth:`submit_job` with the name, resources, replicas and retry budgets taken from ``request``.

        ``request`` is a :class:`~fray.job.JobRequest` or anything shaped like one (the
        controller's :class:`~fray.cluster.protocol.messages.JobSpec`).
        """
        return self.submit_job(
            name=request.name,
            user=user,
            request=request_bytes,
            resources=request.resources
            if isinstance(request.resources, TaskResources)
            else TaskResources.from_config(request.resources),
            now=now,
            replicas=request.replicas,
            max_retries_failure=request.max_retries_failure,
            max_retries_preemption=request.max_retries_preemption,
            parent_id=parent_id,
            namespace=namespace,
            label=label,
            timeout=request.timeout_seconds,
            # A request built past the client's submit may still say 0 (inherit): a top-level job, interactive.
            band=request.priority or 2,
        )

    def get_job(self, job_id: str) -> JobRecord:
        """The job ``job_id``; raises :class:`NotFound`."""
        with self._db.locked():
            return read_job(self._db.conn.cursor(), job_id)

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        """The state of each of ``job_ids`` (a missing id is left out), in one read."""
        with self._db.read() as cur:
            return _job_rows.job_states(cur, job_ids)

    def job_request(self, job_id: str) -> bytes:
        """The opaque request bytes given at submission."""
        with self._db.locked():
            return _job_rows.job_request(self._db.conn.cursor(), job_id)

    def list_jobs(
        self,
        *,
        states: Iterable[JobStatus] | None = None,
        parent_id: str | None = None,
        user: str | None = None,
    ) -> list[JobRecord]:
        """Jobs in submission order, optionally only those in ``states``, children of ``parent_id``, of ``user``."""
        with self._db.locked():
            return _job_rows.list_jobs(self._db.conn.cursor(), states, parent_id, user)

    def get_tasks(self, job_id: str, attempt: int | None = None) -> list[TaskRecord]:
        """The tasks of ``job_id`` in ``attempt`` (default: the current attempt), by task index.

        A PENDING task carries its job's pending reason: a gang is placed as a unit, so
        all its tasks wait for the same reason.
        """
        with self._db.read() as cur:
            job = read_job(cur, job_id)
            return [with_reason(t, job) for t in read_tasks(cur, job_id, job.attempt if attempt is None else attempt)]

    def get_task(self, key: TaskKey) -> TaskRecord:
        """One task attempt (with its pending reason, see :meth:`get_tasks`); raises :class:`NotFound`."""
        with self._db.read() as cur:
            return with_reason(read_task(cur, key), read_job(cur, key.job_id))

    def time_out_jobs(self, now: float) -> Effects:
        """Fail every unfinished job whose timeout ran out by ``now`` (counted from its first start): ``JobTimeout``."""
        with self._db.read() as cur:  # called on every scheduling pass: no write transaction when none is due
            if not _job_rows.timed_out(cur, now):
                return STALE
        with self._db.txn() as cur:
            due = _job_rows.timed_out(cur, now)
            if not due:
                return STALE
            change = self._change(cur, now)
            for job_id, timeout in due:
                failure = Failure.timed_out(timeout)
                change.finish_job(read_job(cur, job_id), JobStatus.FAILED, error=failure.message, failure=failure)
            return change.effects()

    def terminate_job(self, job_id: str, now: float, reason: str = "terminated") -> Effects:
        """Stop ``job_id`` and all its unfinished descendants; a no-op (not applied) on a finished job."""
        with self._db.txn() as cur:
            job = read_job(cur, job_id)
            if job.state.finished:
                return STALE
            change = self._change(cur, now)
            change.finish_job(job, JobStatus.STOPPED, error=reason)
            return change.effects()

    # -- scheduling ------------------------------------------------------------------------

    def scheduler_input(self, *, pending: bool = True, lent: Collection[TaskKey] = ()) -> SchedulerInput:
        """Pending jobs, alive workers, capacity-holding tasks and balances, from one snapshot.

        ``pending=False`` leaves the pending jobs out (a controller that keeps them in memory);
        the tasks in ``lent`` hold no CPU (they lent it while blocked on their own work).
        """
        with self._db.read() as cur:
            return read_scheduler_input(cur, pending=pending, lent=lent)

    def pending_jobs(self) -> list[tuple[PendingJob, str]]:
        """Every PENDING job as the scheduler sees it, with its stored pending reason, in submission order."""
        with self._db.read() as cur:
            return read_pending(cur)

    def pending_job(self, job_id: str) -> PendingJob | None:
        """The scheduler's view of ``job_id`` if it is PENDING, else None."""
        with self._db.read() as cur:
            found = read_pending(cur, job_id)
        return found[0][0] if found else None

    def apply_decision(
        self, decision: SchedulingDecision, now: float, reasons: Mapping[str, str] | None = None
    ) -> list[TaskRecord]:
        """Record a scheduling pass in one transaction; return the newly ASSIGNED tasks.

        An assignment is skipped (left for the next pass) if its job is no longer
        pending or one of its workers is no longer alive, since either may have
        changed after the snapshot the decision was computed from. Pending reasons
        are written only where they changed; ``reasons`` (job id -> reason), when given,
        replaces the decision's own, so a caller that knows which changed writes only those.
        """
        with self._db.txn() as cur:
            return self._change(cur, now).assign(decision, reasons)

    def submit_many(
        self,
        requests: Sequence[tuple[JobShape, bytes]],
        *,
        user: str,
        now: float,
        parent_id: str | None = None,
        namespace: str | None = None,
        labels: Sequence[str] | None = None,
    ) -> list[JobRecord]:
        """:meth:`submit_request` for each ``(request, request_bytes)``, all in one transaction (all or none)."""
        labels = labels or [""] * len(requests)
        with self._db.batch():
            return [
                self.submit_request(
                    request, data, user=user, now=now, parent_id=parent_id, namespace=namespace, label=label
                )
                for (request, data), label in zip(requests, labels, strict=True)
            ]

    # -- task reports ----------------------------------------------------------------------

    def _change(self, cur: sqlite3.Cursor, now: float) -> Change:
        return Change(cur, now, self.credit_policy)

    def mark_task_running(self, key: TaskKey, now: float, worker_id: str | None = None) -> bool:
        """The worker started ``key``. False if the report is stale (the task already ended or was retried).

        Repeating the report is harmless. Billing of the task's usage starts now.
        """
        with self._db.txn() as cur:
            current = _job_rows.current_task(cur, key, worker_id)
            if current is None:
                return False
            _, task = current
            if task.state != TaskState.RUNNING:
                self._change(cur, now).start_task(task)
            return True

    def mark_task_exited(
        self, key: TaskKey, exit_code: int, now: float, failure: bytes | None = None, worker_id: str | None = None
    ) -> Effects:
        """The task's process exited with ``exit_code``; ``failure`` says why (a :class:`~fray.core._lifecycle.Failure`, encoded).

        0: the task SUCCEEDED, and the job too once all its tasks have. Anything else:
        the task FAILED and the gang is retried under the failure budget (or the job
        FAILS when that is used up). Stale reports return ``Effects(applied=False)``:
        a task that already ended (the outcome is recorded once, however often it is
        reported), an older attempt, or -- with ``worker_id`` -- a task no longer on that worker.
        """
        with self._db.txn() as cur:
            change = self._change(cur, now)
            if not change.record_exit(_job_rows.current_task(cur, key, worker_id), exit_code, failure):
                return STALE
            return change.effects()

    def _change_current_task(
        self, key: TaskKey, now: float, act: Callable[[Change, JobRecord, TaskRecord], None]
    ) -> Effects:
        """``act`` on the job and task a report is about, in one transaction; a stale report changes nothing."""
        with self._db.txn() as cur:
            current = _job_rows.current_task(cur, key)
            if current is None:
                return STALE
            change = self._change(cur, now)
            act(change, *current)
            return change.effects()

    def job_failure(self, job_id: str) -> bytes | None:
        """The final failure of a FAILED job (a :class:`~fray.core._lifecycle.Failure`, encoded); None otherwise."""
        with self._db.locked():
            return _job_rows.job_failure(self._db.conn.cursor(), job_id)

    def namespace_owner(self, namespace: str) -> str | None:
        """The user of the first job submitted in ``namespace`` (None if it has none): who owns the namespace."""
        with self._db.locked():
            return _job_rows.namespace_owner(self._db.conn.cursor(), namespace)

    def live_job_with_label(self, namespace: str, label: str) -> str | None:
        """The id of an unfinished job in ``namespace`` whose label is ``label``, if there is one."""
        with self._db.locked():
            return _job_rows.live_job_with_label(self._db.conn.cursor(), namespace, label)

    def mark_task_lost(self, key: TaskKey, now: float, reason: str = "preempted") -> Effects:
        """The task was preempted or vanished: retry the gang under the preemption budget."""
        return self._change_current_task(key, now, lambda change, job, task: change.lose_task(job, task, reason))

    def preempt(self, job_id: str, replica: int | None, now: float) -> Effects:
        """``fray.testing.preempt``: lose the job's running ``replica`` (its whole gang if None); see ``Change.preempt``."""
        with self._db.txn() as cur:
            change = self._change(cur, now)
            change.preempt(job_id, replica)
            return change.effects()

    def preempt_gangs(self, job_ids: Sequence[str], reason: str, now: float) -> Effects:
        """Preempt the whole current attempt of each of ``job_ids`` for ``reason``, in one transaction.

        The scheduler's preemption of a worse band (:mod:`fray.cluster.server.scheduler._preempt`):
        each gang is retried under its preemption budget, exactly as after a lost host. A job
        that ended or was retried since the decision is skipped.
        """
        with self._db.txn() as cur:
            change = self._change(cur, now)
            for job_id in job_ids:
                job = read_job(cur, job_id)
                if job.state == JobStatus.RUNNING and any(t.state.active for t in read_tasks(cur, job_id, job.attempt)):
                    change.preempt(job_id, None, reason)
            return change.effects()

    # -- workers ---------------------------------------------------------------------------

    def register_worker(
        self,
        info: WorkerInfo,
        address: str,
        now: float,
        running: Iterable[TaskKey] = (),
        exited: Iterable[tuple[TaskKey, int, bytes | None]] = (),
    ) -> Effects:
        """A worker (re)joined, reporting the tasks it runs and those that exited unreported; reconcile.

        The registration starts a new *epoch* of the worker (see :meth:`worker_epoch`). The
        exits (``(key, exit_code, failure)``) are recorded first, exactly as reports would
        be -- only for tasks still current on this worker, so a fenced worker's outcomes
        are ignored. Then tasks the worker runs but the store does not expect there (they
        were lost, retried or killed while it was away) get kill orders; tasks the store
        has as RUNNING there but the worker does not report are lost (gang retry); ASSIGNED
        tasks it does not report are left alone: the controller should resend them.
        """
        with self._db.txn() as cur:
            _worker_rows.register(cur, info, address, now)
            change = self._change(cur, now)
            for key, exit_code, failure in exited:
                change.record_exit(_job_rows.current_task(cur, key, info.worker_id), exit_code, failure)
            change.reconcile(info.worker_id, set(running))
            return change.effects()

    def set_worker_health(self, worker_id: str, health: str) -> bool:
        """Record why ``worker_id`` cannot take tasks ("" once it can again); True if that changed anything."""
        with self._db.txn() as cur:
            return _worker_rows.set_health(cur, worker_id, health)

    def worker_epoch(self, worker_id: str) -> int:
        """The worker's current epoch (its registration count); raises :class:`NotFound`."""
        return self.get_worker(worker_id).epoch

    def reconcile_worker(self, worker_id: str, running: Iterable[TaskKey], now: float) -> Effects:
        """Compare an alive worker's list of running tasks with the store (see :meth:`register_worker`)."""
        return self._change_alive_worker(worker_id, now, lambda change: change.reconcile(worker_id, set(running)))

    def _change_alive_worker(self, worker_id: str, now: float, act: Callable[[Change], None]) -> Effects:
        """``act`` on ``worker_id`` in one transaction if it is alive (else stale); NotFound if unknown."""
        with self._db.txn() as cur:
            row = cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
            if row is None:
                raise NotFound(f"no worker {worker_id!r}")
            if row[0] != WorkerState.ALIVE.value:
                return STALE
            change = self._change(cur, now)
            act(change)
            return change.effects()

    def heartbeat(self, worker_id: str, now: float, epoch: int | None = None) -> bool:
        """Record that ``worker_id`` is alive. False if it is unknown or was declared lost (it must re-register).

        With ``epoch``, also False when the worker registered again since (the caller is
        fenced: it speaks for an epoch that has ended).
        """
        with self._db.locked():
            return _worker_rows.heartbeat(self._db.conn.cursor(), worker_id, now, epoch)

    def expire_workers(self, now: float, timeout: float) -> Effects:
        """Declare lost every alive worker not heard from for more than ``timeout`` seconds; retry their gangs."""
        with self._db.read() as cur:  # called on every scheduling pass: no write transaction when none is silent
            if not _worker_rows.silent_workers(cur, now, timeout):
                return Effects()
        with self._db.txn() as cur:
            stale = _worker_rows.silent_workers(cur, now, timeout)
            if not stale:
                return Effects()
            change = self._change(cur, now)
            for worker_id in stale:
                change.lose_worker(worker_id, f"no heartbeat for more than {timeout:g}s")
            return change.effects()

    def lose_worker(self, worker_id: str, now: float, reason: str = "preempted") -> Effects:
        """Declare ``worker_id`` lost now (e.g. on a preemption notice); not applied if it is not alive."""
        return self._change_alive_worker(worker_id, now, lambda change: change.lose_worker(worker_id, reason))

    def stop_worker(
        self, worker_id: str, now: float, reason: str, exited: Sequence[tuple[TaskKey, int, bytes | None]] = ()
    ) -> Effects:
        """``worker_id`` leaves on purpose (drained, or its VM scaled down): STOPPED, not lost.

        ``exited`` are the exits it had not reported yet, recorded first exactly as a report's
        (only for tasks still current on this worker); then whatever it still holds is lost
        (its gangs retried under the preemption budget). NotFound if it never registered.
        """
        with self._db.txn() as cur:
            change = self._change(cur, now)
            for key, exit_code, failure in exited:
                change.record_exit(_job_rows.current_task(cur, key, worker_id), exit_code, failure)
            _worker_rows.stop(cur, change, worker_id, reason)
            return change.effects()

    def revoke_worker(self, worker_id: str, now: float) -> Effects:
        """Revoke ``worker_id``: its issued credentials stop working, it is lost (its gangs retried) and REVOKED.

        NotFound if no such worker was ever registered. Only a credential issued after this (a new
        join) brings it back.
        """
        with self._db.txn() as cur:
            change = self._change(cur, now)
            _worker_rows.revoke(cur, change, worker_id, now)
            return change.effects()

    # -- issued credentials (join tokens, workers' and users' own) --------------------------------

    def add_issued(self, record: Issued) -> None:
        """Record an issued credential or join token."""
        with self._db.txn() as cur:
            _worker_rows.add_issued(cur, record)

    def issued(self) -> list[Issued]:
        """Every issued credential and join token, oldest first."""
        with self._db.locked():
            return _worker_rows.issued(self._db.conn.cursor())

    def revoke_issued(self, credential_id: str, now: float) -> bool:
        """Revoke one issued credential or join token; False if it was revoked already; NotFound if unknown."""
        with self._db.txn() as cur:
            return _worker_rows.revoke_issued(cur, credential_id, now)

    def refresh_heartbeats(self, now: float) -> int:
        """Set every alive worker's last heartbeat to ``now``; return how many.

        Call once when the controller starts on an existing file, so that workers get a
        full timeout to reconnect instead of being expired for the controller's downtime.
        """
        with self._db.txn() as cur:
            return cur.execute("UPDATE workers SET last_heartbeat = ? WHERE state = 'alive'", (now,)).rowcount

    def list_workers(self, *, alive_only: bool = False) -> list[WorkerRecord]:
        """Registered workers by id."""
        with self._db.locked():
            return _worker_rows.list_workers(self._db.conn.cursor(), alive_only)

    def get_worker(self, worker_id: str) -> WorkerRecord:
        """The worker ``worker_id`` (alive or lost); raises :class:`NotFound`."""
        with self._db.locked():
            return _worker_rows.get_worker(self._db.conn.cursor(), worker_id)

    def tasks_on_worker(self, worker_id: str) -> list[TaskRecord]:
        """The tasks currently assigned to or running on ``worker_id``."""
        with self._db.locked():
            return _worker_rows.tasks_on_worker(self._db.conn.cursor(), worker_id)

    # -- endpoints -------------------------------------------------------------------------

    def register_endpoint(self, namespace: str, name: str, address: str, task: TaskKey, now: float) -> bool:
        """Publish ``name`` -> ``address`` in ``namespace`` for as long as ``task`` runs.

        Re-registering the same name from the same task replaces the address. Several
        tasks may register the same name. False (nothing stored) if the task has
        already ended, so an endpoint never outlives its task.
        """
        with self._db.txn() as cur:
            if _job_rows.current_task(cur, task) is None:
                return False
            _tables.add_endpoint(cur, namespace, name, address, task, now)
            return True

    def list_endpoints(self, namespace: str, prefix: str = "") -> list[Endpoint]:
        """Endpoints in ``namespace`` whose name starts with ``prefix``, by name then registration."""
        with self._db.locked():
            return _tables.list_endpoints(self._db.conn.cursor(), namespace, prefix)

    def remove_endpoint(self, namespace: str, name: str, task: TaskKey | None = None) -> int:
        """Remove ``name`` from ``namespace`` (only ``task``'s registration if given); return how many."""
        with self._db.txn() as cur:
            return _tables.remove_endpoint(cur, namespace, name, task)

    # -- logs ------------------------------------------------------------------------------

    def append_logs(self, task: TaskKey, lines: Sequence[str]) -> None:
        """Append output lines of ``task``; beyond ``max_log_lines_per_task`` the oldest are dropped."""
        if not lines:
            return
        with self._db.txn() as cur:
            _tables.append_logs(cur, task, lines, self.max_log_lines_per_task)

    def read_logs(self, job_id: str, *, after_id: int = 0, last: int | None = None) -> list[LogLine]:
        """Stored lines of every task of ``job_id`` with id > ``after_id``, oldest first (only the ``last`` n if given).

        Pass the last ``line_id`` seen as ``after_id`` to follow the output.
        """
        with self._db.locked():
            return _tables.read_logs(self._db.conn.cursor(), job_id, after_id, last)

    # -- credit ----------------------------------------------------------------------------

    def credits(self) -> dict[str, float]:
        """Every known user's current balance (as of the last :meth:`accrue_credits`)."""
        with self._db.locked():
            return {name: balance for name, balance in self._db.conn.execute("SELECT name, balance FROM users")}

    def set_credit(self, user: str, balance: float, now: float) -> None:
        """Set ``user``'s balance (an operator's grant or correction)."""
        with self._db.txn() as cur:
            _tables.set_credit(cur, user, balance, now, self.credit_policy.initial_credit)

    def accrue_credits(self, now: float) -> dict[str, float]:
        """Bill running tasks up to ``now``, regenerate balances, and return the new balances.

        Call it periodically (e.g. once per scheduling pass); a task that ends is
        billed to its end at once.
        """
        with self._db.txn() as cur:
            return _tables.accrue_credits(cur, now, self.credit_policy)

    # -- checking ----------------------------------------------------------------------------

    def check_invariants(self) -> list[str]:
        """Cross-check the stored state; return a description of every inconsistency (empty if none).

        Cheap enough to run once at controller start-up; the tests run it after every step.
        """
        with self._db.read() as cur:
            return _tables.check_invariants(cur)

    # -- extensions ----------------------------------------------------------------------------

    def read_with(self, query: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Run ``query`` on one consistent read snapshot (read models living in their own modules)."""
        with self._db.read() as cur:
            return query(cur)

    def write_with(self, change: Callable[[sqlite3.Cursor], _T]) -> _T:
        """Run ``change`` in one write transaction (maintenance living in its own module, e.g. retention)."""
        with self._db.txn() as cur:
            return change(cur)
