"""The gcp provider, through the real Google client libraries, against the fake API on 127.0.0.1.

The clients are the ones ``fray[gcp]`` installs, on their REST transport, pointed at the
fake with anonymous credentials; every test checks that no connection or name lookup
went anywhere else (a Python audit hook sees every socket the process opens).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.tpu_v2")
pytest.importorskip("google.cloud.compute_v1")

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, tpu_v2

from autoscale.gcp_fake import FakeGcp, Recorded
from fray.cluster.server.autoscale import gcp
from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import CLUSTER_LABEL, CloudState, ProviderVm, SliceRequest
from fray.errors import CapacityUnavailable, ConfigError, QuotaExceeded
from support import fray_cli_in, wait_until

ZONE = "us-central2-b"
CONTROLLER = "10.128.0.2:7733"
TOKEN = "fray-join-0123456789abcdef"
CLUSTER_FILE: dict[str, Any] = {
    "name": "c1",
    "provider": {
        "kind": "gcp",
        "project": "fray-test",
        "zone": ZONE,
        "machine_type": "n2-standard-4",
        "create_wait": 5,
    },
    "scale_groups": {
        "cpu": {"resources": {"cpu": 4, "ram": "8g", "disk": "50g"}, "min": 1, "max": 3, "priority": 1},
        "spot": {"resources": {"cpu": 4, "ram": "8g"}, "max": 3, "preemptible": True},
        "pair": {"hosts": 2, "resources": {"cpu": 4, "ram": "8g"}, "max": 1},
        "v4-16": {"hosts": 2, "resources": {"cpu": 8, "ram": "64g", "device": "tpu:v4-16:4"}, "min": 1, "max": 2},
    },
}

_connections: list[tuple[str, Any]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _connections is not None and event in ("socket.connect", "socket.getaddrinfo"):
        _connections.append((event, args[1] if event == "socket.connect" else args[0]))


sys.addaudithook(_audit)


@pytest.fixture
def fake() -> Iterator[FakeGcp]:
    """The fake API, and afterwards the proof that nothing but it was contacted."""
    global _connections
    _connections = []
    with FakeGcp() as server:
        yield server
    seen, _connections = _connections, None
    port = int(server.url.rsplit(":", 1)[1])
    for event, where in seen:
        if event == "socket.connect":
            assert isinstance(where, tuple) and where[:2] == ("127.0.0.1", port), f"connected to {where}"
        else:
            assert where in ("127.0.0.1", b"127.0.0.1"), f"looked up {where!r}"
    assert {r.host for r in server.requests} <= {f"127.0.0.1:{port}"}


Make = Callable[..., gcp.GcpProvider]


@pytest.fixture
def make(fake: FakeGcp) -> Iterator[Make]:
    """Providers whose clients talk to the fake (a new one is a restarted controller's)."""
    made: list[tuple[gcp.GcpProvider, list[Any]]] = []

    def build(name: str = "c1", join_token: str = TOKEN, **provider: Any) -> gcp.GcpProvider:
        data = json.loads(json.dumps(CLUSTER_FILE))
        data["name"] = name
        data["provider"].update(provider)
        options = ClientOptions(api_endpoint=fake.url)
        anonymous = AnonymousCredentials()
        clients = [
            tpu_v2.TpuClient(credentials=anonymous, transport="rest", client_options=options),
            compute_v1.InstancesClient(credentials=anonymous, transport="rest", client_options=options),
            compute_v1.ZoneOperationsClient(credentials=anonymous, transport="rest", client_options=options),
        ]
        provider_ = gcp.from_config(
            ClusterConfig.from_mapping(data),
            controller=CONTROLLER,
            join_token=join_token,
            tpu_client=clients[0],
            compute_client=clients[1],
            operations_client=clients[2],
        )
        made.append((provider_, clients))
        return provider_

    yield build
    for provider_, clients in made:
        provider_.close()
        for client in clients:
            client.transport.close()


def _config() -> ClusterConfig:
    return ClusterConfig.from_mapping(json.loads(json.dumps(CLUSTER_FILE)))


def _request(group: str, index: int = 0, *, request_id: str | None = None, cluster: str = "c1") -> SliceRequest:
    request = gcp.planned_request(_config().group(group), cluster, index)
    if request_id is not None:
        request = SliceRequest(
            request_id,
            request.group,
            request.slice_id,
            request.vm_ids,
            request.resources,
            request.attributes,
            request.preemptible,
        )
    return request


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    items = body["metadata"]
    return {i["key"]: i["value"] for i in items["items"]} if "items" in items else dict(items)


def _creates(fake: FakeGcp) -> list[Recorded]:
    return [r for r in fake.requests if r.method == "POST"]


def _states(vms: list[ProviderVm] | Any) -> dict[str, CloudState]:
    return {vm.vm_id: vm.state for vm in vms}


# -- creating ----------------------------------------------------------------------------------


def test_a_tpu_slice_is_one_node_whose_hosts_are_the_slices_vms(fake: FakeGcp, make: Make) -> None:
    provider = make()
    vms = provider.create_slice(_request("v4-16"))
    [create] = _creates(fake)
    assert create.path == f"/v2/projects/fray-test/locations/{ZONE}/nodes"
    assert create.query["nodeId"] == "c1-v4-16-0"
    body = create.body
    assert body["acceleratorType"] == "v4-16"
    assert body["runtimeVersion"] == "tpu-ubuntu2204-base"
    assert body["labels"] == {CLUSTER_LABEL: "c1", "fray-group": "v4-16", "fray-slice": "c1-v4-16-0"}
    assert body["schedulingConfig"].get("spot", False) is False
    meta = _metadata(body)
    assert meta["fray-join-token"] == TOKEN
    assert meta["fray-vm-ids"] == "c1-v4-16-0-0,c1-v4-16-0-1"
    script = meta["startup-script"]
    assert TOKEN not in script, "the token travels in the metadata, not in the script's text"
    assert f'worker --controller {CONTROLLER} --join "$TOKEN" --id "$VM_ID"' in script
    assert "--device tpu:v4-16:4" in script and "--attr tpu-name=c1-v4-16-0" in script
    assert [(vm.vm_id, vm.host_index, vm.group, vm.slice_id) for vm in vms] == [
        ("c1-v4-16-0-0", 0, "v4-16", "c1-v4-16-0"),
        ("c1-v4-16-0-1", 1, "v4-16", "c1-v4-16-0"),
    ]
    assert {vm.state for vm in vms} == {CloudState.RUNNING}, "create_wait saw the operation finish"


def test_a_gce_vm_is_an_instance_with_spot_scheduling_and_a_request_id(fake: FakeGcp, make: Make) -> None:
    provider = make()
    [vm] = provider.create_slice(_request("spot"))
    [create] = _creates(fake)
    assert create.path == f"/compute/v1/projects/fray-test/zones/{ZONE}/instances"
    assert uuid.UUID(create.query["requestId"]).version == 5
    body = create.body
    assert body["name"] == "c1-spot-0" == vm.vm_id
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n2-standard-4"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert body["labels"] == {CLUSTER_LABEL: "c1", "fray-group": "spot", "fray-slice": "c1-spot-0", "fray-host": "0"}
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "100"
    meta = _metadata(body)
    assert meta["fray-join-token"] == TOKEN and meta["fray-host-index"] == "0"
    assert "--attr preemptible=true" in meta["startup-script"]
    assert "tpu-name" not in meta["startup-script"], "a single VM is not a slice"
    assert vm.state is CloudState.RUNNING and vm.group == "spot"
    [plain] = make(name="c2").create_slice(_request("cpu", cluster="c2"))
    assert _creates(fake)[-1].body["scheduling"] == {"provisioningModel": "STANDARD"}
    assert _creates(fake)[-1].body["disks"][0]["initializeParams"]["diskSizeGb"] == "50"
    assert plain.vm_id == "c2-cpu-0"


@pytest.mark.parametrize("group", ["v4-16", "cpu"])
def test_a_repeated_create_makes_one_slice_even_after_a_restart(fake: FakeGcp, make: Make, group: str) -> None:
    fake.op_seconds = 3600.0  # operations stay in progress until finish_operations()
    request = _request(group)
    first = make(create_wait=0).create_slice(request)
    again = make(create_wait=0).create_slice(request)  # a restarted controller repeats the request
    assert [vm.vm_id for vm in first] == [vm.vm_id for vm in again] == list(request.vm_ids)
    assert {vm.state for vm in first + again} == {CloudState.CREATING}, "every host, before Google lists them"
    assert len(fake.nodes) + len(fake.instances) == 1
    if group == "cpu":
        first_id, second_id = (r.query["requestId"] for r in _creates(fake))
        assert first_id == second_id, "GCE's requestId makes the insert idempotent"
    later = make()
    fake.finish_operations()
    wait_until(lambda: _states(later.list_vms()) == dict.fromkeys(request.vm_ids, CloudState.RUNNING), what="running")


# -- listing and adoption ----------------------------------------------------------------------


def test_listing_shows_only_this_clusters_vms_and_a_restart_adopts_them(fake: FakeGcp, make: Make) -> None:
    provider = make()
    provider.create_slice(_request("v4-16", 0))
    provider.create_slice(_request("v4-16", 1))
    for i in range(3):
        provider.create_slice(_request("cpu", i))
    other = make(name="other")
    other.create_slice(_request("cpu", 0, cluster="other"))
    other.create_slice(_request("v4-16", 0, cluster="other"))
    assert fake.page_size < 4, "the listing spans pages"
    restarted = make()
    listed = sorted(restarted.list_vms(), key=lambda vm: vm.vm_id)
    assert [(vm.vm_id, vm.slice_id, vm.group, vm.host_index) for vm in listed] == [
        ("c1-cpu-0", "c1-cpu-0", "cpu", 0),
        ("c1-cpu-1", "c1-cpu-1", "cpu", 0),
        ("c1-cpu-2", "c1-cpu-2", "cpu", 0),
        ("c1-v4-16-0-0", "c1-v4-16-0", "v4-16", 0),
        ("c1-v4-16-0-1", "c1-v4-16-0", "v4-16", 1),
        ("c1-v4-16-1-0", "c1-v4-16-1", "v4-16", 0),
        ("c1-v4-16-1-1", "c1-v4-16-1", "v4-16", 1),
    ]
    assert {vm.state for vm in listed} == {CloudState.RUNNING}
    gce_lists = [r for r in fake.requests if r.method == "GET" and r.path.endswith("/instances")]
    assert all(r.query.get("filter") for r in gce_lists), "GCE lists only the cluster's labels"


# -- deleting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["v4-16", "cpu"])
def test_delete_is_idempotent(fake: FakeGcp, make: Make, group: str) -> None:
    provider = make()
    request = _request(group)
    provider.create_slice(request)
    fake.op_seconds = 3600.0  # operations stay in progress until finish_operations()
    provider.delete_slice(request.slice_id)
    provider.delete_slice(request.slice_id)  # while the first delete is in progress
    assert len(fake.calls("DELETE")) == 1
    assert {vm.state for vm in provider.list_vms()} == {CloudState.DELETING}
    fake.finish_operations()
    wait_until(lambda: not provider.list_vms(), what="the slice gone")
    provider.delete_slice(request.slice_id)  # and once it is gone
    provider.delete_slice("c1-cpu-99")  # a slice that never was
    assert len(fake.calls("DELETE")) == 1


# -- errors ------------------------------------------------------------------------------------


def test_quota_errors_are_quota_exceeded_and_create_nothing(fake: FakeGcp, make: Make) -> None:
    provider = make()
    fake.tpu_quota[(ZONE, "v4")] = 16
    provider.create_slice(_request("v4-16", 0))
    with pytest.raises(QuotaExceeded, match="TPUV4PodPerProjectPerZoneForTPUAPI"):
        provider.create_slice(_request("v4-16", 1))
    fake.cpu_quota[("us-central2", "PREEMPTIBLE_CPUS")] = 4
    provider.create_slice(_request("spot", 0))
    with pytest.raises(QuotaExceeded, match="PREEMPTIBLE_CPUS"):
        provider.create_slice(_request("spot", 1))
    assert sorted(vm.slice_id for vm in provider.list_vms()) == ["c1-spot-0", "c1-v4-16-0", "c1-v4-16-0"]


def test_a_slice_refused_part_way_leaves_no_instance_holding_quota(fake: FakeGcp, make: Make) -> None:
    fake.cpu_quota[("us-central2", "CPUS")] = 4  # the first host of the pair fits, the second does not
    provider = make()
    with pytest.raises(QuotaExceeded, match="CPUS"):
        provider.create_slice(_request("pair"))
    assert [r.body["name"] for r in _creates(fake)] == ["c1-pair-0-0", "c1-pair-0-1"]
    assert [r.path.rsplit("/", 1)[1] for r in fake.calls("DELETE")] == ["c1-pair-0-0"]
    wait_until(lambda: not provider.list_vms() and not fake.instances, what="the first host deleted")


@pytest.mark.parametrize("group", ["v4-16", "cpu"])
def test_a_stockout_is_capacity_unavailable(fake: FakeGcp, make: Make, group: str) -> None:
    fake.stockouts |= {(ZONE, "v4-16"), (ZONE, "n2-standard-4")}
    fake.op_seconds = 0.5  # within create_wait (5 s)
    with pytest.raises(CapacityUnavailable):
        make().create_slice(_request(group, 0))
    assert not make().list_vms()
    # Reported after the create returned (create_wait 0): FAILED VMs with the reason, until deleted.
    fake.op_seconds = 3600.0  # operations stay in progress until finish_operations()
    provider = make(create_wait=0)
    vms = provider.create_slice(_request(group, 1))
    assert {vm.state for vm in vms} == {CloudState.CREATING}
    fake.finish_operations()
    failed = wait_until(lambda: [vm for vm in provider.list_vms() if vm.state is CloudState.FAILED], what="FAILED")
    assert [vm.vm_id for vm in failed] == [vm.vm_id for vm in vms]
    assert all("capacity" in vm.reason or "enough resources" in vm.reason for vm in failed)
    provider.delete_slice(_request(group, 1).slice_id)
    assert not provider.list_vms()


def test_preempted_vms_are_preempted_and_a_stopped_standard_vm_is_failed(fake: FakeGcp, make: Make) -> None:
    provider = make()
    provider.create_slice(_request("v4-16"))
    provider.create_slice(_request("spot"))
    provider.create_slice(_request("cpu"))
    fake.preempt("c1-v4-16-0")
    fake.preempt("c1-spot-0")
    fake.preempt("c1-cpu-0")  # a standard VM stopped by someone else
    listed = {vm.vm_id: vm for vm in provider.list_vms()}
    assert listed["c1-v4-16-0-0"].state is listed["c1-v4-16-0-1"].state is CloudState.PREEMPTED
    assert listed["c1-spot-0"].state is CloudState.PREEMPTED and listed["c1-spot-0"].reason == "preempted"
    assert listed["c1-cpu-0"].state is CloudState.FAILED


# -- the start-up script -----------------------------------------------------------------------


def _run_on_vm(
    script: str, tmp_path: Path, attributes: dict[str, str], *, fray: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a start-up script as a VM would, with the metadata server, systemd-run and fray replaced by recorders."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tools = {
        # The metadata server: the last path segment names the attribute; unknown ones are 404s (curl -f: exit 22).
        "curl": 'case "${@: -1}" in '
        + " ".join(f"*/{k}) echo -n {shlex.quote(v)};;" for k, v in attributes.items())
        + " *) exit 22;; esac",
        "systemd-run": f'printf "%s\\n" "$@" > {tmp_path}/argv',
    }
    if fray:
        tools["fray"] = "exit 0"
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_the_startup_script_starts_each_hosts_worker(fake: FakeGcp, make: Make, tmp_path: Path) -> None:
    """Host 1 of a TPU slice starts its worker with its own VM id and worker index, and the token from the metadata."""
    make().create_slice(_request("v4-16"))
    meta = _metadata(_creates(fake)[0].body)
    ran = _run_on_vm(meta["startup-script"], tmp_path, {"agent-worker-number": "1", "fray-join-token": TOKEN})
    assert ran.returncode == 0, ran.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:3] == ["--unit=fray-worker", "--collect", str(tmp_path / "bin" / "fray")]
    worker = argv[3:]
    assert worker[:7] == ["worker", "--controller", CONTROLLER, "--join", TOKEN, "--id", "c1-v4-16-0-1"]
    attrs = {worker[i + 1] for i, arg in enumerate(worker) if arg == "--attr"}
    assert attrs == {
        "scale-group=v4-16",
        "vm=c1-v4-16-0-1",
        "tpu-name=c1-v4-16-0",
        "tpu-worker-id=1",
        "preemptible=false",
    }
    assert worker[worker.index("--device") + 1] == "tpu:v4-16:4"
    assert worker[worker.index("--cpu") + 1] == "8" and worker[worker.index("--ram") + 1] == str(64 * 2**30)


