"""Per-job runtime state that travels with a job's context: the termination flag."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fray.errors import JobTerminated

_terminated: contextvars.ContextVar[tuple[str, threading.Event] | None] = contextvars.ContextVar(
    "fray_terminated", default=None
)


def check_terminated() -> None:
    """Raise :class:`JobTerminated` if the job this thread runs for was terminated.

    Threads cannot be killed safely, so a terminated in-process job is stopped at its
    next Fray call instead; every public entry point of the local backend calls this.
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
