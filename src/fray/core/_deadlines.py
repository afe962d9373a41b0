"""One daemon thread that runs actions at their deadlines: the process's timers share this one form.

Used for ``.remote()`` call timeouts (:mod:`fray.cluster.rpc`), job timeouts
(:mod:`fray.core._lifecycle`) and CPU lending (:mod:`fray.core._lending`). Each user
is a module-level :class:`Deadlines`; its thread starts with the first action and is
started again in a forked child, which forgets the parent's actions (they act on the
parent's calls, jobs and waits).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["Deadlines"]

_log = logging.getLogger(__name__)


class Deadlines:
    """Runs each scheduled action once, in this object's one daemon thread, when its deadline passed."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also after a fork: another thread may have held the lock, or been the timer, at the fork.
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, deadline: float, action: Callable[[], object]) -> None:
        """Run ``action`` once ``deadline`` (``time.monotonic()``) passed; it must not block for long."""
        with self._cond:
            entry = (deadline, next(self._seq), action)
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
                self._thread.start()
            elif self._heap[0] is entry:  # only an action due before every other changes when to wake
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, action = heapq.heappop(self._heap)
            try:
                action()
            except Exception:  # one action's failure must not stop the others
                _log.exception("a scheduled action of %s failed", self._thread_name)
