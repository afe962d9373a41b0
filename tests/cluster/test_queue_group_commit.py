"""Group commit in the controller's queues: concurrent operations share a transaction, none answers before it is committed.

The controller's :class:`~fray.cluster.server.controller._queues.QueueService` runs here on a real
store; another SQLite connection plays a slow disk (it holds the database's write lock)
or a failing one (a trigger refuses one item).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.server.controller._queues import QueueService
from fray.cluster.server.store import ClusterStore
from fray.errors import StoreError
from support import wait_until

KEY = "ns/work"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[QueueService, Path]]:
    store = ClusterStore(str(tmp_path / "controller.db"))
    queues = QueueService(store)
    queues.create(KEY, "alice", False, "create-1")
    try:
        yield queues, tmp_path / "controller.db"
    finally:
        store.close()


def rows(db: Path) -> list[bytes]:
    """The items the database holds, read through a connection of its own."""
    with sqlite3.connect(db) as conn:
        return [bytes(row[0]) for row in conn.execute("SELECT payload FROM queue_items ORDER BY seq")]


def test_concurrent_pushes_share_one_commit_and_answer_only_once_committed(service):
    queues, db = service
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the disk is "slow": no commit can happen while this is held
    pushers = [
        threading.Thread(target=queues.push, args=(KEY, "alice", f"item-{n}", f"payload-{n}".encode()))
        for n in range(8)
    ]
    before = queues.commits
    for pusher in pushers:
        pusher.start()
    wait_until(lambda: queues._commits.waiting == 8, timeout=60, what="all 8 pushes to be queued")
    assert all(pusher.is_alive() for pusher in pushers)  # none answered: nothing is committed yet
    assert rows(db) == []
    blocker.execute("COMMIT")
    for pusher in pushers:
        pusher.join(60)
    assert not any(pusher.is_alive() for pusher in pushers)
    # The first push's commit (with whatever was queued when it began) was already waiting for the
    # disk; all the others share the next one: 8 pushes, at most 2 transactions.
    assert 1 <= queues.commits - before <= 2
    assert sorted(rows(db)) == sorted(f"payload-{n}".encode() for n in range(8))
    assert queues.counts(KEY, "alice") == [8, 0]


def test_a_failed_commit_fails_its_operation_and_memory_is_reloaded_from_the_database(service):
    queues, db = service
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON queue_items WHEN NEW.payload = X'FF' "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    queues.push(KEY, "alice", "good-1", b"good")
    with pytest.raises(StoreError, match="refused by the test"):
        queues.push(KEY, "alice", "bad", b"\xff")
    # The refused item is not served from memory: the next operation reloaded what the disk holds.
    assert queues.counts(KEY, "alice") == [1, 0]
    queues.push_many(KEY, "alice", [("good-2", b"more"), ("good-3", b"again")])
    leases = queues.pop_many(KEY, "alice", 60.0, 0.0, 10)
    assert [payload for _, payload, _ in leases] == [b"good", b"more", b"again"]
    assert queues.done_many(KEY, "alice", [lease_id for lease_id, _, _ in leases], "done-1") == ["ok"] * 3
    assert rows(db) == []
