"""The autoscaler against the simulated provider with a simulated clock: no processes, every rule checked.

Each test drives :class:`Autoscaler.tick` and Fray's own scheduler (what the controller
does between ticks) through :class:`_Sim`, which registers a VM's worker once the
provider says the VM runs, exactly as that worker would (``vm_worker_info``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo
from fray.cluster.server.autoscale._createrate import CreateRate
from fray.cluster.server.autoscale._vmstate import TRANSITIONS, VmRecord, VmState
from fray.cluster.server.autoscale.autoscaler import (
    Autoscaler,
    AutoscalerPolicy,
    ClusterView,
    TickResult,
    vm_worker_info,
)
from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import CloudState
from fray.cluster.server.autoscale.simulated import SimulatedProvider
from fray.cluster.server.scheduler import PendingJob, RunningTask, schedule
from fray.errors import FrayError

GIB = 1 << 30

CONFIG: dict[str, Any] = {
    "provider": {"kind": "simulated", "boot_seconds": 1.0},
    "worker_timeout": 5,
    "idle_seconds": 10,
    "scale_groups": {
        "cpu": {"resources": {"cpu": 2, "ram": "2g"}, "min": 0, "max": 3, "priority": 1},
        "cpu-backup": {"resources": {"cpu": 2, "ram": "2g"}, "max": 2, "priority": 2},
        "v4-16": {"hosts": 2, "resources": {"cpu": 1, "ram": "1g", "device": "tpu:v4-16:4"}, "max": 2, "priority": 1},
    },
}


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class _Sim:
    """The provider, the autoscaler, and a controller's worth of state: pending jobs, workers, tasks."""

    def __init__(self, config: Mapping[str, Any] = CONFIG, policy: AutoscalerPolicy | None = None) -> None:
        self.clock = _Clock()
        self.config = ClusterConfig.from_mapping(dict(config))
        boot = self.config.provider.number("boot_seconds", 1.0)
        self.provider = SimulatedProvider(None, boot_seconds=boot, worker=None, clock=self.clock)
        self.lost_calls: list[tuple[str, str]] = []
        self.stopped_calls: list[tuple[str, str]] = []
        self.autoscaler = self.new_autoscaler(policy)
        self.workers: dict[str, WorkerInfo] = {}
        self.lost: set[str] = set()
        self.silent: set[str] = set()  # VMs whose worker never starts
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, list[RunningTask]] = {}  # job id -> its tasks
        self.placed: dict[str, tuple[str, ...]] = {}
        self.result = TickResult(frozenset(), {})
        self._jobs = 0

    def new_autoscaler(self, policy: AutoscalerPolicy | None = None) -> Autoscaler:
        return Autoscaler(
            self.config, self.provider, policy=policy, clock=self.clock, lose_worker=self._lose, stop_worker=self._stop
        )

    def _lose(self, worker_id: str, reason: str) -> None:
        self.lost_calls.append((worker_id, reason))
        self.kill_worker(worker_id)

    def _stop(self, worker_id: str, reason: str) -> None:
        self.stopped_calls.append((worker_id, reason))
        self.kill_worker(worker_id)

    def kill_worker(self, worker_id: str) -> None:
        """The controller declares the worker lost: its jobs go back to pending (a retry)."""
        self.workers.pop(worker_id, None)
        self.lost.add(worker_id)
        for job_id, tasks in list(self.running.items()):
            if any(t.worker_id == worker_id for t in tasks):
                del self.running[job_id]
                self.pending[job_id] = self.jobs[job_id]

    def submit(self, n: int = 1, *, replicas: int = 1, band: int = 2, **resources: Any) -> list[str]:
        ids = []
        r = TaskResources(**resources)
        for _ in range(n):
            self._jobs += 1
            at = self.clock.now + self._jobs * 1e-6
            job = PendingJob(f"job-{self._jobs:05d}", "alice", replicas, r, at, band=band)
            self.pending[job.job_id] = job
            self.jobs[job.job_id] = job
            ids.append(job.job_id)
        return ids

    jobs: dict[str, PendingJob] = {}

    def finish(self, job_id: str) -> None:
        del self.running[job_id]

    def view(self) -> ClusterView:
        tasks = [t for ts in self.running.values() for t in ts]
        return ClusterView(
            pending=list(self.pending.values()),
            workers=list(self.workers.values()),
            running=tasks,
            registered=frozenset(self.workers),
            lost=frozenset(self.lost),
        )

    def step(self, seconds: float = 1.0) -> TickResult:
        """Time passes; running VMs' workers register; the autoscaler ticks; the scheduler places work."""
        self.clock.now += seconds
        listed = self.provider.list_vms()
        for gone in set(self.workers) - {vm.vm_id for vm in listed}:
            self.kill_worker(gone)  # its VM was deleted: the worker stopped, the controller lost it
        for vm in listed:
            known = any(g.name == vm.group for g in self.config.scale_groups)
            starts = vm.state == CloudState.RUNNING and vm.vm_id not in self.silent | self.lost
            if known and starts and vm.vm_id not in self.workers:
                group = self.config.group(vm.group)
                self.workers[vm.vm_id] = vm_worker_info(group, vm.vm_id, vm.slice_id, vm.host_index)
        self.result = self.autoscaler.tick(self.view())
        self.schedule()
        return self.result

    def schedule(self) -> None:
        usable = [w for w in self.workers.values() if w.worker_id not in self.result.fenced]
        tasks = [t for ts in self.running.values() for t in ts]
        decision = schedule(list(self.pending.values()), usable, tasks, {}, now=self.clock.now)
        for assignment in decision.assignments:
            job = self.pending.pop(assignment.job_id)
            self.placed[job.job_id] = assignment.worker_ids
            self.running[job.job_id] = [RunningTask(w, job.user, job.resources) for w in assignment.worker_ids]

    def vms(self, **filters: str) -> list[dict[str, Any]]:
        return [
            vm
            for vm in self.autoscaler.vms(include_deleted=True)
            if all(vm[key] == value for key, value in filters.items())
        ]

    def live(self, group: str) -> list[dict[str, Any]]:
        return [vm for vm in self.autoscaler.vms() if vm["group"] == group]

    def group_status(self, name: str) -> dict[str, Any]:
        return next(g for g in self.autoscaler.status()["groups"] if g["name"] == name)


