"""The store's SQLite plumbing: one connection, its lock, transactions, batches, and storage errors.

:class:`~fray.cluster.server.store.ClusterStore` holds one :class:`Database` and runs every
method in one of its transactions; a failure of SQLite leaves as a
:class:`~fray.errors.StoreError` naming the file -- a :class:`~fray.errors.StorageError`
with the free space when the file cannot be written (disk full, read-only, I/O error).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fray.core._private_files import open_private
from fray.errors import StorageError, StoreError
from fray.resources import format_size

__all__ = ["Database", "ReadOnlyMode"]

# SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN (primary codes; extended ones keep them in the low byte).
_STORAGE_CODES = frozenset({8, 10, 13, 14})
_STORAGE_WORDS = ("disk is full", "readonly", "read-only", "disk i/o", "unable to open")


class Database:
    """One SQLite file in WAL mode behind one lock; ``synchronous`` as SQLite's pragma."""

    def __init__(self, path: str, synchronous: str = "NORMAL") -> None:
        self.path = path
        # One connection, serialized by a lock: SQLite allows one writer anyway, and this
        # keeps every method's transaction from interleaving with another thread's.
        self.lock = threading.RLock()
        self._in_batch = False
        # Created 0600 before SQLite creates it with the umask's mode; its journal and shared-memory
        # files take the database's mode. A path that cannot be opened is left for SQLite to report.
        with contextlib.suppress(OSError):
            os.close(open_private(self.path, os.O_RDWR | os.O_CREAT))
        try:
            self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self.conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self.conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: could not switch the database to WAL mode (got {mode!r})")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock; SQLite's own errors leave as a :class:`StoreError` naming the file."""
        with self.lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def _error(self, exc: sqlite3.Error) -> StoreError:
        """The Fray error for a failure of SQLite: :class:`StorageError` when the file cannot be written."""
        text = str(exc)
        code = getattr(exc, "sqlite_errorcode", None)
        storage = (code is not None and code & 0xFF in _STORAGE_CODES) or any(
            word in text.lower() for word in _STORAGE_WORDS
        )
        if not storage:
            return StoreError(f"{self.path}: {text}")
        try:
            free = format_size(shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free)
        except OSError:
            free = "unknown"
        return StorageError(
            f"cannot write the cluster state {self.path}: {text} ({free} free on its filesystem); "
            "nothing of this operation was written"
        )

    @contextmanager
    def txn(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction: everything inside commits together or not at all.

        Inside :meth:`batch` it is a savepoint instead, so that each call stays atomic
        (a call that raises leaves no trace) while the batch commits once.
        """
        with self.locked():
            cur = self.conn.cursor()
            if self._in_batch:
                cur.execute("SAVEPOINT call")
                try:
                    yield cur
                except BaseException:
                    self._rollback("ROLLBACK TO call", "RELEASE call")
                    raise
                cur.execute("RELEASE call")
                return
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                self._rollback("ROLLBACK")
                raise

    def _rollback(self, *statements: str) -> None:
        # SQLite may already have rolled back on its own (a full disk, an I/O error): a
        # failing ROLLBACK must not hide the error that caused it.
        for statement in statements:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute(statement)

    @contextmanager
    def read(self) -> Iterator[sqlite3.Cursor]:
        """A read transaction: several SELECTs see one snapshot."""
        with self.locked():
            cur = self.conn.cursor()
            if self._in_batch:
                yield cur
                return
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                cur.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run several calls as one transaction: one commit for, say, all reports of one worker heartbeat.

        Each call inside stays atomic on its own (a call that raises is undone, and the
        batch goes on if the caller catches the error); the batch commits when the
        block ends normally and is rolled back entirely if an exception leaves it.
        Other threads wait until the batch ends. Batches do not nest.
        """
        with self.locked():
            if self._in_batch:
                raise StoreError("batches do not nest")
            self.conn.execute("BEGIN IMMEDIATE")
            self._in_batch = True
            try:
                yield
                self._in_batch = False
                self.conn.execute("COMMIT")
            except BaseException:
                self._in_batch = False
                self._rollback("ROLLBACK")
                raise

    def make_private(self) -> None:
        """Make the file and its journal readable by their owner only (they hold every job's state)."""
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.chmod(self.path + suffix, 0o600)

    def close(self) -> None:
        """Close the connection."""
        with self.locked():
            self.conn.close()


class ReadOnlyMode:
    """Whether the controller's store can be written, why not, and getting out of it again.

    While read-only the controller keeps serving reads; :meth:`try_writable` probes with a
    write (``probe``, which should also restore whatever the outage put at risk).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self.reason = ""

    def failed(self, error: StorageError) -> bool:
        """Enter (or stay in) read-only mode; True if this entered it."""
        with self._lock:
            first = not self.reason
            self.reason = str(error)
        return first

    def try_writable(self, probe: Callable[[], object]) -> bool:
        """Run ``probe``; True (and writable again) if it succeeded."""
        try:
            probe()
        except StorageError as exc:
            with self._lock:
                self.reason = str(exc)
            return False
        with self._lock:
            self.reason = ""
        return True

    def health(self) -> dict[str, object]:
        """Plain data: read-only or not and why, the state file and the free space on its filesystem."""
        try:
            free: int | None = shutil.disk_usage(os.path.dirname(os.path.abspath(self._path))).free
        except OSError:
            free = None
        with self._lock:
            reason = self.reason
        return {"read_only": bool(reason), "reason": reason, "db_path": self._path, "free_bytes": free}
