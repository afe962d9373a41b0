"""Priority bands in a pass (best band first) and the choice of gangs to preempt for a better band."""

from __future__ import annotations

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
from fray.cluster.server.controller._preemption import preemption_after
from fray.cluster.server.scheduler import PendingJob, PendingQueue, RunningTask, schedule, schedule_queue
from fray.cluster.server.scheduler._preempt import Preemption, choose_victims

GiB = 1 << 30
ONE = TaskResources(cpu_millis=1000)
TWO = TaskResources(cpu_millis=2000)


def worker(wid: str, cpu: int = 1) -> WorkerInfo:
    return WorkerInfo(wid, cpu * 1000, 8 * GiB, 10 * GiB, (), {})


def running(job_id: str, wid: str, band: int, started: float, resources: TaskResources = ONE) -> RunningTask:
    return RunningTask(wid, "u", resources, job_id=job_id, band=band, started_at=started)


def pending(job_id: str, band: int, at: float = 10.0, replicas: int = 1, resources: TaskResources = ONE) -> PendingJob:
    return PendingJob(job_id, "u", replicas, resources, at, band=band)


TWO_WORKERS = [worker("w-1"), worker("w-2")]


# -- ordering ---------------------------------------------------------------------------------------


def test_a_pass_places_the_best_band_first_whatever_the_submit_order() -> None:
    jobs = [pending("batch", 3, at=1.0), pending("interactive", 2, at=2.0), pending("production", 1, at=3.0)]
    for decide in (
        lambda: schedule(jobs, [worker("w-1")], [], {}, now=5.0),
        lambda: schedule_queue(PendingQueue.of(jobs), [worker("w-1")], [], {}, now=5.0),
    ):
        decision = decide()
        assert [a.job_id for a in decision.assignments] == ["production"]
        assert set(decision.pending) == {"batch", "interactive"}


def test_within_a_band_the_order_is_submission_order() -> None:
    jobs = [pending("b-late", 3, at=2.0), pending("b-early", 3, at=1.0)]
    decision = schedule(jobs, [worker("w-1")], [], {}, now=5.0)
    assert [a.job_id for a in decision.assignments] == ["b-early"]


def test_a_worse_band_still_backfills_what_a_better_band_cannot_use() -> None:
    jobs = [pending("big", 1, resources=TWO), pending("small", 3)]
    decision = schedule(jobs, TWO_WORKERS, [], {}, now=20.0)
    assert [a.job_id for a in decision.assignments] == ["small"]


# -- victims ----------------------------------------------------------------------------------------


def test_production_preempts_the_most_recently_started_batch_gang() -> None:
    busy = [running("old", "w-1", 3, 1.0), running("new", "w-2", 3, 5.0)]
    chosen = choose_victims(pending("prod", 1), TWO_WORKERS, busy)
    assert chosen == Preemption("prod", 1, ("new",))
    assert chosen.reason == "preempted by job prod (band production)"


def test_the_same_band_or_a_better_one_is_never_preempted() -> None:
    production = [running("a", "w-1", 1, 1.0), running("b", "w-2", 1, 5.0)]
    assert choose_victims(pending("prod", 1), TWO_WORKERS, production) is None
    mixed = [running("a", "w-1", 1, 1.0), running("b", "w-2", 2, 5.0)]
    assert choose_victims(pending("inter", 2), TWO_WORKERS, mixed) is None
    batch_busy = [running("a", "w-1", 3, 1.0), running("b", "w-2", 3, 5.0)]
    assert choose_victims(pending("batch", 3), TWO_WORKERS, batch_busy) is None


def test_interactive_preempts_batch_but_not_production() -> None:
    busy = [running("prod", "w-1", 1, 9.0), running("batch", "w-2", 3, 1.0)]
    assert choose_victims(pending("inter", 2), TWO_WORKERS, busy) == Preemption("inter", 2, ("batch",))


def test_nothing_is_preempted_when_the_job_fits_already() -> None:
    busy = [running("batch", "w-1", 3, 1.0)]
    assert choose_victims(pending("prod", 1), TWO_WORKERS, busy) is None


