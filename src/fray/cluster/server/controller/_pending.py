"""The controller's in-memory view of the queue: pending jobs, their last written reasons, unfinished jobs.

SQLite stays the durable record; this is what lets a scheduling pass avoid re-reading
the queue and rewriting every reason, and ``wait_status`` answer for unfinished jobs
without a query. :class:`PendingSet` is filled from the store at start and kept in step
by the controller: new jobs in, placed jobs out, retried jobs back in, finished jobs out.
Its lock is held while a pass records its decision, so a job retried meanwhile (which
can only happen after the decision committed) is never dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from fray.cluster.protocol.records import Effects, JobRecord, TaskRecord
from fray.cluster.server.scheduler import PendingJob, SchedulingDecision
from fray.cluster.server.store import ClusterStore
from fray.job import JobStatus

__all__ = ["PendingSet"]


class PendingSet:
    """Pending jobs in submission order, the pending reason last written for each, and every unfinished job."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._pending: dict[str, PendingJob] = {}
        self._reasons: dict[str, str] = {}
        self._live: set[str] = set()

    def load(self) -> None:
        """Read the queue back from the store (at start)."""
        with self._lock:
            for job, reason in self._store.pending_jobs():
                self._pending[job.job_id] = job
                self._reasons[job.job_id] = reason
            self._live.update(job.job_id for job in self._store.list_jobs(states=[JobStatus.RUNNING]))
            self._live.update(self._pending)

    def __contains__(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._pending

    def job_ids(self) -> set[str]:
        with self._lock:
            return set(self._pending)

    def reason(self, job_id: str) -> str | None:
        with self._lock:
            return self._reasons.get(job_id)

    def snapshot(self) -> tuple[PendingJob, ...]:
        """The pending jobs, in submission order, for one scheduling pass."""
        with self._lock:
            return tuple(self._pending.values())

    def add(self, records: Iterable[JobRecord]) -> None:
        """Newly submitted jobs."""
        with self._lock:
            for r in records:
                self._pending[r.job_id] = PendingJob(r.job_id, r.user, r.replicas, r.resources, r.submitted_at)
                self._live.add(r.job_id)

    def track(self, effects: Effects) -> None:
        """A state change happened: retried jobs are pending again, finished ones are gone."""
        if not (effects.retried or effects.finished):
            return
        again = [job for job in map(self._store.pending_job, effects.retried) if job is not None]
        with self._lock:
            for job_id in effects.finished:
                self._pending.pop(job_id, None)
                self._reasons.pop(job_id, None)
                self._live.discard(job_id)
            for job in again:
                self._pending[job.job_id] = job
                self._reasons.pop(job.job_id, None)

    def record(
        self, decision: SchedulingDecision, apply: Callable[[dict[str, str]], list[TaskRecord]]
    ) -> list[TaskRecord]:
        """Record a pass: ``apply(changed_reasons)`` commits it; placed jobs leave the set. Returns the assigned tasks."""
        with self._lock:
            changed = {
                job_id: reason.message
                for job_id, reason in decision.pending.items()
                if job_id in self._pending and self._reasons.get(job_id) != reason.message
            }
            assigned = apply(changed)
            for job_id in {task.job_id for task in assigned}:
                self._pending.pop(job_id, None)
                self._reasons.pop(job_id, None)
            for decided in decision.assignments:  # skipped: no longer pending, or a worker went away
                if decided.job_id in self._pending and self._store.pending_job(decided.job_id) is None:
                    self._pending.pop(decided.job_id)
            self._reasons.update(changed)
        return assigned

    def unfinished_states(self, job_ids: Iterable[str]) -> dict[str, str]:
        """The state of those of ``job_ids`` that are unfinished (pending or running), from memory."""
        with self._lock:
            return {
                job_id: JobStatus.PENDING.value if job_id in self._pending else JobStatus.RUNNING.value
                for job_id in job_ids
                if job_id in self._live
            }
