"""WorkerPool: worker jobs scaled with a queue's backlog and replaced when they die, on each backend with queues."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, JobRequest, JobStatus
from fray.pool import WorkerPool
from support import wait_until

POOL_FIXTURES = {"local": "local_client", "ray": "ray_client", "fray": "cluster_client"}

# kill -9 needs a worker that is a process of its own.
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "local": {"test_a_killed_worker_loses_no_item": "local jobs are threads; see the terminate variant"},
}


@pytest.fixture(params=sorted(POOL_FIXTURES))
def pclient(request: pytest.FixtureRequest):
    """A client of each backend with queues, in turn."""
    reason = NOT_APPLICABLE.get(request.param, {}).get(request.node.originalname)
    if reason:
        pytest.skip(f"not applicable on {request.param}: {reason}")
    client = request.getfixturevalue(POOL_FIXTURES[request.param])
    if not hasattr(client, "create_queue"):
        pytest.skip(f"{request.param} has no create_queue yet")
    return client


def worker(tasks, results, marks: str) -> None:
    """Plain user code: pop with a lease, work, push the result, done. Item ``stall`` hangs on first delivery."""
    while True:
        lease = tasks.pop(lease_timeout=3, timeout=1)
        if lease is None:
            continue
        item = lease.item
        if item.get("stall") and lease.deliveries == 1:
            Path(marks, f"stalled-{item['id']}").write_text(str(os.getpid()))
            while True:  # until killed or stopped: short sleeps, so a thread can be stopped too
                time.sleep(0.05)
        while item.get("gate") and not Path(item["gate"]).exists():
            time.sleep(0.05)
        results.push({"id": item["id"], "value": item["id"] * 10, "deliveries": lease.deliveries})
        tasks.done(lease)


def collect(results, count: int, timeout: float = 180) -> dict[int, list[dict]]:
    seen: dict[int, list[dict]] = {}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in seen.values()) < count and time.monotonic() < deadline:
        lease = results.pop(lease_timeout=60, timeout=1)
        if lease is not None:
            seen.setdefault(lease.item["id"], []).append(lease.item)
            results.done(lease)
    return seen


def template(name: str, tasks, results, marks: Path) -> JobRequest:
    return JobRequest(
        name=name,
        entrypoint=Entrypoint.from_callable(worker, args=(tasks, results, str(marks))),
        max_retries_preemption=0,
    )


def test_the_pool_scales_with_the_backlog_and_processes_everything_once(pclient, uid, tmp_path):
    tasks, results = pclient.create_queue(f"t-{uid}"), pclient.create_queue(f"r-{uid}")
    with WorkerPool(
        pclient, template(f"w-{uid}", tasks, results, tmp_path), tasks, 1, 3, scale_down_after=0.5, interval=0.2
    ) as pool:
        assert len(pool.workers) == 1  # min_workers, at once
        gate = tmp_path / "gate"
        for i in range(12):
            tasks.push({"id": i, "gate": str(gate)})  # held until the gate opens: the backlog stays
        wait_until(lambda: len(pool.workers) == 3, timeout=60, what="the pool to grow to max_workers")
        gate.write_text("open")
        seen = collect(results, 12)
        assert sorted(seen) == list(range(12)) and all(len(v) == 1 for v in seen.values())
        wait_until(lambda: len(pool.workers) == 1, timeout=60, what="the pool to shrink back to min_workers")


def test_a_worker_whose_job_ended_is_replaced(pclient, uid, tmp_path):
    tasks, results = pclient.create_queue(f"t-{uid}"), pclient.create_queue(f"r-{uid}")
    with WorkerPool(pclient, template(f"w-{uid}", tasks, results, tmp_path), tasks, 2, 2, interval=0.2) as pool:
        first = pool.workers[0]
        first.terminate()
        wait_until(lambda: first not in pool.workers and len(pool.workers) == 2, timeout=60, what="a replacement")
        assert first in pool.ended and first.status() == JobStatus.STOPPED


def test_a_stopped_worker_mid_item_loses_nothing(pclient, uid, tmp_path):
    tasks, results = pclient.create_queue(f"t-{uid}"), pclient.create_queue(f"r-{uid}")
    tasks.push({"id": 0, "stall": True})
    for i in range(1, 4):
        tasks.push({"id": i})
    with WorkerPool(pclient, template(f"w-{uid}", tasks, results, tmp_path), tasks, 1, 1, interval=0.2) as pool:
        wait_until(lambda: (tmp_path / "stalled-0").exists(), timeout=120, what="the worker to take item 0")
        pool.workers[0].terminate()
        seen = collect(results, 4)
    assert sorted(seen) == [0, 1, 2, 3] and all(len(v) == 1 for v in seen.values())
    assert seen[0][0]["deliveries"] == 2


def test_a_killed_worker_loses_no_item(pclient, uid, tmp_path):
    tasks, results = pclient.create_queue(f"t-{uid}"), pclient.create_queue(f"r-{uid}")
    for i in range(6):
        tasks.push({"id": i, "stall": i == 2})
    with WorkerPool(pclient, template(f"w-{uid}", tasks, results, tmp_path), tasks, 2, 2, interval=0.2):
        mark = tmp_path / "stalled-2"
        pid = int(wait_until(lambda: mark.exists() and mark.read_text(), timeout=120, what="a worker to take item 2"))
        os.kill(pid, signal.SIGKILL)
        seen = collect(results, 6)
    # Item 2 was redelivered after its lease ran out and processed to completion once; nothing was lost.
    assert sorted(seen) == list(range(6)) and all(len(v) == 1 for v in seen.values())
    assert seen[2][0]["deliveries"] == 2


def test_bad_arguments_are_refused(local_client):
    queue = local_client.create_queue("q")
    request = JobRequest(name="w", entrypoint=Entrypoint.from_callable(print))
    with pytest.raises(ConfigError, match="min_workers=3"):
        WorkerPool(local_client, request, queue, 3, 2)
    with pytest.raises(ConfigError, match="must be a queue"):
        WorkerPool(local_client, request, "q", 1, 2)
    with pytest.raises(ConfigError, match="must be a JobRequest"):
        WorkerPool(local_client, "w", queue, 1, 2)
