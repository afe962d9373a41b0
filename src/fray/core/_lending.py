"""Lend while blocked: a job blocked on its own work gives its CPU back to the scheduler until it resumes.

A job that fans out (``create_task`` then ``get``, or submits child jobs then waits for
them) would otherwise hold its CPU while it waits, and on a full cluster the work it waits
for would never start: a deadlock Ray avoids by lending a worker's CPU inside ``ray.get``.
Fray does the same for its own waits, on every backend whose scheduler it controls:

* the places a job blocks on Fray work -- :meth:`JobContext.get` / ``wait``,
  :func:`fray.wait_all` and ``JobHandle.wait``, an actor call's result -- run inside
  :func:`blocked`;
* the backend's runtime installs a :class:`Lender` for the code it runs (:func:`lending_to`:
  per thread context for the local backend, whose jobs are threads; per process for the
  others), which knows how to give the job's CPU back and take it again;
* a wait that lasts more than :data:`LEND_AFTER` lends once, however many of the job's
  threads block; the last to resume takes the CPU back. Taking it back never waits: the
  job may briefly use more than its share (as on Ray), which the scheduler then sees.

Only the CPU is lent, never devices, memory or disk: those stay the job's. Short waits
(a ``get`` of a ready value) lend nothing and cost a lock and a counter.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from fray.core._deadlines import Deadlines

__all__ = ["LEND_AFTER", "Lender", "blocked", "lend_for_this_process", "lending_to", "process_lender"]

#: How long a wait lasts before the job's CPU is lent (shorter waits would cost a round trip for nothing).
LEND_AFTER = 0.05


class Lender(Protocol):
    """What a backend does when its job blocks and resumes (each called once per lending, in turn)."""

    def lend(self) -> None:
        """Give the job's CPU to the scheduler (it is blocked on its own work)."""

    def reclaim(self) -> None:
        """Take it back at once (the job resumed); never waits for room."""


class _Loan:
    """One lender's state: how many threads block on it, and whether its CPU is lent."""

    def __init__(self, lender: Lender) -> None:
        self.lender = lender
        self.blocked = 0
        self.lent = False
        self.generation = 0  # which episode a scheduled lend is for: a stale one does nothing


_loans: contextvars.ContextVar[_Loan | None] = contextvars.ContextVar("fray_lender", default=None)
_process_loan: _Loan | None = None
_lock = threading.Lock()


@contextlib.contextmanager
def lending_to(lender: Lender | None, *, process_wide: bool = False) -> Iterator[None]:
    """Run the block with ``lender`` lending the CPU of the code it runs while it blocks.

    ``process_wide``: for every thread of this process (a backend whose process is one job's);
    otherwise for this context only (the local backend's job threads and what they start with
    a copy of their context).
    """
    if process_wide:
        previous = process_lender()
        lend_for_this_process(lender)
        try:
            yield
        finally:
            lend_for_this_process(previous)
        return
    token = _loans.set(None if lender is None else _Loan(lender))
    try:
        yield
    finally:
        _loans.reset(token)


def lend_for_this_process(lender: Lender | None) -> None:
    """Lend through ``lender`` for every thread of this process (a process that runs one task of a job)."""
    global _process_loan
    _process_loan = None if lender is None else _Loan(lender)


def process_lender() -> Lender | None:
    """The lender :func:`lend_for_this_process` installed, if any."""
    loan = _process_loan
    return None if loan is None else loan.lender


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """Mark the block as waiting on the job's own work: past :data:`LEND_AFTER`, its CPU is lent."""
    loan = _loans.get() or _process_loan
    if loan is None:
        yield
        return
    with _lock:
        loan.blocked += 1
        first = loan.blocked == 1
        if first:
            loan.generation += 1
            generation = loan.generation
    if first:
        _timer.schedule(time.monotonic() + LEND_AFTER, functools.partial(_lend_if_still_blocked, loan, generation))
    try:
        yield
    finally:
        reclaim = False
        with _lock:
            loan.blocked -= 1
            if loan.blocked == 0:
                loan.generation += 1  # a lend still scheduled for this episode is dropped
                reclaim, loan.lent = loan.lent, False
        if reclaim:
            with contextlib.suppress(Exception):  # the job goes on; the scheduler is told at its next report
                loan.lender.reclaim()


def _lend_if_still_blocked(loan: _Loan, generation: int) -> None:
    with _lock:
        if loan.generation != generation or loan.blocked == 0 or loan.lent:
            return
        loan.lent = True
    try:
        loan.lender.lend()
    except Exception:
        with _lock:
            loan.lent = False  # nothing was lent: nothing to take back


_timer = Deadlines("fray-lending")


def _after_fork_in_child() -> None:
    # Another thread may have held the lock at the fork: the child starts afresh (the timer resets itself).
    global _lock, _process_loan
    _lock = threading.Lock()
    _process_loan = None


os.register_at_fork(after_in_child=_after_fork_in_child)
