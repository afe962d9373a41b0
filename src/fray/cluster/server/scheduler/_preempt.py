"""Which running gangs of a worse priority band to preempt so that a better-band job fits.

A pure function of the cluster's state, like :func:`fray.cluster.server.scheduler.schedule`:
the controller calls :func:`choose_victims` for a job of band 1 (production) or 2
(interactive) that a pass could not place, and preempts what it returns. The rules
(``docs/scheduler.md``, "Priority bands"):

* Only work of a strictly worse band is ever preempted: never the same band, never a better one.
* Whole gangs only: a victim is a job, all of whose tasks (every replica of its current attempt) go.
* Only when it helps: if the job would not fit even with every worse-band gang gone, nothing is
  preempted (preempting would cost work and place nothing).
* The fewest gangs, the most recently started first: a single gang that alone makes room is
  preferred (the most recently started such one); otherwise gangs are taken most recent first until
  the job fits, then any taken gang the job fits without is handed back (oldest taken first), so the
  longest-running work is the last to be lost.

Whether the job fits is decided by the scheduler itself (one pass with only this job pending and the
victims' tasks gone), so the constraints, TPU slices and best fit are exactly a pass's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.server.scheduler import PendingJob, RunningTask, SchedulerPolicy, schedule

__all__ = ["BAND_NAMES", "Preemption", "choose_victims"]

#: The bands' names, as users see them ("preempted by job J (band production)").
BAND_NAMES = {1: "production", 2: "interactive", 3: "batch"}

# A fit check is one scheduling pass over one job; no reservations are involved.
_FIT_POLICY = SchedulerPolicy(reserve_after_seconds=None)


@dataclass(frozen=True)
class Preemption:
    """Preempt ``victims`` (job ids, whole gangs) so that ``job_id`` of ``band`` fits."""

    job_id: str
    band: int
    victims: tuple[str, ...]

    @property
    def reason(self) -> str:
        """What a victim's status says: ``preempted by job ID (band production)``."""
        return f"preempted by job {self.job_id} (band {BAND_NAMES.get(self.band, str(self.band))})"


@dataclass(frozen=True)
class _Gang:
    """A running job's current attempt as a preemption candidate."""

    job_id: str
    started_at: float  # the latest assignment among its tasks: when the gang as a whole started


def _fits(job: PendingJob, workers: Sequence[WorkerInfo], running: Sequence[RunningTask], gone: set[str]) -> bool:
    left = [task for task in running if task.job_id not in gone]
    decision = schedule([job], workers, left, {}, now=job.submitted_at, policy=_FIT_POLICY)
    return bool(decision.assignments)


def choose_victims(job: PendingJob, workers: Sequence[WorkerInfo], running: Sequence[RunningTask]) -> Preemption | None:
    """The gangs of a worse band than ``job``'s to preempt so it fits, or None (none needed, or none would do).

    ``workers`` and ``running`` are what a pass sees (``running``'s ``job_id``, ``band`` and
    ``started_at`` must be filled). Returns None when ``job`` fits already, when it is of the
    worst band, or when preempting every worse-band gang would still not make it fit.
    """
    if job.band >= max(BAND_NAMES):
        return None
    starts: dict[str, float] = {}
    for task in running:
        if task.band > job.band and task.job_id:
            starts[task.job_id] = max(starts.get(task.job_id, task.started_at), task.started_at)
    if not starts or _fits(job, workers, running, set()):
        return None
    # Most recently started first; ties by id so that the choice is reproducible.
    gangs = sorted((_Gang(j, t) for j, t in starts.items()), key=lambda g: (-g.started_at, g.job_id))
    if not _fits(job, workers, running, {g.job_id for g in gangs}):
        return None  # not even all of them would make room: preempt nothing
    for gang in gangs:
        if _fits(job, workers, running, {gang.job_id}):
            return Preemption(job.job_id, job.band, (gang.job_id,))
    taken: list[_Gang] = []
    for gang in gangs:
        taken.append(gang)
        if _fits(job, workers, running, {g.job_id for g in taken}):
            break
    # Hand back what is not needed, the longest-running first: it is the dearest to lose.
    for gang in sorted(taken, key=lambda g: (g.started_at, g.job_id)):
        rest = {g.job_id for g in taken if g is not gang}
        if _fits(job, workers, running, rest):
            taken.remove(gang)
    return Preemption(job.job_id, job.band, tuple(g.job_id for g in taken))