@pytest.fixture(autouse=True)
def _fresh_jobs() -> None:
    _Sim.jobs = {}


def _tpu(**extra: Any) -> dict[str, Any]:
    return {"device_kind": "tpu", "device_type": "v4-16", "device_count": 4, "cpu_millis": 500, **extra}


def test_transition_table_allows_only_the_documented_moves() -> None:
    vm = VmRecord("v", "s", "g", 0, VmState.REQUESTED, 0.0)
    vm.move(VmState.BOOTING, 1.0)
    vm.move(VmState.READY, 2.0)
    assert vm.ready_at == 2.0
    with pytest.raises(FrayError, match="no transition READY -> REQUESTED"):
        vm.move(VmState.REQUESTED, 3.0)
    with pytest.raises(FrayError, match="FAILED needs one of"):
        vm.move(VmState.FAILED, 3.0, "because")
    vm.move(VmState.DRAINING, 3.0)
    vm.move(VmState.READY, 4.0)  # got work while draining: kept
    vm.move(VmState.FAILED, 5.0, "preempted")
    assert vm.finished and not TRANSITIONS[VmState.DELETED] and not TRANSITIONS[VmState.FAILED]
    assert vm.as_dict()["reason"] == "preempted" and vm.as_dict()["state"] == "FAILED"


