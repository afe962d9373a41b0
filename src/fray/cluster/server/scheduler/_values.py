"""The scheduler's values: what a pass is given (pending jobs, running tasks, a policy) and what it decides.

Apart from :mod:`fray.cluster.server.scheduler` itself so that its helpers (the kept queue of
:mod:`._queue`, the preemption choice of :mod:`._preempt`) can name them without importing the
package that imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fray.cluster.protocol.capacity import TaskResources
from fray.cluster.server.credit import CreditPolicy
from fray.errors import ConfigError

__all__ = ["Assignment", "PendingJob", "PendingReason", "RunningTask", "SchedulerPolicy", "SchedulingDecision"]


@dataclass(frozen=True)
class PendingJob:
    """The scheduler's view of a job waiting to be placed."""

    job_id: str
    user: str
    replicas: int
    resources: TaskResources
    submitted_at: float
    #: Priority band: 1 production, 2 interactive, 3 batch. A pass places better (lower) bands first.
    band: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ConfigError(f"PendingJob(replicas={self.replicas!r}) must be a whole number >= 1")
        if self.band not in (1, 2, 3):
            raise ConfigError(f"PendingJob(band={self.band!r}) must be 1, 2 or 3")

    @property
    def task_count(self) -> int:
        """How many tasks the job runs: replicas, times hosts per slice for a TPU job."""
        return self.replicas * self.resources.hosts_per_replica


@dataclass(frozen=True)
class RunningTask:
    """A task that holds capacity on a worker (assigned or running) and is billed to ``user``.

    ``job_id``, ``band`` and ``started_at`` (when its attempt was assigned) say which gang it
    belongs to and how much it would cost to preempt (:mod:`fray.cluster.server.scheduler._preempt`).
    """

    worker_id: str
    user: str
    resources: TaskResources
    job_id: str = ""
    band: int = 2
    started_at: float = 0.0


@dataclass(frozen=True)
class SchedulerPolicy:
    """Tunable knobs of :func:`schedule`.

    ``reserve_after_seconds``: how long a placeable job may be passed over by backfill
    before it reserves workers (None: never reserve, pure backfill).
    ``bid_horizon_seconds``: how far ahead a user's running work is charged against
    their bid (see :func:`fray.cluster.server.credit.bid`).
    """

    reserve_after_seconds: float | None = 300.0
    bid_horizon_seconds: float = 600.0
    credit: CreditPolicy = field(default_factory=CreditPolicy)


@dataclass(frozen=True)
class Assignment:
    """Place every task of ``job_id``: ``worker_ids[i]`` runs task ``i``.

    For a TPU job task ``i`` is host ``i % hosts`` of replica ``i // hosts``, and the
    hosts of one replica are the hosts of one slice in ``tpu-worker-id`` order.
    """

    job_id: str
    worker_ids: tuple[str, ...]


@dataclass(frozen=True)
class PendingReason:
    """Why a job is still pending. ``satisfiable`` is False when no registered worker set could ever run it."""

    job_id: str
    message: str
    satisfiable: bool


@dataclass(frozen=True)
class SchedulingDecision:
    """The result of one scheduling pass.

    ``assignments`` are in the order they were decided; ``pending`` has a reason for
    every job not assigned; ``bids`` is each user's bid at the start of the pass.
    """

    assignments: tuple[Assignment, ...]
    pending: Mapping[str, PendingReason]
    bids: Mapping[str, float]
