"""Opaque blobs by content hash in the controller's database (job workspaces), as functions of a cursor.

The ``blobs`` table is part of the store's versioned schema (:mod:`fray.cluster.server.store._schema`,
from version 4). A blob not fetched for longer than the retention period is pruned with
the finished jobs.
"""

from __future__ import annotations

import sqlite3

__all__ = ["get_blob", "has_blob", "prune_blobs", "put_blob"]


def has_blob(cur: sqlite3.Cursor, digest: str) -> bool:
    """True if ``digest`` is stored."""
    return cur.execute("SELECT 1 FROM blobs WHERE digest = ?", (digest,)).fetchone() is not None


def put_blob(cur: sqlite3.Cursor, digest: str, data: bytes, now: float) -> None:
    """Store ``data`` under ``digest`` (a no-op if it is there already)."""
    cur.execute(
        "INSERT OR IGNORE INTO blobs (digest, data, size, created_at, used_at) VALUES (?, ?, ?, ?, ?)",
        (digest, sqlite3.Binary(data), len(data), now, now),
    )


def get_blob(cur: sqlite3.Cursor, digest: str, now: float) -> bytes | None:
    """The blob ``digest`` (None if unknown); marks it used ``now``."""
    row = cur.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None:
        return None
    cur.execute("UPDATE blobs SET used_at = ? WHERE digest = ?", (now, digest))
    return bytes(row[0])


def prune_blobs(cur: sqlite3.Cursor, unused_since: float) -> int:
    """Delete blobs neither stored nor fetched since ``unused_since``; return how many."""
    return cur.execute("DELETE FROM blobs WHERE used_at < ?", (unused_since,)).rowcount