def test_scales_from_zero_to_max_never_past_it_and_overflow_goes_to_the_next_group() -> None:
    sim = _Sim()
    sim.submit(30)  # 1 core each: 2 per VM
    peak: dict[str, int] = {}
    for _ in range(8):
        sim.step()
        for group in ("cpu", "cpu-backup"):
            peak[group] = max(peak.get(group, 0), len(sim.live(group)))
    assert peak == {"cpu": 3, "cpu-backup": 2}
    assert len(sim.running) == 10  # five VMs, two jobs each
    assert all(vm["state"] == "READY" for vm in sim.autoscaler.vms())
    status = sim.autoscaler.status()
    assert status["unmet_count"] == 20
    assert status["unmet"][0]["code"] == "at_max"
    assert status["unmet"][0]["groups"] == {"cpu": "at_max", "cpu-backup": "at_max"}
    job = next(iter(sim.pending))
    assert "cpu is at its max of 3" in sim.result.notes[job]
    # VM ids are the worker ids the jobs run on.
    assert {w for ws in sim.placed.values() for w in ws} == {vm["id"] for vm in sim.autoscaler.vms()}


def test_work_drains_then_idle_vms_scale_down_to_min_with_a_drain() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "min": 1, "max": 3}}}
    sim = _Sim(config)
    jobs = sim.submit(6)
    for _ in range(4):
        sim.step()
    assert len(sim.live("cpu")) == 3 and len(sim.running) == 6
    for job in jobs:
        sim.finish(job)
    sim.step(1.0)  # the first tick that sees them idle
    sim.step(9.0)
    assert all(vm["state"] == "READY" for vm in sim.live("cpu"))  # idle, but not for idle_seconds yet
    sim.step(1.0)
    states = sorted(vm["state"] for vm in sim.live("cpu"))
    assert states == ["DRAINING", "DRAINING", "READY"]  # never below min 1
    draining = [vm["id"] for vm in sim.live("cpu") if vm["state"] == "DRAINING"]
    assert set(draining) <= sim.result.fenced  # nothing new is placed on a draining VM
    sim.step(3.0)
    assert [vm["state"] for vm in sim.live("cpu")] == ["READY"]
    assert sorted(vm["id"] for vm in sim.vms(state="DELETED")) == sorted(draining)
    assert len(sim.provider.list_vms()) == 1
    # Their workers leave the scheduler's sight at once, as stopped (a scale-down is not a crash), and stay
    # fenced for a while: no task lands on a VM that is going away.
    assert sorted(sim.stopped_calls) == sorted(
        (vm_id, f"its VM {vm_id} was deleted (scaled down)") for vm_id in draining
    )
    assert sim.lost_calls == []
    assert set(draining) <= sim.result.fenced
    sim.step(61.0)
    assert not set(draining) & sim.result.fenced


def test_a_draining_vm_that_gets_work_is_kept() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "max": 2}}}
    sim = _Sim(config)
    [job] = sim.submit(1)
    for _ in range(3):
        sim.step()
    [vm] = sim.live("cpu")
    sim.finish(job)
    sim.step(1.0)
    sim.step(10.0)
    assert sim.live("cpu")[0]["state"] == "DRAINING"
    # A scheduling pass that read the workers before the fence places a job there anyway.
    sim.running["late"] = [RunningTask(vm["id"], "alice", TaskResources())]
    sim.step(3.0)
    assert sim.live("cpu")[0]["state"] == "READY" and sim.vms(state="DELETED") == []
    assert vm["id"] not in sim.result.fenced


def test_new_demand_takes_back_a_draining_vm_instead_of_creating_one() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "max": 2}}}
    sim = _Sim(config)
    [job] = sim.submit(1)
    for _ in range(3):
        sim.step()
    sim.finish(job)
    sim.step(1.0)
    sim.step(10.0)
    assert sim.live("cpu")[0]["state"] == "DRAINING"
    sim.submit(1)
    sim.step(0.5)
    assert [vm["state"] for vm in sim.live("cpu")] == ["READY"] and len(sim.running) == 1
    assert len(sim.vms()) == 1  # no second VM was created


