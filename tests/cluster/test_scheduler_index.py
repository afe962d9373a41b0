"""The indexed scheduler takes exactly the decisions of the scan-every-worker scheduler it replaced.

The oracle is a copy of the old pass kept in ``tests/cluster/_old_scheduler.py``. Loads are random
mixes of what the index must get right: worker classes (regions, preemptibility, GPU types, TPU
hosts, hosts with two accelerator kinds), dead workers, over-committed workers, gangs that only
partly fit, TPU slices (complete and broken), starving jobs that reserve workers, and several users.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import _old_scheduler
from fray.cluster.protocol.capacity import Device, TaskResources, WorkerInfo
from fray.cluster.server.scheduler import (
    PendingJob,
    PendingQueue,
    PendingReasons,
    RunningTask,
    SchedulerPolicy,
    schedule,
    schedule_queue,
)
from fray.cluster.server.scheduler._freeindex import FreeIndex

GiB = 1 << 30
_REGIONS = ["r1", "r2", "r3"]  # few values, so that many workers share a class and a free vector
_TPU = "v5litepod-16"  # 4 hosts


@st.composite
def _workers(draw: st.DrawFn) -> list[WorkerInfo]:
    out: list[WorkerInfo] = []
    # Sometimes a uniform fleet (one region, preemptible, no GPUs), where many workers share a class.
    uniform = draw(st.booleans())
    regions = _REGIONS[:1] if uniform else _REGIONS
    gpus = [None] if uniform else [None, ("H100", 8), ("A100", 4), ("A100", 2)]
    for i in range(draw(st.integers(0, 24))):
        devices = []
        gpu = draw(st.sampled_from(gpus))
        if gpu:
            devices.append(Device("gpu", gpu[0], gpu[1]))
        if draw(st.integers(0, 9)) == 0:
            devices.append(Device("tpu", "v5litepod-1", 1))  # a single-host slice of its own
        preemptible = "true" if uniform else draw(st.sampled_from(["true", "False"]))
        attrs = {"region": draw(st.sampled_from(regions)), "preemptible": preemptible}
        out.append(
            WorkerInfo(
                f"w-{draw(st.integers(0, 99)):02d}-{i}",
                draw(st.sampled_from([0, 4000, 16000])),
                draw(st.sampled_from([0, 16, 64])) * GiB,
                draw(st.sampled_from([10, 100])) * GiB,
                tuple(devices),
                attrs,
                alive=draw(st.integers(0, 7)) > 0,
            )
        )
    for s in range(draw(st.integers(0, 3))):
        region = draw(st.sampled_from(_REGIONS))
        for h in range(4):
            if draw(st.integers(0, 11)) == 0:
                continue  # a missing host: an incomplete slice
            attrs = {"region": region, "tpu-name": f"s{s}", "tpu-worker-id": str(h)}
            out.append(WorkerInfo(f"t{s}-{h}", 16000, 64 * GiB, 100 * GiB, (Device("tpu", _TPU, 4),), attrs))
    return out


_cpu_resources = st.builds(
    TaskResources,
    cpu_millis=st.sampled_from([0, 500, 1000, 2000, 4000, 12000]),
    ram_bytes=st.sampled_from([0, 1, 2, 8, 32]).map(lambda g: g * GiB),
    disk_bytes=st.sampled_from([0, GiB, 50 * GiB]),
    preemptible=st.booleans(),
    regions=st.sampled_from([None, ("r1",), ("r2", "r3")]),
)
_gpu_resources = st.builds(
    TaskResources,
    cpu_millis=st.sampled_from([0, 1000, 4000]),
    ram_bytes=st.just(GiB),
    disk_bytes=st.just(0),
    device_kind=st.just("gpu"),
    device_type=st.sampled_from(["H100", "A100", "auto"]),
    device_count=st.sampled_from([1, 2, 4, 8]),
    preemptible=st.booleans(),
)
_tpu_resources = st.builds(
    TaskResources,
    cpu_millis=st.sampled_from([1000, 8000]),
    ram_bytes=st.just(GiB),
    disk_bytes=st.just(0),
    device_kind=st.just("tpu"),
    device_type=st.sampled_from([_TPU, "v5litepod-1"]),
    device_count=st.just(1),
    regions=st.sampled_from([None, ("r1",)]),
)


@st.composite
def _load(draw: st.DrawFn) -> tuple[list[PendingJob], list[WorkerInfo], list[RunningTask], dict[str, float], float]:
    workers = draw(_workers())
    running = []
    for w in workers:
        # Up to over-committed: a worker whose capacity shrank after tasks were placed.
        for _ in range(draw(st.integers(0, 3))):
            running.append(
                RunningTask(w.worker_id, draw(st.sampled_from("abc")), draw(st.one_of(_cpu_resources, _gpu_resources)))
            )
    pending = [
        PendingJob(
            f"j-{i:03d}",
            draw(st.sampled_from("abcd")),
            draw(st.sampled_from([1, 1, 2, 3, 8])),
            draw(st.one_of(_cpu_resources, _cpu_resources, _gpu_resources, _tpu_resources)),
            float(draw(st.integers(0, 1000))),
            band=draw(st.sampled_from([1, 2, 2, 3])),
        )
        for i in range(draw(st.integers(0, 40)))
    ]
    credits = {"a": 100.0, "b": draw(st.sampled_from([50.0, 100.0, 1e6]))}
    return pending, workers, running, credits, float(draw(st.sampled_from([0, 600, 1000])))


@settings(max_examples=400, deadline=None)
@given(_load(), st.sampled_from([None, 0.0, 300.0]))
def test_indexed_scheduler_decides_exactly_like_the_old_one(
    load: tuple[list[PendingJob], list[WorkerInfo], list[RunningTask], dict[str, float], float],
    reserve_after: float | None,
) -> None:
    pending, workers, running, credits, now = load
    policy = SchedulerPolicy(reserve_after_seconds=reserve_after)
    new = schedule(pending, workers, running, credits, now=now, policy=policy)
    old = _old_scheduler.schedule(pending, workers, running, credits, now=now, policy=policy)
    assert new.assignments == old.assignments
    assert new.pending == old.pending
    assert new.bids == old.bids


@settings(max_examples=400, deadline=None)
@given(_load(), st.sampled_from([None, 0.0, 300.0]))
def test_a_pass_over_the_kept_queue_that_stops_early_decides_exactly_like_the_old_one(
    load: tuple[list[PendingJob], list[WorkerInfo], list[RunningTask], dict[str, float], float],
    reserve_after: float | None,
) -> None:
    """schedule_queue stops once every shape left is settled (issue 34): the same placements, bids and reasons."""
    pending, workers, running, credits, now = load
    policy = SchedulerPolicy(reserve_after_seconds=reserve_after)
    new = schedule_queue(PendingQueue.of(pending), workers, running, credits, now=now, policy=policy)
    old = _old_scheduler.schedule(pending, workers, running, credits, now=now, policy=policy)
    assert new.assignments == old.assignments
    assert dict(new.pending) == old.pending
    assert len(new.pending) == len(old.pending) and all(job_id in new.pending for job_id in old.pending)
    assert new.bids == old.bids
    # What a controller reads instead of the whole mapping says the same.
    assert isinstance(new.pending, PendingReasons)
    for job in pending:
        if job.job_id in old.pending and job.job_id not in new.pending.explicit:
            shared = new.pending.by_shape[(job.resources, job.replicas)]
            assert (shared.message, shared.satisfiable) == (
                old.pending[job.job_id].message,
                old.pending[job.job_id].satisfiable,
            )


def test_free_index_prefers_the_first_level_then_the_fullest_fitting_worker() -> None:
    index = FreeIndex(
        [
            ("a", "plain", (4000, 8, 1, 0, 0)),
            ("b", "plain", (2000, 8, 1, 0, 0)),
            ("c", "plain", (2000, 4, 1, 0, 0)),
            ("d", "gpu", (1000, 1, 1, 1, 0)),
        ]
    )
    assert index.best([["gpu"], ["plain"]], (1000, 1, 1, 0, 0)) == "d"
    assert index.best([["plain"], ["gpu"]], (1000, 1, 1, 0, 0)) == "c", "least free cpu, then least free ram"
    assert index.best([["plain"]], (1000, 6, 1, 0, 0)) == "b"
    assert index.best([["plain"]], (3000, 1, 1, 0, 0)) == "a"
    assert index.best([["plain"]], (1000, 1, 2, 0, 0)) is None
    index.discard("c")
    index.move("b", (2000, 5, 1, 0, 0))
    assert index.best([["plain"]], (1000, 1, 1, 0, 0)) == "b"
    index.move("b", (500, 5, 1, 0, 0))
    assert index.best([["plain"]], (1000, 1, 1, 0, 0)) == "a"


def test_free_index_breaks_ties_on_cpu_and_ram_by_worker_id_across_buckets() -> None:
    # Same free cpu and ram, different disk: the smaller worker id wins whichever bucket it is in.
    index = FreeIndex([("z", "k", (1000, 1, 5, 0, 0)), ("m", "k", (1000, 1, 9, 0, 0)), ("a", "j", (1000, 1, 9, 0, 0))])
    assert index.best([["k"]], (1000, 1, 1, 0, 0)) == "m"
    assert index.best([["k", "j"]], (1000, 1, 1, 0, 0)) == "a"