def test_nothing_is_preempted_when_even_all_worse_work_would_not_make_room() -> None:
    # A 2-core job on 1-core workers never fits, and a job the production gang blocks neither.
    busy = [running("a", "w-1", 3, 1.0), running("b", "w-2", 3, 5.0)]
    assert choose_victims(pending("huge", 1, resources=TWO), TWO_WORKERS, busy) is None
    mixed = [running("prod", "w-1", 1, 1.0), running("batch", "w-2", 3, 5.0)]
    assert choose_victims(pending("pair", 1, replicas=2), TWO_WORKERS, mixed) is None


def test_a_gang_is_preempted_whole_and_only_as_many_gangs_as_needed() -> None:
    # A 2-replica batch gang on both workers, and a lone batch job started later on a third.
    workers = [*TWO_WORKERS, worker("w-3")]
    busy = [
        running("gang", "w-1", 3, 2.0),
        running("gang", "w-2", 3, 2.0),
        running("lone", "w-3", 3, 8.0),
    ]
    # One slot: the most recent gang alone does it.
    assert choose_victims(pending("one", 1), workers, busy) == Preemption("one", 1, ("lone",))
    # Two slots: the lone job is not enough; the gang alone is (fewest gangs), and frees both of its workers.
    assert choose_victims(pending("two", 1, replicas=2), workers, busy) == Preemption("two", 1, ("gang",))
    # Three slots: everything.
    chosen = choose_victims(pending("three", 1, replicas=3), workers, busy)
    assert chosen is not None and set(chosen.victims) == {"gang", "lone"}


def test_several_gangs_are_taken_most_recent_first_and_the_unneeded_handed_back() -> None:
    workers = [worker("w-1"), worker("w-2"), worker("w-3")]
    busy = [running("a", "w-1", 3, 1.0), running("b", "w-2", 3, 2.0), running("c", "w-3", 3, 3.0)]
    chosen = choose_victims(pending("pair", 1, replicas=2), workers, busy)
    assert chosen == Preemption("pair", 1, ("c", "b"))  # the oldest, a, keeps running


def test_a_job_that_needs_one_worker_whole_preempts_only_work_on_one_worker() -> None:
    # A 2-core job: one batch task on each of two 2-core workers; preempting either one frees a worker.
    workers = [worker("w-1", cpu=2), worker("w-2", cpu=2)]
    busy = [
        running("x", "w-1", 3, 1.0, TWO),
        running("y", "w-2", 3, 4.0, ONE),
        running("z", "w-2", 1, 5.0, ONE),  # production on w-2: w-2 can never be freed for it
    ]
    assert choose_victims(pending("big", 1, resources=TWO), workers, busy) == Preemption("big", 1, ("x",))


# -- after a pass: which job gets room ---------------------------------------------------------------


def test_after_a_pass_the_best_band_oldest_job_gets_room_and_the_pass_placements_hold_capacity() -> None:
    workers = [*TWO_WORKERS, worker("w-3")]
    busy = [running("b1", "w-1", 3, 1.0), running("b2", "w-2", 3, 2.0)]
    jobs = [pending("inter", 2, at=1.0), pending("prod", 1, at=5.0), pending("fresh-batch", 3, at=0.5)]
    queue = PendingQueue.of(jobs)
    decision = schedule_queue(queue, workers, busy, {}, now=10.0)
    assert [a.job_id for a in decision.assignments] == ["prod"]  # w-3: the best band first, not the oldest
    # "inter" is left; the pass's own placement holds w-3, so a batch gang must go: the most recent one.
    chosen = preemption_after(queue, decision, workers, busy, now=10.0)
    assert chosen == Preemption("inter", 2, ("b2",))


def test_after_a_pass_nothing_is_preempted_for_batch_or_for_a_job_that_can_never_fit() -> None:
    busy = [running("b1", "w-1", 3, 1.0), running("b2", "w-2", 3, 2.0)]
    for job in (pending("batch", 3), pending("huge", 1, resources=TWO)):
        queue = PendingQueue.of([job])
        decision = schedule_queue(queue, TWO_WORKERS, busy, {}, now=10.0)
        assert preemption_after(queue, decision, TWO_WORKERS, busy, now=10.0) is None
