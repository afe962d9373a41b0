"""Group commit: the writes of several concurrent operations committed in one SQLite transaction.

An operation changes its in-memory state under its own lock, queues the statements that
record the change (:meth:`GroupCommit.add`), releases its lock and then waits in
:meth:`GroupCommit.flush` until they are committed; only then does it answer. The first
waiter commits everything queued so far in one transaction (it is the *leader*); the
others wait for it, and what is queued meanwhile goes into the next transaction. So an
answered operation is committed, as with one transaction per operation, while a busy
queue pays one commit for many operations.

Statements are committed in the order they were queued, so a later operation that saw
an earlier one's change (a pop of a pushed item) is never committed without it. When a
commit fails, every operation queued up to then fails with the error, and the group
stays *broken* (refusing new statements) until its owner has reloaded its memory from
the database and called :meth:`GroupCommit.recovered`: memory may hold changes that
never reached the disk.
"""

from __future__ import annotations

import copy
import sqlite3
import threading
from typing import Any

__all__ = ["GroupCommit", "Statement"]

#: One SQL statement and its parameters.
Statement = tuple[str, tuple[Any, ...]]

# Failed ranges remembered so that a late flush of a failed write still raises.
_FAILURES_KEPT = 64


class GroupCommit:
    """Statements queued by many threads, committed together through ``store.write_with``."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._pending: list[Statement] = []
        self._queued = 0  # writes queued so far (a write: the statements of one add())
        self._settled = 0  # writes committed or failed so far
        self._committing = False
        self._failures: list[tuple[int, int, BaseException]] = []  # (first, last) writes of a failed commit, and why
        self._broken: BaseException | None = None
        self.commits = 0  # transactions committed (for tests and benchmarks)

    @property
    def broken(self) -> bool:
        """True after a failed commit, until :meth:`recovered`."""
        with self._cond:
            return self._broken is not None

    @property
    def waiting(self) -> int:
        """Writes queued and not yet committed (or failed)."""
        with self._cond:
            return self._queued - self._settled

    def add(self, statements: list[Statement]) -> int:
        """Queue one write (committed by the next :meth:`flush`); its ticket. Refused while the group is broken."""
        if not statements:
            return 0
        with self._cond:
            if self._broken is not None:
                raise copy.copy(self._broken)
            self._pending.extend(statements)
            self._queued += 1
            return self._queued

    def flush(self, mine: int = 0) -> None:
        """Return once every write queued before this call is settled; raise if the write ``mine`` failed.

        ``mine`` is the ticket of the caller's last write (0: it wrote nothing). A caller
        that only read waits too, so that it does not answer with what may never be
        committed; if that commit fails, its answer is as if read just before it.
        """
        with self._cond:
            target = self._queued
            while self._settled < target:
                if self._committing:
                    self._cond.wait()
                else:
                    self._lead()
            for first, last, error in self._failures:
                if first <= mine <= last:
                    raise copy.copy(error)  # a copy each: several threads raise it at once

    def recovered(self) -> None:
        """The owner reloaded its state from the database: accept writes again."""
        with self._cond:
            self._broken = None

    def _lead(self) -> None:
        """Commit everything queued (``_cond`` held on entry and exit, released while writing)."""
        batch, last = self._pending, self._queued
        first = self._settled + 1
        self._pending = []
        self._committing = True
        self._cond.release()
        error: BaseException | None = None
        try:
            self._store.write_with(lambda cur: _run(cur, batch))
        except BaseException as exc:  # every waiter of this commit gets the error (and nobody waits for ever)
            error = exc
        finally:
            self._cond.acquire()
        self._committing = False
        if error is None:
            self.commits += 1
        else:
            # Writes queued while this one ran were made on memory that is now wrong: they fail too.
            last = self._queued
            self._pending = []
            self._broken = error
            self._failures = [*self._failures[-_FAILURES_KEPT:], (first, last, error)]
        self._settled = last
        self._cond.notify_all()
        if error is not None and not isinstance(error, Exception):
            raise error  # an interrupt of the leader's own thread


def _run(cur: sqlite3.Cursor, statements: list[Statement]) -> None:
    for sql, params in statements:
        cur.execute(sql, params)
