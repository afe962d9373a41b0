"""The fake GCP API answers like the real one: the shapes Google documents, checked against the client libraries' own schemas.

Each answer is parsed with protobuf's strict JSON parser into the client library's
message type (an unknown or mistyped field fails), and the behaviours the gcp provider
relies on are checked over plain HTTP: operations that complete after a delay, 409 on a
taken node id, GCE's requestId idempotency, label filters, paging, quota and stock-out
errors in Google's shapes, and preemption.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.tpu_v2")
pytest.importorskip("google.cloud.compute_v1")

import requests
from google.cloud import compute_v1, tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import json_format
from google.rpc import status_pb2

from autoscale.gcp_fake import FakeGcp
from support import wait_until

ZONE = "us-central2-b"
TPU = f"/v2/projects/fray-test/locations/{ZONE}"
GCE = f"/compute/v1/projects/fray-test/zones/{ZONE}"


@pytest.fixture
def fake() -> Iterator[FakeGcp]:
    with FakeGcp() as server:
        yield server


def _strict(payload: dict[str, Any], message: Any) -> Any:
    """Parse as Google's client does, but refusing unknown fields: the shape is the documented one."""
    return json_format.Parse(json.dumps(payload), message, ignore_unknown_fields=False)


def _node(accel: str = "v4-16", **extra: Any) -> dict[str, Any]:
    return {"acceleratorType": accel, "runtimeVersion": "tpu-ubuntu2204-base", "labels": {"fray-cluster": "c"}, **extra}


def _instance(name: str, machine: str = "n2-standard-4", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/{machine}",
        "labels": {"fray-cluster": "c"},
        **extra,
    }


def test_tpu_create_is_an_operation_and_the_node_is_creating_until_it_completes(fake: FakeGcp) -> None:
    fake.op_seconds = 3600.0  # held until finish_operations()
    answer = requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n1"}, json=_node(), timeout=10)
    assert answer.status_code == 200
    op = _strict(answer.json(), operations_pb2.Operation())
    assert op.name.startswith(f"{TPU[4:]}/operations/") and not op.done
    assert op.metadata.TypeName() == "google.cloud.tpu.v2.OperationMetadata"
    node = _strict(requests.get(f"{fake.url}{TPU}/nodes/n1", timeout=10).json(), tpu_v2.Node.pb(tpu_v2.Node()))
    assert tpu_v2.Node.State(node.state).name == "CREATING"
    assert not node.network_endpoints, "Google lists a node's hosts once it is READY"
    assert not requests.get(f"{fake.url}/v2/{op.name}", timeout=10).json()["done"]
    fake.finish_operations()
    done = wait_until(
        lambda: (o := requests.get(f"{fake.url}/v2/{op.name}", timeout=10).json()).get("done") and o,
        what="the operation",
    )
    finished = _strict(done, operations_pb2.Operation())
    assert finished.response.TypeName() == "google.cloud.tpu.v2.Node"
    node = requests.get(f"{fake.url}{TPU}/nodes/n1", params={"$alt": "json;enum-encoding=int"}, timeout=10).json()
    assert node["state"] == tpu_v2.Node.State.READY.value, "numbers when the client asks for enum-encoding=int"
    assert len(node["networkEndpoints"]) == 2, "a v4-16 has two hosts"


