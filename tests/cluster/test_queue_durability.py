"""The cluster's queues are durable: a controller killed with SIGKILL and restarted loses nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import LeaseError, LeaseExpired
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from support import wait_until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster") as c:
        c.start_controller()
        yield c


def test_items_and_leases_survive_a_controller_kill(cluster: LocalCluster):
    client = ClusterClient(cluster.address, token=cluster.token)
    queue = client.create_queue("work")
    for i in range(100):
        queue.push({"id": i})
    held = [queue.pop(lease_timeout=600) for _ in range(10)]
    for lease in held[:5]:
        queue.done(lease)
    short = queue.pop(lease_timeout=1.0)  # expires while the controller is down or just after
    assert short is not None and short.item == {"id": 10}

    cluster.kill_controller()
    cluster.start_controller()

    assert queue.pending() + queue.in_flight() == 95 - 5 + 5  # 100 pushed, 5 done
    for lease in held[5:]:
        queue.done(lease)  # leases taken before the kill are still held
    with pytest.raises(LeaseError, match="already done"):
        queue.done(held[0])
    wait_until(lambda: queue.in_flight() == 0, timeout=60, what="the short lease to run out")
    again = queue.pop(lease_timeout=600)
    assert again.item == {"id": 10} and again.deliveries == 2  # back at the front
    with pytest.raises(LeaseExpired):
        queue.done(short)
    queue.done(again)
    rest = []
    while (lease := queue.pop(lease_timeout=600)) is not None:
        rest.append(lease.item["id"])
        queue.done(lease)
    assert rest == list(range(11, 100))  # in order, none lost, none twice
    assert queue.pending() == 0 and queue.in_flight() == 0


def test_a_blocking_pop_rides_out_a_controller_restart(cluster: LocalCluster):
    client = ClusterClient(cluster.address, token=cluster.token)
    queue = client.create_queue("wait")
    got: list[object] = []
    started = threading.Event()

    def consume() -> None:
        started.set()
        got.append(queue.pop(lease_timeout=60, timeout=120))

    consumer = threading.Thread(target=consume)
    consumer.start()
    started.wait(30)
    cluster.kill_controller()
    cluster.start_controller()
    queue.push("after the restart")
    consumer.join(150)
    assert not consumer.is_alive() and got[0] is not None and got[0].item == "after the restart"


def test_the_same_name_in_another_namespace_is_another_queue(cluster: LocalCluster):
    first = ClusterClient(cluster.address, token=cluster.token, namespace="ns-a").create_queue("jobs")
    second = ClusterClient(cluster.address, token=cluster.token, namespace="ns-b").create_queue("jobs")
    first.push(1)
    assert second.pending() == 0 and first.pending() == 1