def test_a_two_host_slice_is_created_as_one_ready_only_when_both_hosts_registered() -> None:
    sim = _Sim()
    [job] = sim.submit(1, **_tpu())
    sim.step(0.1)
    slice_vms = sim.live("v4-16")
    assert [vm["id"] for vm in slice_vms] == ["fray-v4-16-0-0", "fray-v4-16-0-1"]
    assert {vm["slice"] for vm in slice_vms} == {"fray-v4-16-0"}
    assert all(vm["state"] == "REQUESTED" for vm in slice_vms)
    assert "scale group v4-16 is starting 1 slice" in sim.result.notes[job]
    sim.silent.add("fray-v4-16-0-1")  # the second host's worker is late
    sim.step(1.5)
    assert all(vm["state"] == "BOOTING" for vm in sim.live("v4-16"))
    assert "fray-v4-16-0-0" in sim.result.fenced and job in sim.pending  # nothing placed on half a slice
    sim.silent.clear()
    sim.step(0.5)
    assert all(vm["state"] == "READY" for vm in sim.live("v4-16"))
    assert sim.placed[job] == ("fray-v4-16-0-0", "fray-v4-16-0-1")
    assert len(sim.live("v4-16")) == 2 and len(sim.live("cpu")) == 0


def test_a_partial_slice_past_the_boot_deadline_is_deleted_whole_and_requested_again() -> None:
    sim = _Sim()
    [job] = sim.submit(1, **_tpu())
    sim.silent.add("fray-v4-16-0-1")  # never boots
    sim.step(0.1)
    for _ in range(10):
        sim.step()
    assert all(vm["state"] == "BOOTING" for vm in sim.live("v4-16"))
    sim.step(1.0)  # 11.1 s after the create: past boot_timeout 10 s
    failed = sim.vms(slice="fray-v4-16-0")
    assert [(vm["state"], vm["reason"]) for vm in failed] == [("FAILED", "boot_deadline")] * 2
    assert [vm["slice"] for vm in sim.live("v4-16")] == ["fray-v4-16-1"] * 2  # requested again, whole
    assert not any(vm.slice_id == "fray-v4-16-0" for vm in sim.provider.list_vms())
    assert sim.group_status("v4-16")["state"].startswith("backoff")
    assert sim.group_status("v4-16")["create_rate_per_minute"] == pytest.approx(60.0)  # halved from 120
    sim.step(1.5)
    assert sim.placed[job] == ("fray-v4-16-1-0", "fray-v4-16-1-1")


def test_the_create_rate_drops_multiplicatively_with_a_floor_and_recovers_linearly() -> None:
    rate = CreateRate(base=1.0, burst=4.0, factor=0.5, floor=1 / 60, recovery_seconds=100.0, updated=0.0)
    assert [rate.take() for _ in range(5)] == [True] * 4 + [False]  # a burst of 4
    rate.boot_failed(0.0)
    assert rate.rate == 0.5 and rate.throttled
    for _ in range(11):
        rate.boot_failed(0.0)
    assert rate.rate == pytest.approx(1 / 60)  # 1/2^12 is below the floor
    rate.advance(50.0)  # half the recovery time: about half the rate again, not an exponential wait
    assert rate.rate == pytest.approx(0.5 + 1 / 120, rel=0.01)
    assert rate.tokens <= 4 * rate.rate < 4.0  # a throttled group's bucket is smaller: no burst
    rate.advance(110.0)
    assert rate.rate == 1.0 and not rate.throttled and rate.tokens == 4.0


def test_a_throttled_group_creates_slowly_and_says_so() -> None:
    policy = AutoscalerPolicy(boot_timeout=10.0, create_rate=1.0, create_burst=4.0, recovery_seconds=100.0)
    sim = _Sim(policy=policy)
    for _ in range(12):
        sim.autoscaler._groups["cpu"].rate.boot_failed(sim.clock.now)
    sim.submit(6)
    sim.step(0.0)
    assert len(sim.live("cpu")) == 1  # the bucket holds one create at the floor
    assert sim.result.notes[next(iter(sim.pending))].endswith(
        "is starting 1 VM and will create 2 more (create rate limited)"
    )
    assert sim.group_status("cpu")["state"] == "backoff (12 boot failures)"
    sim.step(110.0)
    assert len(sim.live("cpu")) == 3 and sim.group_status("cpu")["state"] == "ok"


