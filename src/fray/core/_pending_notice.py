"""No silent waits: a job still PENDING after a while says so, once, on the driver's stderr, with the reason.

Jobs that come due together and wait for the same reason share one line that counts them.

Every backend calls :func:`watch` with each job it submits; the backend's only part is
its handle's ``info()`` (is the job pending, and why). One daemon thread per process
looks at each job once when it has waited ``FRAY_PENDING_NOTICE_SECONDS`` (10 s unless
set; ``off`` turns the notice off) and prints one line for a job still PENDING. Jobs
that started (or finished) by then cost one batched status read (the backend's
``_fray_wait_some`` with no wait, as ``wait_all`` uses) and are forgotten. Jobs are held
weakly: a job whose handle the program dropped has nobody waiting on it here, and is not looked at.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fray.errors import ConfigError

if TYPE_CHECKING:
    from fray.job import JobHandle, JobStatus

__all__ = ["ENV_VAR", "notice_seconds", "watch"]

ENV_VAR = "FRAY_PENDING_NOTICE_SECONDS"
_DEFAULT_SECONDS = 10.0

# A pending job whose backend has no reason yet (a scheduling pass still to come) is looked at again
# this often, this many times, before the notice goes out without one: a wait must not stay silent.
_NO_REASON_RECHECK = 1.0
_NO_REASON_TRIES = 5

# Jobs looked at in one go (one batched status read per backend).
_BATCH = 500

# Jobs named in a notice about several that wait for the same reason.
_NAMED = 3
# How much longer than its due time a job waits for the jobs due soon after it (see _gathered_by).
_GATHER_FRACTION = 0.2
_GATHER_MAX = 2.0

# The client that submitted a job, weakly (None: not known).
_Owner = Callable[[], Any] | None
# (when due, sequence, the job (weakly), submitted at, looks so far, owner)
_Entry = tuple[float, int, "weakref.ref[JobHandle]", float, int, _Owner]


def notice_seconds() -> float | None:
    """After how many seconds a pending job says so (``FRAY_PENDING_NOTICE_SECONDS``); None when turned off."""
    global _last
    raw = os.environ.get(ENV_VAR, "")
    last = _last
    if raw == last[0]:  # read at every submit: parsed only when it changed
        return last[1]
    seconds = _parse_seconds(raw)
    _last = (raw, seconds)
    return seconds


_last: tuple[str, float | None] = ("", _DEFAULT_SECONDS)  # the setting last read, and what it means


def _parse_seconds(raw: str) -> float | None:
    text = raw.strip()
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
        self._due: list[_Entry] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, job: JobHandle, after: float, owner: _Owner) -> None:
        now = time.monotonic()
        with self._lock:
            # Weakly: a handle kept here for the notice's delay kept every quick job of that long alive
            # (thousands of handles and their engine's objects, and the garbage collector's work on them).
            # A job whose handle was dropped has nobody waiting on it through this process.
            entry = (now + after, next(self._seq), weakref.ref(job), now, 0, owner)
            heapq.heappush(self._due, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fray-pending-notice", daemon=True)
                self._thread.start()
            elif self._due[0] is entry:
                # Only a job due before every other changes when the thread must wake. Jobs submitted
                # one after another are due in that order: waking the thread for each would cost a
                # thread switch per submit, a tenth of a quick Ray task.
                self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._due or _gathered_by(self._due[0]) > time.monotonic():
                    self._lock.wait(None if not self._due else _gathered_by(self._due[0]) - time.monotonic())
                now = time.monotonic()
                due: list[_Entry] = []
                while self._due and self._due[0][0] <= now and len(due) < _BATCH:
                    due.append(heapq.heappop(self._due))
            # A job whose client was shut down (or dropped) has nobody waiting on it: it is not looked at,
            # so no thread of a finished script reaches a backend it stopped.
            live = [(job, entry) for entry in due if _open(entry[5]) and (job := entry[2]()) is not None]
            again = _look([(job, submitted, tries) for job, (_, _, _, submitted, tries, _) in live])
            owners = {id(job): entry[5] for job, entry in live}
            if again:
                with self._lock:
                    for job, submitted, tries in again:
                        when = time.monotonic() + _NO_REASON_RECHECK
                        entry = (when, next(self._seq), weakref.ref(job), submitted, tries + 1, owners[id(job)])
                        heapq.heappush(self._due, entry)


def _gathered_by(entry: _Entry) -> float:
    # A burst of submits comes due over as long as the burst took: waiting a fifth of the notice's
    # delay longer (at most 2 s) lets its jobs share one line instead of one line per wake-up.
    due, submitted = entry[0], entry[3]
    return due + min(_GATHER_MAX, _GATHER_FRACTION * max(0.0, due - submitted))


def _open(owner: _Owner) -> bool:
    if owner is None:
        return True
    client = owner()
    return client is not None and not getattr(client, "closed", False)


def _statuses(jobs: list[JobHandle]) -> list[JobStatus | None]:
    """Each job's status, read in one go where the backend can (its ``_fray_wait_some`` with no wait)."""
    from fray.job import waiter_groups

    statuses: list[JobStatus | None] = [None] * len(jobs)
    for wait_some, indices in waiter_groups(jobs):
        try:
            found = wait_some([jobs[i] for i in indices], 0.0)
        except Exception:  # the backend is gone: nobody is waiting to be told
            continue
        for index, status in zip(indices, found, strict=True):
            statuses[index] = status
    return statuses


