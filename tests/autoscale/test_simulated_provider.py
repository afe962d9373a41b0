"""The simulated VM provider: what the autoscaler, the CLI and a user rehearsing faults rely on."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.server.autoscale.provider import CloudState, Provider, SliceRequest, VmResources
from fray.cluster.server.autoscale.simulated import SimulatedProvider, WorkerLaunch
from fray.cluster.server.launcher import LocalCluster
from fray.errors import QuotaExceeded, VmNotFound
from support import alive, wait_until

CPU = VmResources(cpu=1, ram_bytes=512 << 20, disk_bytes=1 << 30)
TPU = VmResources(cpu=1, ram_bytes=512 << 20, disk_bytes=1 << 30, devices=("tpu:v4-16:4",))


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def request(slice_id: str, hosts: int = 1, group: str = "cpu", resources: VmResources = CPU) -> SliceRequest:
    vm_ids = tuple(f"{slice_id}-{i}" for i in range(hosts)) if hosts > 1 else (slice_id,)
    attributes = {"scale-group": group}
    return SliceRequest(f"req-{slice_id}", group, slice_id, vm_ids, resources, attributes)


def states(provider: SimulatedProvider) -> dict[str, CloudState]:
    return {vm.vm_id: vm.state for vm in provider.list_vms()}


def test_is_a_provider_and_boots_by_its_clock() -> None:
    clock = Clock()
    provider = SimulatedProvider(None, boot_seconds=2.0, clock=clock)
    assert isinstance(provider, Provider) and provider.kind == "simulated"
    created = provider.create_slice(request("s1", hosts=2, resources=TPU))
    assert [(vm.vm_id, vm.host_index, vm.state) for vm in created] == [
        ("s1-0", 0, CloudState.CREATING),
        ("s1-1", 1, CloudState.CREATING),
    ]
    assert all(vm.created_at == clock.now and vm.slice_id == "s1" and vm.group == "cpu" for vm in created)
    clock.now += 1.9
    assert set(states(provider).values()) == {CloudState.CREATING}
    clock.now += 0.1
    assert states(provider) == {"s1-0": CloudState.RUNNING, "s1-1": CloudState.RUNNING}


def test_create_is_idempotent_by_request_id() -> None:
    clock = Clock()
    provider = SimulatedProvider(None, boot_seconds=1.0, clock=clock)
    first = provider.create_slice(request("s1"))
    clock.now += 5
    again = provider.create_slice(request("s1"))
    assert [vm.vm_id for vm in again] == [vm.vm_id for vm in first]
    assert [vm.created_at for vm in again] == [vm.created_at for vm in first]  # the first create's VM, not a new one
    assert len(provider.list_vms()) == 1


def test_quota_exhaustion_refuses_creates_in_that_group_only() -> None:
    provider = SimulatedProvider(None, boot_seconds=0.0, clock=Clock())
    provider.set_quota_exhausted("cpu", True)
    with pytest.raises(QuotaExceeded, match="cpu"):
        provider.create_slice(request("s1"))
    assert provider.list_vms() == []  # a refusal creates nothing
    provider.create_slice(request("b1", group="backup"))
    provider.set_quota_exhausted("cpu", False)
    provider.create_slice(request("s1"))
    assert sorted(states(provider)) == ["b1", "s1"]


def test_fail_boot_counts_vms_of_its_group() -> None:
    clock = Clock()
    provider = SimulatedProvider(None, boot_seconds=1.0, clock=clock)
    provider.fail_boot("tpu", count=1)
    assert provider.faults() == {"quota_exhausted": [], "fail_boot": {"tpu": 1}}
    provider.create_slice(request("other", group="cpu"))  # another group's VM does not use the fault up
    provider.create_slice(request("t1", hosts=2, group="tpu"))
    provider.create_slice(request("t2", hosts=2, group="tpu"))
    assert provider.faults() == {"quota_exhausted": [], "fail_boot": {}}
    clock.now += 1
    # RUNNING at the "cloud" (as a VM whose start-up script broke would be): only its worker never comes.
    assert set(states(provider).values()) == {CloudState.RUNNING}


def test_preempt_and_delete() -> None:
    provider = SimulatedProvider(None, boot_seconds=0.0, clock=Clock())
    provider.create_slice(request("s1", hosts=2))
    provider.preempt("s1-1")
    listed = {vm.vm_id: vm for vm in provider.list_vms()}
    assert listed["s1-1"].state is CloudState.PREEMPTED and listed["s1-1"].reason == "preempted"
    assert listed["s1-0"].state is CloudState.RUNNING
    with pytest.raises(VmNotFound):
        provider.preempt("nope")
    provider.delete_slice("s1")
    assert provider.list_vms() == []
    provider.delete_slice("s1")  # deleting what is gone is not an error


def test_listing_a_thousand_vms_is_cheap() -> None:
    import time

    clock = Clock()
    provider = SimulatedProvider(None, boot_seconds=1.0, clock=clock)
    for i in range(1000):
        provider.create_slice(request(f"s{i}"))
    clock.now += 1
    assert len(provider.list_vms()) == 1000
    started = time.perf_counter()
    for _ in range(100):
        provider.list_vms()
    per_call = (time.perf_counter() - started) / 100
    assert per_call < 0.01, f"list_vms of 1,000 VMs took {per_call * 1000:.1f} ms"


def test_state_file_is_private_and_survives_a_new_provider(tmp_path: Path) -> None:
    clock = Clock()
    first = SimulatedProvider(tmp_path / "vms", cluster="c1", boot_seconds=1.0, clock=clock)
    first.create_slice(request("s1", hosts=2))
    first.set_quota_exhausted("cpu", True)
    first.fail_boot("tpu", 3)
    state_file = tmp_path / "vms" / "vms.json"
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "vms").stat().st_mode) == 0o700
    clock.now += 1
    second = SimulatedProvider(tmp_path / "vms", cluster="c1", boot_seconds=1.0, clock=clock)
    assert states(second) == {"s1-0": CloudState.RUNNING, "s1-1": CloudState.RUNNING}
    # The faults injected before a controller restart still hold after it.
    assert second.faults() == {"quota_exhausted": ["cpu"], "fail_boot": {"tpu": 3}}
    with pytest.raises(QuotaExceeded):
        second.create_slice(request("s2"))
    # The request id is remembered too: a create repeated after a restart makes no second slice.
    assert [vm.vm_id for vm in second.create_slice(request("s1", hosts=2))] == ["s1-0", "s1-1"]
    second.delete_slice("s1")
    assert first.list_vms() == []  # the first instance reads the file: the listing is the truth
    other = SimulatedProvider(tmp_path / "vms", cluster="c2", clock=clock)
    other.create_slice(request("x", group="gpu"))
    assert [vm.vm_id for vm in first.list_vms()] == []  # another cluster's VMs are not this one's


def test_vm_workers_join_a_real_controller_and_stop_on_delete(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", worker_timeout=5.0) as cluster:
        cluster.start(0)
        launch = WorkerLaunch(cluster.address, cluster.worker_credential.encode(), tmp_path / "cluster" / "vms")
        provider = SimulatedProvider(tmp_path / "cluster" / "vms", cluster="fray", boot_seconds=0.0, worker=launch)
        client = controller_client(cluster.address, cluster.token)
        try:
            provider.fail_boot("v4-16", 1)
            slice_req = SliceRequest(
                "req-t1", "v4-16", "t1", ("t1-0", "t1-1"), TPU, {"scale-group": "v4-16"}, preemptible=True
            )
            provider.create_slice(slice_req)
            provider.create_slice(request("c1"))

            def joined_workers() -> dict[str, Any]:
                alive_workers = {w.info.worker_id: w for w in client.list_workers() if w.info.alive}
                return alive_workers if {"t1-1", "c1"} <= set(alive_workers) else {}

            joined = wait_until(joined_workers, 60, "the VMs' workers to register")
            # The first VM of the group failed its boot: RUNNING at the cloud, no worker.
            assert "t1-0" not in joined and provider.worker_pid("t1-0") is None
            info = joined["t1-1"].info
            assert info.attributes["scale-group"] == "v4-16"
            assert info.attributes["vm"] == "t1-1"
            assert info.attributes["tpu-name"] == "t1"
            assert info.attributes["tpu-worker-id"] == "1"
            assert info.attributes["preemptible"] == "true"
            assert info.cpu_millis == 1000 and info.ram_bytes == 512 << 20
            assert [f"{d.kind}:{d.type}:{d.count}" for d in info.devices] == ["tpu:v4-16:4"]
            assert joined["c1"].info.attributes["preemptible"] == "false"

            pid = provider.worker_pid("c1")
            assert pid is not None and os.getsid(pid) == pid  # its own session: it outlives the controller
            # A new provider on the same directory (a restarted controller, `fray cluster down`) stops it.
            SimulatedProvider(tmp_path / "cluster" / "vms", boot_seconds=0.0).delete_slice("c1")
            assert not alive(pid)

            tpu_pid = provider.worker_pid("t1-1")
            assert tpu_pid is not None
            provider.preempt("t1-1")
            wait_until(lambda: not alive(tpu_pid), 10, "the preempted VM's worker to die")
            assert {vm.vm_id: vm.state for vm in provider.list_vms()} == {
                "t1-0": CloudState.RUNNING,
                "t1-1": CloudState.PREEMPTED,
            }
            assert oct(stat.S_IMODE((tmp_path / "cluster" / "vms" / "c1.log").stat().st_mode)) == oct(0o600)
        finally:
            for vm in provider.list_vms():
                provider.delete_slice(vm.slice_id)
            provider.close()
            client.close()
