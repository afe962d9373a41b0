"""The pending queue as a scheduling pass reads it when it is kept sorted, and the reasons such a pass gives.

A controller with thousands of jobs waiting and a slot freeing every few milliseconds cannot afford
a pass that sorts the queue and gives every job a new reason object each time: the cost per placed
job would grow with the backlog. It keeps the queue sorted per user and counted per *shape* (the
resources and replica count that decide where a job fits) instead, and hands a pass a
:class:`PendingQueue`; the pass stops once every shape left is settled (see
:func:`fray.cluster.server.scheduler.schedule_queue`), and its reasons come back as a
:class:`PendingReasons`: the jobs it looked at one by one, and one reason per shape for the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass

from fray.cluster.protocol.capacity import TaskResources
from fray.cluster.server.scheduler._values import PendingJob, PendingReason

__all__ = ["PendingQueue", "PendingReasons", "Shape", "queue_order", "shape_of"]

#: What decides where a job fits, and so what its jobs share when they cannot: resources and replicas.
Shape = tuple[TaskResources, int]


def shape_of(job: PendingJob) -> Shape:
    """The shape of ``job``."""
    return (job.resources, job.replicas)


def queue_order(job: PendingJob) -> tuple[int, float, str]:
    """Where a job stands in its user's queue: best band first, then submission order, ties by id."""
    return (job.band, job.submitted_at, job.job_id)


@dataclass(frozen=True)
class PendingQueue:
    """A consistent view of the pending jobs for one pass.

    ``jobs``: every pending job by id; ``by_user``: each user's jobs best band first, then in
    submission order (:func:`queue_order`); ``shapes``: for each shape, how many of ``jobs`` have it and the
    earliest ``submitted_at`` among them (which says whether any of them may reserve workers).
    """

    jobs: Mapping[str, PendingJob]
    by_user: Mapping[str, Sequence[PendingJob]]
    shapes: Mapping[Shape, tuple[int, float]]

    @classmethod
    def of(cls, pending: Sequence[PendingJob]) -> PendingQueue:
        """The view of ``pending`` built from scratch (what a controller keeps up to date instead)."""
        by_user: dict[str, list[PendingJob]] = {}
        shapes: dict[Shape, tuple[int, float]] = {}
        for job in sorted(pending, key=queue_order):
            by_user.setdefault(job.user, []).append(job)
            count, oldest = shapes.get(shape_of(job), (0, job.submitted_at))
            shapes[shape_of(job)] = (count + 1, min(oldest, job.submitted_at))
        return cls({job.job_id: job for job in pending}, by_user, shapes)


class PendingReasons(Mapping[str, "PendingReason"]):
    """Every unplaced job's reason after a pass that stopped early: looked-at jobs one by one, the rest by shape.

    As a mapping it is exactly what a full pass's ``SchedulingDecision.pending`` would be (a job of
    ``jobs`` not in ``placed``: its own reason if the pass looked at it, else its shape's); reading
    it all costs one step per job, so a caller that can should use :attr:`explicit` and
    :attr:`by_shape` instead (every job of ``jobs`` neither placed nor in :attr:`explicit` has
    the reason of its shape in :attr:`by_shape`, whose ``job_id`` is empty).
    """

    def __init__(
        self,
        jobs: Mapping[str, PendingJob],
        placed: Set[str],
        explicit: Mapping[str, PendingReason],
        by_shape: Mapping[Shape, PendingReason],
    ) -> None:
        self.jobs = jobs
        self.placed = placed
        #: The reasons of the jobs the pass looked at (or settled) one by one.
        self.explicit = explicit
        #: The reason of every other unplaced job, by its shape (``job_id`` is "").
        self.by_shape = by_shape

    def __getitem__(self, job_id: str) -> PendingReason:
        found = self.explicit.get(job_id)
        if found is not None:
            return found
        job = self.jobs.get(job_id)
        if job is None or job_id in self.placed:
            raise KeyError(job_id)
        shared = self.by_shape[shape_of(job)]
        return type(shared)(job_id, shared.message, shared.satisfiable)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.explicit or (job_id in self.jobs and job_id not in self.placed)

    def __iter__(self) -> Iterator[str]:
        for job_id in self.jobs:
            if job_id not in self.placed:
                yield job_id

    def __len__(self) -> int:
        return len(self.jobs) - len(self.placed & self.jobs.keys())