def test_the_startup_script_installs_fray_only_when_told_how(fake: FakeGcp, make: Make, tmp_path: Path) -> None:
    """Without provider.install a VM lacking Fray fails its boot saying so; with it, the command runs first."""
    make().create_slice(_request("cpu"))
    script = _metadata(_creates(fake)[-1].body)["startup-script"]
    on_gce = {"fray-host-index": "0", "fray-join-token": TOKEN}
    ran = _run_on_vm(script, tmp_path, on_gce, fray=False)
    assert ran.returncode == 1 and "fray is not on this VM: set provider.install" in ran.stderr
    assert not (tmp_path / "argv").exists()
    install = f"printf '#!/bin/bash\\n' > {tmp_path}/bin/fray && chmod +x {tmp_path}/bin/fray"
    make(name="c2", install=install).create_slice(_request("cpu", cluster="c2"))
    script = _metadata(_creates(fake)[-1].body)["startup-script"]
    ran = _run_on_vm(script, tmp_path, on_gce, fray=False)
    assert ran.returncode == 0, ran.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[2] == f"{tmp_path}/bin/fray" and argv[3:5] == ["worker", "--controller"]
    assert argv[argv.index("--id") + 1] == "c2-cpu-0"


# -- planned calls and configuration ----------------------------------------------------------


