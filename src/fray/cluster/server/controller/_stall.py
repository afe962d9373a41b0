"""Noticing that the controller process itself stood still (SIGSTOP, a long GC or swap stall, a VM pause).

While the controller is stopped it hears no heartbeat, yet its clock runs on: on resume every
worker's last heartbeat looks older than the worker timeout and, unless told, the controller
would declare them all lost and reschedule every task, although it was the controller that
was silent. :class:`StallWatch` measures the gaps between the ticks of a small thread that does
nothing else (so a slow scheduling pass, during which the server threads still hear
heartbeats, is not taken for a stall); the scheduling loop asks it before expiring workers and,
after a stall, gives every worker a full timeout from the resume.
"""

from __future__ import annotations

import threading
import time

__all__ = ["StallWatch"]


def _now() -> float:
    # CLOCK_BOOTTIME also counts a suspended machine (a laptop lid, a suspended VM), which
    # CLOCK_MONOTONIC does not; both ignore changes to the wall clock.
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


class StallWatch:
    """Reports gaps longer than ``threshold`` seconds in the process's own progress.

    A thread ticks every ``interval`` seconds; :meth:`take` returns the longest gap seen since
    the last call (counting the time since the last tick, so the caller never runs ahead of a
    tick that has not happened yet after a resume), or 0.0 if none exceeded ``threshold``.
    """

    def __init__(self, threshold: float, interval: float = 0.1) -> None:
        self.threshold = threshold
        self._interval = interval
        self._lock = threading.Lock()
        self._last = _now()
        self._longest = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start ticking."""
        with self._lock:
            self._last = _now()
            self._longest = 0.0
        self._thread = threading.Thread(target=self._tick_loop, name="fray-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _gap(self) -> float:
        """The time since the last tick, which becomes now (call with ``_lock`` held)."""
        now = _now()
        gap = now - self._last
        self._last = now
        return gap

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self._interval):
            with self._lock:
                self._longest = max(self._longest, self._gap())

    def take(self) -> float:
        """The longest stall since the last call (0.0 if none was longer than ``threshold``)."""
        with self._lock:
            longest = max(self._longest, self._gap())
            self._longest = 0.0
        return longest if longest > self.threshold else 0.0
