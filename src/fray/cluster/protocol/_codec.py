"""The cluster's messages as plain data: what crosses the controller's data-only RPC and sits in its store.

Every function here turns one of the typed values of :mod:`fray.cluster.protocol.messages`,
:mod:`fray.cluster.protocol.records` and :mod:`fray.cluster.protocol.capacity` into nil, booleans,
numbers, strings, byte strings, lists and maps (``*_data``), or back (``*_from``). The
``*_from`` functions check shapes and raise :class:`~fray.errors.ProtocolError` for
anything malformed, so a hostile or confused peer gets a clear refusal, never a crash.
User payloads (a callable job's entrypoint, an exception in a failure report) stay
opaque byte strings.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypeVar

from fray.cluster.protocol.capacity import Device, TaskResources, WorkerInfo
from fray.cluster.protocol.messages import (
    JobSpec,
    JobView,
    StacksAsk,
    TaskAssignment,
    TaskExit,
    WorkerCommands,
    WorkerReport,
)
from fray.cluster.protocol.records import Endpoint, TaskKey, TaskRecord, TaskState, WorkerRecord, WorkerState
from fray.cluster.rpc.datarpc import pack, unpack
from fray.errors import FrayError, ProtocolError
from fray.job import EnvironmentConfig, JobStatus

__all__ = [
    "as_int",
    "as_str",
    "assignment_data",
    "assignment_from",
    "commands_data",
    "commands_from",
    "decode_spec",
    "encode_spec",
    "endpoint_data",
    "endpoint_from",
    "exit_data",
    "exit_from",
    "key_data",
    "key_from",
    "report_data",
    "report_from",
    "spec_data",
    "spec_from",
    "stacks_ask_data",
    "stacks_ask_from",
    "task_data",
    "task_from",
    "view_data",
    "view_from",
    "worker_info_data",
    "worker_info_from",
    "worker_record_data",
    "worker_record_from",
]

T = TypeVar("T")


def checked(what: str, build: Callable[[], T]) -> T:
    """``build()``, with a malformed input reported as ProtocolError naming ``what``."""
    try:
        return build()
    except FrayError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ProtocolError(f"malformed {what}: {type(exc).__name__}: {exc}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _fields_data(value: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}


def as_str(value: Any) -> str:
    """``value`` if it is a string; TypeError otherwise (``checked`` words it as a ProtocolError)."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def as_int(value: Any) -> int:
    """``value`` if it is a whole number (not a bool); TypeError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _opt_bytes(value: Any) -> bytes | None:
    if value is not None and not isinstance(value, bytes):
        raise TypeError(f"expected bytes or nil, got {type(value).__name__}")
    return value


# -- keys, exits, resources -------------------------------------------------------------------


def key_data(key: TaskKey) -> list[Any]:
    return [key.job_id, key.task_index, key.attempt]


def key_from(data: Any) -> TaskKey:
    return checked("task key", lambda: TaskKey(as_str(data[0]), as_int(data[1]), as_int(data[2])))


def exit_data(exit_: TaskExit) -> list[Any]:
    return [key_data(exit_.key), exit_.exit_code, exit_.failure]


def exit_from(data: Any) -> TaskExit:
    return checked("task exit", lambda: TaskExit(key_from(data[0]), as_int(data[1]), _opt_bytes(data[2])))


def resources_data(resources: TaskResources) -> dict[str, Any]:
    return _fields_data(resources)


def resources_from(data: Any) -> TaskResources:
    def build() -> TaskResources:
        values = dict(data)
        if values.get("regions") is not None:
            values["regions"] = tuple(as_str(r) for r in values["regions"])
        return TaskResources(**values)

    return checked("resources", build)


def worker_info_data(info: WorkerInfo) -> dict[str, Any]:
    data = _fields_data(info)
    data["devices"] = [[d.kind, d.type, d.count] for d in info.devices]
    data["attributes"] = dict(info.attributes)
    return data


def worker_info_from(data: Any) -> WorkerInfo:
    def build() -> WorkerInfo:
        values = dict(data)
        values["devices"] = tuple(Device(as_str(d[0]), as_str(d[1]), as_int(d[2])) for d in values.get("devices", ()))
        values["attributes"] = {as_str(k): as_str(v) for k, v in dict(values.get("attributes", {})).items()}
        return WorkerInfo(**values)

    return checked("worker info", build)


# -- jobs -------------------------------------------------------------------------------------


def spec_data(spec: JobSpec) -> dict[str, Any]:
    data = _fields_data(spec)
    data["resources"] = resources_data(spec.resources)
    data["environment"] = _fields_data(spec.environment)
    return data


def spec_from(data: Any) -> JobSpec:
    def build() -> JobSpec:
        values = dict(data)
        values["resources"] = resources_from(values["resources"])
        environment = dict(values["environment"])
        environment["env_vars"] = {as_str(k): as_str(v) for k, v in dict(environment.get("env_vars", {})).items()}
        values["environment"] = EnvironmentConfig(**environment)
        if values.get("argv") is not None:
            values["argv"] = tuple(as_str(a) for a in values["argv"])
        values["payload"] = _opt_bytes(values.get("payload"))
        values["command"] = as_str(values.get("command", ""))
        processes = values["processes_per_task"] = as_int(values.get("processes_per_task", 1))
        if processes < 1:  # workers start that many processes a task
            raise ValueError(f"processes_per_task {processes} must be >= 1")
        timeout = values.get("timeout_seconds")
        if timeout is not None:
            timeout = values["timeout_seconds"] = float(timeout)
            if not timeout > 0:  # the controller adds it to a start time
                raise ValueError(f"timeout_seconds {timeout} must be > 0")
        band = values["priority"] = as_int(values.get("priority", 2))
        if band not in (1, 2, 3):  # the scheduler orders and preempts by it
            raise ValueError(f"priority {band} is not a priority band (1, 2 or 3)")
        digest = values["workspace_digest"] = as_str(values.get("workspace_digest", ""))
        if digest and _DIGEST.fullmatch(digest) is None:  # workers make a directory name of it
            raise ValueError(f"workspace_digest {digest[:80]!r} is not sha256:<64 hex digits>")
        return JobSpec(**values)

    return checked("job spec", build)


def encode_spec(spec: JobSpec) -> bytes:
    """The one form a job's spec travels and is stored in: msgpack, made once, by the client that submits it.

    The controller stores these bytes as they came and forwards them in each task's
    assignment; it decodes them (:func:`decode_spec`) to check and schedule, never to encode again.
    """
    return pack(spec_data(spec))


def decode_spec(data: Any) -> JobSpec:
    """The spec :func:`encode_spec` made; ProtocolError for anything else."""
    if not isinstance(data, bytes):
        raise ProtocolError(f"malformed job spec: expected its encoded bytes, got {type(data).__name__}")
    return spec_from(unpack(data))


def view_data(view: JobView) -> dict[str, Any]:
    data = _fields_data(view)
    data["state"] = view.state.value
    return data


def view_from(data: Any) -> JobView:
    def build() -> JobView:
        values = dict(data)
        values["state"] = JobStatus(values["state"])
        return JobView(**values)

    return checked("job view", build)


def task_data(task: TaskRecord) -> dict[str, Any]:
    data = _fields_data(task)
    data["state"] = task.state.value
    return data


def task_from(data: Any) -> TaskRecord:
    def build() -> TaskRecord:
        values = dict(data)
        values["state"] = TaskState(values["state"])
        return TaskRecord(**values)

    return checked("task record", build)


# -- workers ----------------------------------------------------------------------------------


def worker_record_data(record: WorkerRecord) -> dict[str, Any]:
    data = _fields_data(record)
    data["info"] = worker_info_data(record.info)
    data["state"] = record.state.value
    return data


def worker_record_from(data: Any) -> WorkerRecord:
    def build() -> WorkerRecord:
        values = dict(data)
        values["info"] = worker_info_from(values["info"])
        values["state"] = WorkerState(values["state"])
        return WorkerRecord(**values)

    return checked("worker record", build)


def assignment_data(assignment: TaskAssignment) -> dict[str, Any]:
    data = {f.name: _plain(getattr(assignment, f.name)) for f in _ASSIGNMENT_FIELDS}
    data["key"] = key_data(assignment.key)
    # The client's bytes, as stored: an assignment never encodes the spec again.
    data["spec"] = assignment.encoded_spec or encode_spec(assignment.spec)
    return data


def assignment_from(data: Any, decoded: dict[bytes, JobSpec] | None = None) -> TaskAssignment:
    """The assignment in ``data``; ``decoded`` remembers specs already decoded (the replicas of one job)."""

    def build() -> TaskAssignment:
        values = dict(data)
        values["key"] = key_from(values["key"])
        encoded = values["encoded_spec"] = values["spec"]
        spec = decoded.get(encoded) if decoded is not None and isinstance(encoded, bytes) else None
        if spec is None:
            spec = decode_spec(encoded)
            if decoded is not None:
                decoded[encoded] = spec
        values["spec"] = spec
        values["device_env"] = {as_str(k): as_str(v) for k, v in dict(values.get("device_env", {})).items()}
        return TaskAssignment(**values)

    return checked("task assignment", build)


_ASSIGNMENT_FIELDS = tuple(f for f in dataclasses.fields(TaskAssignment) if f.name not in ("spec", "encoded_spec"))


def commands_data(commands: WorkerCommands) -> dict[str, Any]:
    return {
        "start": [assignment_data(a) for a in commands.start],
        "kill": [key_data(k) for k in commands.kill],
        "reregister": commands.reregister,
        "epoch": commands.epoch,
        "lease_seconds": commands.lease_seconds,
        "stacks": [stacks_ask_data(ask) for ask in commands.stacks],
    }


def stacks_ask_data(ask: StacksAsk) -> list[Any]:
    return [ask.request_id, [[key_data(key), label] for key, label in ask.tasks], ask.timeout, ask.locals]


def stacks_ask_from(data: Any) -> StacksAsk:
    return checked(
        "stacks request",
        lambda: StacksAsk(
            request_id=as_int(data[0]),
            tasks=tuple((key_from(key), as_str(label)) for key, label in data[1]),
            timeout=float(data[2]),
            locals=bool(data[3]),
        ),
    )


def commands_from(data: Any) -> WorkerCommands:
    decoded: dict[bytes, JobSpec] = {}  # the replicas of one job placed together share one decoding
    return checked(
        "worker commands",
        lambda: WorkerCommands(
            start=tuple(assignment_from(a, decoded) for a in data["start"]),
            kill=tuple(key_from(k) for k in data["kill"]),
            reregister=bool(data["reregister"]),
            epoch=as_int(data["epoch"]),
            lease_seconds=float(data["lease_seconds"]),
            # A controller older than live stacks sends none.
            stacks=tuple(stacks_ask_from(a) for a in data.get("stacks", ())),
        ),
    )


def report_data(report: WorkerReport) -> dict[str, Any]:
    return {
        "started": [key_data(k) for k in report.started],
        "exited": [exit_data(e) for e in report.exited],
        "logs": [[key_data(k), list(lines)] for k, lines in report.logs],
        "health": report.health,
    }


def report_from(data: Any) -> WorkerReport:
    return checked(
        "worker report",
        lambda: WorkerReport(
            started=[key_from(k) for k in data["started"]],
            exited=[exit_from(e) for e in data["exited"]],
            logs=[(key_from(k), [as_str(line) for line in lines]) for k, lines in data["logs"]],
            health=as_str(data.get("health", "")),
        ),
    )


def endpoint_data(endpoint: Endpoint) -> dict[str, Any]:
    data = _fields_data(endpoint)
    data["task"] = key_data(endpoint.task)
    return data


def endpoint_from(data: Any) -> Endpoint:
    def build() -> Endpoint:
        values = dict(data)
        values["task"] = key_from(values["task"])
        return Endpoint(**values)

    return checked("endpoint", build)
