"""The controller's in-memory view of the queue: pending jobs, their last written reasons, unfinished jobs.

SQLite stays the durable record; this is what lets a scheduling pass avoid re-reading
the queue and rewriting every reason, and ``wait_status`` answer for unfinished jobs
without a query. :class:`PendingSet` is filled from the store at start and kept in step
by the controller: new jobs in, placed jobs out, retried jobs back in, finished jobs out.
Its lock is held while a pass records its decision, so a job retried meanwhile (which
can only happen after the decision committed) is never dropped.

A pass must cost the same whether 10 or 10,000 jobs wait (issue 34), so the set is kept the way a
pass reads it (:class:`~fray.cluster.server.scheduler.PendingQueue`): each user's jobs sorted by
submission, and per *shape* (resources and replicas) their count and the oldest submit time. The
reasons last written are grouped by shape too, so recording a pass that gave the jobs it did not
look at their shape's reason (:class:`~fray.cluster.server.scheduler.PendingReasons`) touches only
the jobs whose reason changed -- in a steady backlog, none.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from collections.abc import Callable, Iterable

from fray.cluster.protocol.records import Effects, JobRecord, TaskRecord
from fray.cluster.server.scheduler import PendingJob, PendingQueue, PendingReasons, SchedulingDecision, Shape
from fray.cluster.server.scheduler._queue import queue_order, shape_of
from fray.cluster.server.store import ClusterStore
from fray.job import JobStatus

__all__ = ["PendingSet"]


def _order(job: PendingJob) -> tuple[int, float, str]:
    """Where a job stands in its user's queue: as the scheduler sorts (best band, then submission order)."""
    return queue_order(job)


