"""The workers' rows of the cluster store and its issued credentials, as functions of a cursor.

:class:`~fray.cluster.server.store.ClusterStore` calls these inside its own transactions (and
holds its lock around the reads); a move of a worker through its state machine that
affects its tasks goes through a :class:`~fray.cluster.server.store._change.Change` of the caller's.
"""

from __future__ import annotations

import sqlite3

from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.credentials import Issued
from fray.cluster.protocol.records import TaskRecord, WorkerRecord, WorkerState, check_worker_transition
from fray.cluster.server.store._change import Change
from fray.cluster.server.store._schema import ACTIVE, TASK_COLS, WORKER_COLS, task_from, worker_from, write_worker
from fray.errors import NotFound

__all__ = [
    "add_issued",
    "get_worker",
    "heartbeat",
    "issued",
    "list_workers",
    "register",
    "revoke",
    "revoke_issued",
    "set_health",
    "silent_workers",
    "stop",
    "tasks_on_worker",
]


def register(cur: sqlite3.Cursor, info: WorkerInfo, address: str, now: float) -> None:
    """Make ``info``'s worker ALIVE (a new one, or one rejoining: a new epoch), heard from ``now``."""
    row = cur.execute("SELECT state, registered_at FROM workers WHERE id = ?", (info.worker_id,)).fetchone()
    if row is not None:
        check_worker_transition(WorkerState(row[0]), WorkerState.ALIVE)
    write_worker(cur, info, address, now)


def set_health(cur: sqlite3.Cursor, worker_id: str, health: str) -> bool:
    """Record why ``worker_id`` cannot take tasks ("" once it can again); True if that changed anything."""
    return (
        cur.execute("UPDATE workers SET health = ? WHERE id = ? AND health != ?", (health, worker_id, health)).rowcount
        == 1
    )


def heartbeat(cur: sqlite3.Cursor, worker_id: str, now: float, epoch: int | None) -> bool:
    """Record that ``worker_id`` (in ``epoch``, if given) is alive; False if it is not (any more)."""
    if epoch is None:
        cur.execute("UPDATE workers SET last_heartbeat = ? WHERE id = ? AND state = 'alive'", (now, worker_id))
    else:
        cur.execute(
            "UPDATE workers SET last_heartbeat = ? WHERE id = ? AND state = 'alive' AND epoch = ?",
            (now, worker_id, epoch),
        )
    return cur.rowcount == 1


def silent_workers(cur: sqlite3.Cursor, now: float, timeout: float) -> list[str]:
    """The alive workers not heard from for more than ``timeout`` seconds, by id."""
    return [
        r[0]
        for r in cur.execute(
            "SELECT id FROM workers WHERE state = 'alive' AND last_heartbeat < ? ORDER BY id", (now - timeout,)
        ).fetchall()
    ]


def revoke(cur: sqlite3.Cursor, change: Change, worker_id: str, now: float) -> None:
    """Revoke ``worker_id``'s credentials and the join tokens it joined with, lose it (through ``change``) if alive,
    and make it REVOKED.

    Raises :class:`NotFound` if no such worker was ever registered.
    """
    row = cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
    if row is None:
        raise NotFound(f"no worker {worker_id!r}")
    # The join tokens it joined with first: whoever holds its machine holds them, and must not join anew.
    cur.execute(
        "UPDATE credentials SET revoked_at = ? WHERE subject = 'join' AND revoked_at IS NULL AND id IN "
        "(SELECT via FROM credentials WHERE subject = ? AND via != '')",
        (now, f"worker:{worker_id}"),
    )
    cur.execute(
        "UPDATE credentials SET revoked_at = ? WHERE subject = ? AND revoked_at IS NULL",
        (now, f"worker:{worker_id}"),
    )
    state = WorkerState(row[0])
    if state == WorkerState.ALIVE:
        change.lose_worker(worker_id, "its credential was revoked")
        state = WorkerState.LOST
    check_worker_transition(state, WorkerState.REVOKED)
    cur.execute("UPDATE workers SET state = 'revoked' WHERE id = ?", (worker_id,))


def stop(cur: sqlite3.Cursor, change: Change, worker_id: str, reason: str) -> bool:
    """``worker_id`` left on purpose (it drained, or its VM was scaled down): STOPPED, not lost.

    Its tasks still assigned or running there are lost through ``change`` (their gangs retried
    under the preemption budget, as for any lost worker) first. A REVOKED or STOPPED worker stays
    as it is (False); NotFound if no such worker was ever registered.
    """
    row = cur.execute("SELECT state FROM workers WHERE id = ?", (worker_id,)).fetchone()
    if row is None:
        raise NotFound(f"no worker {worker_id!r}")
    state = WorkerState(row[0])
    if state in (WorkerState.REVOKED, WorkerState.STOPPED):
        return False
    if state == WorkerState.ALIVE:
        change.lose_worker(worker_id, reason)
        state = WorkerState.LOST
    check_worker_transition(state, WorkerState.STOPPED)
    cur.execute("UPDATE workers SET state = 'stopped', health = '' WHERE id = ?", (worker_id,))
    return True


def list_workers(cur: sqlite3.Cursor, alive_only: bool) -> list[WorkerRecord]:
    """Registered workers by id."""
    where = "WHERE state = 'alive'" if alive_only else ""
    rows = cur.execute(f"SELECT {WORKER_COLS} FROM workers {where} ORDER BY id").fetchall()
    return [worker_from(r) for r in rows]


def get_worker(cur: sqlite3.Cursor, worker_id: str) -> WorkerRecord:
    """The worker ``worker_id`` (alive or lost); raises :class:`NotFound`."""
    row = cur.execute(f"SELECT {WORKER_COLS} FROM workers WHERE id = ?", (worker_id,)).fetchone()
    if row is None:
        raise NotFound(f"no worker {worker_id!r}")
    return worker_from(row)


def tasks_on_worker(cur: sqlite3.Cursor, worker_id: str) -> list[TaskRecord]:
    """The tasks currently assigned to or running on ``worker_id``."""
    rows = cur.execute(
        f"SELECT {TASK_COLS} FROM tasks WHERE worker_id = ? AND state IN (?, ?) ORDER BY job_id, attempt, task_index",
        (worker_id, *ACTIVE),
    ).fetchall()
    return [task_from(r) for r in rows]


# -- issued credentials (join tokens, workers' and users' own) --------------------------------------


def add_issued(cur: sqlite3.Cursor, record: Issued) -> None:
    """Record an issued credential or join token."""
    cur.execute(
        "INSERT INTO credentials (id, subject, created_at, expires_at, revoked_at, via) VALUES (?, ?, ?, ?, ?, ?)",
        (record.credential_id, record.subject, record.created_at, record.expires_at, record.revoked_at, record.via),
    )


def issued(cur: sqlite3.Cursor) -> list[Issued]:
    """Every issued credential and join token, oldest first."""
    rows = cur.execute(
        "SELECT id, subject, created_at, expires_at, revoked_at, via FROM credentials ORDER BY created_at, id"
    ).fetchall()
    return [Issued(str(i), str(subject), float(c), e, r, str(via)) for i, subject, c, e, r, via in rows]


def revoke_issued(cur: sqlite3.Cursor, credential_id: str, now: float) -> bool:
    """Revoke one issued credential or join token; False if it was revoked already; NotFound if unknown."""
    if cur.execute("SELECT 1 FROM credentials WHERE id = ?", (credential_id,)).fetchone() is None:
        raise NotFound(f"no credential or token {credential_id!r}")
    updated = cur.execute(
        "UPDATE credentials SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, credential_id)
    )
    return updated.rowcount == 1
