"""The autoscaler inside a real controller: its VMs' workers run jobs, reasons reach pending jobs, people see it.

One controller in this process with the simulated provider; every VM is a real ``fray worker``
process. The end-to-end scenarios of issue 24 (through ``fray cluster up --config``) are in
``test_cluster_config_cli.py``; this file checks the controller side: the pending reason of
a job no group can fit, ``fray status``, and who may read and change the VMs.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, ResourceConfig
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import ops_client
from fray.cluster.protocol.credentials import WORKER, Credential, user_principal
from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.providers import make_provider
from fray.cluster.server.controller import Controller
from fray.cluster.server.controller._autoscale_host import AutoscaleHost, start_autoscaling
from fray.cluster.server.dashboard.pages import workers_page
from fray.errors import ConfigError, PermissionDenied
from support import fray_cli_in, wait_until

CONFIG = {
    "provider": {"kind": "simulated", "boot_seconds": 0.2},
    "worker_timeout": 5,
    "idle_seconds": 600,
    "scale_groups": {"cpu": {"resources": {"cpu": 1, "ram": "1g", "disk": "10g"}, "max": 1}},
}


@dataclass
class _Cluster:
    controller: Controller
    host: AutoscaleHost
    token: str
    home: Path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[_Cluster]:
    token = secrets.token_hex(16)
    ctl = Controller(str(tmp_path / "controller.db"), token=token, worker_timeout=5).start()
    config = ClusterConfig.from_mapping(CONFIG)
    credential = Credential.mint(token.encode(), WORKER).encode()
    provider = make_provider(config, state_dir=tmp_path / "vms", controller=ctl.address, credential=credential)
    host = start_autoscaling(ctl, config, provider)
    try:
        yield _Cluster(ctl, host, token, tmp_path)
    finally:
        host.delete_all()  # stops the VMs' worker processes
        host.stop()
        ctl.stop()


def test_jobs_run_on_vms_and_impossible_demand_is_explained_in_status(
    cluster: _Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's pending notice would look at the job still pending after the controller is gone.
    monkeypatch.setenv("FRAY_PENDING_NOTICE_SECONDS", "off")
    client = ClusterClient(cluster.controller.address, token=cluster.token)
    try:
        _run_jobs_and_check_status(cluster, client)
    finally:
        client.shutdown(wait=False)  # while its controller is there to hear it


def _run_jobs_and_check_status(cluster: _Cluster, client: ClusterClient) -> None:
    where = client.submit(
        JobRequest(
            name="where",
            entrypoint=Entrypoint.from_binary("bash", ["-c", "echo on $FRAY_WORKER_ID"]),
            resources=ResourceConfig(cpu=1, ram="256m", disk="1g"),
        )
    )
    big = client.submit(
        JobRequest(name="big", entrypoint=Entrypoint.from_binary("true"), resources=ResourceConfig(cpu=64))
    )
    where.wait(timeout=120)
    assert "on fray-cpu-0" in "\n".join(where.logs())  # the VM's id is its worker's id

    def reason() -> str:
        return str(client._controller.job(big.job_id).pending_reason)

    wait_until(lambda: reason().startswith("can never be scheduled: [no_group_fits]"), timeout=30, what="a reason")
    assert "The largest group is cpu (1 core, 1 GiB RAM" in reason()

    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(
        HOME=str(cluster.home), FRAY_TOKEN=cluster.token, FRAY_CLIENT_SPEC=f"fray://{cluster.controller.address}"
    )
    run = fray_cli_in(env)
    data = json.loads(run("status", "--json").stdout)["autoscaler"]
    assert [(g["name"], g["state"], g["max"]) for g in data["groups"]] == [("cpu", "ok", 1)]
    assert [(vm["id"], vm["state"], vm["worker_id"]) for vm in data["vms"]] == [("fray-cpu-0", "READY", "fray-cpu-0")]
    assert data["unmet_by_code"] == {"no_group_fits": 1} and data["unmet"][0]["job_id"] == big.job_id
    text = run("status").stdout
    assert "scale groups" in text and "fray-cpu-0" in text and "[no_group_fits]" in text
    # The reason code is shown as written in the tables too (rich would read "[no_group_fits]" as markup).
    assert "can never be scheduled: [no_group_fits]" in run("job", "list").stdout
    assert "can never be scheduled: [no_group_fits]" in run("job", "status", big.job_id).stdout
    html = workers_page(cluster.controller.ops.status(), csrf="x")  # the dashboard's Workers page
    assert "<h2>Scale groups (simulated provider)</h2>" in html and "fray-cpu-0" in html
    assert "Unmet demand: 1 jobs" in html and big.job_id in html


def test_everybody_reads_the_vms_only_the_administrator_changes_them(cluster: _Cluster) -> None:
    address = cluster.controller.address
    bob = Credential.mint(cluster.token.encode(), user_principal("bob"))
    user = ops_client(address, token=bob)
    admin = ops_client(address, token=cluster.token)
    try:
        assert user.vms() == [] and user.autoscaler_status()["groups"][0]["name"] == "cpu"
        with pytest.raises(PermissionDenied):
            user.vm_quota("cpu", True)
        with pytest.raises(PermissionDenied):
            user.delete_all_vms()
        with pytest.raises(ConfigError, match="no scale group 'gpu'"):
            admin.vm_fail_boot("gpu", 1)
        admin.vm_quota("cpu", True)
        assert cluster.host.autoscaler.provider.faults()["quota_exhausted"] == ["cpu"]  # type: ignore[attr-defined]
    finally:
        user.close()
        admin.close()


def test_a_controller_without_a_provider_says_so(tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    ctl = Controller(str(tmp_path / "controller.db"), token=token).start()
    ops = ops_client(ctl.address, token=token)
    try:
        for call in (ops.vms, ops.autoscaler_status, ops.delete_all_vms, lambda: ops.vm_preempt("x")):
            with pytest.raises(ConfigError, match="this cluster has no VM provider"):
                call()
        assert ops.status()["autoscaler"] is None
    finally:
        ops.close()
        ctl.stop()