def test_quota_exhaustion_blocks_the_group_and_its_demand_goes_to_the_next_group_at_once() -> None:
    sim = _Sim()
    sim.provider.set_quota_exhausted("cpu", True)
    [job] = sim.submit(1)
    sim.step(0.1)
    assert sim.live("cpu") == [] and sim.vms(group="cpu") == []  # a refusal creates no VM
    assert [vm["group"] for vm in sim.live("cpu-backup")] == ["cpu-backup"]  # the same tick
    status = sim.group_status("cpu")
    assert status["state"].startswith("quota-blocked until ") and "quota" in status["last_error"]
    sim.step(1.5)
    assert sim.placed[job] == ("fray-cpu-backup-0",)
    sim.provider.set_quota_exhausted("cpu", False)
    sim.submit(1)
    sim.step(1.0)
    assert sim.live("cpu") == []  # still blocked: 60 s by default for the simulated provider
    sim.step(60.0)
    assert sim.group_status("cpu")["state"] == "ok"


def test_demand_is_counted_by_band_production_first_and_its_vms_are_never_reclaimed() -> None:
    sim = _Sim()
    batch = sim.submit(20, band=3)  # twice what the groups' maxima hold (10 slots)
    production = sim.submit(4, band=1)  # submitted last
    for _ in range(8):
        sim.step()
    assert all(job in sim.running for job in production)  # served first although submitted last
    unmet = {entry["job_id"] for entry in sim.autoscaler.status()["unmet"]}
    assert unmet and unmet <= set(batch)
    # The batch backlog never drains a VM that runs work (only idle VMs are reclaimed), production's included.
    hosts = {w for job in production for w in sim.placed[job]}
    for _ in range(30):
        sim.step()
        assert all(vm["state"] == "READY" for vm in sim.autoscaler.vms() if vm["id"] in hosts)


def test_every_group_blocked_or_full_is_a_machine_readable_reason() -> None:
    sim = _Sim()
    sim.provider.set_quota_exhausted("cpu", True)
    sim.provider.set_quota_exhausted("cpu-backup", True)
    [job] = sim.submit(1)
    sim.step(0.1)
    entry = sim.autoscaler.status()["unmet"][0]
    assert entry["job_id"] == job and entry["code"] == "quota_blocked" and not entry["never"]
    assert entry["groups"] == {"cpu": "quota_blocked", "cpu-backup": "quota_blocked"}
    assert sim.result.notes[job].startswith("waiting for capacity: [quota_blocked]")


def test_impossible_demand_says_so_naming_the_largest_group() -> None:
    sim = _Sim()
    [big] = sim.submit(1, cpu_millis=8000)
    [gang] = sim.submit(1, replicas=20)
    [gpu] = sim.submit(1, device_kind="gpu", device_type="H100", device_count=1)
    sim.step(0.1)
    note = sim.result.notes[big]
    assert note.startswith("can never be scheduled: [no_group_fits]")
    assert "The largest group is cpu (2 cores, 2 GiB RAM" in note
    assert "above its max" in sim.result.notes[gang]
    assert "has no GPU" in sim.result.notes[gpu]
    assert sim.autoscaler.vms() == []
    codes = {entry["job_id"]: entry["code"] for entry in sim.autoscaler.status()["unmet"]}
    assert codes == {big: "no_group_fits", gang: "no_group_fits", gpu: "no_group_fits"}


