"""Queues with leases (``client.create_queue``), specified once for every backend that has them.

Its own backend list: the local backend, Ray, the Fray cluster, and Monarch (whose
queue is the generic actor-backed one). Iris refuses ``create_queue`` by name.
"""

from __future__ import annotations

import pickle
import threading

import pytest

from fray import ConfigError, Entrypoint, JobRequest, LeaseError, LeaseExpired, QueueAlreadyExists, QueueCounts
from fray.queue import Lease, Queue
from support import TYPED_VALUES, typed, wait_until

QUEUE_FIXTURES = {
    "local": "local_client",
    "ray": "ray_client",
    "fray": "cluster_client",
    "monarch": "monarch_client",
}

NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "monarch": {
        "test_exist_ok_attaches_to_the_same_queue": "actor-backed queues cannot be looked up by name",
    },
}


@pytest.fixture(params=sorted(QUEUE_FIXTURES))
def qclient(request: pytest.FixtureRequest):
    """A client of each backend with queues, in turn."""
    reason = NOT_APPLICABLE.get(request.param, {}).get(request.node.originalname)
    if reason:
        pytest.skip(f"not applicable on {request.param}: {reason}")
    client = request.getfixturevalue(QUEUE_FIXTURES[request.param])
    if not hasattr(client, "create_queue"):
        pytest.skip(f"{request.param} has no create_queue yet")
    return client


def produce(queue, count: int) -> None:
    for i in range(count):
        queue.push({"id": i})


def square_all(tasks, results) -> None:
    """A consumer: pop with a lease, work, push the result, mark the lease done; until the queue is empty."""
    while True:
        lease = tasks.pop(lease_timeout=60, timeout=0)
        if lease is None:
            return
        results.push({"id": lease.item["id"], "square": lease.item["id"] ** 2})
        tasks.done(lease)


def test_push_peek_pop_done(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    assert isinstance(queue, Queue) and queue.name == f"q-{uid}"
    assert queue.peek() is None and queue.pop() is None
    for item in ("a", "b", "c"):
        queue.push(item)
    assert queue.peek() == "a" and queue.pending() == 3 and queue.in_flight() == 0
    lease = queue.pop(lease_timeout=60)
    assert isinstance(lease, Lease) and lease.item == "a" and lease.deliveries == 1
    assert queue.pending() == 2 and queue.in_flight() == 1 and queue.peek() == "b"
    queue.done(lease)
    assert queue.in_flight() == 0
    second, third = queue.pop(), queue.pop()
    assert (second.item, third.item) == ("b", "c") and queue.pop() is None
    queue.done(third)
    queue.done(second)
    assert queue.pending() == 0 and queue.in_flight() == 0


def test_counts_gives_waiting_and_leased_items_together(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    assert queue.counts() == QueueCounts(pending=0, in_flight=0)
    for item in ("a", "b", "c"):
        queue.push(item)
    lease = queue.pop(lease_timeout=60)
    counts = queue.counts()
    assert counts == QueueCounts(pending=2, in_flight=1) and counts.unfinished == 3
    queue.done(lease)
    assert queue.counts() == QueueCounts(pending=2, in_flight=0)


def test_counts_is_one_reading_while_leases_run_out(qclient, uid):
    # "Is every item done?" must never be answered yes while an item is leased: an item
    # whose lease runs out moves from leased to waiting, and one reading sees it in one place.
    queue = qclient.create_queue(f"q-{uid}")
    for i in range(5):
        queue.push(i)
    for i in range(5):
        assert queue.pop(lease_timeout=0.2 * (i + 1)) is not None
    readings: list[QueueCounts] = []

    def all_back() -> bool:
        readings.append(queue.counts())
        return readings[-1].pending == 5

    wait_until(all_back, timeout=60, what="every lease to run out")
    assert {counts.unfinished for counts in readings} == {5}
    assert readings[0].in_flight > 0  # the leases were read while they were still held


def test_blocking_pop_waits_for_a_push_or_times_out(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    assert queue.pop(timeout=0.3) is None
    got: list[object] = []
    started = threading.Event()

    def consume() -> None:
        started.set()
        got.append(queue.pop(lease_timeout=60, timeout=120))

    consumer = threading.Thread(target=consume)
    consumer.start()
    started.wait(30)
    queue.push("late")
    consumer.join(150)
    assert not consumer.is_alive() and isinstance(got[0], Lease) and got[0].item == "late"


def test_an_expired_lease_is_redelivered_and_cannot_be_done(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    queue.push("work")
    first = queue.pop(lease_timeout=0.3)
    assert first is not None and first.deliveries == 1
    again = wait_until(lambda: queue.pop(lease_timeout=60), timeout=60, what="the item to be redelivered")
    assert again.item == "work" and again.deliveries == 2
    with pytest.raises(LeaseExpired, match="expired"):
        queue.done(first)
    queue.done(again)
    with pytest.raises(LeaseError, match="already done"):
        queue.done(again)
    assert queue.pending() == 0 and queue.in_flight() == 0


def test_a_blocking_pop_gets_an_item_whose_lease_ran_out(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    queue.push("work")
    assert queue.pop(lease_timeout=0.5) is not None
    again = queue.pop(lease_timeout=60, timeout=120)
    assert again is not None and again.deliveries == 2


def test_bad_input_is_refused_with_the_fix(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    with pytest.raises(QueueAlreadyExists, match="exist_ok=True"):
        qclient.create_queue(f"q-{uid}")
    with pytest.raises(ConfigError, match="queue name"):
        qclient.create_queue("no spaces allowed")
    with pytest.raises(ConfigError, match="lease_timeout"):
        queue.pop(lease_timeout=0)
    with pytest.raises(ConfigError, match="timeout"):
        queue.pop(timeout=-1)
    with pytest.raises(LeaseError, match="takes the Lease"):
        queue.done("lease-1")
    other = qclient.create_queue(f"other-{uid}")
    other.push(1)
    with pytest.raises(LeaseError, match="not"):
        queue.done(other.pop())


def test_exist_ok_attaches_to_the_same_queue(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    queue.push("shared")
    same = qclient.create_queue(f"q-{uid}", exist_ok=True)
    assert same.pop().item == "shared" and queue.in_flight() == 1


def test_handles_pickle_and_work_inside_jobs(qclient, uid):
    tasks = qclient.create_queue(f"tasks-{uid}")
    results = qclient.create_queue(f"results-{uid}")
    assert pickle.loads(pickle.dumps(tasks)).name == tasks.name
    producer = qclient.submit(
        JobRequest(name=f"produce-{uid}", entrypoint=Entrypoint.from_callable(produce, args=(tasks, 5)))
    )
    producer.wait(timeout=120)
    assert tasks.pending() == 5
    consumer = qclient.submit(
        JobRequest(name=f"consume-{uid}", entrypoint=Entrypoint.from_callable(square_all, args=(tasks, results)))
    )
    consumer.wait(timeout=120)
    squares = {}
    while (lease := results.pop()) is not None:
        squares[lease.item["id"]] = lease.item["square"]
        results.done(lease)
    assert squares == {i: i * i for i in range(5)}
    assert tasks.pending() == 0 and tasks.in_flight() == 0


def test_items_keep_their_type(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    for value in TYPED_VALUES:
        queue.push(value)
    assert typed(queue.peek()) == typed(TYPED_VALUES[0])
    for value in TYPED_VALUES:
        lease = queue.pop(lease_timeout=60)
        assert lease is not None and typed(lease.item) == typed(value)
        queue.done(lease)
