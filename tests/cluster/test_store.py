"""The controller's durable store: ids, lifecycle, gang retries, workers, endpoints, logs, credit, crashes."""

from __future__ import annotations

import os
import pickle
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fray.cluster.protocol.capacity import Device, TaskResources, WorkerInfo
from fray.cluster.protocol.records import (
    TASK_TRANSITIONS,
    Effects,
    JobRecord,
    KillOrder,
    TaskKey,
    TaskState,
    WorkerState,
    check_task_transition,
    check_worker_transition,
)
from fray.cluster.server.credit import CreditPolicy
from fray.cluster.server.scheduler import Assignment, PendingReason, SchedulingDecision, schedule
from fray.cluster.server.store import ClusterStore, _blobs
from fray.cluster.server.store._schema import SCHEMA_VERSION
from fray.core._lifecycle import TRANSITIONS, Failure, FailureKind, RetryBudget, check_transition
from fray.errors import IllegalTransition, JobTimeout, NotFound, StoreError
from fray.job import Entrypoint, JobRequest, JobStatus
from fray.resources import ResourceConfig, TpuConfig

GiB = 1 << 30


def make_worker(wid: str, cpu: int = 8, **attributes: str) -> WorkerInfo:
    return WorkerInfo(wid, cpu * 1000, 32 * GiB, 100 * GiB, (), {k.replace("_", "-"): v for k, v in attributes.items()})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClusterStore]:
    s = ClusterStore(tmp_path / "cluster.db")
    yield s
    assert s.check_invariants() == []
    s.close()


def submit(
    store: ClusterStore, name: str = "job", *, replicas: int = 1, now: float = 0.0, **kwargs: object
) -> JobRecord:
    kwargs.setdefault("resources", TaskResources())
    kwargs.setdefault("user", "alice")
    return store.submit_job(name=name, request=b"opaque", replicas=replicas, now=now, **kwargs)  # type: ignore[arg-type]


def start(store: ClusterStore, job: JobRecord, workers: list[str], now: float = 1.0) -> list[TaskKey]:
    """Assign every task of ``job`` (task i to workers[i]) and mark them running."""
    assigned = store.apply_decision(SchedulingDecision((Assignment(job.job_id, tuple(workers)),), {}, {}), now)
    assert [t.job_id for t in assigned] == [job.job_id] * len(workers)
    for t in assigned:
        assert store.mark_task_running(t.key, now)
    return [t.key for t in assigned]


@pytest.fixture
def two_workers(store: ClusterStore) -> list[str]:
    store.register_worker(make_worker("w-1"), "10.0.0.1:1", 0.0)
    store.register_worker(make_worker("w-2"), "10.0.0.2:1", 0.0)
    return ["w-1", "w-2"]


# -- state machines ----------------------------------------------------------------------------