def test_a_gang_needs_enough_single_vms_of_one_group() -> None:
    sim = _Sim()
    [gang] = sim.submit(1, replicas=5, cpu_millis=2000)  # one VM each; cpu has 3, cpu-backup 2
    sim.step(0.1)
    assert sim.live("cpu") == [] and sim.live("cpu-backup") == []
    assert sim.autoscaler.status()["unmet"][0]["code"] == "no_group_fits"
    [fits] = sim.submit(1, replicas=3, cpu_millis=2000)
    sim.step(0.1)
    assert len(sim.live("cpu")) == 3
    sim.step(1.5)
    assert sorted(sim.placed[fits]) == ["fray-cpu-0", "fray-cpu-1", "fray-cpu-2"]
    assert gang in sim.pending


def test_a_preempted_vm_is_failed_its_worker_lost_at_once_and_replaced() -> None:
    sim = _Sim()
    [job] = sim.submit(1)
    for _ in range(3):
        sim.step()
    [vm_id] = sim.placed[job]
    sim.provider.preempt(vm_id)
    sim.step(0.1)
    assert sim.lost_calls == [(vm_id, f"VM {vm_id} preempted")]
    assert [(vm["state"], vm["reason"]) for vm in sim.vms(id=vm_id)] == [("FAILED", "preempted")]
    assert job in sim.pending or sim.placed[job] != (vm_id,)
    for _ in range(3):
        sim.step()
    assert job in sim.running and sim.placed[job] != (vm_id,)
    assert sim.group_status("cpu")["state"] == "ok"  # a preemption is no boot failure


def test_a_lost_worker_fails_its_vm_and_the_vm_is_deleted() -> None:
    sim = _Sim()
    [job] = sim.submit(1)
    for _ in range(3):
        sim.step()
    [vm_id] = sim.placed[job]
    sim.kill_worker(vm_id)  # the worker died; the VM still runs at the "cloud"
    sim.silent.add(vm_id)
    sim.step(0.1)
    assert [(vm["state"], vm["reason"]) for vm in sim.vms(id=vm_id)] == [("FAILED", "lost")]
    assert vm_id not in {vm.vm_id for vm in sim.provider.list_vms()}


def test_a_restarted_autoscaler_adopts_the_vms_it_finds_and_creates_no_duplicates() -> None:
    sim = _Sim()
    sim.submit(4)
    sim.submit(1, **_tpu())
    for _ in range(3):
        sim.step()
    before = sorted((vm["id"], vm["state"]) for vm in sim.autoscaler.vms())
    assert len(before) == 4
    sim.autoscaler = sim.new_autoscaler()  # the controller was killed and started again
    sim.submit(1)
    sim.step(0.1)
    assert sorted((vm["id"], vm["state"]) for vm in sim.autoscaler.vms()) == sorted(
        [*before, ("fray-cpu-2", "REQUESTED")]
    )
    assert len(sim.provider.list_vms()) == 5


def test_a_repeated_create_is_idempotent_by_request_id() -> None:
    sim = _Sim()
    sim.submit(1)
    sim.step(0.1)
    [vm] = sim.provider.list_vms()
    from fray.cluster.server.autoscale.provider import SliceRequest

    group = sim.config.group("cpu")
    again = SliceRequest("fray-cpu-0", "cpu", "fray-cpu-0", ("fray-cpu-0",), group.resources, {})
    assert [v.vm_id for v in sim.provider.create_slice(again)] == [vm.vm_id]
    assert len(sim.provider.list_vms()) == 1


def test_min_is_kept_and_unknown_groups_slices_are_deleted_on_adoption() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "min": 2, "max": 3}}}
    sim = _Sim(config)
    sim.step(0.1)
    sim.step(1.5)
    assert [vm["state"] for vm in sim.live("cpu")] == ["READY", "READY"]
    sim.step(30.0)
    assert len(sim.live("cpu")) == 2  # idle, but min 2
    other = _Sim()
    other.provider = sim.provider  # the file now has no such group
    other.config = ClusterConfig.from_mapping(CONFIG | {"scale_groups": {"gpu": {"resources": {"cpu": 1}, "max": 1}}})
    other.autoscaler = other.new_autoscaler()
    other.step(0.1)
    assert sim.provider.list_vms() == []


