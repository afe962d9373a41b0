"""A fake of the parts of Google's Cloud TPU v2 and Compute Engine v1 REST APIs that Fray's gcp provider uses.

It is served over real HTTP on 127.0.0.1 so that the real client libraries
(``google-cloud-tpu``, ``google-cloud-compute``) talk to it through their own REST
transport, unchanged: the test points them at :attr:`FakeGcp.url` with anonymous
credentials. It keeps state like the API does and answers in the API's documented shapes:

* TPU v2: ``nodes`` create (``?nodeId=``, 409 ALREADY_EXISTS on a taken id), get, list
  (paged), delete, and the long-running ``operations`` they return, which complete
  after :attr:`FakeGcp.op_seconds`; a node is CREATING (no network endpoints yet) until
  its operation completes, then READY with one endpoint per host. Quota is per accelerator family and zone in TensorCores (the N of
  ``v4-N``); a create over it is refused at once with 429 RESOURCE_EXHAUSTED and a
  ``google.rpc.QuotaFailure`` detail. A stock-out lets the create start and fails its
  operation with code 8 and "There is no more capacity in the zone ..." (the node is gone).
* Compute v1: ``instances`` insert (idempotent by ``requestId``: the same id answers the
  same operation and makes no second instance; another id for a taken name is 409
  ``alreadyExists``), list (paged, with the ``labels.KEY = VALUE`` filter), get, delete,
  and zone ``operations``; deleting an instance whose delete is in progress is 400
  ``resourceNotReady``. vCPU quota per region (``CPUS``, or ``PREEMPTIBLE_CPUS`` for
  spot VMs) refuses an insert with 403 ``quotaExceeded``; a stock-out fails the insert's
  operation with ``ZONE_RESOURCE_POOL_EXHAUSTED`` (HTTP 503 in the operation), the instance
  gone.
* :meth:`FakeGcp.preempt` reclaims a node (state PREEMPTED) or a spot instance
  (status TERMINATED), as Google does.

Every request is recorded (:attr:`FakeGcp.requests`) with its method, path, query,
JSON body and ``Host`` header, so tests check the exact calls. Time is read lazily from
``time.monotonic`` on each request (no background thread changes state).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeGcp", "Recorded"]

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# TPU v2 Node.State numbers (google/cloud/tpu/v2/cloud_tpu.proto), for ``$alt=json;enum-encoding=int``.
_TPU_STATES = {"CREATING": 1, "READY": 2, "DELETING": 5, "PREEMPTED": 11, "TERMINATED": 12}
_COMPUTE = "https://www.googleapis.com/compute/v1"


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    host: str


class _ApiError(Exception):
    def __init__(self, status: int, payload: dict[str, Any]) -> None:
        super().__init__(payload)
        self.status = status
        self.payload = payload


@dataclass
class _Op:
    name: str
    kind: str  # "tpu" or "compute"
    verb: str
    target: str
    started: float
    done_at: float
    error: dict[str, Any] | None = None
    """Set when the operation fails (at ``done_at``)."""
    on_done: list[Any] = field(default_factory=list)
    request_id: str = ""
    insert_time: str = ""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _google_error(status: int, grpc_status: str, message: str, details: list[Any] | None = None) -> _ApiError:
    error: dict[str, Any] = {"code": status, "message": message, "status": grpc_status}
    if details:
        error["details"] = details
    return _ApiError(status, {"error": error})


def _compute_error(status: int, reason: str, message: str, domain: str = "global") -> _ApiError:
    """Compute Engine's error shape: the legacy ``errors`` list beside code and message."""
    return _ApiError(
        status,
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": domain, "reason": reason}],
            }
        },
    )


