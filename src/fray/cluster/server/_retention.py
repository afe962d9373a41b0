"""How long the controller keeps finished jobs, and the pruning that enforces it.

A finished job is kept with its tasks, output and endpoints until it is older than
``max_age_seconds`` *or* more than ``max_jobs`` newer finished jobs exist. Jobs are
pruned as whole trees: a top-level job together with its child jobs (which always
finish with it), so that no stored job ever names a parent that is gone. Unfinished
jobs are never pruned, however old.

Workers that are gone are pruned too (:func:`prune_departed_workers`): a STOPPED one (it drained,
or its VM was scaled down) an hour after it was last heard from, a LOST one after a day, so that
the listings show the cluster as it is, not every VM it ever had. REVOKED workers are kept: their
row is what keeps a revoked id refused to the shared worker credential.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from fray.errors import ConfigError

__all__ = [
    "DEFAULT_LOST_WORKER_SECONDS",
    "DEFAULT_MAX_AGE_SECONDS",
    "DEFAULT_MAX_JOBS",
    "DEFAULT_STOPPED_WORKER_SECONDS",
    "RetentionPolicy",
    "prune_departed_workers",
    "prune_finished_jobs",
]

#: Finished jobs are kept 7 days by default...
DEFAULT_MAX_AGE_SECONDS = 7 * 24 * 3600.0
#: ... and at most this many of them (top-level jobs, each with its children).
DEFAULT_MAX_JOBS = 10_000
#: A stopped worker (drained, or its VM scaled down) is listed this long after it was last heard from...
DEFAULT_STOPPED_WORKER_SECONDS = 3600.0
#: ... and a lost one (crashed, cut off) this long.
DEFAULT_LOST_WORKER_SECONDS = 24 * 3600.0

_FINISHED = ("succeeded", "failed", "stopped")
# Trees pruned per transaction: keeps each write short, so workers' reports are not held up.
_BATCH = 200


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep finished jobs for ``max_age_seconds`` and at most ``max_jobs`` of them (newest kept).

    Stopped workers are listed for ``stopped_worker_seconds`` after their last contact, lost ones for
    ``lost_worker_seconds``.
    """

    max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS
    max_jobs: int = DEFAULT_MAX_JOBS
    stopped_worker_seconds: float = DEFAULT_STOPPED_WORKER_SECONDS
    lost_worker_seconds: float = DEFAULT_LOST_WORKER_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.max_age_seconds, bool) or not isinstance(self.max_age_seconds, int | float):
            raise ConfigError(f"RetentionPolicy(max_age_seconds={self.max_age_seconds!r}) must be a number of seconds")
        if not self.max_age_seconds > 0:
            raise ConfigError(f"RetentionPolicy(max_age_seconds={self.max_age_seconds!r}) must be > 0")
        if isinstance(self.max_jobs, bool) or not isinstance(self.max_jobs, int) or self.max_jobs < 1:
            raise ConfigError(f"RetentionPolicy(max_jobs={self.max_jobs!r}) must be a whole number >= 1")
        for name in ("stopped_worker_seconds", "lost_worker_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"RetentionPolicy({name}={value!r}) must be a number of seconds > 0")


def _doomed_roots(cur: sqlite3.Cursor, now: float, policy: RetentionPolicy) -> list[str]:
    marks = ", ".join("?" * len(_FINISHED))
    too_old = cur.execute(
        f"SELECT id FROM jobs WHERE parent_id IS NULL AND state IN ({marks}) AND finished_at < ? ORDER BY seq LIMIT ?",
        (*_FINISHED, now - policy.max_age_seconds, _BATCH),
    ).fetchall()
    too_many = cur.execute(
        f"SELECT id FROM jobs WHERE parent_id IS NULL AND state IN ({marks}) ORDER BY seq DESC LIMIT ? OFFSET ?",
        (*_FINISHED, _BATCH, policy.max_jobs),
    ).fetchall()
    return list(dict.fromkeys(row[0] for row in (*too_old, *too_many)))


def _tree(cur: sqlite3.Cursor, root: str) -> list[str] | None:
    """``root`` and its descendants, or None if any of them is unfinished (never prune a live job)."""
    rows = cur.execute(
        "SELECT id, state FROM jobs WHERE id = ? OR substr(id, 1, ?) = ?", (root, len(root) + 1, root + "/")
    ).fetchall()
    if any(state not in _FINISHED for _, state in rows):
        return None
    return [job_id for job_id, _ in rows]


def prune_finished_jobs(cur: sqlite3.Cursor, now: float, policy: RetentionPolicy) -> list[str]:
    """Delete up to one batch of finished job trees past ``policy``; return the deleted job ids.

    Call it inside a write transaction, again while it returns something.
    """
    deleted: list[str] = []
    for root in _doomed_roots(cur, now, policy):
        tree = _tree(cur, root)
        if tree is None:
            continue
        params = [(job_id,) for job_id in tree]
        for table in ("logs", "endpoints", "tasks", "jobs"):
            column = "id" if table == "jobs" else "job_id"
            cur.executemany(f"DELETE FROM {table} WHERE {column} = ?", params)
        deleted.extend(tree)
    return deleted


def prune_departed_workers(cur: sqlite3.Cursor, now: float, policy: RetentionPolicy) -> list[str]:
    """Delete the stopped and lost workers past ``policy`` (never one a task is still active on); return their ids.

    Call it inside a write transaction.
    """
    rows = cur.execute(
        "SELECT id FROM workers w WHERE ((state = 'stopped' AND last_heartbeat < ?) "
        "OR (state = 'lost' AND last_heartbeat < ?)) "
        "AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')) "
        "ORDER BY id",
        (now - policy.stopped_worker_seconds, now - policy.lost_worker_seconds),
    ).fetchall()
    gone = [str(row[0]) for row in rows]
    cur.executemany("DELETE FROM workers WHERE id = ?", [(worker_id,) for worker_id in gone])
    return gone
