"""No silent waits: a job still PENDING after a while says so, once, on the driver's stderr, with the reason.

Every backend calls :func:`watch` with each job it submits; the backend's only part is
its handle's ``info()`` (is the job pending, and why). One daemon thread per process
looks at each job once when it has waited ``FRAY_PENDING_NOTICE_SECONDS`` (10 s unless
set; ``off`` turns the notice off) and prints one line for a job still PENDING. A job
that started (or finished) by then costs that single look and is forgotten.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from fray.errors import ConfigError

if TYPE_CHECKING:
    from fray.job import JobHandle

__all__ = ["ENV_VAR", "notice_seconds", "watch"]

ENV_VAR = "FRAY_PENDING_NOTICE_SECONDS"
_DEFAULT_SECONDS = 10.0

# A pending job whose backend has no reason yet (a scheduling pass still to come) is looked at again
# this often, this many times, before the notice goes out without one: a wait must not stay silent.
_NO_REASON_RECHECK = 1.0
_NO_REASON_TRIES = 5


def notice_seconds() -> float | None:
    """After how many seconds a pending job says so (``FRAY_PENDING_NOTICE_SECONDS``); None when turned off."""
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return _DEFAULT_SECONDS
    if text.lower() in ("off", "never", "none"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses nan
        raise ConfigError(f"{ENV_VAR}={text!r} must be a number of seconds >= 0, or 'off'")
    return seconds


class _Watcher:
    """The process's one thread that looks at submitted jobs when they are due."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, JobHandle, float, int]] = []  # (when, seq, job, submitted, tries)
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, job: JobHandle, after: float) -> None:
        now = time.monotonic()
        with self._lock:
            heapq.heappush(self._due, (now + after, next(self._seq), job, now, 0))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fray-pending-notice", daemon=True)
                self._thread.start()
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._lock.wait(None if not self._due else self._due[0][0] - time.monotonic())
                _, _, job, submitted, tries = heapq.heappop(self._due)
            again = _look(job, submitted, tries)
            if again:
                with self._lock:
                    heapq.heappush(
                        self._due, (time.monotonic() + _NO_REASON_RECHECK, next(self._seq), job, submitted, tries + 1)
                    )


def _look(job: JobHandle, submitted: float, tries: int) -> bool:
    """Print the notice if ``job`` is still pending; True to look again later (pending, no reason yet)."""
    from fray.job import JobStatus

    try:
        info = job.info()
    except Exception:  # the backend is gone or the job with it: nobody is waiting to be told
        return False
    if info.status != JobStatus.PENDING:
        return False
    if not info.pending_reason and tries < _NO_REASON_TRIES:
        return True
    waited = time.monotonic() - submitted
    why = info.pending_reason or "the backend gives no reason"
    with contextlib.suppress(OSError, ValueError):  # stderr closed at interpreter exit
        print(f"fray: job {info.job_id!r} is still pending after {waited:.0f}s: {why}", file=sys.stderr, flush=True)
    return False


_WATCHER = _Watcher()


def watch(job: JobHandle) -> None:
    """Have ``job`` say why on stderr, once, if it is still PENDING after ``FRAY_PENDING_NOTICE_SECONDS``."""
    after = notice_seconds()
    if after is not None:
        _WATCHER.add(job, after)