def tpu_cores(accelerator_type: str) -> int:
    """The TensorCores (or chips) a type asks for: the N of ``v4-N``."""
    try:
        return int(accelerator_type.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise _google_error(400, "INVALID_ARGUMENT", f'Invalid accelerator type "{accelerator_type}".') from None


def tpu_hosts(accelerator_type: str) -> int:
    """How many VMs (hosts) a TPU type has: 4 chips per host; v2-v5p count 2 cores per chip."""
    family = accelerator_type.rsplit("-", 1)[0]
    cores = tpu_cores(accelerator_type)
    if family.startswith(("v5lite", "v6e")):
        return 1 if cores <= 8 else cores // 4
    return max(1, cores // 8)


def _vcpus(machine_type: str) -> int:
    last = machine_type.rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else 2


class FakeGcp:
    """The fake API server. Use as a context manager, or :meth:`start` and :meth:`stop`."""

    def __init__(self, *, project: str = "fray-test", op_seconds: float = 0.0, page_size: int = 2) -> None:
        self.project = project
        self.op_seconds = op_seconds
        """Seconds an operation takes (create: the node/instance is CREATING/PROVISIONING until then);
        tests hold operations with a long one and end them with :meth:`finish_operations`."""
        self.page_size = page_size
        """The most items one list page returns (small, so clients must follow ``nextPageToken``)."""
        self.requests: list[Recorded] = []
        self.nodes: dict[str, dict[str, Any]] = {}  # full name -> Node JSON
        self.instances: dict[str, dict[str, Any]] = {}  # "zone/name" -> Instance JSON
        self.tpu_quota: dict[tuple[str, str], int] = {}
        """(zone, family such as ``v4``) -> TensorCores allowed; absent means unlimited."""
        self.cpu_quota: dict[tuple[str, str], int] = {}
        """(region, ``CPUS`` or ``PREEMPTIBLE_CPUS``) -> vCPUs allowed; absent means unlimited."""
        self.stockouts: set[tuple[str, str]] = set()
        """(zone, accelerator or machine type) whose creates fail for lack of capacity."""
        self._ops: dict[str, _Op] = {}
        self._compute_requests: dict[str, _Op] = {}
        self._ids = itertools.count(1000001)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The ``http://127.0.0.1:PORT`` the clients use as their API endpoint."""
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeGcp:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._handle(self)

            def do_POST(self) -> None:
                fake._handle(self)

            def do_DELETE(self) -> None:
                fake._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-gcp", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeGcp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests do to the "cloud" --------------------------------------------------------

    def preempt(self, name: str) -> None:
        """Reclaim a TPU node (by node id) or a spot instance (by instance name), as Google does."""
        with self._lock:
            self._settle()
            for full, node in self.nodes.items():
                if full.rsplit("/", 1)[1] == name:
                    node["state"] = "PREEMPTED"
                    return
            for key, inst in self.instances.items():
                if key.rsplit("/", 1)[1] == name:
                    inst["status"] = "TERMINATED"
                    inst["lastStopTimestamp"] = _now_iso()
                    return
        raise KeyError(name)

    def finish_operations(self) -> None:
        """Let every operation in progress complete now (tests hold them with a long ``op_seconds``)."""
        with self._lock:
            now = time.monotonic()
            for op in self._ops.values():
                op.done_at = min(op.done_at, now)

    def calls(self, method: str | None = None, contains: str = "") -> list[Recorded]:
        """The recorded requests, optionally of one method and with ``contains`` in the path."""
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    # -- HTTP --------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        status, payload = 200, {}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            status, payload = (
                400,
                {"error": {"code": 400, "message": "Invalid JSON payload received.", "status": "INVALID_ARGUMENT"}},
            )
        with self._lock:
            self.requests.append(Recorded(handler.command, parts.path, query, body, handler.headers.get("Host", "")))
            if status == 200:
                try:
                    self._settle()
                    payload = self._route(handler.command, parts.path, query, body)
                except _ApiError as exc:
                    status, payload = exc.status, exc.payload
            numeric = query.get("$alt", "").endswith("enum-encoding=int")
        data = json.dumps(_numeric_states(payload) if numeric else payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        m = re.fullmatch(r"/v2/(projects/([^/]+)/locations/([^/]+))/(nodes|operations)(?:/([^/]+))?", path)
        if m:
            parent, _, zone, collection, item = m.groups()
            if collection == "operations" and method == "GET" and item:
                return self._op_json(self._op(f"{parent}/operations/{item}"))
            if collection == "nodes":
                if method == "POST" and not item:
                    return self._tpu_create(parent, zone, query, body)
                if method == "GET" and not item:
                    return self._page(list(self.nodes.values()), "nodes", query, "pageSize")
                if method == "GET":
                    return self._tpu_node(f"{parent}/nodes/{item}")
                if method == "DELETE":
                    return self._tpu_delete(f"{parent}/nodes/{item}")
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)(?:/([^/]+))?", path)
        if m:
            project, zone, collection, item = m.groups()
            if collection == "operations" and method == "GET" and item:
                return self._op_json(self._op(f"compute/{project}/{zone}/{item}"))
            if collection == "instances":
                if method == "POST" and not item:
                    return self._gce_insert(project, zone, query, body)
                if method == "GET" and not item:
                    return self._gce_list(project, zone, query)
                if method == "GET":
                    return self._gce_instance(project, zone, item)
                if method == "DELETE":
                    return self._gce_delete(project, zone, item, query)
        raise _google_error(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")

    # -- time --------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Complete every operation whose time has come (lazily, on each request)."""
        now = time.monotonic()
        for op in self._ops.values():
            if op.done_at <= now and op.on_done:
                callbacks, op.on_done = op.on_done, []
                for callback in callbacks:
                    callback()

    def _new_op(self, name: str, kind: str, verb: str, target: str) -> _Op:
        start = time.monotonic()
        op = _Op(name, kind, verb, target, start, start + self.op_seconds, insert_time=_now_iso())
        self._ops[name] = op
        return op

    def _op(self, name: str) -> _Op:
        op = self._ops.get(name)
        if op is None:
            if name.startswith("compute/"):
                raise _compute_error(404, "notFound", f"The resource '{name}' was not found")
            raise _google_error(404, "NOT_FOUND", f"Operation {name} not found.")
        return op

    def _op_json(self, op: _Op) -> dict[str, Any]:
        done = op.done_at <= time.monotonic() and not op.on_done
        if op.kind == "tpu":
            out: dict[str, Any] = {
                "name": op.name,
                "metadata": {
                    "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                    "createTime": op.insert_time,
                    "target": op.target,
                    "verb": op.verb,
                    "cancelRequested": False,
                    "apiVersion": "v2",
                },
                "done": done,
            }
            if done and op.error is not None:
                out["error"] = op.error
            elif done and op.verb == "create" and op.target in self.nodes:
                out["response"] = {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **self.nodes[op.target]}
            elif done:
                out["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
            return out
        _, project, zone, short = op.name.split("/", 3)
        out = {
            "kind": "compute#operation",
            "id": str(abs(hash(op.name)) % 10**18),
            "name": short,
            "zone": f"{_COMPUTE}/projects/{project}/zones/{zone}",
            "operationType": op.verb,
            "targetLink": op.target,
            "targetId": str(abs(hash(op.target)) % 10**18),
            "status": "DONE" if done else "RUNNING",
            "user": "fray-test@example.iam.gserviceaccount.com",
            "progress": 100 if done else 0,
            "insertTime": op.insert_time,
            "startTime": op.insert_time,
            "selfLink": f"{_COMPUTE}/projects/{project}/zones/{zone}/operations/{short}",
        }
        if done:
            out["endTime"] = _now_iso()
            if op.error is not None:
                out.update(op.error)
        return out

    # -- TPU ---------------------------------------------------------------------------------

    def _tpu_create(self, parent: str, zone: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        node_id = query.get("nodeId", "")
        if not _NAME_RE.match(node_id):
            raise _google_error(400, "INVALID_ARGUMENT", f'Invalid node id "{node_id}".')
        if not isinstance(body, dict) or not body.get("acceleratorType") or not body.get("runtimeVersion"):
            raise _google_error(
                400,
                "INVALID_ARGUMENT",
                "Node must specify accelerator_type (or accelerator_config) and runtime_version.",
            )
        name = f"{parent}/nodes/{node_id}"
        if name in self.nodes:
            raise _google_error(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        accel = str(body["acceleratorType"])
        family = accel.rsplit("-", 1)[0]
        cores = tpu_cores(accel)
        limit = self.tpu_quota.get((zone, family))
        if limit is not None:
            used = sum(
                tpu_cores(n["acceleratorType"])
                for key, n in self.nodes.items()
                if key.startswith(parent + "/") and n["acceleratorType"].rsplit("-", 1)[0] == family
            )
            if used + cores > limit:
                metric = f"tpu.googleapis.com/tpu_{family}_pod_cores"
                quota_id = f"TPU{family.upper()}PodPerProjectPerZoneForTPUAPI"
                message = f"Quota limit '{quota_id}' has been exceeded. Limit: {limit} in zone {zone}."
                raise _google_error(
                    429,
                    "RESOURCE_EXHAUSTED",
                    message,
                    [
                        {
                            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                            "violations": [{"subject": f"project:{self.project}", "description": message}],
                        },
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "RATE_LIMIT_EXCEEDED",
                            "domain": "googleapis.com",
                            "metadata": {
                                "quota_metric": metric,
                                "quota_limit": quota_id,
                                "service": "tpu.googleapis.com",
                            },
                        },
                    ],
                )
        node = {
            **body,
            "name": name,
            "state": "CREATING",
            "createTime": _now_iso(),
            "id": str(next(self._ids)),
            "apiVersion": "V2",
        }
        node.setdefault("labels", {})
        self.nodes[name] = node
        op = self._new_op(f"{parent}/operations/operation-{uuid.uuid4().hex[:20]}", "tpu", "create", name)
        if (zone, accel) in self.stockouts:
            op.error = {
                "code": 8,
                "message": f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
                "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1a2b3c4d]",
            }
            op.on_done.append(lambda: self.nodes.pop(name, None))
        else:
            op.on_done.append(lambda: self._ready(name))
        return self._op_json(op)

    def _ready(self, name: str) -> None:
        """The node is up: READY, and its hosts listed (Google lists no network endpoints before)."""
        node = self.nodes.get(name)
        if node is not None and node["state"] == "CREATING":
            node["state"] = "READY"
            base = int(node["id"]) % 200
            node["networkEndpoints"] = [
                {"ipAddress": f"10.130.{base}.{i + 2}", "port": 8470} for i in range(tpu_hosts(node["acceleratorType"]))
            ]

    def _tpu_node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise _google_error(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return self.nodes[name]

    def _tpu_delete(self, name: str) -> dict[str, Any]:
        node = self._tpu_node(name)
        node["state"] = "DELETING"
        parent = name.rsplit("/nodes/", 1)[0]
        op = self._new_op(f"{parent}/operations/operation-{uuid.uuid4().hex[:20]}", "tpu", "delete", name)
        op.on_done.append(lambda: self.nodes.pop(name, None))
        return self._op_json(op)

    # -- Compute -----------------------------------------------------------------------------

    def _gce_insert(self, project: str, zone: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        request_id = query.get("requestId", "")
        if request_id:
            try:
                if uuid.UUID(request_id).int == 0:
                    raise ValueError
            except ValueError:
                raise _compute_error(
                    400,
                    "invalid",
                    f"Invalid value for field 'requestId': '{request_id}'. The request ID must be a valid UUID.",
                ) from None
            earlier = self._compute_requests.get(f"{project}/{zone}/{request_id}")
            if earlier is not None:
                return self._op_json(earlier)
        if not isinstance(body, dict) or not _NAME_RE.match(str(body.get("name", ""))):
            raise _compute_error(
                400, "invalid", f"Invalid value for field 'resource.name': '{(body or {}).get('name')}'."
            )
        name = str(body["name"])
        key = f"{zone}/{name}"
        target = f"{_COMPUTE}/projects/{project}/zones/{zone}/instances/{name}"
        if key in self.instances:
            raise _compute_error(
                409, "alreadyExists", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
            )
        machine_type = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if not machine_type:
            raise _compute_error(400, "required", "Required field 'resource.machineType' not specified")
        spot = (body.get("scheduling") or {}).get("provisioningModel") == "SPOT"
        metric = "PREEMPTIBLE_CPUS" if spot else "CPUS"
        region = zone.rsplit("-", 1)[0]
        limit = self.cpu_quota.get((region, metric))
        if limit is not None:
            used = sum(
                _vcpus(str(i["machineType"]).rsplit("/", 1)[-1])
                for k, i in self.instances.items()
                if k.startswith(region) and ((i.get("scheduling") or {}).get("provisioningModel") == "SPOT") == spot
            )
            if used + _vcpus(machine_type) > limit:
                raise _compute_error(
                    403,
                    "quotaExceeded",
                    f"Quota '{metric}' exceeded.  Limit: {float(limit)} in region {region}.",
                    "usageLimits",
                )
        instance = {
            **body,
            "kind": "compute#instance",
            "id": str(next(self._ids)),
            "creationTimestamp": _now_iso(),
            "status": "PROVISIONING",
            "zone": f"{_COMPUTE}/projects/{project}/zones/{zone}",
            "selfLink": target,
            "labelFingerprint": uuid.uuid4().hex[:12],
        }
        instance.setdefault("labels", {})
        self.instances[key] = instance
        op = self._new_op(f"compute/{project}/{zone}/operation-{uuid.uuid4().hex}", "compute", "insert", target)
        if request_id:
            op.request_id = request_id
            self._compute_requests[f"{project}/{zone}/{request_id}"] = op
        if (zone, machine_type) in self.stockouts:
            message = (
                f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill "
                "the request.  Try a different zone, or try again later."
            )
            op.error = {
                "httpErrorStatusCode": 503,
                "httpErrorMessage": "SERVICE UNAVAILABLE",
                "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message}]},
            }
            op.on_done.append(lambda: self.instances.pop(key, None))
        else:
            op.on_done.append(lambda: self._running(key))
        return self._op_json(op)

    def _running(self, key: str) -> None:
        inst = self.instances.get(key)
        if inst is not None and inst["status"] == "PROVISIONING":
            inst["status"] = "RUNNING"

    def _gce_list(self, project: str, zone: str, query: dict[str, str]) -> dict[str, Any]:
        items = [i for k, i in self.instances.items() if k.startswith(zone + "/")]
        expr = query.get("filter", "").strip()
        if expr:
            m = re.fullmatch(r'labels\.([a-z][-_a-z0-9]*)\s*=\s*"?([-_a-z0-9]*)"?', expr)
            if m is None:
                raise _compute_error(
                    400, "invalid", f"Invalid value for field 'filter': '{expr}'. Invalid list filter expression."
                )
            items = [i for i in items if i.get("labels", {}).get(m.group(1)) == m.group(2)]
        page = self._page(items, "items", query, "maxResults")
        page.update(
            kind="compute#instanceList",
            id=f"projects/{project}/zones/{zone}/instances",
            selfLink=f"{_COMPUTE}/projects/{project}/zones/{zone}/instances",
        )
        return page

    def _gce_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        inst = self.instances.get(f"{zone}/{name}")
        if inst is None:
            raise _compute_error(
                404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        return inst

    def _gce_delete(self, project: str, zone: str, name: str, query: dict[str, str]) -> dict[str, Any]:
        inst = self._gce_instance(project, zone, name)
        if any(op.verb == "delete" and op.target == inst["selfLink"] and op.on_done for op in self._ops.values()):
            raise _compute_error(
                400,
                "resourceNotReady",
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready",
            )
        inst["status"] = "STOPPING"
        op = self._new_op(
            f"compute/{project}/{zone}/operation-{uuid.uuid4().hex}", "compute", "delete", inst["selfLink"]
        )
        op.on_done.append(lambda: self.instances.pop(f"{zone}/{name}", None))
        return self._op_json(op)

    # -- paging ------------------------------------------------------------------------------

    def _page(self, items: list[dict[str, Any]], key: str, query: dict[str, str], size_key: str) -> dict[str, Any]:
        size = min(int(query.get(size_key) or self.page_size), self.page_size)
        start = int(query.get("pageToken") or 0)
        out: dict[str, Any] = {key: items[start : start + size]}
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out


def _numeric_states(payload: Any) -> Any:
    """Node.state as its enum number, as Google answers when asked for ``enum-encoding=int``."""
    if isinstance(payload, dict):
        out = {k: _numeric_states(v) for k, v in payload.items()}
        if "acceleratorType" in out and isinstance(out.get("state"), str):
            out["state"] = _TPU_STATES.get(out["state"], 16)
        return out
    if isinstance(payload, list):
        return [_numeric_states(v) for v in payload]
    return payload
