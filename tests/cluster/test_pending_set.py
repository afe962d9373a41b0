"""The controller's pending set and a pass over it cost the same whatever the backlog (issue 34).

A pass over the kept queue (``schedule_queue``) looks at the jobs up to the point where every shape left
is settled, and the pending set writes only the reasons that changed: with 2 slots and 10 or 10,000 jobs
waiting, a pass looks at the same few jobs and, once every reason is written, writes none. That the
decisions are the old scheduler's is ``tests/cluster/test_scheduler_index.py``'s.
"""

from __future__ import annotations

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
from fray.cluster.protocol.records import Effects, TaskRecord, TaskState
from fray.cluster.server.controller._pending import PendingSet
from fray.cluster.server.scheduler import PendingJob, PendingReasons, RunningTask, schedule_queue
from fray.job import JobStatus

GiB = 1 << 30
ONE_CPU = TaskResources(cpu_millis=1000)
TWO_CPU = TaskResources(cpu_millis=2000)
WORKERS = [WorkerInfo(f"worker-{i}", 1000, 4 * GiB, 100 * GiB, (), {}) for i in range(2)]


class _Store:
    """The store as the pending set asks it: which jobs are pending again after a retry."""

    def __init__(self) -> None:
        self.pending: dict[str, PendingJob] = {}

    def pending_job(self, job_id: str) -> PendingJob | None:
        return self.pending.get(job_id)


def _filled(count: int, resources: TaskResources = ONE_CPU) -> tuple[PendingSet, _Store]:
    store = _Store()
    pending = PendingSet(store)  # type: ignore[arg-type]  # only pending_job is used here
    with pending._lock:
        for i in range(count):
            pending._insert(PendingJob(f"j{i:05d}", "alice" if i % 3 else "bob", 1, resources, 1000.0 + i))
    return pending, store


def _pass(pending: PendingSet, running: list[RunningTask]) -> tuple[PendingReasons, dict[str, str], list[str]]:
    """One pass and its record; the reasons written and the jobs placed."""
    decision = schedule_queue(pending.view(), WORKERS, running, {}, now=1100.0)
    written: dict[str, str] = {}

    def apply(changed: dict[str, str]) -> list[TaskRecord]:
        written.update(changed)
        return [_task(a.job_id, w) for a in decision.assignments for w in a.worker_ids]

    pending.record(decision, apply)
    assert isinstance(decision.pending, PendingReasons)
    return decision.pending, written, [a.job_id for a in decision.assignments]


def _task(job_id: str, worker_id: str) -> TaskRecord:
    return TaskRecord(job_id, 0, 0, 0, 0, TaskState.ASSIGNED, worker_id, None, "", 1000.0, 1100.0, None, None)


def test_a_pass_looks_at_the_same_few_jobs_whether_10_or_10000_wait() -> None:
    full = [RunningTask(w.worker_id, "carol", ONE_CPU) for w in WORKERS]
    looked: dict[int, int] = {}
    for count in (10, 10_000):
        pending, _ = _filled(count)
        reasons, written, placed = _pass(pending, full)
        assert placed == []
        assert len(written) == count, "the first pass writes every job's reason"
        assert len(reasons) == count and reasons[f"j{count - 1:05d}"].message.startswith("waiting for capacity")
        looked[count] = len(reasons.explicit)
        # Nothing changed: the next pass writes nothing.
        assert _pass(pending, full)[1] == {}
    assert looked[10] == looked[10_000] <= 2


def test_a_freed_slot_places_the_oldest_job_and_writes_no_other_reason() -> None:
    pending, _ = _filled(5_000)
    full = [RunningTask(w.worker_id, "carol", ONE_CPU) for w in WORKERS]
    _pass(pending, full)
    _, written, placed = _pass(pending, full[:1])  # worker-1 freed its slot
    assert placed == ["j00000"]
    assert written == {}
    assert "j00000" not in pending and "j00001" in pending


def test_a_retried_job_is_back_in_its_place_and_a_finished_one_gone() -> None:
    pending, store = _filled(4)
    full = [RunningTask(w.worker_id, "carol", ONE_CPU) for w in WORKERS]
    _, _, placed = _pass(pending, [])
    assert placed == ["j00000", "j00001"]
    # j00000 is retried (pending again, first in line), j00002 terminated while pending.
    store.pending["j00000"] = PendingJob("j00000", "bob", 1, ONE_CPU, 1000.0)
    pending.track(Effects(retried=("j00000",), finished={"j00002": JobStatus.STOPPED}))
    view = pending.view()
    assert set(view.jobs) == {"j00000", "j00003"}
    assert view.shapes == {(ONE_CPU, 1): (2, 1000.0)}
    reasons, written, _ = _pass(pending, full)
    assert set(written) == {"j00000"}, "only the retried job has no reason written yet"
    assert set(reasons) == {"j00000", "j00003"}


def test_a_shape_that_can_never_fit_is_settled_apart_from_the_others() -> None:
    pending, _ = _filled(300, TWO_CPU)  # no worker has 2 cores
    with pending._lock:
        for i in range(300):
            pending._insert(PendingJob(f"k{i:03d}", "alice", 1, ONE_CPU, 2000.0 + i))
    reasons, written, placed = _pass(pending, [])
    assert placed == ["k000", "k001"]
    assert reasons["j00000"].message.startswith("can never be scheduled") and not reasons["j00000"].satisfiable
    assert reasons["k299"].message.startswith("waiting for capacity") and reasons["k299"].satisfiable
    assert len(written) == 598
    # The pass walked the settled 2-core jobs queued ahead of the 1-core ones (one dict entry each, no
    # placement attempt), and stopped at the first 1-core job that no longer fit.
    assert len(reasons.explicit) == 301
