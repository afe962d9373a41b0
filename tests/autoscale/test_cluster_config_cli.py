"""Issue 24's "Done when" on the simulated provider, driven as a user would.

Each cluster is ``fray cluster up --config FILE --port 0`` in a subprocess with its own
``HOME`` and ``--dir``; faults are injected with ``fray cluster vm ...``; jobs are submitted
with the Python client. Every VM is a real ``fray worker`` process, so what is checked
(which VM ran a job, how many VMs a group had at once) is what a user would see.
Two clusters: one for growth (from zero to max, overflow to the next group, idle
scale-down, slices and the example, impossible demand), one for faults (quota, a failed
boot, preemption, a controller killed with SIGKILL and restarted).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fray import Entrypoint, JobRequest, ResourceConfig, TpuConfig
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import OpsProxy, ops_client
from support import alive, fray_cli_in, wait_until

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
LIVE = ("REQUESTED", "BOOTING", "READY", "DRAINING")

GROWTH_CONFIG = """
provider:
  kind: simulated
  boot_seconds: 0.5
worker_timeout: 5
idle_seconds: 3
scale_groups:
  cpu:
    resources: {cpu: 2, ram: 2g}
    max: 3
    priority: 1
  cpu-backup:
    resources: {cpu: 2, ram: 2g}
    max: 2
    priority: 2
  v4-16:
    hosts: 2
    resources: {cpu: 1, ram: 1g, device: "tpu:v4-16:4"}
    max: 2
    priority: 1
"""

FAULTS_CONFIG = """
provider:
  kind: simulated
  boot_seconds: 0.5
  boot_timeout: 6
worker_timeout: 3
idle_seconds: 120
scale_groups:
  cpu:
    resources: {cpu: 2, ram: 2g}
    max: 2
    priority: 1
  cpu-backup:
    resources: {cpu: 2, ram: 2g}
    max: 2
    priority: 2
  v4-16:
    hosts: 2
    resources: {cpu: 1, ram: 1g, device: "tpu:v4-16:4"}
    max: 1
    priority: 1