def test_tpu_errors_have_googles_shapes(fake: FakeGcp) -> None:
    assert requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n1"}, json=_node(), timeout=10).ok
    taken = requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n1"}, json=_node(), timeout=10)
    assert taken.status_code == 409 and taken.json()["error"]["status"] == "ALREADY_EXISTS"
    missing = requests.get(f"{fake.url}{TPU}/nodes/nope", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    fake.tpu_quota[(ZONE, "v4")] = 24
    over = requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n2"}, json=_node("v4-16"), timeout=10)
    assert over.status_code == 429
    error = _strict({k: v for k, v in over.json()["error"].items() if k != "status"}, status_pb2.Status())
    assert error.code == 429 and "Quota limit 'TPUV4PodPerProjectPerZoneForTPUAPI'" in error.message
    assert [d.TypeName() for d in error.details] == ["google.rpc.QuotaFailure", "google.rpc.ErrorInfo"]
    assert requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n2"}, json=_node("v4-8"), timeout=10).ok
    bad = requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n3"}, json={"acceleratorType": "v4-8"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_tpu_stockout_fails_the_operation_and_leaves_no_node(fake: FakeGcp) -> None:
    fake.stockouts.add((ZONE, "v4-16"))
    op = requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": "n1"}, json=_node(), timeout=10).json()
    done = requests.get(f"{fake.url}/v2/{op['name']}", timeout=10).json()
    finished = _strict(done, operations_pb2.Operation())
    assert finished.done and finished.error.code == 8 and "no more capacity" in finished.error.message
    assert requests.get(f"{fake.url}{TPU}/nodes/n1", timeout=10).status_code == 404


def test_tpu_list_pages_and_preemption(fake: FakeGcp) -> None:
    for i in range(5):
        assert requests.post(f"{fake.url}{TPU}/nodes", params={"nodeId": f"n{i}"}, json=_node("v4-8"), timeout=10).ok
    names, token = [], ""
    while True:
        page = requests.get(f"{fake.url}{TPU}/nodes", params={"pageToken": token} if token else {}, timeout=10).json()
        listing = _strict(page, tpu_v2.ListNodesResponse.pb(tpu_v2.ListNodesResponse()))
        assert len(listing.nodes) <= fake.page_size
        names += [n.name.rsplit("/", 1)[1] for n in listing.nodes]
        token = listing.next_page_token
        if not token:
            break
    assert names == [f"n{i}" for i in range(5)]
    fake.preempt("n3")
    assert requests.get(f"{fake.url}{TPU}/nodes/n3", timeout=10).json()["state"] == "PREEMPTED"


def test_gce_insert_is_idempotent_by_request_id(fake: FakeGcp) -> None:
    fake.op_seconds = 3600.0  # held until finish_operations()
    rid = str(uuid.uuid4())
    first = requests.post(f"{fake.url}{GCE}/instances", params={"requestId": rid}, json=_instance("vm1"), timeout=10)
    again = requests.post(f"{fake.url}{GCE}/instances", params={"requestId": rid}, json=_instance("vm1"), timeout=10)
    op = _strict(first.json(), compute_v1.Operation.pb(compute_v1.Operation()))
    assert op.operation_type == "insert" and op.status == compute_v1.Operation.Status.RUNNING.value
    assert again.json()["name"] == op.name, "the same requestId answers the same operation"
    assert len(fake.instances) == 1
    other = requests.post(
        f"{fake.url}{GCE}/instances", params={"requestId": str(uuid.uuid4())}, json=_instance("vm1"), timeout=10
    )
    assert other.status_code == 409 and other.json()["error"]["errors"][0]["reason"] == "alreadyExists"
    bad = requests.post(
        f"{fake.url}{GCE}/instances", params={"requestId": "not-a-uuid"}, json=_instance("vm2"), timeout=10
    )
    assert bad.status_code == 400
    inst = requests.get(f"{fake.url}{GCE}/instances/vm1", timeout=10).json()
    assert _strict(inst, compute_v1.Instance.pb(compute_v1.Instance())).status == "PROVISIONING"
    fake.finish_operations()
    wait_until(
        lambda: requests.get(f"{fake.url}{GCE}/operations/{op.name}", timeout=10).json()["status"] == "DONE",
        what="the insert operation",
    )
    assert requests.get(f"{fake.url}{GCE}/instances/vm1", timeout=10).json()["status"] == "RUNNING"


def test_gce_list_filters_by_label_and_pages(fake: FakeGcp) -> None:
    for i in range(3):
        assert requests.post(f"{fake.url}{GCE}/instances", json=_instance(f"a{i}"), timeout=10).ok
    other = _instance("b0")
    other["labels"] = {"fray-cluster": "other"}
    assert requests.post(f"{fake.url}{GCE}/instances", json=other, timeout=10).ok
    names, token = [], ""
    while True:
        params = {"filter": 'labels.fray-cluster = "c"', **({"pageToken": token} if token else {})}
        page = requests.get(f"{fake.url}{GCE}/instances", params=params, timeout=10).json()
        listing = _strict(page, compute_v1.InstanceList.pb(compute_v1.InstanceList()))
        names += [i.name for i in listing.items]
        token = listing.next_page_token
        if not token:
            break
    assert names == ["a0", "a1", "a2"]
    assert requests.get(f"{fake.url}{GCE}/instances", params={"filter": "name eq a.*"}, timeout=10).status_code == 400


def test_gce_quota_and_stockout_errors(fake: FakeGcp) -> None:
    fake.cpu_quota[("us-central2", "CPUS")] = 6
    assert requests.post(f"{fake.url}{GCE}/instances", json=_instance("vm1", "n2-standard-4"), timeout=10).ok
    over = requests.post(f"{fake.url}{GCE}/instances", json=_instance("vm2", "n2-standard-4"), timeout=10)
    assert over.status_code == 403
    assert over.json()["error"]["errors"] == [
        {
            "message": "Quota 'CPUS' exceeded.  Limit: 6.0 in region us-central2.",
            "domain": "usageLimits",
            "reason": "quotaExceeded",
        }
    ]
    assert f"{ZONE}/vm2" not in fake.instances
    fake.stockouts.add((ZONE, "a2-highgpu-1g"))
    op = requests.post(f"{fake.url}{GCE}/instances", json=_instance("gpu1", "a2-highgpu-1g"), timeout=10).json()
    done = requests.get(f"{fake.url}{GCE}/operations/{op['name']}", timeout=10).json()
    finished = _strict(done, compute_v1.Operation.pb(compute_v1.Operation()))
    assert finished.http_error_status_code == 503
    assert finished.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert requests.get(f"{fake.url}{GCE}/instances/gpu1", timeout=10).status_code == 404


def test_gce_delete_and_preemption(fake: FakeGcp) -> None:
    fake.op_seconds = 60.0  # the delete stays in progress for the whole test
    assert requests.post(f"{fake.url}{GCE}/instances", json=_instance("vm1"), timeout=10).ok
    assert requests.post(f"{fake.url}{GCE}/instances", json=_instance("spot1"), timeout=10).ok
    fake.preempt("spot1")
    assert requests.get(f"{fake.url}{GCE}/instances/spot1", timeout=10).json()["status"] == "TERMINATED"
    first = requests.delete(f"{fake.url}{GCE}/instances/vm1", timeout=10)
    assert first.ok and first.json()["operationType"] == "delete"
    again = requests.delete(f"{fake.url}{GCE}/instances/vm1", timeout=10)
    assert again.status_code == 400 and again.json()["error"]["errors"][0]["reason"] == "resourceNotReady"
    fake.op_seconds = 0.0
    assert requests.delete(f"{fake.url}{GCE}/instances/spot1", timeout=10).ok
    wait_until(lambda: requests.get(f"{fake.url}{GCE}/instances/spot1", timeout=10).status_code == 404, what="delete")