def test_delete_all_stops_creating_and_deletes_every_vm() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "min": 2, "max": 3}}}
    sim = _Sim(config)
    sim.step(0.1)
    assert sim.autoscaler.delete_all() == 2
    sim.step(1.0)
    assert sim.provider.list_vms() == [] and sim.autoscaler.vms() == []
    assert sim.group_status("cpu")["state"] == "stopped"
    assert [vm["state"] for vm in sim.vms()] == ["DELETED", "DELETED"]


def test_the_scale_simulation_runs_at_a_tiny_size() -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "autoscale_sim.py"
    done = subprocess.run([sys.executable, str(script), "--small"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["50", "200"]
    assert all(row[-1].endswith("s") and float(row[-1][:-1]) < 5 for row in rows)
    assert int(rows[1][1]) == 40  # every VM of the tiny cluster was created and registered


def test_demand_is_what_the_controllers_last_pass_left_pending_when_it_is_given() -> None:
    sim = _Sim()
    [waiting] = sim.submit(2)[1:]
    view = sim.view()
    sim.autoscaler.tick(replace(view, unplaced=[]))  # the pass placed everything: no demand
    assert sim.autoscaler.vms() == []
    result = sim.autoscaler.tick(replace(view, unplaced=[sim.pending[waiting]]))
    assert len(sim.autoscaler.vms()) == 1 and set(result.notes) == {waiting}


def test_a_cpu_gang_takes_one_slice_whose_hosts_equal_its_replicas() -> None:
    groups = {"pair": {"hosts": 2, "resources": {"cpu": 2, "ram": "2g"}, "max": 2}}
    sim = _Sim({**CONFIG, "scale_groups": groups})
    [gang] = sim.submit(1, replicas=2, cpu_millis=2000)
    [three] = sim.submit(1, replicas=3)
    sim.step(0.1)
    assert [vm["slice"] for vm in sim.live("pair")] == ["fray-pair-0"] * 2
    assert "slices of 2 hosts, the gang has 3 replicas" in sim.result.notes[three]
    sim.step(1.5)
    assert sim.placed[gang] == ("fray-pair-0-0", "fray-pair-0-1")


def test_after_a_restart_names_of_slices_deleted_before_are_not_reused() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "max": 3}}}
    sim = _Sim(config)
    [job] = sim.submit(1)
    for _ in range(3):
        sim.step()
    sim.finish(job)
    sim.step(1.0)
    sim.step(10.0)
    sim.step(3.0)
    assert sim.provider.list_vms() == [] and [vm["state"] for vm in sim.vms()] == ["DELETED"]
    sim.autoscaler = sim.new_autoscaler()  # restarted: nothing listed, so it counts from 0 again
    sim.submit(1)
    sim.step(0.1)
    assert [vm["id"] for vm in sim.autoscaler.vms()] == ["fray-cpu-1"]  # fray-cpu-0's request id is spent
    assert [vm.vm_id for vm in sim.provider.list_vms()] == ["fray-cpu-1"]


def test_a_pass_from_before_a_slice_became_ready_is_not_taken_as_demand() -> None:
    config = {**CONFIG, "scale_groups": {"cpu": {"resources": {"cpu": 2, "ram": "2g"}, "max": 2}}}
    sim = _Sim(config)
    [job] = sim.submit(1)
    sim.step(0.1)
    assert len(sim.live("cpu")) == 1
    sim.clock.now += 1.5
    [vm] = sim.provider.list_vms()
    sim.workers[vm.vm_id] = vm_worker_info(sim.config.group("cpu"), vm.vm_id, vm.slice_id, 0)
    # The controller's last pass ran while the VM was still fenced: it left the job pending.
    result = sim.autoscaler.tick(replace(sim.view(), unplaced=[sim.pending[job]]))
    assert sim.live("cpu")[0]["state"] == "READY"
    assert job not in result.notes and len(sim.autoscaler.vms()) == 1  # no second VM, no "at max"
    assert sim.autoscaler.status()["unmet_count"] == 0