def test_planned_calls_are_the_requests_the_provider_sends(fake: FakeGcp, make: Make) -> None:
    lines = gcp.planned_calls(_config(), controller=CONTROLLER)
    calls = [line.split(" ", 2)[:2] for line in lines]
    gce_url, request_id = calls[0][1].split("?requestId=")
    assert uuid.UUID(request_id)
    assert [calls[0][0], gce_url, *calls[1]] == [
        "POST",
        f"https://compute.googleapis.com/compute/v1/projects/fray-test/zones/{ZONE}/instances",
        "POST",
        f"https://tpu.googleapis.com/v2/projects/fray-test/locations/{ZONE}/nodes?nodeId=c1-v4-16-0",
    ], "the min slices of each group, by priority; none of spot (min 0)"
    assert lines == gcp.planned_calls(_config(), controller=CONTROLLER), "the same every time (request ids too)"
    assert TOKEN not in "".join(lines) and "<join-token>" in lines[0]
    # The same requests, sent for real with the placeholder token, have exactly the planned bodies.
    provider = make(join_token="<join-token>")
    for group in ("cpu", "v4-16"):
        provider.create_slice(_request(group))
    sent = _creates(fake)
    for line, request in zip(lines, sent, strict=True):
        planned = json.loads(line.split(" ", 2)[2])
        assert planned == request.body
        assert line.split(" ")[1].split("?")[1] == "&".join(
            f"{k}={v}" for k, v in request.query.items() if not k.startswith("$")
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"project": None}, "provider.project is required"),
        ({"zones": "x"}, "provider.zones is not a gcp provider key"),
        ({"machine_type": None}, r"provider.machine_type \(or provider.machine_types.cpu\) is required"),
        ({"machine_types": {"gpu": "a2-highgpu-1g"}}, "no scale group 'gpu'"),
        ({"create_wait": "soon"}, "provider.create_wait must be a number"),
        ({"external_ip": "yes"}, "provider.external_ip must be true or false"),
    ],
)
def test_bad_provider_keys_are_config_errors_naming_the_key(change: dict[str, Any], message: str) -> None:
    data = json.loads(json.dumps(CLUSTER_FILE))
    for key, value in change.items():
        if value is None:
            data["provider"].pop(key)
        else:
            data["provider"][key] = value
    with pytest.raises(ConfigError, match=message):
        gcp.planned_calls(ClusterConfig.from_mapping(data), controller=CONTROLLER)


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"hosts": 1, "resources": {"cpu": 8, "device": "tpu:v4-16:4"}, "max": 1}, "a v4-16 TPU slice has 2 host"),
        ({"hosts": 4, "resources": {"cpu": 8, "device": "tpu:v5p-32:4"}, "max": 1}, None),
        ({"hosts": 3, "resources": {"cpu": 8, "device": "tpu:v5litepod-16:4"}, "max": 1}, None),
    ],
)
def test_a_tpu_groups_hosts_must_match_its_type(group: dict[str, Any], message: str | None) -> None:
    data = json.loads(json.dumps(CLUSTER_FILE))
    data["scale_groups"]["tpu"] = group
    config = ClusterConfig.from_mapping(data)
    if message is None:  # a fixed shape that matches, or a type whose hosts Fray does not know: trusted
        assert gcp.GcpSettings.from_config(config).project == "fray-test"
    else:
        with pytest.raises(ConfigError, match=message):
            gcp.GcpSettings.from_config(config)


