"""What clients, the controller and workers send each other: plain, picklable dataclasses.

The controller never unpickles user code: a callable job travels as an opaque
``payload`` (the cloudpickled entrypoint) that only the task process opens.
Everything else here is built from Fray's own types, so the controller can decode
it without the user's modules installed.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field

import cloudpickle

from fray._serialization import call_parts, check_picklable
from fray.cluster.store import TaskKey
from fray.errors import RemoteError
from fray.job import BinaryEntrypoint, CallableEntrypoint, EnvironmentConfig, JobRequest, JobStatus
from fray.resources import ResourceConfig

__all__ = ["JobSpec", "JobView", "TaskAssignment", "TaskExit", "WorkerCommands", "WorkerReport"]


@dataclass(frozen=True)
class JobSpec:
    """A job as the controller stores it: the request without any user code in the clear."""

    name: str
    resources: ResourceConfig
    environment: EnvironmentConfig
    replicas: int
    max_retries_failure: int
    max_retries_preemption: int
    argv: tuple[str, ...] | None = None
    payload: bytes | None = None
    actor_name: str = ""

    @classmethod
    def from_request(cls, request: JobRequest, *, actor_name: str = "") -> JobSpec:
        """Encode ``request``; raises SerializationError naming what cannot be pickled."""
        entry = request.entrypoint
        argv: tuple[str, ...] | None = None
        payload: bytes | None = None
        if isinstance(entry, BinaryEntrypoint):
            argv = tuple(entry.argv)
        else:
            payload = encode_callable(request.name, entry)
        return cls(
            name=request.name,
            resources=request.resources,
            environment=request.environment or EnvironmentConfig(),
            replicas=request.replicas,
            max_retries_failure=request.max_retries_failure,
            max_retries_preemption=request.max_retries_preemption,
            argv=argv,
            payload=payload,
            actor_name=actor_name,
        )


def encode_callable(job_name: str, entry: CallableEntrypoint) -> bytes:
    """Cloudpickle a callable entrypoint, naming the offending part if that fails."""
    try:
        return cloudpickle.dumps(entry)
    except Exception:
        check_picklable(f"job {job_name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
        raise


@dataclass(frozen=True)
class TaskAssignment:
    """Tells a worker to start one task."""

    key: TaskKey
    job_name: str
    namespace: str
    replica_index: int
    replica_count: int
    host_index: int
    spec: JobSpec


@dataclass(frozen=True)
class TaskExit:
    """A task process ended; ``failure`` is an encoded report from :func:`encode_failure`."""

    key: TaskKey
    exit_code: int
    error: str = ""
    failure: bytes | None = None


@dataclass
class WorkerReport:
    """What a worker has to tell since its last report."""

    started: list[TaskKey] = field(default_factory=list)
    exited: list[TaskExit] = field(default_factory=list)
    logs: list[tuple[TaskKey, list[str]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.started or self.exited or self.logs)


@dataclass(frozen=True)
class WorkerCommands:
    """What the controller wants a worker to do; ``reregister`` if it does not know the worker (any more)."""

    start: tuple[TaskAssignment, ...] = ()
    kill: tuple[TaskKey, ...] = ()
    reregister: bool = False


@dataclass(frozen=True)
class JobView:
    """A job as clients see it. ``settled`` is False while killed tasks may still be running.

    For a FAILED job, ``failure`` (an :func:`encode_failure` report, from Python tasks) and
    ``exit_code`` describe its last failed task.
    """

    job_id: str
    name: str
    namespace: str
    state: JobStatus
    attempt: int
    pending_reason: str
    error: str
    failure: bytes | None
    exit_code: int | None
    settled: bool
    parent_id: str | None
    user: str
    submitted_at: float
    finished_at: float | None
    replicas: int
    label: str = ""


def encode_failure(exc: BaseException) -> bytes:
    """Encode an exception raised by user code, with its traceback, for the client to re-raise."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = cloudpickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt (custom __init__)
    except Exception:
        blob = cloudpickle.dumps(RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), text))
    return pickle.dumps((blob, text))


def decode_failure(data: bytes) -> tuple[BaseException, str]:
    """The exception and traceback text from :func:`encode_failure`; a RemoteError if the type is unknown here."""
    blob, text = pickle.loads(data)
    try:
        exc = pickle.loads(blob)
    except Exception as err:
        exc = RemoteError("unknown", f"the job's exception could not be rebuilt here: {err!r}", text)
    if not isinstance(exc, BaseException):
        exc = RemoteError(type(exc).__name__, repr(exc), text)
    return exc, text
