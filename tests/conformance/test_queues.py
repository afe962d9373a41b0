"""Queues with leases (``client.create_queue``), specified once for every backend that has them.

Its own backend list: the local backend, Ray, the Fray cluster, and Monarch (whose
queue is the generic actor-backed one). Iris refuses ``create_queue`` by name.
"""

from __future__ import annotations

import pickle
import re
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


# ----- batches: push_many, pop_many, done_many ---------------------------------------------------


def test_batches_push_pop_and_done_several_items_in_order(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    assert queue.pop_many(5) == []
    queue.push_many(["a", "b", "c", "d", "e"])
    queue.push_many([])  # nothing to push: nothing happens
    assert queue.counts() == QueueCounts(pending=5, in_flight=0) and queue.peek() == "a"
    first = queue.pop_many(3, lease_timeout=60)
    assert [lease.item for lease in first] == ["a", "b", "c"]
    assert all(isinstance(lease, Lease) and lease.deliveries == 1 and lease.timeout == 60 for lease in first)
    assert len({lease.lease_id for lease in first}) == 3
    rest = queue.pop_many(10)  # fewer waiting than asked for: what there is
    assert [lease.item for lease in rest] == ["d", "e"]
    assert queue.counts() == QueueCounts(pending=0, in_flight=5)
    queue.done_many(first + rest)
    queue.done_many([])
    assert queue.counts() == QueueCounts(pending=0, in_flight=0)
    with pytest.raises(LeaseError, match="already done"):
        queue.done(first[0])


def test_batches_mix_with_single_operations(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    queue.push("one")
    queue.push_many(("two", "three"))
    lease = queue.pop()
    assert lease.item == "one"
    batch = queue.pop_many(2)
    assert [each.item for each in batch] == ["two", "three"]
    queue.done_many([lease])
    for each in batch:
        queue.done(each)
    assert queue.counts().unfinished == 0


def test_blocking_pop_many_waits_for_the_first_item_or_times_out(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    assert queue.pop_many(4, timeout=0.3) == []
    got: list[list[Lease]] = []
    started = threading.Event()

    def consume() -> None:
        started.set()
        got.append(queue.pop_many(4, lease_timeout=60, timeout=120))

    consumer = threading.Thread(target=consume)
    consumer.start()
    started.wait(30)
    queue.push_many(["late"])
    consumer.join(150)
    assert not consumer.is_alive() and [lease.item for lease in got[0]] == ["late"]


def test_a_lease_from_pop_many_expires_and_is_redelivered(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    queue.push_many(["short", "long"])
    short, long = queue.pop_many(1, lease_timeout=0.3) + queue.pop_many(1, lease_timeout=600)
    assert (short.item, long.item) == ("short", "long")
    again = wait_until(lambda: queue.pop_many(5, lease_timeout=60), timeout=60, what="the item to be redelivered")
    assert [(lease.item, lease.deliveries) for lease in again] == [("short", 2)]
    queue.done_many([long, again[0]])
    assert queue.counts().unfinished == 0


def test_done_many_with_an_expired_lease_does_the_others_and_names_it(qclient, uid):
    # The chosen rule: every lease still held is done; the call then raises done()'s error
    # for the lease that is not (LeaseExpired), naming it.
    queue = qclient.create_queue(f"q-{uid}")
    queue.push_many(["expires", "kept-1", "kept-2"])
    expiring = queue.pop_many(1, lease_timeout=0.3)[0]
    kept = queue.pop_many(2, lease_timeout=600)
    redelivered = wait_until(lambda: queue.pop(lease_timeout=600), timeout=60, what="the lease to run out")
    assert redelivered.item == "expires"
    with pytest.raises(LeaseExpired, match=re.escape(expiring.lease_id)) as caught:
        queue.done_many([kept[0], expiring, kept[1]])
    assert "2 lease(s) of this call are done" in str(caught.value)
    assert queue.counts() == QueueCounts(pending=0, in_flight=1)  # only the redelivered lease is left
    with pytest.raises(LeaseError, match="already done"):
        queue.done(kept[1])
    queue.done(redelivered)
    assert queue.counts().unfinished == 0


def test_batch_bad_input_is_refused_with_the_fix(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    for wrong in ("abc", b"abc", {"a": 1}, 7, None):
        with pytest.raises(ConfigError, match=r"push_many.*list"):
            queue.push_many(wrong)
    for wrong in (0, -1, 2.5, True, "3"):
        with pytest.raises(ConfigError, match="max_items"):
            queue.pop_many(wrong)
    with pytest.raises(ConfigError, match="lease_timeout"):
        queue.pop_many(2, lease_timeout=0)
    with pytest.raises(ConfigError, match="timeout"):
        queue.pop_many(2, timeout=-1)
    with pytest.raises(ConfigError, match=r"done_many.*list"):
        queue.done_many("lease-1")
    queue.push_many([1, 2])
    leases = queue.pop_many(2)
    with pytest.raises(LeaseError, match="takes the Lease"):
        queue.done_many([leases[0], "lease-1"])
    other = qclient.create_queue(f"other-{uid}")
    other.push(3)
    with pytest.raises(LeaseError, match="call done_many"):
        queue.done_many([leases[0], other.pop()])
    assert queue.in_flight() == 2  # a refused call does nothing, not even to the leases that were fine
    queue.done_many(leases)
    assert queue.counts().unfinished == 0


def test_batched_items_keep_their_type(qclient, uid):
    queue = qclient.create_queue(f"q-{uid}")
    queue.push_many(TYPED_VALUES)
    leases = queue.pop_many(len(TYPED_VALUES), lease_timeout=60)
    assert [typed(lease.item) for lease in leases] == [typed(value) for value in TYPED_VALUES]
    queue.done_many(leases)