class PendingSet:
    """Pending jobs in submission order, the pending reason last written for each, and every unfinished job."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._pending: dict[str, PendingJob] = {}
        self._reasons: dict[str, str] = {}
        self._live: set[str] = set()
        self._by_user: dict[str, list[PendingJob]] = {}  # each sorted by _order
        self._shape_count: dict[Shape, int] = {}
        self._band_count: dict[int, int] = {}  # pending jobs per priority band (what a worse band waits behind)
        # Per shape, (submitted_at, job id) of its jobs; entries of jobs that left are dropped when on top.
        self._shape_oldest: dict[Shape, list[tuple[float, str]]] = {}
        # Per shape, the jobs by the reason last written for them (None: none yet).
        self._groups: dict[Shape, dict[str | None, set[str]]] = {}

    # ----- keeping the indexes (with the lock held) ----------------------------------------------

    def _insert(self, job: PendingJob) -> None:
        if job.job_id in self._pending:
            self._remove(job.job_id)
        self._pending[job.job_id] = job
        bisect.insort(self._by_user.setdefault(job.user, []), job, key=_order)
        shape = shape_of(job)
        self._shape_count[shape] = self._shape_count.get(shape, 0) + 1
        self._band_count[job.band] = self._band_count.get(job.band, 0) + 1
        heapq.heappush(self._shape_oldest.setdefault(shape, []), (job.submitted_at, job.job_id))
        self._groups.setdefault(shape, {}).setdefault(None, set()).add(job.job_id)

    def _remove(self, job_id: str) -> None:
        job = self._pending.pop(job_id, None)
        reason = self._reasons.pop(job_id, None)
        if job is None:
            return
        queue = self._by_user[job.user]
        at = bisect.bisect_left(queue, _order(job), key=_order)
        if at < len(queue) and queue[at].job_id == job_id:
            del queue[at]
        if not queue:
            del self._by_user[job.user]
        shape = shape_of(job)
        self._shape_count[shape] -= 1
        self._band_count[job.band] -= 1
        group = self._groups[shape].get(reason)
        if group is not None:
            group.discard(job_id)
            if not group:
                del self._groups[shape][reason]
        if not self._shape_count[shape]:
            del self._shape_count[shape], self._shape_oldest[shape], self._groups[shape]

    def _set_reason(self, job_id: str, reason: str) -> None:
        job = self._pending.get(job_id)
        if job is None:
            return
        groups = self._groups[shape_of(job)]
        old = self._reasons.get(job_id)
        group = groups.get(old)
        if group is not None:
            group.discard(job_id)
            if not group:
                del groups[old]
        self._reasons[job_id] = reason
        groups.setdefault(reason, set()).add(job_id)

    def _oldest(self, shape: Shape) -> float:
        heap = self._shape_oldest[shape]
        while heap[0][1] not in self._pending:
            heapq.heappop(heap)
        return heap[0][0]

    # ----- reading and changing -------------------------------------------------------------------

    def load(self) -> None:
        """Read the queue back from the store (at start)."""
        with self._lock:
            for job, reason in self._store.pending_jobs():
                self._insert(job)
                self._set_reason(job.job_id, reason)
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

    def waiting_by_band(self) -> dict[int, int]:
        """How many jobs of each priority band are pending."""
        with self._lock:
            return {band: count for band, count in self._band_count.items() if count}

    def snapshot(self) -> tuple[PendingJob, ...]:
        """The pending jobs, in submission order, for one scheduling pass."""
        with self._lock:
            return tuple(self._pending.values())

    def view(self) -> PendingQueue:
        """The pending jobs as a scheduling pass reads them (copies of the indexes: no per-job work)."""
        with self._lock:
            return PendingQueue(
                dict(self._pending),
                {user: list(queue) for user, queue in self._by_user.items()},
                {shape: (count, self._oldest(shape)) for shape, count in self._shape_count.items()},
            )

    def add(self, records: Iterable[JobRecord]) -> None:
        """Newly submitted jobs."""
        with self._lock:
            for r in records:
                self._insert(PendingJob(r.job_id, r.user, r.replicas, r.resources, r.submitted_at, band=r.band))
                self._live.add(r.job_id)

    def track(self, effects: Effects) -> None:
        """A state change happened: retried jobs are pending again, finished ones are gone."""
        if not (effects.retried or effects.finished):
            return
        again = [job for job in map(self._store.pending_job, effects.retried) if job is not None]
        with self._lock:
            for job_id in effects.finished:
                self._remove(job_id)
                self._live.discard(job_id)
            for job in again:
                self._insert(job)  # its reason is written afresh by the next pass

    def record(
        self, decision: SchedulingDecision, apply: Callable[[dict[str, str]], list[TaskRecord]]
    ) -> list[TaskRecord]:
        """Record a pass: ``apply(changed_reasons)`` commits it; placed jobs leave the set. Returns the assigned tasks."""
        with self._lock:
            changed = self._changed_reasons(decision)
            assigned = apply(changed)
            for job_id in {task.job_id for task in assigned}:
                self._remove(job_id)
            for decided in decision.assignments:  # skipped: no longer pending, or a worker went away
                if decided.job_id in self._pending and self._store.pending_job(decided.job_id) is None:
                    self._remove(decided.job_id)
            for job_id, reason in changed.items():
                self._set_reason(job_id, reason)
        return assigned

    def _changed_reasons(self, decision: SchedulingDecision) -> dict[str, str]:
        """The reasons of ``decision`` that differ from those last written (lock held)."""
        given = decision.pending
        if not isinstance(given, PendingReasons):
            return {
                job_id: reason.message
                for job_id, reason in given.items()
                if job_id in self._pending and self._reasons.get(job_id) != reason.message
            }
        changed = {
            job_id: reason.message
            for job_id, reason in given.explicit.items()
            if job_id in self._pending and self._reasons.get(job_id) != reason.message
        }
        # The others have their shape's reason: only the jobs of a shape last written with another need it.
        for shape, shared in given.by_shape.items():
            for written, job_ids in self._groups.get(shape, {}).items():
                if written == shared.message:
                    continue
                for job_id in job_ids:
                    if job_id in given.jobs and job_id not in given.placed and job_id not in given.explicit:
                        changed[job_id] = shared.message
        return changed

    def unfinished_states(self, job_ids: Iterable[str]) -> dict[str, str]:
        """The state of those of ``job_ids`` that are unfinished (pending or running), from memory."""
        with self._lock:
            return {
                job_id: JobStatus.PENDING.value if job_id in self._pending else JobStatus.RUNNING.value
                for job_id in job_ids
                if job_id in self._live
            }