def test_ids_too_long_for_gcp_are_a_config_error() -> None:
    data = json.loads(json.dumps(CLUSTER_FILE))
    data["name"] = "a-rather-long-cluster-name-for-research"
    data["scale_groups"]["a-rather-long-group-name"] = {"resources": {"cpu": 1}, "max": 10}
    with pytest.raises(ConfigError, match=r"'a-rather-long-group-name'.*too long for GCP names"):
        gcp.GcpSettings.from_config(ClusterConfig.from_mapping(data))


def test_machine_types_per_group(fake: FakeGcp, make: Make) -> None:
    provider = make(machine_types={"spot": "e2-standard-2"})
    provider.create_slice(_request("spot"))
    provider.create_slice(_request("cpu"))
    assert [r.body["machineType"].rsplit("/", 1)[1] for r in _creates(fake)] == ["e2-standard-2", "n2-standard-4"]


def test_without_google_credentials_the_provider_is_a_config_error(
    fake: FakeGcp, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default clients use Application Default Credentials; none is a ConfigError saying how to get some."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=r"no Google credentials.*gcloud auth application-default login"):
        gcp.from_config(_config(), controller=CONTROLLER, join_token=TOKEN)


def test_cluster_up_dry_run_prints_the_planned_calls(tmp_path: Path) -> None:
    """``fray cluster up --config … --dry-run`` on a gcp cluster file prints exactly planned_calls' lines."""
    import yaml

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRAY_", "GOOGLE_"))}
    env["HOME"] = str(tmp_path)
    run = fray_cli_in(env)
    config = tmp_path / "cluster.yaml"
    # Cloud VMs cannot reach this machine's loopback: without an address they reach, the file is refused.
    config.write_text(yaml.safe_dump(CLUSTER_FILE))
    unreachable = run("cluster", "up", "--config", str(config), "--dry-run", "--port", "7399", check=False)
    assert unreachable.returncode == 2 and "provider.controller_address" in unreachable.stderr
    reachable = json.loads(json.dumps(CLUSTER_FILE))
    reachable["provider"]["controller_address"] = CONTROLLER
    config.write_text(yaml.safe_dump(reachable))
    out = run("cluster", "up", "--config", str(config), "--dry-run", "--port", "7399")
    printed = [line.strip() for line in out.stdout.splitlines() if line.startswith("  POST ")]
    assert printed == gcp.planned_calls(_config(), controller=CONTROLLER)
    # The file's address is not where `fray cluster up` would listen (loopback): said, with what to run instead.
    host, _, port = CONTROLLER.rpartition(":")
    assert f"provider.controller_address {CONTROLLER}" in out.stderr and "127.0.0.1:7399" in out.stderr
    assert f"fray controller --config FILE --host {host} --port {port}" in out.stderr
    assert len(printed) == 2 and all(CONTROLLER in line for line in printed)
    bad = json.loads(json.dumps(reachable))
    del bad["provider"]["zone"]
    config.write_text(yaml.safe_dump(bad))
    refused = run("cluster", "up", "--config", str(config), "--dry-run", check=False)
    assert refused.returncode == 2 and "provider.zone is required" in refused.stderr


# -- with the autoscaler -----------------------------------------------------------------------


def test_the_autoscaler_sends_the_planned_calls_and_adopts_after_a_restart(fake: FakeGcp, make: Make) -> None:
    """Fray's autoscaler on the gcp provider: start-up sends exactly what --dry-run printed; a restart creates nothing."""
    from fray.cluster.server.autoscale.autoscaler import Autoscaler, ClusterView

    idle = ClusterView(pending=[], workers=[], running=[])
    first = Autoscaler(_config(), make(join_token="<join-token>"))
    assert first.tick(idle).created == 2
    planned = gcp.planned_calls(_config(), controller=CONTROLLER)
    sent = _creates(fake)
    planned_bodies = [json.loads(line.split(" ", 2)[2]) for line in planned]
    canonical = lambda body: json.dumps(body, sort_keys=True)  # noqa: E731
    assert sorted(map(canonical, planned_bodies)) == sorted(canonical(r.body) for r in sent)
    restarted = Autoscaler(_config(), make(join_token="<join-token>"))
    assert restarted.tick(idle).created == 0
    assert len(_creates(fake)) == 2, "the restarted autoscaler adopted the VMs it found"
    assert sorted((vm["id"], vm["state"]) for vm in restarted.vms()) == [
        ("c1-cpu-0", "BOOTING"),
        ("c1-v4-16-0-0", "BOOTING"),
        ("c1-v4-16-0-1", "BOOTING"),
    ]


def test_the_autoscaler_blocks_a_group_google_refuses_for_quota(fake: FakeGcp, make: Make) -> None:
    from fray.cluster.server.autoscale.autoscaler import Autoscaler, ClusterView

    fake.cpu_quota[("us-central2", "CPUS")] = 0
    autoscaler = Autoscaler(_config(), make())
    autoscaler.tick(ClusterView(pending=[], workers=[], running=[]))
    groups = {g["name"]: g for g in autoscaler.status()["groups"]}
    assert groups["cpu"]["state"].startswith("quota-blocked")
    assert "Quota 'CPUS' exceeded" in groups["cpu"]["last_error"]
    assert groups["v4-16"]["slices"] == 1 and not fake.instances


def test_the_docs_example_is_a_valid_gcp_cluster_file() -> None:
    """docs/autoscaling.md's gcp cluster file loads, and its groups plan as documented (none at start-up: min 0)."""
    import yaml

    docs = (Path(__file__).parents[2] / "docs" / "autoscaling.md").read_text()
    section = docs[docs.index("## The gcp provider") :]
    example = section[section.index("```yaml") + len("```yaml") : section.index("```", section.index("```yaml") + 7)]
    config = ClusterConfig.from_mapping(yaml.safe_load(example))
    settings = gcp.GcpSettings.from_config(config)
    assert settings.machine_type_of("big") == "n2-highmem-32" and settings.machine_type_of("cpu") == "n2-standard-8"
    assert gcp.planned_calls(config, controller=CONTROLLER) == []
