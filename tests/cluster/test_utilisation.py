"""The controller's utilisation sampler (the dashboard's charts): what a sample holds, the ring buffer's bounds,
the operator API's view of it, and the chart data and job timeline the dashboard draws from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fray.cluster.protocol.records import WorkerInfo
from fray.cluster.server.controller._utilisation import SAMPLE_CAPACITY, SAMPLE_INTERVAL_SECONDS, UtilisationSampler
from fray.cluster.server.ops import OpsService
from fray.cluster.server.store import ClusterStore
from support import wait_until

GiB = 1 << 30


def _worker(wid: str, state: str = "alive", cpu: float = 8.0, used: float = 0.0, tasks: int = 0) -> dict[str, Any]:
    return {
        "worker_id": wid,
        "state": state,
        "cpu_total": cpu,
        "cpu_used": used,
        "ram_total": 16 * GiB,
        "ram_used": int(used * GiB),
        "tasks": tasks,
    }


class _Cluster:
    """What the sampler reads, changed by the test between samples."""

    def __init__(self) -> None:
        self.workers = [_worker("w-0", used=2.0, tasks=2), _worker("w-1", used=1.0, tasks=1)]
        self.jobs = {"pending": 1, "running": 3, "succeeded": 0, "failed": 0, "stopped": 0}
        self.now = 1000.0

    def read(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        return self.workers, self.jobs

    def clock(self) -> float:
        return self.now


def test_a_sample_holds_the_live_workers_totals_jobs_by_state_and_each_worker():
    cluster = _Cluster()
    cluster.workers.append(_worker("w-lost", state="lost", cpu=64.0, used=64.0))
    sampler = UtilisationSampler(cluster.read, clock=cluster.clock)
    sampler.sample()
    (sample,) = sampler.samples()
    # A lost worker offers nothing: it counts neither in the totals nor per worker.
    assert sample["at"] == 1000.0
    assert (sample["cpu_used"], sample["cpu_total"]) == (3.0, 16.0)
    assert (sample["ram_used"], sample["ram_total"]) == (3 * GiB, 32 * GiB)
    assert sample["jobs"] == {"pending": 1, "running": 3, "succeeded": 0, "failed": 0, "stopped": 0}
    assert [w["worker_id"] for w in sample["workers"]] == ["w-0", "w-1"]
    assert sample["workers"][0] == {
        "worker_id": "w-0",
        "cpu_used": 2.0,
        "cpu_total": 8.0,
        "ram_used": 2 * GiB,
        "ram_total": 16 * GiB,
        "tasks": 2,
    }
    # Plain data only, and a copy: changing what was returned changes nothing kept.
    sample["jobs"]["pending"] = 99
    assert sampler.samples()[0]["jobs"]["pending"] == 1


def test_the_ring_buffer_keeps_the_newest_samples_up_to_its_capacity():
    cluster = _Cluster()
    sampler = UtilisationSampler(cluster.read, capacity=3, clock=cluster.clock)
    for step in range(5):
        cluster.now = 1000.0 + 5 * step
        cluster.jobs = {**cluster.jobs, "running": step}
        sampler.sample()
    kept = sampler.samples()
    assert [s["at"] for s in kept] == [1010.0, 1015.0, 1020.0]  # the two oldest went
    assert [s["jobs"]["running"] for s in kept] == [2, 3, 4]
    assert [s["at"] for s in sampler.samples(since=1010.0)] == [1015.0, 1020.0]
    # The default keeps one hour at one sample every five seconds.
    assert SAMPLE_INTERVAL_SECONDS * SAMPLE_CAPACITY == 3600
    with pytest.raises(ValueError):
        UtilisationSampler(cluster.read, capacity=0)


def test_the_sampler_thread_samples_at_once_and_then_every_interval_until_stopped():
    cluster = _Cluster()
    sampler = UtilisationSampler(cluster.read, interval=0.05, capacity=1000)
    sampler.start()
    try:
        wait_until(lambda: len(sampler.samples()) >= 3, timeout=30)
    finally:
        sampler.stop()
    count = len(sampler.samples())
    times = [s["at"] for s in sampler.samples()]
    assert times == sorted(times)
    sampler.sample()  # a sample taken by hand after stop still counts; the thread took no more
    assert len(sampler.samples()) == count + 1


def test_a_failing_read_leaves_a_gap_not_a_dead_sampler():
    cluster = _Cluster()
    failures = [2]

    def flaky() -> tuple[list[dict[str, Any]], dict[str, int]]:
        if failures[0]:
            failures[0] -= 1
            raise OSError("database is locked")
        return cluster.read()

    sampler = UtilisationSampler(flaky, interval=0.02)
    sampler.start()
    try:
        wait_until(lambda: len(sampler.samples()) >= 1, timeout=30)
    finally:
        sampler.stop()
    assert failures[0] == 0


def test_the_operator_api_reads_samples_of_the_store(tmp_path: Path):
    store = ClusterStore(tmp_path / "cluster.db")
    now = [500.0]
    ops = OpsService(store, spec_command=lambda job_id: "", clock=lambda: now[0], prune_interval=3600)
    try:
        store.register_worker(WorkerInfo("w-a", 4000, 8 * GiB, 8 * GiB), "127.0.0.1:1", now[0])
        store.register_worker(WorkerInfo("w-b", 2500, 4 * GiB, 8 * GiB), "127.0.0.1:2", now[0])
        ops.sampler.sample()
        data = ops.utilisation()
        assert data["interval"] == SAMPLE_INTERVAL_SECONDS and data["capacity"] == SAMPLE_CAPACITY
        (sample,) = data["samples"]
        assert (sample["cpu_used"], sample["cpu_total"]) == (0.0, 6.5)
        assert sample["ram_total"] == 12 * GiB
        assert sorted(w["worker_id"] for w in sample["workers"]) == ["w-a", "w-b"]
        assert sample["jobs"]["pending"] == 0
        # A user's view (not the administrator's) leaves out the cluster-wide job counts.
        assert "jobs" not in ops.utilisation(jobs=False)["samples"][0]
        assert ops.utilisation(since=500.0)["samples"] == []
    finally:
        ops.stop()
        store.close()


def test_chart_data_has_one_column_per_series_and_gaps_for_absent_workers():
    charts = pytest.importorskip("fray.cluster.server.dashboard.charts", reason="the dashboard extra is not installed")
    cluster = _Cluster()
    sampler = UtilisationSampler(cluster.read, clock=cluster.clock)
    sampler.sample()
    cluster.now += 5
    cluster.workers = [*cluster.workers, _worker("w-2", used=4.0)]
    sampler.sample()
    data = charts.chart_data({"interval": 5.0, "capacity": 720, "samples": sampler.samples()})
    assert data["t"] == [1000.0, 1005.0]
    by_id = {c["id"]: c for c in data["charts"]}
    assert by_id["cpu"]["series"][0] == {"label": "in use", "values": [3.0, 7.0]}
    assert by_id["cpu"]["series"][1] == {"label": "offered", "values": [16.0, 24.0]}
    assert by_id["ram"]["series"][1]["values"] == [32.0, 48.0]
    assert [s["label"] for s in by_id["jobs"]["series"]] == ["pending", "running", "succeeded", "failed", "stopped"]
    workers = {s["label"]: s["values"] for s in by_id["workers"]["series"]}
    assert workers == {"w-0": [2.0, 2.0], "w-1": [1.0, 1.0], "w-2": [None, 4.0]}
    memory = {s["label"]: s["values"] for s in by_id["workers_ram"]["series"]}
    assert memory == {"w-0": [2.0, 2.0], "w-1": [1.0, 1.0], "w-2": [None, 4.0]}  # GiB


def test_the_timeline_draws_one_bar_per_task_coloured_by_outcome_and_escapes_text():
    timeline = pytest.importorskip(
        "fray.cluster.server.dashboard.timeline", reason="the dashboard extra is not installed"
    )

    def task(attempt: int, state: str, start: float, end: float | None, worker: str) -> dict[str, Any]:
        return {
            "task": attempt,
            "attempt": attempt,
            "replica": 0,
            "state": state,
            "worker": worker,
            "exit_code": 1 if state == "failed" else None,
            "error": "<boom>" if state == "failed" else "",
            "created_at": start - 1,
            "assigned_at": start,
            "started_at": start,
            "finished_at": end,
        }

    svg = timeline.timeline_svg([task(1, "running", 20.0, None, "w-1"), task(0, "failed", 10.0, 15.0, "<w>")], 30.0)
    assert svg.count('<rect class="bar') == 2
    assert 'class="bar state-failed" data-attempt="0"' in svg  # oldest attempt first
    assert svg.index('data-attempt="0"') < svg.index('data-attempt="1"')
    assert "&lt;boom&gt;" in svg and "&lt;w&gt;" in svg and "<boom>" not in svg and "<w>" not in svg
    assert timeline.timeline_svg([], 0.0) == '<p class="muted">No tasks yet.</p>'