"""


# -- what the jobs run (imported by the VMs' workers from tests/, on PYTHONPATH) --------------------


def record_and_hold(out_dir: str, name: str, hold: float, release: str) -> None:
    """Record where this attempt runs; hold ``hold`` seconds, or until the file ``release`` exists."""
    worker = os.environ.get("FRAY_WORKER_ID", "")
    attempt = os.environ.get("FRAY_JOB_ATTEMPT", "")
    Path(out_dir, f"{name}.start.{worker}.{time.monotonic_ns()}").write_text(attempt)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline and not (release and Path(release).exists()):
        time.sleep(0.05)  # the job's own "work": it runs until released
    Path(out_dir, f"{name}.done.{worker}.{time.monotonic_ns()}").write_text(attempt)


def starts(out_dir: Path, name: str) -> list[str]:
    """The workers (VM ids) the attempts of job ``name`` started on, in order."""
    found = sorted(out_dir.glob(f"{name}.start.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    return [p.name.split(".")[2] for p in found]


def dones(out_dir: Path, name: str) -> list[str]:
    return [p.name.split(".")[2] for p in out_dir.glob(f"{name}.done.*")]


# -- a cluster up --config, as a user starts it ------------------------------------------------------


@dataclass
class ConfigCluster:
    """A ``fray cluster up --config`` cluster in its own HOME, with a client, the operator API and the CLI."""

    home: Path
    directory: Path
    env: dict[str, str]
    address: str = ""
    token: str = ""
    client: ClusterClient | None = None
    ops: OpsProxy | None = None
    vm_pids: set[int] = field(default_factory=set)

    def fray(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return fray_cli_in(self.env)(*args, check=check)

    def up(self, config: str) -> None:
        path = self.home / "cluster.yaml"
        path.write_text(config)
        out = self.fray("cluster", "up", "--config", str(path), "--port", "0", "--dir", str(self.directory), "--json")
        state = json.loads(out.stdout)
        self.address = state["address"]
        self.token = (self.home / ".config" / "fray" / "token").read_text().strip()
        self.env = {**self.env, "FRAY_TOKEN": self.token, "FRAY_CLIENT_SPEC": f"fray://{self.address}"}
        self.client = ClusterClient(self.address, token=self.token)
        self.ops = ops_client(self.address, self.token)

    def vms(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        assert self.ops is not None
        vms = list(self.ops.vms(include_deleted))
        self.vm_pids |= set(self.provider_pids().values())
        return vms

    def live(self, group: str) -> list[dict[str, Any]]:
        return [vm for vm in self.vms() if vm["group"] == group and vm["state"] in LIVE]

    def vm_list_json(self, *extra: str) -> list[dict[str, Any]]:
        """``fray cluster vm list --json`` as the CLI prints it."""
        return list(json.loads(self.fray("cluster", "vm", "list", "--json", *extra).stdout))

    def provider_state(self) -> dict[str, Any]:
        path = self.directory / "vms" / "vms.json"
        return json.loads(path.read_text()) if path.exists() else {"vms": []}

    def provider_pids(self) -> dict[str, int]:
        return {vm["vm_id"]: vm["process"]["pid"] for vm in self.provider_state()["vms"] if vm.get("process")}

    def submit(self, name: str, resources: ResourceConfig, *args: Any, **options: Any) -> Any:
        assert self.client is not None
        request = JobRequest(
            name=name,
            entrypoint=Entrypoint.from_callable(record_and_hold, args=args),
            resources=resources,
            **options,
        )
        return self.client.submit(request)

    def down(self) -> None:
        if self.client is not None:
            self.client.shutdown(wait=False)
        if self.ops is not None:
            self.ops.close()
        self.fray("cluster", "down", check=False)


@pytest.fixture(scope="module")
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    started: list[ConfigCluster] = []

    def make(config: str) -> ConfigCluster:
        home = tmp_path_factory.mktemp("home")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
        pythonpath = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
        env.update(HOME=str(home), PYTHONPATH=os.pathsep.join(pythonpath))
        cluster = ConfigCluster(home, home / "cluster", env)
        started.append(cluster)
        cluster.up(config)
        return cluster

    yield make
    for cluster in started:
        pids = cluster.vm_pids | set(cluster.provider_pids().values())
        cluster.down()
        # `fray cluster down` deleted every VM: none of their workers is left running.
        leftover = [pid for pid in pids if alive(pid)]
        for pid in leftover:
            os.killpg(pid, signal.SIGKILL)
        assert not leftover, f"VM workers left running after fray cluster down: {leftover}"


@pytest.fixture(scope="module")
def growth(make_cluster: Any) -> ConfigCluster:
    return make_cluster(GROWTH_CONFIG)


@pytest.fixture(scope="module")
def faults(make_cluster: Any) -> ConfigCluster:
    return make_cluster(FAULTS_CONFIG)


# -- the growth cluster -------------------------------------------------------------------------


def test_up_prints_the_groups_and_dry_run_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env["HOME"] = str(home)
    run = fray_cli_in(env)
    config = tmp_path / "cluster.yaml"
    config.write_text(GROWTH_CONFIG.replace("max: 3", "min: 1\n    max: 3"))
    out = run("cluster", "up", "--config", str(config), "--dry-run", "--port", "7399")
    assert "group cpu: 1..3 VMs" in out.stdout and "group v4-16: 0..2 slices of 2 VMs" in out.stdout
    calls = [line for line in out.stdout.splitlines() if "create_slice(" in line]
    assert len(calls) == 1 and "group=cpu" in calls[0] and "127.0.0.1:7399" in calls[0]
    assert not (home / ".config" / "fray" / "cluster.json").exists()  # nothing started
    refused = run("cluster", "up", "--config", str(config), "--workers", "2", check=False)
    assert refused.returncode == 2 and "--workers cannot be combined with --config" in refused.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(GROWTH_CONFIG.replace("max: 3", "max: many"))
    refused = run("cluster", "up", "--config", str(bad), check=False)
    assert refused.returncode == 2 and "scale_groups.cpu.max" in refused.stderr


def test_vm_commands_on_a_cluster_without_a_provider(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env["HOME"] = str(tmp_path)
    run = fray_cli_in(env)
    run("cluster", "up", "--workers", "0", "--port", "0", "--dir", str(tmp_path / "c"), "--no-dashboard")
    try:
        for args in (("list",), ("preempt", "x"), ("quota", "cpu", "--exhausted"), ("fail-boot", "cpu")):
            out = run("cluster", "vm", *args, check=False)
            assert out.returncode == 2, out.stderr
            assert "has no VM provider" in out.stderr.splitlines()[0]
    finally:
        run("cluster", "down")


def test_impossible_demand_says_why_within_seconds(growth: ConfigCluster, tmp_path: Path) -> None:
    job = growth.submit("too-big", ResourceConfig(cpu=64), str(tmp_path), "too-big", 0.0, "")
    try:
        started = time.monotonic()
        reason = wait_until(lambda: job.info().pending_reason, 15, "a pending reason")
        # It names the largest group, so the user knows what the cluster can offer at most.
        wait_until(lambda: "cpu" in job.info().pending_reason, 15, f"the reason to name a group (was {reason!r})")
        print(f"impossible demand explained after {time.monotonic() - started:.2f}s: {job.info().pending_reason}")
        assert not growth.vms(), "demand no group can fit created VMs"
    finally:
        job.terminate()


def test_scales_from_zero_to_max_never_past_it_then_idles_down(growth: ConfigCluster, tmp_path: Path) -> None:
    assert not [vm for vm in growth.vms() if vm["state"] in LIVE]  # from zero
    jobs = [
        growth.submit(f"load-{i}", ResourceConfig(cpu=2, ram="1g"), str(tmp_path), f"load-{i}", 1.0, "")
        for i in range(30)
    ]
    peak: dict[str, int] = {}
    started = time.monotonic()
    deadline = started + 240
    while not all(job.status().finished for job in jobs):
        for group in ("cpu", "cpu-backup"):
            peak[group] = max(peak.get(group, 0), len(growth.live(group)))
        assert time.monotonic() < deadline, f"30 jobs not finished in 240 s; peak VMs {peak}"
        time.sleep(0.1)  # sampling the VM count while the jobs run
    print(f"30 jobs on up to {peak} VMs in {time.monotonic() - started:.1f}s")
    assert peak["cpu"] == 3, f"group cpu never reached its max of 3 (peak {peak})"
    assert peak["cpu-backup"] <= 2
    for i, job in enumerate(jobs):
        job.wait(timeout=0)
        assert len(dones(tmp_path, f"load-{i}")) == 1
    ran_on = {vm: vm_group for vm, vm_group in ((vm["id"], vm["group"]) for vm in growth.vms(include_deleted=True))}
    assert {ran_on.get(starts(tmp_path, f"load-{i}")[0]) for i in range(30)} <= {"cpu", "cpu-backup"}
    # Idle scale-down: every VM of the CPU groups drained and deleted (min is 0), none while it had work.
    idle_started = time.monotonic()
    wait_until(lambda: not growth.live("cpu") and not growth.live("cpu-backup"), 60, "idle VMs to be deleted")
    print(f"idle scale-down to min took {time.monotonic() - idle_started:.1f}s after the last job")
    deleted = [vm for vm in growth.vm_list_json("--all") if vm["group"] in ("cpu", "cpu-backup")]
    assert deleted and {vm["state"] for vm in deleted} == {"DELETED"}
    # A scale-down is not a crash: their workers are listed as stopped, none as lost.
    workers = {w["worker_id"]: w["state"] for w in json.loads(growth.fray("worker", "list", "--json").stdout)}
    registered = {vm["worker_id"] for vm in deleted if vm["worker_id"]}
    assert registered and {workers[w] for w in registered} == {"stopped"}, workers


def test_the_example_runs_on_slices_the_provider_creates(growth: ConfigCluster) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_on_slices.py")],
        env=growth.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "training job finished after 1 attempt(s) on 4 host process(es)" in out.stdout
    tpu_vms = [vm for vm in growth.vm_list_json("--all") if vm["group"] == "v4-16"]
    slices: dict[str, list[dict[str, Any]]] = {}
    for vm in tpu_vms:
        slices.setdefault(vm["slice"], []).append(vm)
    # Two slices of two VMs each, created as units, and the job's hosts ran on exactly them.
    assert len(slices) == 2 and all(len(vms) == 2 for vms in slices.values()), tpu_vms
    for slice_id in slices:
        assert f"({slice_id})" in out.stdout
    assert all(vm["worker_id"] in (None, vm["id"]) for vm in tpu_vms)  # a VM's worker id is its VM id


# -- the faults cluster ---------------------------------------------------------------------------


def test_quota_exhaustion_routes_demand_to_the_next_group(faults: ConfigCluster, tmp_path: Path) -> None:
    faults.fray("cluster", "vm", "quota", "cpu", "--exhausted")
    try:
        job = faults.submit("quota", ResourceConfig(cpu=2, ram="1g"), str(tmp_path), "quota", 0.0, "")
        job.wait(timeout=90)
        (vm_id,) = starts(tmp_path, "quota")
        groups = {vm["id"]: vm["group"] for vm in faults.vms(include_deleted=True)}
        assert groups[vm_id] == "cpu-backup"
        assert "cpu" not in groups.values(), "a quota refusal created a VM"
        # The refusal shows as the group's state in `fray status`.
        status = faults.fray("status").stdout
        cpu_rows = [line for line in status.splitlines() if line.strip("│┃ ").startswith("cpu ")]
        assert cpu_rows and "quota" in cpu_rows[0], status
    finally:
        available = faults.fray("cluster", "vm", "quota", "cpu", "--available").stdout
    # The refusal blocked the group for quota_block_seconds: --available says it stays blocked, and until when.
    assert "accepts creates in group cpu again; the autoscaler keeps the group quota-blocked until " in available
    assert re.search(r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(", available), available


def test_a_failed_boot_is_replaced(faults: ConfigCluster, tmp_path: Path) -> None:
    # A slice with one host that never boots: the whole slice is deleted at the boot deadline and made again.
    faults.fray("cluster", "vm", "fail-boot", "v4-16", "--count", "1")
    assert faults.client is not None
    job = faults.client.submit(
        JobRequest(
            name="tpu-after-failed-boot",
            entrypoint=Entrypoint.from_callable(record_and_hold, args=(str(tmp_path), "tpu", 0.0, "")),
            resources=ResourceConfig(cpu=0.5, device=TpuConfig("v4-16")),
        )
    )
    job.wait(timeout=120)
    tpu = [vm for vm in faults.vm_list_json("--all") if vm["group"] == "v4-16"]
    failed = [vm for vm in tpu if vm["state"] == "FAILED" or vm["reason"]]
    assert failed and {vm["reason"] for vm in failed} <= {"boot_deadline", "boot_failed"}, tpu
    ran = set(starts(tmp_path, "tpu"))
    assert len(ran) == 2 and not ran & {vm["id"] for vm in failed}
    assert len({vm["slice"] for vm in tpu if vm["id"] in ran}) == 1  # both hosts on one (new) slice


def test_a_preempted_vms_job_is_retried_once_and_completes_once(faults: ConfigCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = faults.submit(
        "preempted",
        ResourceConfig(cpu=2, ram="1g"),
        str(tmp_path),
        "preempted",
        600.0,
        str(release),
        max_retries_preemption=1,
    )
    first = wait_until(lambda: starts(tmp_path, "preempted"), 90, "the job to start")[0]
    faults.fray("cluster", "vm", "preempt", first)
    second = wait_until(lambda: starts(tmp_path, "preempted")[1:], 90, "the job to be retried")[0]
    assert second != first
    release.write_text("")
    job.wait(timeout=60)
    assert starts(tmp_path, "preempted") == [first, second]
    assert dones(tmp_path, "preempted") == [second]  # completed exactly once
    listed = {vm["id"]: vm for vm in faults.vm_list_json("--all")}
    assert listed[first]["state"] == "FAILED" and listed[first]["reason"] == "preempted"


def test_vms_are_adopted_after_the_controller_is_killed(faults: ConfigCluster, tmp_path: Path) -> None:
    ready = wait_until(lambda: [vm for vm in faults.vms() if vm["state"] == "READY"], 30, "a READY VM")
    before = faults.provider_pids()
    assert before
    state = json.loads((faults.home / ".config" / "fray" / "cluster.json").read_text())
    controller = int(state["processes"]["controller"]["pid"])
    os.kill(controller, signal.SIGKILL)
    wait_until(lambda: not alive(controller), 10, "the controller to die")
    assert all(alive(pid) for pid in before.values())  # a VM's worker does not die with the controller
    out = faults.fray("cluster", "restart")
    assert "adopts" in out.stdout
    assert faults.ops is not None
    faults.ops.close()
    faults.ops = ops_client(faults.address, faults.token)
    ready_ids = {vm["id"] for vm in ready}
    wait_until(
        lambda: ready_ids <= {vm["id"] for vm in faults.vms() if vm["state"] == "READY"},
        60,
        "the restarted controller to adopt the READY VMs",
    )
    # A job runs on an adopted VM, and no duplicate VM was created for what was already there.
    job = faults.submit("after-restart", ResourceConfig(cpu=0.5, ram="128m"), str(tmp_path), "after", 0.0, "")
    job.wait(timeout=60)
    now = faults.provider_pids()
    assert set(now) <= set(before), f"VMs created after the restart: {set(now) - set(before)}"
    assert all(now[vm] == before[vm] for vm in ready_ids)  # the same worker processes, not new ones
    assert starts(tmp_path, "after")[0] in before


def test_down_with_the_controller_dead_deletes_every_vm(faults: ConfigCluster) -> None:
    pids = faults.provider_pids()
    assert pids, "the faults cluster has VMs to delete"
    assert faults.client is not None
    faults.client.shutdown(wait=False)  # while its controller is there to hear it
    faults.client = None
    state = json.loads((faults.home / ".config" / "fray" / "cluster.json").read_text())
    controller = int(state["processes"]["controller"]["pid"])
    os.kill(controller, signal.SIGKILL)
    wait_until(lambda: not alive(controller), 10, "the controller to die")
    out = faults.fray("cluster", "down")
    # The provider's listing is the truth: with no controller to ask, down deletes what the provider lists.
    assert "deleted" in out.stdout and "left at the simulated provider" in out.stdout, out.stdout
    assert faults.provider_state()["vms"] == []
    assert not [pid for pid in pids.values() if alive(pid)]
    again = faults.fray("cluster", "down")  # safe to repeat
    assert "nothing to stop" in again.stdout
