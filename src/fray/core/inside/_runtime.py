"""Per-job runtime state of in-process jobs: the termination flag, and stopping a job's threads.

A job that runs as threads of this process is stopped two ways at once:

* :func:`check_terminated`, called by every public Fray entry point, raises
  :class:`~fray.errors.JobTerminated` in a thread whose job was terminated;
* :class:`StoppableRun` raises it *asynchronously* in the thread running the job's
  code (``PyThreadState_SetAsyncExc``), so a pure-Python loop that never calls Fray
  stops too. The exception lands at the thread's next Python instruction; a thread
  blocked inside one C call (``time.sleep``, a socket read, a lock) gets it when that
  call returns.
"""

from __future__ import annotations

import contextvars
import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from fray.errors import JobTerminated

__all__ = ["StoppableRun", "ThreadStopped", "check_terminated", "terminating_on"]

T = TypeVar("T")

_terminated: contextvars.ContextVar[tuple[str, threading.Event] | None] = contextvars.ContextVar(
    "fray_terminated", default=None
)


def check_terminated() -> None:
    """Raise :class:`JobTerminated` if the job this thread runs for was terminated.

    Every public entry point of the local backend calls this, so a terminated job
    that catches the asynchronous stop (see :class:`StoppableRun`) still stops at its
    next Fray call.
    """
    current = _terminated.get()
    if current is not None and current[1].is_set():
        raise JobTerminated(f"job {current[0]!r} was terminated; stopping at this Fray call")


@contextmanager
def terminating_on(job_id: str, event: threading.Event) -> Iterator[None]:
    """Within the block, :func:`check_terminated` raises once ``event`` is set."""
    token = _terminated.set((job_id, event))
    try:
        yield
    finally:
        _terminated.reset(token)


class ThreadStopped(JobTerminated):
    """The :class:`JobTerminated` raised asynchronously in a stopped job's thread.

    CPython raises an asynchronous exception by instantiating its class with no
    arguments, so the message is fixed here.
    """

    def __init__(self, message: str = "this job was terminated; Fray stopped its thread") -> None:
        super().__init__(message)


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def _raise_in(ident: int, exc_type: type[BaseException] | None) -> None:
    # A NULL exception (an empty py_object) clears one that is still pending.
    _set_async_exc(ident, ctypes.py_object(exc_type) if exc_type is not None else ctypes.py_object())


class StoppableRun:
    """Runs code on the calling thread so that another thread can stop it with :class:`ThreadStopped`.

    One instance per job thread (a replica, an actor). :meth:`run` marks the thread
    as running the job's code while ``fn`` runs; :meth:`stop` raises
    :class:`ThreadStopped` in that thread if, and only if, it is marked at that
    moment. Marking, unmarking and stopping happen under one lock, and an exception
    still pending when ``fn`` ends is cleared before the mark goes, so the exception
    never reaches a thread that has moved on (to Fray's bookkeeping or to another
    job). At most one exception is raised per :meth:`run`, which the unmarking code
    relies on: wherever that one lands, it is caught once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None  # the thread running fn, while it runs
        self._stopped = False
        self._raised = False  # an exception was raised in the current run

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, stoppable; raises :class:`ThreadStopped` at once if already stopped."""
        try:
            self._mark()
            return fn(*args, **kwargs)
        finally:
            # The stop may land anywhere from here on, even inside _unmark, but only once
            # per run: so one retry is all the unmarking ever needs.
            while True:
                try:
                    self._unmark()
                    break
                except ThreadStopped:
                    continue

    def _mark(self) -> None:
        with self._lock:
            if self._stopped:
                raise ThreadStopped()
            self._ident = threading.get_ident()
            self._raised = False

    def _unmark(self) -> None:
        with self._lock:
            ident, self._ident = self._ident, None
            if ident is not None and self._raised:
                _raise_in(ident, None)

    def stop(self) -> bool:
        """Stop the code running under :meth:`run` now, and any later :meth:`run`; True if code was running."""
        with self._lock:
            self._stopped = True
            ident = self._ident
            if ident is None or self._raised:
                return ident is not None
            if ident == threading.get_ident():
                # Code stopping its own job: it is told at its next Fray call, not mid-bookkeeping.
                return True
            self._raised = True
            _raise_in(ident, ThreadStopped)
            return True
