"""After a pass: which better-band job that could not be placed gets room by preempting worse-band gangs.

The victims themselves are chosen by the pure
:func:`~fray.cluster.server.scheduler._preempt.choose_victims`; this module picks the job to make
room for, from the pass's queue and decision. The controller preempts the victims through the
store (each gang is retried under its own preemption budget) and runs the next pass at once,
where the better job comes first in the order: the victims, now pending again in a worse band,
cannot take the freed room before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.server.scheduler import PendingJob, PendingQueue, RunningTask, SchedulingDecision, Shape, queue_order
from fray.cluster.server.scheduler._preempt import Preemption, choose_victims
from fray.cluster.server.scheduler._queue import shape_of

__all__ = ["MAX_CANDIDATES", "preemption_after"]

#: Better-band jobs tried per pass: each try is a few one-job passes, so it is bounded whatever the backlog.
MAX_CANDIDATES = 8
_WORST_BAND = 3


def preemption_after(
    queue: PendingQueue,
    decision: SchedulingDecision,
    workers: Sequence[WorkerInfo],
    running: Sequence[RunningTask],
    now: float,
) -> Preemption | None:
    """The preemption that lets the first unplaced better-band job of ``decision`` fit, if any does.

    ``running`` is what the pass saw; the pass's own placements are added to it (they hold
    capacity from now on). Jobs are tried in queue order (best band, then oldest), at most
    :data:`MAX_CANDIDATES`, skipping those that can never fit the registered workers.
    """
    # Only a job of a better band than some running work may preempt: by default every job is
    # interactive, and then this is one look at the running tasks and one at each user's first job.
    worst_running = max((task.band for task in running), default=0)
    placed = {a.job_id for a in decision.assignments}
    candidates: list[PendingJob] = []
    for jobs in queue.by_user.values():
        taken = 0
        for job in jobs:  # each user's jobs are sorted best band first
            if job.band >= min(worst_running, _WORST_BAND) or taken >= MAX_CANDIDATES:
                break
            if job.job_id not in placed:
                candidates.append(job)
                taken += 1
    if not candidates:
        return None
    holding = list(running)
    for assignment in decision.assignments:
        placed_job = queue.jobs.get(assignment.job_id)
        if placed_job is not None:
            p = placed_job
            holding.extend(
                RunningTask(w, p.user, p.resources, job_id=p.job_id, band=p.band, started_at=now)
                for w in assignment.worker_ids
            )
    tried: set[tuple[Shape, int]] = set()
    for job in sorted(candidates, key=queue_order)[:MAX_CANDIDATES]:
        reason = decision.pending.get(job.job_id)
        if reason is not None and not reason.satisfiable:
            continue  # no registered worker set could run it: preempting would not help
        if (shape_of(job), job.band) in tried:
            continue  # the same shape and band gets the same answer: a sweep costs one try
        tried.add((shape_of(job), job.band))
        chosen = choose_victims(job, workers, holding)
        if chosen is not None:
            return chosen
    return None
