"""Retention: finished jobs are pruned by age and by count, as whole trees; live jobs never."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
from fray.cluster.protocol.records import JobRecord, TaskKey, WorkerState
from fray.cluster.server._retention import RetentionPolicy, prune_departed_workers, prune_finished_jobs
from fray.cluster.server.ops import OpsService
from fray.cluster.server.scheduler import Assignment, SchedulingDecision
from fray.cluster.server.store import ClusterStore
from fray.errors import ConfigError, NotFound
from support import wait_until

DAY = 86400.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClusterStore]:
    s = ClusterStore(tmp_path / "cluster.db")
    yield s
    assert s.check_invariants() == []
    s.close()


def _job(store: ClusterStore, name: str, now: float, parent: str | None = None) -> JobRecord:
    return store.submit_job(
        name=name, user="alice", request=b"opaque", resources=TaskResources(), now=now, parent_id=parent
    )


def _finish(store: ClusterStore, job_id: str, now: float) -> None:
    store.terminate_job(job_id, now)


def _prune(store: ClusterStore, now: float, policy: RetentionPolicy) -> list[str]:
    deleted: list[str] = []
    while batch := store.write_with(lambda cur: prune_finished_jobs(cur, now, policy)):
        deleted += batch
    return deleted


def _ids(store: ClusterStore) -> set[str]:
    return {job.job_id for job in store.list_jobs()}


def test_finished_jobs_older_than_the_age_limit_go_with_their_logs(store: ClusterStore):
    old = _job(store, "old", now=0.0)
    store.append_logs(TaskKey(old.job_id, 0, 0), ["a line"])
    _finish(store, old.job_id, now=1.0)
    recent = _job(store, "recent", now=5 * DAY)
    _finish(store, recent.job_id, now=5 * DAY)
    live = _job(store, "live", now=0.0)  # pending for 10 days: never pruned

    assert _prune(store, 10 * DAY, RetentionPolicy(max_age_seconds=7 * DAY)) == [old.job_id]
    assert _ids(store) == {recent.job_id, live.job_id}
    assert store.read_logs(old.job_id) == []
    with pytest.raises(NotFound):
        store.get_job(old.job_id)


def test_only_the_newest_finished_jobs_are_kept_beyond_the_count_limit(store: ClusterStore):
    finished = []
    for i in range(5):
        job = _job(store, f"j{i}", now=float(i))
        _finish(store, job.job_id, now=float(i))
        finished.append(job.job_id)
    live = _job(store, "live", now=0.0)
    assert sorted(_prune(store, 10.0, RetentionPolicy(max_jobs=2))) == sorted(finished[:3])
    assert _ids(store) == {*finished[3:], live.job_id}


def test_a_job_tree_goes_whole_or_not_at_all(store: ClusterStore):
    parent = _job(store, "parent", now=0.0)
    child = _job(store, "child", now=0.0, parent=parent.job_id)
    _finish(store, parent.job_id, now=1.0)  # stops the child too
    assert sorted(_prune(store, 30 * DAY, RetentionPolicy())) == sorted([parent.job_id, child.job_id])
    assert _ids(store) == set()


def test_the_policy_refuses_nonsense():
    with pytest.raises(ConfigError, match="max_jobs"):
        RetentionPolicy(max_jobs=0)
    with pytest.raises(ConfigError, match="max_age_seconds"):
        RetentionPolicy(max_age_seconds=-1)


def test_the_controller_prunes_on_its_own(store: ClusterStore):
    now = [100 * DAY]
    old = _job(store, "old", now=0.0)
    _finish(store, old.job_id, now=0.0)
    store.register_worker(WorkerInfo("gone", 1000, 1 << 30, 1 << 30), "h:1", now=0.0)
    store.stop_worker("gone", 0.0, "drained")
    ops = OpsService(store, spec_command=lambda job_id: "", clock=lambda: now[0], prune_interval=3600)
    ops.start()  # prunes once at start
    try:
        wait_until(lambda: old.job_id not in _ids(store), what="the retention thread to prune the old job")
        wait_until(lambda: not store.list_workers(), what="the retention thread to prune the stopped worker")
    finally:
        ops.stop()


def test_stopped_and_lost_workers_are_pruned_after_their_time_and_revoked_ones_never(store: ClusterStore):
    for wid in ("stopped", "lost", "revoked", "alive", "busy"):
        store.register_worker(WorkerInfo(wid, 1000, 1 << 30, 1 << 30), "h:1", now=0.0)
    store.stop_worker("stopped", 0.0, "drained")
    store.lose_worker("lost", 0.0, "no heartbeat")
    store.revoke_worker("revoked", 0.0)
    job = _job(store, "busy", now=0.0)
    store.apply_decision(SchedulingDecision((Assignment(job.job_id, ("busy",)),), {}, {}), 0.0)
    store.stop_worker("busy", 0.0, "drained")  # its task is lost with it: nothing is active there any more
    policy = RetentionPolicy(stopped_worker_seconds=3600.0, lost_worker_seconds=DAY)

    def prune(now: float) -> list[str]:
        return store.write_with(lambda cur: prune_departed_workers(cur, now, policy))

    assert prune(1800.0) == []
    assert prune(3601.0) == ["busy", "stopped"]
    assert prune(DAY - 1) == []
    assert prune(DAY + 1) == ["lost"]
    assert {w.info.worker_id: w.state for w in store.list_workers()} == {
        "alive": WorkerState.ALIVE,  # heard from at 0 and never declared lost: not this function's to judge
        "revoked": WorkerState.REVOKED,
    }
    with pytest.raises(ConfigError, match="stopped_worker_seconds"):
        RetentionPolicy(stopped_worker_seconds=0)
