"""Durable queues with leases in the controller: the ``queue.*`` methods, their state and their SQLite tables.

Each queue is kept in memory (so that reads and blocking pops cost no query) and
written through to three tables of the controller's database, created here (not in
the store's schema), so that a controller killed with ``kill -9`` and restarted
loses nothing: items waiting, items leased (with their deadlines, in wall-clock
time), and the leases that ended (so that a late ``done`` still says why it fails).
Changes are committed with *group commit* (:mod:`fray.cluster.server.controller._groupcommit`): an
operation changes memory under the service's lock, queues its statements, and answers
once they are committed; concurrent operations share one transaction. A batch
(``push_many``, ``pop_many``, ``done_many``) is one write for all its items. If a commit
fails, the operations in it fail and memory is reloaded from the database before the
next operation.

Items are opaque bytes: only clients and tasks unpickle them. Queues are named
``NAMESPACE/NAME`` and belong to the user who created them; that user's clients and
jobs (and the administrator) may use them, nobody else. Calls that may be repeated
after a lost connection are made harmless to repeat: a push carries the item's id
(pushed once), a ``done`` and a ``create`` their own call id.

Semantics are those of :class:`fray.queue.QueueCore`: a redelivered item goes back to
the front, ``deliveries`` counts its hand-outs, ``done`` of an expired lease is
``expired``, of a done one ``done``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

from fray.cluster.protocol._codec import checked
from fray.cluster.server.controller._api import Caller
from fray.cluster.server.controller._groupcommit import GroupCommit
from fray.errors import NotFound, PermissionDenied, ProtocolError, QueueAlreadyExists, StorageError

__all__ = ["QUEUE_PREFIX", "QueueAPI", "QueueService", "with_queues"]

#: The prefix of the queue methods' names on the controller's RPC.
QUEUE_PREFIX = "queue."
#: The longest a blocking pop waits in one call (clients call again): shorter than any RPC timeout.
MAX_WAIT = 5.0
#: Ended leases are remembered this long (so that a late done() says "expired"), then forgotten.
ENDED_MEMORY_SECONDS = 24 * 3600.0
#: A pop_many answer stops growing once its items hold this many bytes (it always holds one item).
MAX_POP_BYTES = 32 << 20

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS queues (key TEXT PRIMARY KEY, user TEXT NOT NULL, created REAL NOT NULL, "
    "create_call TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS queue_items (queue TEXT NOT NULL, item_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "payload BLOB NOT NULL, deliveries INTEGER NOT NULL, lease_id TEXT, deadline REAL, PRIMARY KEY (queue, item_id))",
    "CREATE TABLE IF NOT EXISTS queue_leases_ended (queue TEXT NOT NULL, lease_id TEXT NOT NULL, how TEXT NOT NULL, "
    "call_id TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (queue, lease_id))",
)


@dataclass
class _Item:
    item_id: str
    seq: int
    payload: bytes
    deliveries: int = 0
    lease_id: str | None = None
    deadline: float = 0.0


@dataclass
class _Queue:
    key: str
    user: str
    create_call: str
    waiting: deque[str] = field(default_factory=deque)  # item ids, front first
    items: dict[str, _Item] = field(default_factory=dict)
    leases: dict[str, str] = field(default_factory=dict)  # lease id -> item id
    deadlines: list[tuple[float, str]] = field(default_factory=list)  # (deadline, lease id), a heap
    ended: dict[str, tuple[str, str]] = field(default_factory=dict)  # lease id -> (how, call id)
    front: int = 0  # the seq given to the next item put back at the front (decreasing)
    back: int = 0  # the seq given to the next pushed item (increasing)


class QueueService:
    """Every queue of the controller: in memory, written through to ``store`` (a ``ClusterStore``)."""

    def __init__(self, store: Any, clock: Any = time.time) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queues: dict[str, _Queue] = {}
        self._ids = uuid.uuid4().hex[:8]
        self._serial = 0
        self._commits = GroupCommit(store)
        self._mine = threading.local()  # the ticket of this thread's last write in the current operation
        store.write_with(self._create_tables)
        self._queues = store.read_with(self._load)
        self.prune()

    # ----- loading and writing through ---------------------------------------------------------

    @staticmethod
    def _create_tables(cur: sqlite3.Cursor) -> None:
        for statement in _SCHEMA:
            cur.execute(statement)

    def _load(self, cur: sqlite3.Cursor) -> dict[str, _Queue]:
        queues = {
            key: _Queue(key, user, call)
            for key, user, call in cur.execute("SELECT key, user, create_call FROM queues").fetchall()
        }
        rows = cur.execute(
            "SELECT queue, item_id, seq, payload, deliveries, lease_id, deadline FROM queue_items ORDER BY queue, seq"
        ).fetchall()
        for key, item_id, seq, payload, deliveries, lease_id, deadline in rows:
            queue = queues.get(key)
            if queue is None:
                continue
            item = _Item(item_id, seq, bytes(payload), deliveries, lease_id, deadline or 0.0)
            queue.items[item_id] = item
            queue.front, queue.back = min(queue.front, seq - 1), max(queue.back, seq + 1)
            if lease_id is None:
                queue.waiting.append(item_id)
            else:
                queue.leases[lease_id] = item_id
                heappush(queue.deadlines, (item.deadline, lease_id))
        cutoff = self._clock() - ENDED_MEMORY_SECONDS
        for key, lease_id, how, call_id in cur.execute(
            "SELECT queue, lease_id, how, call_id FROM queue_leases_ended WHERE at >= ?", (cutoff,)
        ).fetchall():
            if key in queues:
                queues[key].ended[lease_id] = (how, call_id)
        return queues

    def _write(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        """Queue statements for the next group commit (lock held): the operation answers once they are committed."""
        self._mine.ticket = self._commits.add(list(statements))

    @contextmanager
    def _op(self) -> Iterator[None]:
        """One operation: the lock while it runs, then (lock released) wait until its writes are committed."""
        self._mine.ticket = 0
        with self._lock:
            if self._commits.broken:  # a commit failed: memory may hold changes the database does not
                self._queues = self._store.read_with(self._load)
                self._commits.recovered()
                self._changed.notify_all()
            yield
        self._commits.flush(self._mine.ticket)

    @property
    def commits(self) -> int:
        """Transactions committed so far by queue operations (several operations may share one)."""
        return self._commits.commits

    def _expire(self, queue: _Queue, now: float) -> None:
        """Put back the items whose lease ran out (lock held): to the front, in deadline order."""
        expired: list[tuple[str, _Item]] = []
        while queue.deadlines and queue.deadlines[0][0] <= now:
            _, lease_id = heappop(queue.deadlines)
            item_id = queue.leases.get(lease_id)
            if item_id is not None:
                expired.append((lease_id, queue.items[item_id]))
        if not expired:
            return
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for lease_id, item in reversed(expired):  # the earliest deadline ends up first
            queue.front -= 1
            statements.append(
                (
                    "UPDATE queue_items SET lease_id = NULL, deadline = NULL, seq = ? WHERE queue = ? AND item_id = ?",
                    (queue.front, queue.key, item.item_id),
                )
            )
            statements.append(
                (
                    "INSERT OR REPLACE INTO queue_leases_ended (queue, lease_id, how, call_id, at) VALUES (?, ?, ?, ?, ?)",
                    (queue.key, lease_id, "expired", "", now),
                )
            )
        self._write(*statements)
        for lease_id, item in reversed(expired):
            del queue.leases[lease_id]
            item.lease_id, item.seq = None, queue.front
            queue.waiting.appendleft(item.item_id)
            queue.ended[lease_id] = ("expired", "")
        self._changed.notify_all()

    # ----- the operations (each checks the caller) ---------------------------------------------

    def _get(self, key: str, user: str | None) -> _Queue:
        queue = self._queues.get(key)
        if queue is None:
            raise NotFound(f"no queue {key!r} on this cluster (it was never created, or was deleted)")
        if user is not None and queue.user != user:
            raise PermissionDenied(f"queue {key!r} belongs to user {queue.user!r}")
        return queue

    def create(self, key: str, user: str, exist_ok: bool, call_id: str) -> bool:
        """Create the queue ``key`` for ``user``; True if it was created now (False: attached with ``exist_ok``)."""
        with self._op():
            queue = self._queues.get(key)
            if queue is not None:
                if queue.user != user:
                    raise PermissionDenied(f"queue {key!r} belongs to user {queue.user!r}; pick another name")
                if queue.create_call == call_id:
                    return True  # this very call, repeated after a lost answer
                if not exist_ok:
                    raise QueueAlreadyExists(
                        f"a queue named {key!r} already exists on this cluster; pass its handle along (queue handles "
                        "are picklable), use create_queue(name, exist_ok=True) to attach to it, or pick another name"
                    )
                return False
            self._write(
                (
                    "INSERT INTO queues (key, user, created, create_call) VALUES (?, ?, ?, ?)",
                    (key, user, self._clock(), call_id),
                )
            )
            self._queues[key] = _Queue(key, user, call_id)
            return True

    def push(self, key: str, user: str | None, item_id: str, payload: bytes) -> None:
        """Append one item (opaque bytes); a repeated push of the same ``item_id`` does nothing."""
        self.push_many(key, user, [(item_id, payload)])

    def push_many(self, key: str, user: str | None, items: list[tuple[str, bytes]]) -> None:
        """Append ``(item_id, payload)`` pairs in order, in one transaction; ids already pushed are skipped."""
        with self._op():
            queue = self._get(key, user)
            fresh: dict[str, bytes] = {}
            for item_id, payload in items:
                if item_id not in queue.items and item_id not in fresh:
                    fresh[item_id] = payload
            if not fresh:
                return
            self._write(
                *(
                    (
                        "INSERT INTO queue_items (queue, item_id, seq, payload, deliveries) VALUES (?, ?, ?, ?, 0)",
                        (key, item_id, queue.back + offset, payload),
                    )
                    for offset, (item_id, payload) in enumerate(fresh.items())
                )
            )
            for item_id, payload in fresh.items():
                queue.items[item_id] = _Item(item_id, queue.back, payload)
                queue.waiting.append(item_id)
                queue.back += 1
            self._changed.notify_all()

    def peek(self, key: str, user: str | None) -> list[Any]:
        """``[found, payload]`` of the next item."""
        with self._op():
            queue = self._get(key, user)
            self._expire(queue, self._clock())
            if not queue.waiting:
                return [False, b""]
            return [True, queue.items[queue.waiting[0]].payload]

    def pop(self, key: str, user: str | None, lease_timeout: float, wait: float) -> list[Any] | None:
        """Lease the next item: ``[lease_id, payload, deliveries]``, or None after ``wait`` seconds (at most MAX_WAIT)."""
        leases = self.pop_many(key, user, lease_timeout, wait, 1)
        return leases[0] if leases else None

    def pop_many(self, key: str, user: str | None, lease_timeout: float, wait: float, max_items: int) -> list[Any]:
        """Lease up to ``max_items`` items in one transaction: ``[[lease_id, payload, deliveries], ...]``.

        Waits up to ``wait`` seconds (at most MAX_WAIT) for the first item, not for more;
        ``[]`` when none came.
        """
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
        with self._op():
            while True:
                queue = self._get(key, user)
                now = self._clock()
                self._expire(queue, now)
                if queue.waiting:
                    return self._lease(queue, now, lease_timeout, max(1, max_items))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                wake = remaining
                if queue.deadlines:  # an item comes back when the earliest lease runs out
                    wake = min(wake, max(0.0, queue.deadlines[0][0] - now))
                self._changed.wait(wake)

    def _lease(self, queue: _Queue, now: float, lease_timeout: float, max_items: int) -> list[Any]:
        """Lease the first items waiting (at least one; lock held), written in one transaction."""
        chosen: list[_Item] = []
        size = 0
        for item_id in queue.waiting:
            if len(chosen) == max_items or (chosen and size >= MAX_POP_BYTES):
                break
            chosen.append(queue.items[item_id])
            size += len(chosen[-1].payload)
        deadline = now + lease_timeout
        lease_ids = [f"{self._ids}-{self._serial + n}" for n in range(1, len(chosen) + 1)]
        self._write(
            *(
                (
                    "UPDATE queue_items SET lease_id = ?, deadline = ?, deliveries = ? WHERE queue = ? AND item_id = ?",
                    (lease_id, deadline, item.deliveries + 1, queue.key, item.item_id),
                )
                for lease_id, item in zip(lease_ids, chosen, strict=True)
            )
        )
        self._serial += len(chosen)
        answer = []
        for lease_id, item in zip(lease_ids, chosen, strict=True):
            queue.waiting.popleft()
            item.lease_id, item.deadline, item.deliveries = lease_id, deadline, item.deliveries + 1
            queue.leases[lease_id] = item.item_id
            heappush(queue.deadlines, (deadline, lease_id))
            answer.append([lease_id, item.payload, item.deliveries])
        return answer

    def done(self, key: str, user: str | None, lease_id: str, call_id: str) -> str:
        """Remove a leased item: ``"ok"``, or ``"expired"``, ``"done"``, ``"unknown"`` (see QueueCore.done)."""
        return self.done_many(key, user, [lease_id], call_id)[0]

    def done_many(self, key: str, user: str | None, lease_ids: list[str], call_id: str) -> list[str]:
        """Remove the items of several leases in one transaction; each lease's status as :meth:`done` gives it.

        The leases held are done even when others are not. A repeat of this call
        (the same ``call_id``) answers ``"ok"`` for the leases it did.
        """
        with self._op():
            queue = self._get(key, user)
            now = self._clock()
            self._expire(queue, now)
            statuses: list[str] = []
            finishing: dict[str, str] = {}  # lease id -> item id, done by this call
            for lease_id in lease_ids:
                item_id = queue.leases.get(lease_id)
                if lease_id in finishing:
                    statuses.append("done")  # the same lease twice in one call: as done() twice
                elif item_id is not None:
                    finishing[lease_id] = item_id
                    statuses.append("ok")
                else:
                    how, by = queue.ended.get(lease_id, ("unknown", ""))
                    statuses.append("ok" if how == "done" and by == call_id else how)
            if not finishing:
                return statuses
            statements: list[tuple[str, tuple[Any, ...]]] = []
            for lease_id, item_id in finishing.items():
                statements.append(("DELETE FROM queue_items WHERE queue = ? AND item_id = ?", (key, item_id)))
                statements.append(
                    (
                        "INSERT OR REPLACE INTO queue_leases_ended (queue, lease_id, how, call_id, at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (key, lease_id, "done", call_id, now),
                    )
                )
            self._write(*statements)
            for lease_id, item_id in finishing.items():
                del queue.leases[lease_id]
                del queue.items[item_id]
                queue.ended[lease_id] = ("done", call_id)
            return statuses

    def counts(self, key: str, user: str | None) -> list[int]:
        """``[pending, in_flight]``."""
        with self._op():
            queue = self._get(key, user)
            self._expire(queue, self._clock())
            return [len(queue.waiting), len(queue.leases)]

    def stats(self) -> list[dict[str, Any]]:
        """Every queue with its backlog (for the dashboard and ``fray status``)."""
        with self._op():
            now = self._clock()
            out = []
            for key in sorted(self._queues):
                queue = self._queues[key]
                self._expire(queue, now)
                out.append(
                    {"queue": key, "user": queue.user, "pending": len(queue.waiting), "in_flight": len(queue.leases)}
                )
            return out

    def prune(self) -> None:
        """Forget ended leases older than :data:`ENDED_MEMORY_SECONDS`."""
        cutoff = self._clock() - ENDED_MEMORY_SECONDS
        with self._op():
            self._write(("DELETE FROM queue_leases_ended WHERE at < ?", (cutoff,)))


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{what} must be a non-empty string, got {type(value).__name__}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


class QueueAPI:
    """Dispatches ``queue.*`` calls of plain data to a :class:`QueueService`, per caller.

    Users and jobs use their own user's queues; the administrator any; workers none.
    """

    def __init__(self, queues: QueueService, on_storage_error: Any = None) -> None:
        self._queues = queues
        self._on_storage_error = on_storage_error

    def __call__(self, caller: Caller, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if caller.worker or (caller.user is None and not caller.admin):
            raise PermissionDenied(f"this credential may not use queues (queue.{method})")
        handler = getattr(self, f"_{method}", None)
        if handler is None:
            raise ProtocolError(f"the controller has no method queue.{method}")
        try:
            return handler(caller, *args, **kwargs)
        except StorageError as exc:
            if self._on_storage_error is not None:
                self._on_storage_error(exc)
            raise

    @staticmethod
    def _user(caller: Caller) -> str | None:
        return None if caller.admin else caller.user

    def _create(self, caller: Caller, key: Any, exist_ok: Any, call_id: Any, user: Any = None) -> bool:
        owner = str(user) if caller.admin and user else caller.user or "admin"
        return self._queues.create(_str(key, "queue"), owner, bool(exist_ok), _str(call_id, "call id"))

    def _push(self, caller: Caller, key: Any, item_id: Any, payload: Any) -> None:
        if not isinstance(payload, bytes):
            raise ProtocolError(f"a queue item is a byte string, got {type(payload).__name__}")
        self._queues.push(_str(key, "queue"), self._user(caller), _str(item_id, "item id"), payload)

    def _push_many(self, caller: Caller, key: Any, items: Any) -> None:
        if not isinstance(items, list):
            raise ProtocolError(f"push_many takes a list of [item id, payload] pairs, got {type(items).__name__}")
        pairs: list[tuple[str, bytes]] = []
        for pair in items:
            if not isinstance(pair, list | tuple) or len(pair) != 2 or not isinstance(pair[1], bytes):
                raise ProtocolError("push_many takes [item id, payload] pairs, each payload a byte string")
            pairs.append((_str(pair[0], "item id"), pair[1]))
        self._queues.push_many(_str(key, "queue"), self._user(caller), pairs)

    def _peek(self, caller: Caller, key: Any) -> list[Any]:
        return self._queues.peek(_str(key, "queue"), self._user(caller))

    def _pop(self, caller: Caller, key: Any, lease_timeout: Any, wait: Any = 0.0) -> list[Any] | None:
        return self._queues.pop(
            _str(key, "queue"), self._user(caller), _number(lease_timeout, "lease_timeout"), _number(wait, "wait")
        )

    def _pop_many(self, caller: Caller, key: Any, lease_timeout: Any, wait: Any, max_items: Any) -> list[Any]:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ProtocolError(f"max_items must be a whole number >= 1, got {max_items!r}")
        return self._queues.pop_many(
            _str(key, "queue"),
            self._user(caller),
            _number(lease_timeout, "lease_timeout"),
            _number(wait, "wait"),
            max_items,
        )

    def _done_many(self, caller: Caller, key: Any, lease_ids: Any, call_id: Any) -> list[str]:
        if not isinstance(lease_ids, list):
            raise ProtocolError(f"done_many takes a list of lease ids, got {type(lease_ids).__name__}")
        return self._queues.done_many(
            _str(key, "queue"),
            self._user(caller),
            [_str(lease_id, "lease id") for lease_id in lease_ids],
            _str(call_id, "call id"),
        )

    def _done(self, caller: Caller, key: Any, lease_id: Any, call_id: Any) -> str:
        return self._queues.done(
            _str(key, "queue"), self._user(caller), _str(lease_id, "lease id"), _str(call_id, "call id")
        )

    def _counts(self, caller: Caller, key: Any) -> list[int]:
        return self._queues.counts(_str(key, "queue"), self._user(caller))


def with_queues(api: Any, queues: QueueAPI, service: Any) -> Any:
    """The controller's request handler: ``queue.*`` methods to ``queues``, the rest to ``api`` (a ControllerAPI)."""

    def handle(principal: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not method.startswith(QUEUE_PREFIX):
            return api(principal, method, args, kwargs)
        caller = Caller(principal, service)
        name = method.removeprefix(QUEUE_PREFIX)
        return checked(f"arguments of {method}", lambda: queues(caller, name, args, kwargs))

    return handle
