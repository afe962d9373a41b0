"""Cluster utilisation over time: the controller samples cores, memory and jobs by state into a ring buffer.

A :class:`UtilisationSampler` takes one :class:`Sample` every ``interval`` seconds (5 s by
default) on its own thread and keeps the last ``capacity`` of them (720: one hour) in
memory only: a restarted controller starts a new history, which is what a dashboard
chart of the last hour needs and no more. :meth:`UtilisationSampler.samples` returns
plain data, read by the operator API (:meth:`fray.cluster.server.ops.OpsService.utilisation`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SAMPLE_CAPACITY", "SAMPLE_INTERVAL_SECONDS", "Sample", "UtilisationSampler", "WorkerSample", "make_sample"]

logger = logging.getLogger(__name__)

#: Seconds between two samples.
SAMPLE_INTERVAL_SECONDS = 5.0
#: Samples kept: one hour at the default interval.
SAMPLE_CAPACITY = 720

#: What the sampler reads each time: the workers (as ``fray.cluster.server.store._views.worker_rows``) and jobs by state.
Reader = Callable[[], tuple[list[dict[str, Any]], Mapping[str, int]]]


@dataclass(frozen=True)
class WorkerSample:
    """One live worker at one moment: cores and bytes of memory in use and offered, tasks placed on it."""

    worker_id: str
    cpu_used: float
    cpu_total: float
    ram_used: int
    ram_total: int
    tasks: int


@dataclass(frozen=True)
class Sample:
    """The cluster at one moment (``at``, seconds since the epoch): the live workers' totals, jobs by state, per worker."""

    at: float
    cpu_used: float
    cpu_total: float
    ram_used: int
    ram_total: int
    jobs: tuple[tuple[str, int], ...]
    workers: tuple[WorkerSample, ...]

    def to_dict(self) -> dict[str, Any]:
        """The sample as plain data (what the operator API returns)."""
        return {
            "at": self.at,
            "cpu_used": self.cpu_used,
            "cpu_total": self.cpu_total,
            "ram_used": self.ram_used,
            "ram_total": self.ram_total,
            "jobs": dict(self.jobs),
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "cpu_used": w.cpu_used,
                    "cpu_total": w.cpu_total,
                    "ram_used": w.ram_used,
                    "ram_total": w.ram_total,
                    "tasks": w.tasks,
                }
                for w in self.workers
            ],
        }


def make_sample(at: float, workers: list[dict[str, Any]], jobs: Mapping[str, int]) -> Sample:
    """A :class:`Sample` from worker rows and job counts; lost workers offer nothing and are left out."""
    alive = [
        WorkerSample(
            worker_id=str(w["worker_id"]),
            cpu_used=float(w["cpu_used"]),
            cpu_total=float(w["cpu_total"]),
            ram_used=int(w["ram_used"]),
            ram_total=int(w["ram_total"]),
            tasks=int(w["tasks"]),
        )
        for w in workers
        if w["state"] == "alive"
    ]
    return Sample(
        at=at,
        cpu_used=sum(w.cpu_used for w in alive),
        cpu_total=sum(w.cpu_total for w in alive),
        ram_used=sum(w.ram_used for w in alive),
        ram_total=sum(w.ram_total for w in alive),
        jobs=tuple(sorted((str(k), int(v)) for k, v in jobs.items())),
        workers=tuple(alive),
    )


class UtilisationSampler:
    """A ring buffer of the last ``capacity`` samples, filled every ``interval`` seconds by :meth:`start`."""

    def __init__(
        self,
        read: Reader,
        *,
        interval: float = SAMPLE_INTERVAL_SECONDS,
        capacity: int = SAMPLE_CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1 or interval <= 0:
            raise ValueError(f"a sampler needs capacity >= 1 and interval > 0, not {capacity} and {interval}")
        self.interval = interval
        self.capacity = capacity
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: collections.deque[Sample] = collections.deque(maxlen=capacity)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        """Take one sample now and keep it (the oldest goes once ``capacity`` are kept)."""
        workers, jobs = self._read()
        taken = make_sample(self._clock(), workers, jobs)
        with self._lock:
            self._samples.append(taken)
        return taken

    def samples(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The kept samples taken after ``since``, oldest first, as plain data."""
        with self._lock:
            kept = list(self._samples)
        return [s.to_dict() for s in kept if s.at > since]

    def start(self) -> None:
        """Sample now, then every ``interval`` seconds, on a background thread."""
        self._thread = threading.Thread(target=self._loop, name="fray-utilisation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sample()
            except Exception:  # a store that cannot be read now (closing, busy) leaves a gap in the chart, no more
                logger.debug("utilisation sample failed", exc_info=True)
            self._stopping.wait(self.interval)