def test_state_machines_allow_exactly_the_documented_moves() -> None:
    # Jobs use the state machine every backend shares; tasks and workers are the cluster's own.
    check_transition(JobStatus.PENDING, JobStatus.RUNNING)
    check_transition(JobStatus.RUNNING, JobStatus.PENDING)
    check_task_transition(TaskState.ASSIGNED, TaskState.SUCCEEDED)
    check_worker_transition(WorkerState.LOST, WorkerState.ALIVE)
    for bad in [(JobStatus.PENDING, JobStatus.SUCCEEDED), (JobStatus.SUCCEEDED, JobStatus.RUNNING)]:
        with pytest.raises(IllegalTransition, match="is not allowed"):
            check_transition(*bad)
    with pytest.raises(IllegalTransition, match="cannot go from"):
        check_worker_transition(WorkerState.LOST, WorkerState.LOST)
    with pytest.raises(IllegalTransition):
        check_task_transition(TaskState.PENDING, TaskState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_task_transition(TaskState.KILLED, TaskState.RUNNING)
    for state in JobStatus:
        assert (TRANSITIONS[state] == frozenset()) == state.finished
    for task_state in TaskState:
        assert (TASK_TRANSITIONS[task_state] == frozenset()) == task_state.finished


# -- submission, ids, namespaces ---------------------------------------------------------------


def test_submit_creates_pending_job_with_pending_tasks(store: ClusterStore) -> None:
    job = submit(store, "train", replicas=3)
    assert re.fullmatch(r"train-[0-9a-f]{4}", job.job_id)
    assert job.state == JobStatus.PENDING and job.namespace == job.job_id and job.parent_id is None
    tasks = store.get_tasks(job.job_id)
    assert [(t.task_index, t.attempt, t.state) for t in tasks] == [(i, 0, TaskState.PENDING) for i in range(3)]
    assert store.job_request(job.job_id) == b"opaque"
    assert store.credits() == {"alice": CreditPolicy().initial_credit}


def test_children_get_hierarchical_ids_and_inherit_the_namespace(store: ClusterStore) -> None:
    parent = submit(store, "leader")
    child = submit(store, "rollout", parent_id=parent.job_id)
    grandchild = submit(store, "inference", parent_id=child.job_id)
    other = submit(store, "shared", parent_id=parent.job_id, namespace="global")
    assert re.fullmatch(re.escape(parent.job_id) + r"/rollout-[0-9a-f]{4}", child.job_id)
    assert grandchild.job_id.startswith(child.job_id + "/inference-")
    assert child.namespace == grandchild.namespace == parent.namespace == parent.job_id
    assert other.namespace == "global"
    assert [j.job_id for j in store.list_jobs(parent_id=parent.job_id)] == [child.job_id, other.job_id]


def test_submit_rejects_bad_input_and_finished_parents(store: ClusterStore) -> None:
    with pytest.raises(ValueError):
        submit(store, "has/slash")
    with pytest.raises(NotFound):
        submit(store, "x", parent_id="nope-0000")
    with pytest.raises(NotFound):
        store.get_worker("nope")
    parent = submit(store, "p")
    store.terminate_job(parent.job_id, 1.0)
    with pytest.raises(StoreError, match="already stopped"):
        submit(store, "late", parent_id=parent.job_id)


def test_submit_request_takes_everything_from_the_job_request(store: ClusterStore) -> None:
    request = JobRequest(
        name="tpu-train",
        entrypoint=Entrypoint.from_binary("true"),
        resources=ResourceConfig(device=TpuConfig("v5litepod-16")),
        replicas=2,
        max_retries_failure=3,
        max_retries_preemption=7,
    )
    job = store.submit_request(request, pickle.dumps(request.name), user="bob", now=0.0)
    assert (job.replicas, job.max_retries_failure, job.max_retries_preemption) == (2, 3, 7)
    assert job.task_count == 8
    tasks = store.get_tasks(job.job_id)
    assert [(t.replica_index, t.host_index) for t in tasks] == [(r, h) for r in range(2) for h in range(4)]


# -- scheduling round trip ---------------------------------------------------------------------


def test_scheduler_input_and_apply_decision_round_trip(store: ClusterStore, two_workers: list[str]) -> None:
    fits = submit(store, "fits", replicas=2, now=1.0)
    huge = submit(store, "huge", resources=TaskResources(ram_bytes=1024 * GiB), now=2.0)
    inp = store.scheduler_input()
    assert [p.job_id for p in inp.pending] == [fits.job_id, huge.job_id]
    assert {w.worker_id for w in inp.workers} == set(two_workers)
    decision = schedule(inp.pending, inp.workers, inp.running, inp.credits, now=3.0)
    assigned = store.apply_decision(decision, 3.0)
    assert {t.state for t in assigned} == {TaskState.ASSIGNED}
    assert store.get_job(fits.job_id).state == JobStatus.RUNNING
    pending = store.get_job(huge.job_id)
    assert pending.state == JobStatus.PENDING
    assert pending.pending_reason.startswith("can never be scheduled with the current workers: no worker has 1 TiB RAM")
    assert len(store.scheduler_input().running) == 2
    # A never-satisfiable job can still be terminated.
    assert store.terminate_job(huge.job_id, 4.0).finished == {huge.job_id: JobStatus.STOPPED}


def test_apply_decision_skips_jobs_no_longer_pending_and_dead_workers(
    store: ClusterStore, two_workers: list[str]
) -> None:
    gone = submit(store, "gone")
    moved = submit(store, "moved")
    store.terminate_job(gone.job_id, 1.0)
    store.lose_worker("w-2", 1.0)
    decision = SchedulingDecision(
        (Assignment(gone.job_id, ("w-1",)), Assignment(moved.job_id, ("w-2",))),
        {moved.job_id: PendingReason(moved.job_id, "waiting", True)},
        {},
    )
    assert store.apply_decision(decision, 2.0) == []
    assert store.get_job(gone.job_id).state == JobStatus.STOPPED
    assert store.get_job(moved.job_id).state == JobStatus.PENDING
    with pytest.raises(StoreError, match="names 2 workers"):
        store.apply_decision(SchedulingDecision((Assignment(moved.job_id, ("w-1", "w-1")),), {}, {}), 2.0)


def test_pending_tasks_expose_their_jobs_reason(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, resources=TaskResources(cpu_millis=64_000), replicas=2)
    inp = store.scheduler_input()
    store.apply_decision(schedule(inp.pending, inp.workers, inp.running, inp.credits, now=1.0), 1.0)
    reasons = {t.pending_reason for t in store.get_tasks(job.job_id)}
    assert reasons == {
        "can never be scheduled with the current workers: no worker has 64 cores (largest: 8 cores on w-2)"
    }
    assert store.get_task(TaskKey(job.job_id, 1, 0)).pending_reason == reasons.pop()


def test_batch_commits_once_and_keeps_each_call_atomic(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = ClusterStore(path)
    store.register_worker(make_worker("w-1"), "a", 0.0)
    with store.batch():
        kept = submit(store, "kept")
        with pytest.raises(NotFound):
            submit(store, "orphan", parent_id="missing-0000")  # undone on its own; the batch goes on
        # Another connection does not see the batch before it commits.
        with sqlite3.connect(path) as other:
            assert other.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0
        with pytest.raises(StoreError, match="nest"), store.batch():
            pass
    assert [j.job_id for j in store.list_jobs()] == [kept.job_id]
    with pytest.raises(RuntimeError), store.batch():
        submit(store, "dropped")
        raise RuntimeError("controller bug")
    assert [j.name for j in store.list_jobs()] == ["kept"], "a batch left by an exception is rolled back"
    assert store.check_invariants() == []
    store.close()


# -- task lifecycle and gang retries -------------------------------------------------------------


def test_job_succeeds_when_every_task_exits_zero(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, replicas=2)
    a, b = start(store, job, two_workers)
    first = store.mark_task_exited(a, 0, 2.0)
    assert first.applied and first.finished == {}
    assert store.get_job(job.job_id).state == JobStatus.RUNNING
    last = store.mark_task_exited(b, 0, 3.0)
    assert last.finished == {job.job_id: JobStatus.SUCCEEDED}
    assert store.get_job(job.job_id).finished_at == 3.0


def test_short_task_may_exit_before_its_start_report(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store)
    (task,) = store.apply_decision(SchedulingDecision((Assignment(job.job_id, ("w-1",)),), {}, {}), 1.0)
    assert store.mark_task_exited(task.key, 0, 1.5).finished == {job.job_id: JobStatus.SUCCEEDED}
    assert store.mark_task_running(task.key, 1.6) is False, "a late start report is stale"


def test_a_failing_replica_retries_the_whole_gang(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, replicas=2, max_retries_failure=1)
    a, b = start(store, job, two_workers)
    fx = store.mark_task_exited(a, 3, 2.0, Failure.from_exit("train", 3, ["loss: nan"]).encode())
    assert fx.retried == (job.job_id,)
    assert fx.kill == (KillOrder(b, "w-2"),), "the surviving replica is stopped"
    again = store.get_job(job.job_id)
    assert (again.state, again.attempt, again.failure_count) == (JobStatus.PENDING, 1, 1)
    first = "replica 0 of 2: 'train' exit code 3; last output:\nloss: nan"
    assert again.error == first
    # The pending reason is worded by the shared retry budget, as on every backend.
    assert again.pending_reason == RetryBudget(1, 100).decide(Failure(first))[2]
    old = store.get_tasks(job.job_id, attempt=0)
    assert [(t.state, t.exit_code) for t in old] == [(TaskState.FAILED, 3), (TaskState.KILLED, None)]
    assert [t.state for t in store.get_tasks(job.job_id)] == [TaskState.PENDING] * 2
    # A report from the killed replica of the old attempt is stale and ignored.
    assert store.mark_task_exited(b, 137, 2.5).applied is False
    # Second failure exhausts the budget: the job fails and keeps the error.
    a2, b2 = start(store, again, two_workers, now=3.0)
    fx = store.mark_task_exited(b2, 1, 4.0)  # no failure report: the store words the exit itself
    assert fx.finished == {job.job_id: JobStatus.FAILED} and fx.kill == (KillOrder(a2, "w-1"),)
    final = store.get_job(job.job_id)
    last = Failure.from_exit("task 1", 1).in_replica(1, 2)
    assert final.state == JobStatus.FAILED
    assert final.error == RetryBudget(1, 100, failures=1).exhausted_message(last)
    stored = store.job_failure(job.job_id)
    assert stored is not None and Failure.decode(stored).message == final.error


def test_a_job_that_succeeds_on_a_retry_has_no_error(store: ClusterStore, two_workers: list[str]) -> None:
    """Listings show a succeeded job without the failed attempt's error; that attempt's task keeps it."""
    job = submit(store, replicas=1, max_retries_failure=1)
    (a,) = start(store, job, two_workers[:1])
    store.mark_task_exited(a, 3, 2.0, Failure.from_exit("train", 3, ["loss: nan"]).encode())
    assert store.get_job(job.job_id).error, "a job waiting for its retry says why"
    (a2,) = start(store, store.get_job(job.job_id), two_workers[:1], now=3.0)
    assert store.mark_task_exited(a2, 0, 4.0).finished == {job.job_id: JobStatus.SUCCEEDED}
    final = store.get_job(job.job_id)
    assert (final.state, final.error) == (JobStatus.SUCCEEDED, "")
    (failed,) = store.get_tasks(job.job_id, attempt=0)
    assert failed.state == TaskState.FAILED and "exit code 3" in failed.error


def test_failure_and_preemption_budgets_are_separate(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, max_retries_failure=0, max_retries_preemption=2)
    for attempt in range(2):
        (key,) = start(store, store.get_job(job.job_id), ["w-1"], now=float(attempt))
        assert store.mark_task_lost(key, attempt + 0.5).retried == (job.job_id,)
    rec = store.get_job(job.job_id)
    assert (rec.preemption_count, rec.failure_count, rec.attempt) == (2, 0, 2)
    (key,) = start(store, rec, ["w-1"], now=5.0)
    assert store.mark_task_exited(key, 1, 6.0).finished == {job.job_id: JobStatus.FAILED}
    budget = RetryBudget(0, 2, failures=0, preemptions=2)
    assert store.get_job(job.job_id).error == budget.exhausted_message(Failure.from_exit("task 0", 1))


def test_an_exhausted_preemption_budget_fails_the_job_with_the_shared_words(
    store: ClusterStore, two_workers: list[str]
) -> None:
    job = submit(store, max_retries_preemption=0)
    (key,) = start(store, job, ["w-1"])
    assert store.mark_task_lost(key, 2.0, "preempted").finished == {job.job_id: JobStatus.FAILED}
    final = store.get_job(job.job_id)
    assert final.error == "task 0 lost: preempted"  # no retries were allowed: the plain reason
    stored = store.job_failure(job.job_id)
    assert stored is not None and Failure.decode(stored).kind == "preemption"


def test_terminate_stops_the_job_and_all_descendants(store: ClusterStore, two_workers: list[str]) -> None:
    parent = submit(store, "leader")
    (pkey,) = start(store, parent, ["w-1"])
    child = submit(store, "child", parent_id=parent.job_id, replicas=2)
    (c1, c2) = start(store, child, two_workers)
    pending_grandchild = submit(store, "gc", parent_id=child.job_id)
    fx = store.terminate_job(parent.job_id, 5.0, reason="user asked")
    assert fx.finished == {
        parent.job_id: JobStatus.STOPPED,
        child.job_id: JobStatus.STOPPED,
        pending_grandchild.job_id: JobStatus.STOPPED,
    }
    assert set(fx.kill) == {KillOrder(pkey, "w-1"), KillOrder(c1, "w-1"), KillOrder(c2, "w-2")}
    assert store.get_job(child.job_id).error == "parent job " + parent.job_id + " stopped"
    assert store.get_job(parent.job_id).error == "user asked"
    assert store.terminate_job(parent.job_id, 6.0).applied is False


def test_children_are_stopped_when_the_parent_succeeds(store: ClusterStore, two_workers: list[str]) -> None:
    parent = submit(store, "leader")
    (pkey,) = start(store, parent, ["w-1"])
    child = submit(store, "child", parent_id=parent.job_id)
    (ckey,) = start(store, child, ["w-2"])
    fx = store.mark_task_exited(pkey, 0, 3.0)
    assert fx.finished == {parent.job_id: JobStatus.SUCCEEDED, child.job_id: JobStatus.STOPPED}
    assert fx.kill == (KillOrder(ckey, "w-2"),)


# -- workers -----------------------------------------------------------------------------------


def test_lost_worker_retries_its_gangs_under_the_preemption_budget(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, replicas=2)
    a, b = start(store, job, two_workers, now=1.0)
    assert store.heartbeat("w-2", 20.0)
    fx = store.expire_workers(now=25.0, timeout=10.0)
    assert fx.lost_workers == ("w-1",)
    assert fx.retried == (job.job_id,)
    assert fx.kill == (KillOrder(b, "w-2"),), "no kill order goes to the lost worker"
    assert store.get_task(a).state == TaskState.LOST
    assert store.get_job(job.job_id).preemption_count == 1
    assert store.heartbeat("w-1", 26.0) is False, "a lost worker must re-register"
    assert [w.info.worker_id for w in store.list_workers(alive_only=True)] == ["w-2"]
    assert {w.worker_id for w in store.scheduler_input().workers} == {"w-2"}


def test_a_worker_that_leaves_is_stopped_not_lost_and_its_last_exits_count(
    store: ClusterStore, two_workers: list[str]
) -> None:
    done = submit(store, "done")
    (finished,) = start(store, done, ["w-1"], now=1.0)
    held = submit(store, "held", max_retries_failure=0, max_retries_preemption=2)
    (handed_back,) = start(store, held, ["w-1"], now=1.0)
    # The draining worker's last exits go first (a task that exited 0 succeeded); what it still held is lost.
    fx = store.stop_worker("w-1", 5.0, "it left the cluster (SIGTERM)", [(finished, 0, None)])
    assert fx.retried == (held.job_id,) and fx.finished == {done.job_id: JobStatus.SUCCEEDED}
    assert store.get_task(handed_back).state == TaskState.LOST
    after = store.get_job(held.job_id)
    assert (after.state, after.failure_count, after.preemption_count) == (JobStatus.PENDING, 0, 1)
    assert "left the cluster (SIGTERM)" in after.pending_reason
    assert store.get_worker("w-1").state == WorkerState.STOPPED
    assert store.stop_worker("w-1", 6.0, "again") == Effects(), "a stopped worker stays as it is"
    assert {w.worker_id for w in store.scheduler_input().workers} == {"w-2"}
    # It may come back (started again): a new epoch, alive.
    store.register_worker(make_worker("w-1"), "10.0.0.1:1", 7.0)
    assert store.get_worker("w-1").state == WorkerState.ALIVE
    check_worker_transition(WorkerState.LOST, WorkerState.STOPPED)  # a lost VM that was then scaled down
    with pytest.raises(IllegalTransition):
        check_worker_transition(WorkerState.STOPPED, WorkerState.LOST)


def test_a_returning_worker_has_its_stale_tasks_killed(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store)
    (key,) = start(store, job, ["w-1"])
    store.lose_worker("w-1", 2.0, "preempted")
    fx = store.register_worker(make_worker("w-1"), "10.0.0.1:2", 3.0, running=[key])
    assert fx.kill == (KillOrder(key, "w-1"),)
    record = store.get_worker("w-1")
    assert (record.state, record.address, record.last_heartbeat) == (WorkerState.ALIVE, "10.0.0.1:2", 3.0)


def test_reregistering_worker_that_lost_its_tasks_loses_them(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, max_retries_preemption=5)
    (key,) = start(store, job, ["w-1"])
    fx = store.register_worker(make_worker("w-1"), "10.0.0.1:1", 3.0, running=[])
    assert fx.retried == (job.job_id,)
    assert store.get_task(key).state == TaskState.LOST
    # An assigned-but-not-yet-started task is left for the controller to resend.
    (assigned,) = store.apply_decision(SchedulingDecision((Assignment(job.job_id, ("w-1",)),), {}, {}), 4.0)
    assert store.reconcile_worker("w-1", [], 5.0).applied
    assert store.get_task(assigned.key).state == TaskState.ASSIGNED
    assert [t.key for t in store.tasks_on_worker("w-1")] == [assigned.key]


def test_refresh_heartbeats_gives_workers_a_full_timeout_after_a_restart(
    store: ClusterStore, two_workers: list[str]
) -> None:
    assert store.refresh_heartbeats(1000.0) == 2
    assert store.expire_workers(now=1005.0, timeout=10.0).lost_workers == ()
    assert store.expire_workers(now=1011.0, timeout=10.0).lost_workers == ("w-1", "w-2")


def test_worker_record_round_trips_devices_and_attributes(store: ClusterStore) -> None:
    info = WorkerInfo(
        "tpu-0",
        96_000,
        200 * GiB,
        1000 * GiB,
        (Device("tpu", "v5litepod-16", 4),),
        {"tpu-name": "s", "tpu-worker-id": "0"},
    )
    store.register_worker(info, "h:1", 0.0)
    assert store.list_workers()[0].info == info


# -- endpoints ---------------------------------------------------------------------------------


def test_endpoints_register_list_and_vanish_with_their_task(store: ClusterStore, two_workers: list[str]) -> None:
    job = submit(store, replicas=2)
    a, b = start(store, job, two_workers)
    ns = job.namespace
    assert store.register_endpoint(ns, "actor/curriculum", "10.0.0.1:7000", a, 2.0)
    assert store.register_endpoint(ns, "actor/curriculum", "10.0.0.2:7000", b, 2.0)
    assert store.register_endpoint(ns, "actor/curriculum", "10.0.0.1:7001", a, 2.5), "re-registering replaces"
    assert store.register_endpoint("other-ns", "actor/curriculum", "x:1", a, 2.0)
    assert [e.address for e in store.list_endpoints(ns, "actor/")] == ["10.0.0.2:7000", "10.0.0.1:7001"]
    assert store.list_endpoints(ns, "nope") == []
    assert store.remove_endpoint("other-ns", "actor/curriculum") == 1
    # The task ends: its endpoints disappear; a late registration is refused.
    store.mark_task_exited(a, 0, 3.0)
    assert [e.task for e in store.list_endpoints(ns)] == [b]
    assert store.register_endpoint(ns, "late", "x:1", a, 3.5) is False
    # A gang retry (here: termination) removes the rest.
    store.terminate_job(job.job_id, 4.0)
    assert store.list_endpoints(ns) == []


# -- logs ----------------------------------------------------------------------------------------


def test_logs_append_read_follow_and_are_bounded_per_task(tmp_path: Path) -> None:
    with ClusterStore(tmp_path / "db", max_log_lines_per_task=5) as store:
        job = submit(store, replicas=2)
        a, b = (t.key for t in store.get_tasks(job.job_id))
        store.append_logs(a, [f"a{i}" for i in range(4)])
        store.append_logs(b, ["b0"])
        lines = store.read_logs(job.job_id)
        assert [line.line for line in lines] == ["a0", "a1", "a2", "a3", "b0"]
        assert [line.line for line in store.read_logs(job.job_id, after_id=lines[2].line_id)] == ["a3", "b0"]
        assert [line.line for line in store.read_logs(job.job_id, last=2)] == ["a3", "b0"]
        store.append_logs(a, [f"a{i}" for i in range(4, 9)])
        assert [line.line for line in store.read_logs(job.job_id) if line.task_index == 0] == [
            f"a{i}" for i in range(4, 9)
        ]
        with pytest.raises(NotFound):
            store.append_logs(TaskKey(job.job_id, 9, 0), ["x"])


# -- credit --------------------------------------------------------------------------------------


def test_running_tasks_are_billed_and_balances_regenerate_up_to_the_cap(tmp_path: Path) -> None:
    policy = CreditPolicy(initial_credit=1000.0, regen_per_second=1.0, cpu_weight=1.0, ram_gib_weight=0.0)
    with ClusterStore(tmp_path / "db", credit_policy=policy) as store:
        store.register_worker(make_worker("w-1"), "a", 0.0)
        job = submit(store, resources=TaskResources(cpu_millis=2000), replicas=2, now=0.0)
        a, b = start(store, job, ["w-1", "w-1"], now=0.0)
        # 10 s of 2 tasks x 2 cores cost 40 credits; 10 s of regeneration give 10 back.
        assert store.accrue_credits(10.0) == {"alice": pytest.approx(1000.0 - 40.0 + 10.0)}
        # One task ends at t=15: billed to its end at once (2 cores x 5 s).
        assert store.mark_task_exited(a, 0, 15.0).applied
        assert store.credits()["alice"] == pytest.approx(970.0 - 10.0)
        # t=20: the other task's 10 s (20 credits), plus 10 s of regeneration.
        assert store.accrue_credits(20.0)["alice"] == pytest.approx(960.0 - 20.0 + 10.0)
        store.mark_task_exited(b, 0, 20.0)
        assert store.accrue_credits(1000.0)["alice"] == 1000.0, "idle users regenerate to the cap"
        store.set_credit("bob", 5.0, 1000.0)
        assert store.scheduler_input().credits == {"alice": 1000.0, "bob": 5.0}


# -- durability ----------------------------------------------------------------------------------


def _snapshot(store: ClusterStore) -> tuple[object, ...]:
    jobs = store.list_jobs()
    return (
        jobs,
        [store.get_tasks(j.job_id, a) for j in jobs for a in range(j.attempt + 1)],
        store.list_workers(),
        [store.list_endpoints(j.namespace) for j in jobs],
        [store.read_logs(j.job_id) for j in jobs],
        store.credits(),
    )


def test_reopening_gives_back_exactly_the_committed_state(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = ClusterStore(path)
    store.register_worker(make_worker("w-1", region="us"), "a:1", 0.0)
    store.register_worker(make_worker("w-2"), "a:2", 0.0)
    job = submit(store, "svc", replicas=2)
    a, _ = start(store, job, ["w-1", "w-2"])
    store.register_endpoint(job.namespace, "svc", "a:9", a, 2.0)
    store.append_logs(a, ["hello"])
    failed = submit(store, "flaky", max_retries_failure=2)
    (f,) = start(store, failed, ["w-1"], now=3.0)
    store.mark_task_exited(f, 1, 4.0)
    submit(store, "child", parent_id=job.job_id)
    store.accrue_credits(5.0)
    before = _snapshot(store)
    store.close()
    with ClusterStore(path) as again:
        assert _snapshot(again) == before
        assert again.check_invariants() == []
        assert again.schema_version == SCHEMA_VERSION


def _drop_bands(conn: sqlite3.Connection) -> None:
    """Make a current file look as it did before version 7: jobs without a priority band."""
    conn.execute("ALTER TABLE jobs DROP COLUMN band")


def _drop_timeouts(conn: sqlite3.Connection) -> None:
    """Make a current file look as it did before version 6: jobs without a timeout or deadline (nor a band)."""
    _drop_bands(conn)
    conn.execute("DROP INDEX jobs_by_deadline")
    conn.execute("ALTER TABLE jobs DROP COLUMN deadline")
    conn.execute("ALTER TABLE jobs DROP COLUMN timeout")


def test_a_version_5_file_gains_job_timeouts_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with ClusterStore(path) as store:
        store.register_worker(make_worker("w-1"), "10.0.0.1:1", 0.0)
        old = submit(store, "old")
    with sqlite3.connect(path) as conn:
        _drop_timeouts(conn)
        conn.execute("UPDATE schema_version SET version = 5")
    with ClusterStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 7
        assert store.get_job(old.job_id).state == JobStatus.PENDING  # unchanged, and no timeout
        limited = submit(store, "limited", now=1.0, timeout=5.0, max_retries_failure=1)
        (first,) = start(store, store.get_job(limited.job_id), ["w-1"], now=2.0)
        store.mark_task_exited(first, 1, 3.0)  # retried: the deadline stays 2.0 + 5.0
        start(store, store.get_job(limited.job_id), ["w-1"], now=4.0)
        assert not store.time_out_jobs(6.9).applied
        assert store.time_out_jobs(7.0).applied
        failed = store.get_job(limited.job_id)
        assert failed.state == JobStatus.FAILED and "timeout of 5s" in failed.error
        failure = Failure.decode(store.job_failure(limited.job_id) or b"")
        assert failure.kind == FailureKind.TIMEOUT and isinstance(failure.error(limited.job_id), JobTimeout)
        assert store.get_job(old.job_id).state == JobStatus.PENDING
        assert store.check_invariants() == []


def test_a_version_6_file_gains_bands_and_its_jobs_are_interactive(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with ClusterStore(path) as store:
        store.register_worker(make_worker("w-1"), "10.0.0.1:1", 0.0)
        old = submit(store, "old")
    with sqlite3.connect(path) as conn:
        _drop_bands(conn)
        conn.execute("UPDATE schema_version SET version = 6")
    with ClusterStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 7
        assert store.get_job(old.job_id).band == 2
        ((pending, _),) = store.pending_jobs()
        assert pending.band == 2
        batch = store.submit_job(name="b", user="u", request=b"", resources=TaskResources(), now=1.0, band=3)
        assert store.get_job(batch.job_id).band == 3
        assert sorted(job.band for job, _ in store.pending_jobs()) == [2, 3]
        assert store.check_invariants() == []


def test_a_version_1_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with ClusterStore(path) as store:
        store.register_worker(make_worker("w-1"), "10.0.0.1:1", 0.0)
        job = submit(store)
    with sqlite3.connect(path) as conn:  # what version 1 looked like: no final failure per job
        _drop_timeouts(conn)
        conn.execute("ALTER TABLE jobs DROP COLUMN failure")
        conn.execute("ALTER TABLE workers DROP COLUMN epoch")
        conn.execute("ALTER TABLE workers DROP COLUMN health")
        conn.execute("UPDATE schema_version SET version = 1")
    with ClusterStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.worker_epoch("w-1") == 0  # registered before epochs existed
        # Its request was a pickle, which the controller no longer opens: the job fails, saying why.
        old = store.get_job(job.job_id)
        assert old.state == JobStatus.FAILED and "older Fray" in old.error
        assert store.check_invariants() == []
        fresh = submit(store)
        (key,) = start(store, store.get_job(fresh.job_id), ["w-1"])
        store.mark_task_exited(key, 2, 3.0)
        stored = store.job_failure(fresh.job_id)
        assert stored is not None and Failure.decode(stored).message == "'task 0' exit code 2"
        assert store.check_invariants() == []


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("had_blobs", [False, True], ids=["no-blobs", "blobs-made-by-an-operator-build"])
def test_version_2_and_3_files_gain_the_blobs_table(tmp_path: Path, version: int, had_blobs: bool) -> None:
    path = tmp_path / "db"
    with ClusterStore(path) as store:
        store.register_worker(make_worker("w-1"), "10.0.0.1:1", 0.0)
        done = submit(store, "done")
        (key,) = start(store, store.get_job(done.job_id), ["w-1"])
        store.mark_task_exited(key, 0, 2.0)
        if had_blobs:  # an operator build before version 4 made this table outside the schema
            store.write_with(lambda cur: _blobs.put_blob(cur, "sha256:kept", b"old workspace", 1.0))
    with sqlite3.connect(path) as conn:
        _drop_timeouts(conn)
        conn.execute("DROP TABLE credentials")  # versions before 5 had none
        if not had_blobs:
            conn.execute("DROP TABLE blobs")
        if version == 2:
            conn.execute("ALTER TABLE workers DROP COLUMN epoch")
            conn.execute("ALTER TABLE workers DROP COLUMN health")
        conn.execute("UPDATE schema_version SET version = ?", (version,))
    with ClusterStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 7
        assert store.issued() == []  # the credentials table is there
        assert store.get_job(done.job_id).state == JobStatus.SUCCEEDED  # finished jobs keep their history
        kept = store.write_with(lambda cur: _blobs.get_blob(cur, "sha256:kept", 5.0))
        assert kept == (b"old workspace" if had_blobs else None)
        store.write_with(lambda cur: _blobs.put_blob(cur, "sha256:new", b"new workspace", 5.0))
        assert store.read_with(lambda cur: _blobs.has_blob(cur, "sha256:new"))
        assert store.check_invariants() == []


def test_a_file_with_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db"
    ClusterStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        ClusterStore(path)


_WRITER = textwrap.dedent(
    """
    import sys
    from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
    from fray.cluster.server.scheduler import schedule
    from fray.cluster.server.store import ClusterStore

    store = ClusterStore(sys.argv[1])
    for w in ("w-1", "w-2"):
        store.register_worker(WorkerInfo(w, 4000, 8 << 30, 8 << 30), w, 0.0)
    now = 1.0
    while True:
        now += 1.0
        job = store.submit_job(name="j", user="u", request=b"x" * 64, resources=TaskResources(), replicas=2,
                               now=now, max_retries_failure=1)
        print("submitted", job.job_id, flush=True)
        inp = store.scheduler_input()
        tasks = store.apply_decision(schedule(inp.pending, inp.workers, inp.running, inp.credits, now=now), now)
        for t in tasks:
            store.mark_task_running(t.key, now)
            store.append_logs(t.key, ["line"] * 3)
        for i, t in enumerate(tasks):
            fx = store.mark_task_exited(t.key, 1 if (t.task_index == 1 and t.attempt == 0) else 0, now)
            for jid, state in fx.finished.items():
                print(state.value, jid, flush=True)
        store.accrue_credits(now)
    """
)


def test_store_survives_sigkill_mid_work(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    submitted: list[str] = []
    finished: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            word, jid = line.split()
            if word == "submitted":
                submitted.append(jid)
            else:
                finished[jid] = word
            if len(finished) >= 60:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, (
        f"the writer died on its own: {proc.stderr.read() if proc.stderr else ''}"
    )
    with ClusterStore(path) as store:
        assert store.check_invariants() == []
        jobs = {j.job_id: j for j in store.list_jobs()}
        assert set(submitted) <= set(jobs), "every acknowledged submission survived"
        for jid, state in finished.items():
            assert jobs[jid].state.value == state
        # The writer kept working after the last line we read: whatever it committed is whole.
        for job in jobs.values():
            assert len(store.get_tasks(job.job_id)) == 2
        # The store is fully usable after the crash.
        submit(store, "after", now=1e6)


# -- random sequences of operations keep the store consistent -----------------------------------


class StoreMachine(RuleBasedStateMachine):
    """Drive the store with random controller calls; after each, the invariants hold."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.store = ClusterStore(Path(self.dir.name) / "db")
        self.now = 0.0
        for i in range(3):
            self.store.register_worker(make_worker(f"w-{i}", cpu=4), f"a:{i}", 0.0)

    def teardown(self) -> None:
        self.store.close()
        self.dir.cleanup()

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def active(self) -> list[TaskKey]:
        return [t.key for w in range(3) for t in self.store.tasks_on_worker(f"w-{w}")]

    @rule(replicas=st.integers(1, 3), child=st.booleans(), retries=st.integers(0, 2))
    def submit(self, replicas: int, child: bool, retries: int) -> None:
        parents = [j.job_id for j in self.store.list_jobs(states=[JobStatus.PENDING, JobStatus.RUNNING])]
        parent = parents[0] if child and parents else None
        self.store.submit_job(
            name="j",
            user="u",
            request=b"",
            resources=TaskResources(cpu_millis=2000),
            replicas=replicas,
            now=self.tick(),
            max_retries_failure=retries,
            max_retries_preemption=retries,
            parent_id=parent,
        )

    @rule()
    def schedule_pass(self) -> None:
        inp = self.store.scheduler_input()
        now = self.tick()
        self.store.apply_decision(schedule(inp.pending, inp.workers, inp.running, inp.credits, now=now), now)

    @rule(data=st.data(), outcome=st.sampled_from(["running", "exit0", "exit1", "lost"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        keys = self.active()
        if not keys:
            return
        key = data.draw(st.sampled_from(keys))
        if outcome == "running":
            assert self.store.mark_task_running(key, self.tick())
        elif outcome == "lost":
            assert self.store.mark_task_lost(key, self.tick()).applied
        else:
            assert self.store.mark_task_exited(key, int(outcome[-1]), self.tick()).applied

    @rule(data=st.data())
    def terminate(self, data: st.DataObject) -> None:
        jobs = self.store.list_jobs()
        if jobs:
            self.store.terminate_job(data.draw(st.sampled_from(jobs)).job_id, self.tick())

    @rule(w=st.integers(0, 2))
    def lose_and_return(self, w: int) -> None:
        self.store.lose_worker(f"w-{w}", self.tick())
        fx = self.store.register_worker(make_worker(f"w-{w}", cpu=4), f"a:{w}", self.tick())
        assert fx.kill == ()

    @rule(data=st.data())
    def stale_report(self, data: st.DataObject) -> None:
        for job in self.store.list_jobs():
            if job.attempt > 0:
                old = self.store.get_tasks(job.job_id, attempt=0)[0]
                assert self.store.mark_task_exited(old.key, 0, self.tick()).applied is False
                return

    @invariant()
    def consistent(self) -> None:
        assert self.store.check_invariants() == []


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
