"""The scheduler: fitting, constraints, gangs, TPU slices, credit order, backfill and reasons."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray.cluster.protocol.capacity import Device, TaskResources, WorkerInfo
from fray.cluster.server.credit import CreditPolicy
from fray.cluster.server.scheduler import PendingJob, RunningTask, SchedulerPolicy, SchedulingDecision, schedule
from fray.errors import ConfigError
from fray.resources import TPU_TOPOLOGIES, GpuConfig, ResourceConfig, TpuConfig

GiB = 1 << 30


def worker(
    wid: str,
    cpu: float = 8,
    ram_gib: int = 32,
    disk_gib: int = 100,
    devices: Sequence[Device] = (),
    alive: bool = True,
    **attributes: str,
) -> WorkerInfo:
    attrs = {k.replace("_", "-"): v for k, v in attributes.items()}
    return WorkerInfo(wid, round(cpu * 1000), ram_gib * GiB, disk_gib * GiB, tuple(devices), attrs, alive)


def job(
    jid: str,
    user: str = "alice",
    replicas: int = 1,
    at: float = 0.0,
    **resources: object,
) -> PendingJob:
    return PendingJob(jid, user, replicas, TaskResources.from_config(ResourceConfig(**resources)), at)  # type: ignore[arg-type]


def tpu_slice(name: str, slice_type: str, **attributes: str) -> list[WorkerInfo]:
    topo = TPU_TOPOLOGIES[slice_type]
    return [
        worker(
            f"{name}-h{i}",
            cpu=16,
            ram_gib=64,
            devices=[Device("tpu", slice_type, topo.chips_per_host)],
            tpu_name=name,
            tpu_worker_id=str(i),
            **attributes,
        )
        for i in range(topo.hosts)
    ]


def run(
    pending: Sequence[PendingJob],
    workers: Sequence[WorkerInfo],
    running: Sequence[RunningTask] = (),
    credits: dict[str, float] | None = None,
    now: float = 0.0,
    policy: SchedulerPolicy | None = None,
) -> SchedulingDecision:
    return schedule(pending, workers, running, credits or {}, now=now, policy=policy)


def placed(decision: SchedulingDecision) -> dict[str, tuple[str, ...]]:
    return {a.job_id: a.worker_ids for a in decision.assignments}


# -- normalization -----------------------------------------------------------------------------


def test_task_resources_from_config_normalizes_every_field() -> None:
    r = TaskResources.from_config(
        ResourceConfig(cpu=0.5, ram="2g", disk="10g", device=GpuConfig("H100", 8), preemptible=False, regions=["eu"])
    )
    assert (r.cpu_millis, r.ram_bytes, r.disk_bytes) == (500, 2 * GiB, 10 * GiB)
    assert (r.device_kind, r.device_type, r.device_count) == ("gpu", "H100", 8)
    assert (r.preemptible, r.regions) == (False, ("eu",))
    tpu = TaskResources.from_config(ResourceConfig(device=TpuConfig("v5litepod-16")))
    assert (tpu.device_kind, tpu.device_type, tpu.device_count, tpu.hosts_per_replica) == ("tpu", "v5litepod-16", 4, 4)
    assert PendingJob("j", "u", 2, tpu, 0.0).task_count == 8


def test_worker_info_rejects_two_devices_of_a_kind_and_reads_attributes() -> None:
    with pytest.raises(ConfigError):
        worker("w", devices=[Device("gpu", "H100", 1), Device("gpu", "A100", 1)])
    w = worker("w", preemptible="False", region="us", tpu_worker_id="3")
    assert (w.preemptible, w.region, w.tpu_worker_id) == (False, "us", 3)
    assert worker("w").preemptible, "a worker without the attribute counts as preemptible"


# -- fitting and constraints -------------------------------------------------------------------


def test_a_job_that_fits_is_assigned_one_worker_per_replica() -> None:
    decision = run([job("j", replicas=3, cpu=2)], [worker("w-1", cpu=4), worker("w-2", cpu=4)])
    assert sorted(placed(decision)["j"]) == ["w-1", "w-1", "w-2"] or sorted(placed(decision)["j"]) == [
        "w-1",
        "w-2",
        "w-2",
    ]
    assert decision.pending == {}


def test_running_tasks_use_up_capacity() -> None:
    busy = [RunningTask("w-1", "bob", TaskResources(cpu_millis=7000))]
    decision = run([job("j", cpu=2)], [worker("w-1", cpu=8)], busy)
    reason = decision.pending["j"]
    assert reason.satisfiable
    assert reason.message == "waiting for capacity: no worker has 2 cores free (largest free: 1 core on w-1)"


def test_never_satisfiable_ram_names_the_largest_worker() -> None:
    decision = run([job("j", ram="64g")], [worker("w-1", ram_gib=8), worker("w-2", ram_gib=16)])
    reason = decision.pending["j"]
    assert not reason.satisfiable
    assert reason.message == (
        "can never be scheduled with the current workers: no worker has 64 GiB RAM (largest: 16 GiB on w-2)"
    )


def test_waiting_for_free_ram_names_the_largest_free() -> None:
    busy = [RunningTask("w-2", "bob", TaskResources(ram_bytes=48 * GiB))]
    decision = run([job("j", ram="32g")], [worker("w-1", ram_gib=16), worker("w-2", ram_gib=64)], busy)
    assert decision.pending["j"].satisfiable
    assert decision.pending["j"].message == (
        "waiting for capacity: no worker has 32 GiB RAM free (largest free: 16 GiB on w-2)"
    )


def test_non_preemptible_job_only_on_non_preemptible_worker() -> None:
    workers = [worker("w-pre", cpu=64), worker("w-safe", cpu=2, preemptible="false")]
    assert placed(run([job("j", preemptible=False)], workers))["j"] == ("w-safe",)
    reason = run([job("j", preemptible=False)], [worker("w-pre")]).pending["j"]
    assert not reason.satisfiable
    assert reason.message.endswith("needs a non-preemptible worker; none registered")


def test_preemptible_job_prefers_preemptible_workers() -> None:
    workers = [worker("w-safe", cpu=8, preemptible="false"), worker("w-pre", cpu=8)]
    assert placed(run([job("j")], workers))["j"] == ("w-pre",)


def test_regions_restrict_placement_and_explain_absence() -> None:
    workers = [worker("w-us", region="us-central1"), worker("w-eu", region="europe-west4")]
    assert placed(run([job("j", regions=["europe-west4"])], workers))["j"] == ("w-eu",)
    reason = run([job("j", regions=["asia-east1"])], workers).pending["j"]
    assert not reason.satisfiable
    assert reason.message.endswith("no worker in region asia-east1 at all")


def test_gpu_type_must_match_unless_auto() -> None:
    workers = [
        worker("w-a100", devices=[Device("gpu", "A100", 8)]),
        worker("w-h100", devices=[Device("gpu", "H100", 8)]),
    ]
    assert placed(run([job("j", device=GpuConfig("H100", 4))], workers))["j"] == ("w-h100",)
    assert len(placed(run([job("j", device=GpuConfig("auto", 8))], workers))["j"]) == 1
    reason = run([job("j", device=GpuConfig("B200", 1))], workers).pending["j"]
    assert not reason.satisfiable and "B200" in reason.message
    reason = run([job("j", device=GpuConfig("H100", 16))], workers).pending["j"]
    assert reason.message.endswith("no worker has 16 GPUs (largest: 8 on w-h100)")


def test_cpu_jobs_avoid_accelerator_hosts_when_they_can() -> None:
    workers = [worker("w-gpu", cpu=64, devices=[Device("gpu", "H100", 8)]), worker("w-cpu", cpu=4)]
    assert placed(run([job("j")], workers))["j"] == ("w-cpu",)


def test_dead_workers_are_ignored() -> None:
    decision = run([job("j")], [worker("w-dead", alive=False)])
    assert not decision.pending["j"].satisfiable
    assert decision.pending["j"].message.endswith("no workers are registered")


def test_best_fit_packs_small_tasks_leaving_room_for_big_ones() -> None:
    workers = [worker("w-1", cpu=8), worker("w-2", cpu=8)]
    busy = [RunningTask("w-2", "bob", TaskResources(cpu_millis=4000))]
    decision = run([job("small", cpu=1, at=0), job("big", cpu=8, at=1)], workers, busy)
    assert placed(decision) == {"small": ("w-2",), "big": ("w-1",)}


# -- gangs -------------------------------------------------------------------------------------


def test_gang_is_all_or_nothing_and_does_not_hold_capacity() -> None:
    workers = [worker("w-1", cpu=4), worker("w-2", cpu=4)]
    decision = run([job("gang", replicas=3, cpu=4, at=0), job("small", cpu=4, at=1)], workers)
    assert "gang" not in placed(decision)
    assert decision.pending["gang"].message == (
        "can never be scheduled with the current workers: gang of 3 replicas: at most 2 fit even with every "
        "suitable worker idle"
    )
    # The failed gang took nothing: the small job behind it still gets a worker.
    assert len(placed(decision)["small"]) == 1


def test_gang_waiting_reason_counts_what_fits_now() -> None:
    workers = [worker(f"w-{i}", cpu=4) for i in range(4)]
    busy = [RunningTask("w-0", "bob", TaskResources(cpu_millis=4000)), RunningTask("w-1", "bob", TaskResources())]
    decision = run([job("gang", replicas=4, cpu=4)], workers, busy)
    assert decision.pending["gang"].satisfiable
    assert decision.pending["gang"].message == "waiting for capacity: gang of 4 replicas: only 2 fit now"


def test_fragmented_capacity_says_no_single_worker_has_it_all() -> None:
    workers = [worker("w-1", cpu=8, ram_gib=32), worker("w-2", cpu=8, ram_gib=32)]
    busy = [
        RunningTask("w-1", "bob", TaskResources(cpu_millis=6000, ram_bytes=0)),
        RunningTask("w-2", "bob", TaskResources(cpu_millis=0, ram_bytes=30 * GiB)),
    ]
    reason = run([job("j", cpu=4, ram="4g", disk="1g")], workers, busy).pending["j"]
    assert reason.message == "waiting for capacity: no single worker has 4 cores, 4 GiB RAM, 1 GiB disk free at once"


# -- TPU slices --------------------------------------------------------------------------------


def test_tpu_job_takes_every_host_of_one_slice_in_worker_id_order() -> None:
    workers = list(reversed(tpu_slice("slice-a", "v5litepod-16")))
    decision = run([job("t", device=TpuConfig("v5litepod-16"))], workers)
    assert placed(decision)["t"] == ("slice-a-h0", "slice-a-h1", "slice-a-h2", "slice-a-h3")


def test_tpu_replicas_take_distinct_complete_slices() -> None:
    workers = tpu_slice("a", "v5litepod-16") + tpu_slice("b", "v5litepod-16") + tpu_slice("c", "v5litepod-16")
    got = placed(run([job("t", replicas=2, device=TpuConfig("v5litepod-16"))], workers))["t"]
    assert len(got) == 8
    first, second = {w.split("-")[0] for w in got[:4]}, {w.split("-")[0] for w in got[4:]}
    assert len(first) == 1 and len(second) == 1 and first != second


def test_incomplete_slice_never_fits_and_says_why() -> None:
    workers = tpu_slice("a", "v5litepod-16")[:3]
    reason = run([job("t", device=TpuConfig("v5litepod-16"))], workers).pending["t"]
    assert not reason.satisfiable
    assert reason.message == (
        "can never be scheduled with the current workers: needs TPU slice v5litepod-16 (4 hosts); "
        "no complete one (slice a: only 3 of its 4 hosts are registered)"
    )


def test_busy_slice_means_waiting_and_hosts_of_different_slices_are_never_mixed() -> None:
    a, b = tpu_slice("a", "v5litepod-16"), tpu_slice("b", "v5litepod-16")
    # One host busy in each slice: 6 free hosts exist, but no complete free slice.
    busy = [
        RunningTask("a-h0", "bob", TaskResources.from_config(ResourceConfig(device=TpuConfig("v5litepod-16")))),
        RunningTask("b-h3", "bob", TaskResources.from_config(ResourceConfig(device=TpuConfig("v5litepod-16")))),
    ]
    reason = run([job("t", device=TpuConfig("v5litepod-16"))], a + b, busy).pending["t"]
    assert reason.satisfiable
    assert reason.message == (
        "waiting for capacity: needs TPU slice v5litepod-16 (4 hosts); no complete free slice (2 suitable, all busy)"
    )


def test_multi_slice_job_waits_until_enough_slices_are_free() -> None:
    workers = tpu_slice("a", "v5litepod-16") + tpu_slice("b", "v5litepod-16")
    busy = [RunningTask("a-h2", "bob", TaskResources(cpu_millis=16_000))]
    reason = run([job("t", replicas=2, device=TpuConfig("v5litepod-16"))], workers, busy).pending["t"]
    assert reason.message == (
        "waiting for capacity: needs 2 TPU slices v5litepod-16 (4 hosts each); only 1 of 2 suitable slices free"
    )


def test_tpu_constraints_apply_to_every_host() -> None:
    eu = tpu_slice("eu", "v5litepod-16", region="europe-west4")
    us = tpu_slice("us", "v5litepod-16", region="us-central2")
    got = placed(run([job("t", regions=["us-central2"], device=TpuConfig("v5litepod-16"))], eu + us))["t"]
    assert {w.split("-")[0] for w in got} == {"us"}
    reason = run([job("t", preemptible=False, device=TpuConfig("v5litepod-16"))], eu + us).pending["t"]
    assert reason.message.endswith("needs a non-preemptible v5litepod-16 slice; none registered")


def test_tpu_job_needs_slice_of_its_exact_type() -> None:
    reason = run([job("t", device=TpuConfig("v5litepod-16"))], tpu_slice("a", "v6e-16")).pending["t"]
    assert not reason.satisfiable
    assert reason.message.endswith("needs TPU slice v5litepod-16 (4 hosts); no v5litepod-16 slice is registered")


def test_too_few_slices_for_replicas_is_never() -> None:
    reason = run([job("t", replicas=2, device=TpuConfig("v5litepod-16"))], tpu_slice("a", "v5litepod-16")).pending["t"]
    assert not reason.satisfiable
    assert "needs 2 complete v5litepod-16 slices; only 1 suitable registered" in reason.message


def test_single_host_tpu_without_tpu_name_is_its_own_slice() -> None:
    w = worker("w", devices=[Device("tpu", "v5litepod-8", 8)])
    assert placed(run([job("t", device=TpuConfig("v5litepod-8"))], [w]))["t"] == ("w",)


def test_slice_with_duplicate_host_ids_is_not_used() -> None:
    hosts = tpu_slice("a", "v5litepod-16")
    dup = WorkerInfo(
        "a-extra",
        hosts[0].cpu_millis,
        hosts[0].ram_bytes,
        hosts[0].disk_bytes,
        hosts[0].devices,
        {**hosts[0].attributes, "tpu-worker-id": "1"},
    )
    reason = run([job("t", device=TpuConfig("v5litepod-16"))], [*hosts, dup]).pending["t"]
    assert not reason.satisfiable and "share tpu-worker-id 1" in reason.message


# -- credit order, backfill, reservation -------------------------------------------------------


def test_higher_credit_goes_first_then_earlier_submission() -> None:
    workers = [worker("w", cpu=1)]
    pending = [job("poor", user="p", at=0), job("rich", user="r", at=5)]
    assert set(placed(run(pending, workers, credits={"p": 10, "r": 20}))) == {"rich"}
    pending = [job("later", user="a", at=5), job("earlier", user="b", at=1)]
    assert set(placed(run(pending, workers, credits={"a": 10, "b": 10}))) == {"earlier"}


def test_a_sweep_does_not_starve_a_single_run() -> None:
    workers = [worker("w", cpu=3)]
    sweep = [job(f"sweep-{i}", user="sweeper", at=i) for i in range(20)]
    single = job("single", user="solo", at=100)
    decision = run([*sweep, single], workers, credits={"sweeper": 1000, "solo": 1000})
    assert "single" in placed(decision), "after the sweep's first placement its bid drops below the solo user's"
    assert len(decision.assignments) == 3


def test_running_work_lowers_the_bid() -> None:
    workers = [worker("w", cpu=4)]
    busy = [RunningTask("w", "heavy", TaskResources(cpu_millis=3000))]
    pending = [job("h", user="heavy", at=0), job("l", user="light", at=1)]
    decision = run(pending, workers, busy, credits={"heavy": 1000, "light": 1000})
    assert set(placed(decision)) == {"l"}
    assert decision.bids["heavy"] < decision.bids["light"]


def test_missing_user_bids_the_initial_credit() -> None:
    policy = SchedulerPolicy(credit=CreditPolicy(initial_credit=500))
    decision = run([job("j", user="new")], [worker("w")], policy=policy)
    assert decision.bids == {"new": 500}


def test_backfill_places_small_jobs_behind_a_blocked_big_one() -> None:
    workers = [worker("w", cpu=8)]
    busy = [RunningTask("w", "bob", TaskResources(cpu_millis=4000))]
    decision = run([job("big", cpu=8, at=0), job("small", cpu=1, at=1)], workers, busy, now=10)
    assert set(placed(decision)) == {"small"}
    assert decision.pending["big"].satisfiable


def test_starving_job_reserves_workers_so_they_drain() -> None:
    workers = [worker("w-1", cpu=8), worker("w-2", cpu=8)]
    busy = [
        RunningTask("w-1", "bob", TaskResources(cpu_millis=4000)),
        RunningTask("w-2", "bob", TaskResources(cpu_millis=6000)),
    ]
    pending = [job("big", cpu=8, at=0), job("small", cpu=1, at=1)]
    policy = SchedulerPolicy(reserve_after_seconds=60)
    # Not yet starving: pure backfill.
    assert set(placed(run(pending, workers, busy, now=30, policy=policy))) == {"small"}
    # Starving: the worker closest to fitting (w-1) is held; small jobs may only use w-2.
    decision = run(pending, workers, busy, now=61, policy=policy)
    assert placed(decision) == {"small": ("w-2",)}
    # With w-2 full too, the small job waits and says why.
    busy_full = [*busy, RunningTask("w-2", "bob", TaskResources(cpu_millis=2000))]
    decision = run(pending, workers, busy_full, now=61, policy=policy)
    assert placed(decision) == {}
    assert "held for an older job" in decision.pending["small"].message


def test_reservation_can_be_disabled() -> None:
    workers = [worker("w-1", cpu=8)]
    busy = [RunningTask("w-1", "bob", TaskResources(cpu_millis=4000))]
    decision = run(
        [job("big", cpu=8, at=0), job("small", cpu=1, at=1)],
        workers,
        busy,
        now=10_000,
        policy=SchedulerPolicy(reserve_after_seconds=None),
    )
    assert set(placed(decision)) == {"small"}


def test_many_identical_jobs_fill_capacity_exactly() -> None:
    workers = [worker(f"w-{i}", cpu=4) for i in range(10)]
    pending = [job(f"j-{i}", user=f"u{i % 7}", at=i, cpu=1) for i in range(2000)]
    decision = run(pending, workers)
    assert len(decision.assignments) == 40
    assert len(decision.pending) == 1960
    assert all(r.satisfiable for r in decision.pending.values())


def test_schedule_is_deterministic() -> None:
    workers = [worker(f"w-{i}", cpu=4, region="r1" if i % 2 else "r2") for i in range(6)]
    pending = [job(f"j-{i}", user=f"u{i % 3}", at=i % 5, cpu=1 + i % 3) for i in range(30)]
    assert run(pending, workers) == run(list(reversed(pending)), list(reversed(workers)))


# -- properties --------------------------------------------------------------------------------

_regions = st.sampled_from(["r1", "r2"])


@st.composite
def _workers(draw: st.DrawFn) -> list[WorkerInfo]:
    count = draw(st.integers(0, 6))
    out = []
    for i in range(count):
        gpu = draw(st.sampled_from([None, ("H100", 8), ("A100", 4)]))
        out.append(
            worker(
                f"w-{i}",
                cpu=draw(st.integers(0, 8)),
                ram_gib=draw(st.integers(0, 32)),
                disk_gib=draw(st.integers(0, 50)),
                devices=[Device("gpu", gpu[0], gpu[1])] if gpu else [],
                alive=draw(st.booleans()) or i == 0,
                preemptible=draw(st.sampled_from(["true", "false"])),
                region=draw(_regions),
            )
        )
    return out


_resources = st.builds(
    TaskResources,
    cpu_millis=st.integers(0, 6000),
    ram_bytes=st.integers(0, 20).map(lambda g: g * GiB),
    disk_bytes=st.sampled_from([0, GiB, 40 * GiB]),
    device_kind=st.just("cpu"),
    preemptible=st.booleans(),
    regions=st.sampled_from([None, ("r1",), ("r2",), ("r1", "r2")]),
)
_gpu_resources = st.builds(
    TaskResources,
    cpu_millis=st.integers(0, 4000),
    ram_bytes=st.just(GiB),
    disk_bytes=st.just(0),
    device_kind=st.just("gpu"),
    device_type=st.sampled_from(["H100", "A100", "auto"]),
    device_count=st.integers(1, 8),
)


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[list[PendingJob], list[WorkerInfo], list[RunningTask], float]:
    workers = draw(_workers())
    alive = [w for w in workers if w.alive]
    running = []
    for _ in range(draw(st.integers(0, 4))):
        if alive:
            w = draw(st.sampled_from(alive))
            running.append(
                RunningTask(w.worker_id, draw(st.sampled_from("ab")), TaskResources(cpu_millis=1000, ram_bytes=GiB))
            )
    pending = [
        PendingJob(
            f"j-{i}",
            draw(st.sampled_from("abc")),
            draw(st.integers(1, 4)),
            draw(st.one_of(_resources, _gpu_resources)),
            float(draw(st.integers(0, 100))),
        )
        for i in range(draw(st.integers(0, 8)))
    ]
    return pending, workers, running, float(draw(st.sampled_from([0, 1000])))


def _need(r: TaskResources) -> list[int]:
    return [r.cpu_millis, r.ram_bytes, r.disk_bytes, r.device_count if r.device_kind == "gpu" else 0]


def _capacity(w: WorkerInfo) -> list[int]:
    gpu = w.device("gpu")
    return [w.cpu_millis, w.ram_bytes, w.disk_bytes, gpu.count if gpu else 0]


@settings(max_examples=150, deadline=None)
@given(_scenario())
def test_property_no_overcommit_no_partial_gang_constraints_hold(
    scenario: tuple[list[PendingJob], list[WorkerInfo], list[RunningTask], float],
) -> None:
    pending, workers, running, now = scenario
    decision = schedule(
        pending, workers, running, {"a": 5.0, "b": 1.0}, now=now, policy=SchedulerPolicy(reserve_after_seconds=50)
    )
    by_id = {j.job_id: j for j in pending}
    wmap = {w.worker_id: w for w in workers}
    assigned = placed(decision)
    # Every job is either assigned or has a reason, never both.
    assert set(assigned) | set(decision.pending) == set(by_id)
    assert not set(assigned) & set(decision.pending)
    used: dict[str, list[int]] = {}
    for t in running:
        used.setdefault(t.worker_id, [0, 0, 0, 0])
        used[t.worker_id] = [a + b for a, b in zip(used[t.worker_id], _need(t.resources), strict=True)]
    newly: dict[str, list[int]] = {}
    for jid, wids in assigned.items():
        j = by_id[jid]
        assert len(wids) == j.task_count, "all replicas are placed at once"
        for wid in wids:
            w = wmap[wid]
            assert w.alive
            r = j.resources
            if r.regions is not None:
                assert w.region in r.regions
            if not r.preemptible:
                assert not w.preemptible
            if r.device_kind == "gpu":
                dev = w.device("gpu")
                assert dev is not None and r.device_type in ("auto", dev.type)
            newly.setdefault(wid, [0, 0, 0, 0])
            newly[wid] = [a + b for a, b in zip(newly[wid], _need(r), strict=True)]
    for wid, add in newly.items():
        total = [a + b for a, b in zip(used.get(wid, [0, 0, 0, 0]), add, strict=True)]
        assert all(t <= c for t, c in zip(total, _capacity(wmap[wid]), strict=True)), f"{wid} over-committed"


@settings(max_examples=150, deadline=None)
@given(_scenario())
def test_property_never_means_never_and_satisfiable_means_it_fits_an_idle_cluster(
    scenario: tuple[list[PendingJob], list[WorkerInfo], list[RunningTask], float],
) -> None:
    pending, workers, running, now = scenario
    decision = schedule(pending, workers, running, {}, now=now)
    for jid, reason in decision.pending.items():
        alone = next(j for j in pending if j.job_id == jid)
        fits_idle = bool(schedule([alone], workers, [], {}, now=now).assignments)
        assert fits_idle == reason.satisfiable, reason.message
        prefix = "waiting for capacity: " if reason.satisfiable else "can never be scheduled with the current workers: "
        assert reason.message.startswith(prefix)


_TPU_TYPES = ["v5litepod-16", "v5litepod-8", "v4-16"]


@st.composite
def _tpu_scenario(draw: st.DrawFn) -> tuple[list[PendingJob], list[WorkerInfo]]:
    workers: list[WorkerInfo] = []
    for s in range(draw(st.integers(0, 5))):
        stype = draw(st.sampled_from(_TPU_TYPES))
        hosts = tpu_slice(f"s{s}", stype)
        # Drop hosts at random to make incomplete slices.
        keep = draw(st.lists(st.booleans(), min_size=len(hosts), max_size=len(hosts)))
        workers.extend(h for h, k in zip(hosts, keep, strict=True) if k or draw(st.booleans()))
    workers.append(worker("cpu-only", cpu=64, ram_gib=256))
    pending = [
        PendingJob(
            f"t-{i}",
            draw(st.sampled_from("ab")),
            draw(st.integers(1, 3)),
            TaskResources.from_config(
                ResourceConfig(
                    cpu=draw(st.sampled_from([1, 8, 32])), device=TpuConfig(draw(st.sampled_from(_TPU_TYPES)))
                )
            ),
            float(i),
        )
        for i in range(draw(st.integers(1, 6)))
    ]
    return pending, workers


@settings(max_examples=150, deadline=None)
@given(_tpu_scenario())
def test_property_tpu_replicas_each_take_one_whole_slice(scenario: tuple[list[PendingJob], list[WorkerInfo]]) -> None:
    pending, workers = scenario
    wmap = {w.worker_id: w for w in workers}
    slices: dict[str, set[str]] = {}
    for w in workers:
        if w.tpu_name:
            slices.setdefault(w.tpu_name, set()).add(w.worker_id)
    decision = schedule(pending, workers, [], {}, now=0.0)
    taken: set[str] = set()
    by_id = {j.job_id: j for j in pending}
    for a in decision.assignments:
        j = by_id[a.job_id]
        hosts = j.resources.hosts_per_replica
        assert len(a.worker_ids) == j.replicas * hosts
        names = []
        for r in range(j.replicas):
            group = a.worker_ids[r * hosts : (r + 1) * hosts]
            name = wmap[group[0]].tpu_name
            assert name is not None
            names.append(name)
            assert set(group) == slices[name], "a replica gets every host of its slice"
            assert [wmap[g].tpu_worker_id for g in group] == list(range(hosts))
            assert all(wmap[g].device("tpu").type == j.resources.device_type for g in group)  # type: ignore[union-attr]
        assert len(set(names)) == j.replicas, "replicas use distinct slices"
        assert not taken & set(a.worker_ids), "no host is given to two jobs"
        taken |= set(a.worker_ids)