def _look(due: list[tuple[JobHandle, float, int]]) -> list[tuple[JobHandle, float, int]]:
    """Print the notice for the jobs still pending; the ones to look at again (pending, no reason yet).

    Most jobs started long before they are due: one batched status read clears them, and
    only a job still PENDING costs an ``info()``. Jobs due together that wait for the same
    reason (a burst nothing can place yet) share one line, which counts and names them: a
    thousand identical lines would bury what they say.
    """
    from fray.job import JobStatus

    again: list[tuple[JobHandle, float, int]] = []
    waiting: dict[str, tuple[list[str], float]] = {}  # reason -> (job ids, longest wait)
    statuses = _statuses([job for job, _, _ in due])
    for (job, submitted, tries), status in zip(due, statuses, strict=True):
        if status != JobStatus.PENDING:
            continue
        try:
            info = job.info()
        except Exception:  # the backend is gone or the job with it: nobody is waiting to be told
            continue
        if info.status != JobStatus.PENDING:
            continue
        if not info.pending_reason and tries < _NO_REASON_TRIES:
            again.append((job, submitted, tries))
            continue
        why = info.pending_reason or "the backend gives no reason"
        ids, waited = waiting.get(why, ([], 0.0))
        ids.append(info.job_id)
        waiting[why] = (ids, max(waited, time.monotonic() - submitted))
    for why, (ids, waited) in waiting.items():
        with contextlib.suppress(OSError, ValueError):  # stderr closed at interpreter exit
            print(_notice(ids, waited, why), file=sys.stderr, flush=True)
    return again


def _notice(job_ids: list[str], waited: float, why: str) -> str:
    if len(job_ids) == 1:
        return f"fray: job {job_ids[0]!r} is still pending after {waited:.0f}s: {why}"
    named = ", ".join(repr(job_id) for job_id in job_ids[:_NAMED])
    more = f" and {len(job_ids) - _NAMED} more" if len(job_ids) > _NAMED else ""
    return f"fray: {len(job_ids)} jobs are still pending after {waited:.0f}s: {why} ({named}{more})"


_WATCHER = _Watcher()


_warned: set[str] = set()


def watch(job: JobHandle, client: object | None = None) -> None:
    """Have ``job`` say why on stderr, once, if it is still PENDING after ``FRAY_PENDING_NOTICE_SECONDS``.

    ``client`` is the client that submitted it: once that is shut down (its ``closed``) or
    gone, the job is no longer looked at.

    Never raises: it runs after the job was submitted, so a bad setting is named once on
    stderr and the default used, rather than failing a submit whose job already runs.
    """
    try:
        after = notice_seconds()
    except ConfigError as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            print(f"fray: {exc}; using {_DEFAULT_SECONDS:g}", file=sys.stderr, flush=True)
        after = _DEFAULT_SECONDS
    if after is not None:
        _WATCHER.add(job, after, None if client is None else weakref.ref(client))
