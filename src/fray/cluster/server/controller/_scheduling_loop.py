"""The controller's scheduling thread: expire silent workers, time out jobs, accrue credit, run scheduling passes.

:class:`~fray.cluster.server.controller.ControllerService` runs one :class:`SchedulingLoop`. A pass
runs soon after something kicks the loop (a submit, an exit, a worker joining) -- at once
when the cluster was idle -- and at least every quarter of the worker timeout otherwise. While the store cannot be written, the loop
only probes whether it can be again (see :class:`~fray.cluster.server.store._database.ReadOnlyMode`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sized

from fray.cluster.protocol.records import Effects
from fray.cluster.server.controller._stall import StallWatch
from fray.cluster.server.store import ClusterStore
from fray.cluster.server.store._database import ReadOnlyMode
from fray.errors import StorageError

__all__ = ["LEASE_FRACTION", "SchedulingLoop"]

# The controller's log lines keep the controller's name, wherever they are written from.
logger = logging.getLogger("fray.cluster.server.controller")

#: A worker's tasks may run this fraction of the worker timeout without the worker
#: renewing its lease: they are dead before the controller can declare the worker lost.
LEASE_FRACTION = 0.75
# A scheduling pass waits this long after the event that wakes it, so a burst costs one pass.
_DEBOUNCE_SECONDS = 0.002
_DEBOUNCE_MAX = 0.05
# ... unless the cluster was idle: the last pass placed nothing and took less than this (no queue to
# speak of). Then the pass runs at once, so that a lone submit is not kept waiting; a burst's later
# events gather while it runs.
_IDLE_PASS_SECONDS = 0.001
# Expiring silent workers and timing out jobs run at most this often (monotonic), not on every pass: each is a
# query, and on a small busy cluster passes come one per freed slot, every few milliseconds. Both have
# second-scale deadlines, so this delays neither noticeably.
_HOUSEKEEPING_SECONDS = 0.1


class SchedulingLoop:
    """The thread that runs the controller's periodic work; ``kick`` wakes it for a pass soon.

    ``apply`` acts on the effects of expiring workers, ``schedule`` runs one scheduling pass
    at the given time, and ``storage_failed`` is told when the store could not be written.
    """

    def __init__(
        self,
        store: ClusterStore,
        storage: ReadOnlyMode,
        *,
        worker_timeout: float,
        clock: Callable[[], float],
        kick: threading.Event,
        stopping: threading.Event,
        apply: Callable[[Effects], None],
        schedule: Callable[[float], Sized],
        storage_failed: Callable[[StorageError], None],
    ) -> None:
        self._store = store
        self._storage = storage
        self._worker_timeout = worker_timeout
        self._clock = clock
        self._kick = kick
        self._stopping = stopping
        self._apply = apply
        self._schedule = schedule
        self._storage_failed = storage_failed
        self._thread: threading.Thread | None = None
        self._last_pass = 0.0  # seconds the last scheduling pass took (sets the debounce)
        self._idle = True  # the last pass placed nothing, cheaply: the next event runs one at once
        # A stall of the controller itself longer than this could make a worker's heartbeat look
        # older than the timeout although the worker still holds its lease (see _run).
        self._stalls = StallWatch(threshold=worker_timeout * (1 - LEASE_FRACTION))

    def start(self) -> None:
        """Start the thread (and the watch for stalls of the whole process)."""
        self._stalls.start()
        self._thread = threading.Thread(target=self._run, name="fray-scheduler", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait (up to 5 s) for the thread to end once ``stopping`` is set and ``kick`` too."""
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._stalls.stop()

    def _run(self) -> None:
        last_accrual = 0.0
        last_housekeeping = -_HOUSEKEEPING_SECONDS
        while not self._stopping.is_set():
            if self._kick.wait(timeout=min(1.0, self._worker_timeout / 4)) and not self._idle:
                # Let the events of a burst (submits, exits) gather into one pass: the dearer
                # the last pass (a long queue), the longer, so a pass is never wasted on one event.
                self._stopping.wait(min(_DEBOUNCE_MAX, max(_DEBOUNCE_SECONDS, 2 * self._last_pass)))
            self._kick.clear()
            if self._stopping.is_set():
                return
            try:
                now = self._clock()
                if self._storage.reason:
                    self._try_writable(now)
                    continue
                if time.monotonic() - last_housekeeping >= _HOUSEKEEPING_SECONDS:
                    last_housekeeping = time.monotonic()
                    self._housekeeping(now)
                if now - last_accrual >= 5.0:
                    self._store.accrue_credits(now)
                    last_accrual = now
                started = time.perf_counter()
                assigned = self._schedule(now)
                self._last_pass = time.perf_counter() - started
                self._idle = not assigned and self._last_pass < _IDLE_PASS_SECONDS
            except StorageError as exc:
                self._storage_failed(exc)
            except Exception:  # the loop must survive anything one pass hits
                logger.exception("scheduling pass failed")

    def _housekeeping(self, now: float) -> None:
        """Expire silent workers and time out jobs (see _HOUSEKEEPING_SECONDS)."""
        self._forgive_stall()  # after ``now``: a stall in between is seen here
        expired = self._store.expire_workers(now, self._worker_timeout)
        for worker_id in expired.lost_workers:
            logger.warning("worker %s is lost: no heartbeat for more than %gs", worker_id, self._worker_timeout)
        self._apply(expired)
        # Jobs past their timeout (one indexed query; nothing when none has one).
        self._apply(self._store.time_out_jobs(now))

    def _forgive_stall(self) -> None:
        # The controller itself stood still (SIGSTOP, GC, swap, a VM pause) and heard nobody
        # meanwhile: every worker gets a full timeout from the resume, as after a restart, so
        # only those that stay silent after it are lost. A worker that was cut off from us
        # meanwhile has stopped its own tasks (its lease) and reports them lost on its next call.
        stalled = self._stalls.take()
        if stalled:
            refreshed = self._store.refresh_heartbeats(self._clock())
            logger.warning(
                "the controller stood still for %.1fs (more than %.1fs); %d alive workers get %gs from now to be heard",
                stalled,
                self._stalls.threshold,
                refreshed,
                self._worker_timeout,
            )

    def _try_writable(self, now: float) -> None:
        # Heartbeats could not be recorded meanwhile: give every worker a full timeout again
        # (as after a restart), so no worker -- and none of its finished jobs -- is declared
        # lost for the controller's own outage. That write is also the probe.
        if self._storage.try_writable(lambda: self._store.refresh_heartbeats(now)):
            logger.warning("the controller's storage is writable again; leaving read-only mode")
            self._kick.set()
