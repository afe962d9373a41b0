"""What clients, the controller and workers send each other: plain frozen dataclasses.

On the wire (and in the controller's store) they travel as plain data -- see
:mod:`fray.cluster.protocol._codec` -- and the controller never unpickles anything: a callable
job's entrypoint is an opaque ``payload`` (cloudpickled) that only the task process opens.

The forms of one ``fray://`` submit, from the user's call to the task's process. The spec is
encoded once, by the client, and those bytes are what the controller stores and every
worker receives::

    client   JobRequest ──JobSpec.from_request──▶ JobSpec            (the callable cloudpickled once: payload)
             JobSpec ──_codec.encode_spec──▶ spec bytes ──▶ RPC       (ControllerProxy.submit: the one encoding,
                                                                       by the codec controller_api.SPEC)
    server   spec bytes ──_codec.decode_spec──▶ JobSpec               (controller_api.SPEC: EncodedSpec of both;
                                                                       checked, scheduled by)
             spec bytes, as they came ──▶ jobs.request                (ControllerService.submit_many → store)
             (spec bytes, JobSpec without payload, namespace)         (SpecCache; a miss: read the store, decode once)
             TaskAssignment(spec bytes) ──▶ WorkerCommands ──▶ RPC    (a poll's answer: the bytes forwarded)
    worker   spec bytes ──_codec.decode_spec──▶ JobSpec               (once per job in a poll's answer)
             TaskAssignment(JobSpec) ──▶ fork request                 (Worker._launch: argv, env, payload)
    task     payload ──cloudpickle.loads──▶ the callable              (the only unpickling: in the task)

The payload's bytes are never decoded on the way, and the spec around them is encoded
once; ``tests/cluster/test_one_form.py`` counts both.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from fray.cluster.protocol.capacity import TaskResources
from fray.cluster.protocol.records import TaskKey
from fray.core._codepickle import dumps
from fray.core._serialization import call_parts, check_picklable
from fray.errors import SerializationError
from fray.job import BinaryEntrypoint, CallableEntrypoint, EnvironmentConfig, JobRequest, JobStatus
from fray.resources import format_size, parse_size

__all__ = [
    "CONTROLLER_ACTOR",
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "JobSpec",
    "JobView",
    "StacksAsk",
    "TaskAssignment",
    "TaskExit",
    "WorkerCommands",
    "WorkerReport",
    "describe_entrypoint",
    "max_argument_bytes",
]

#: The name under which the controller's API was served as an actor (kept for compatibility).
CONTROLLER_ACTOR = "fray-controller"

#: The default of :func:`max_argument_bytes`: 256 MiB.
DEFAULT_MAX_ARGUMENT_BYTES = 256 << 20


@dataclass(frozen=True)
class JobSpec:
    """A job as the controller stores it: the request without any user code in the clear.

    ``resources`` is the normalized :class:`~fray.cluster.protocol.capacity.TaskResources` (plain
    numbers), so the controller needs nothing of the client's :mod:`fray.resources`.
    """

    name: str
    resources: TaskResources
    environment: EnvironmentConfig
    replicas: int
    max_retries_failure: int
    max_retries_preemption: int
    argv: tuple[str, ...] | None = None
    payload: bytes | None = None
    actor_name: str = ""
    #: What the job runs, for people: the command line, or the callable's qualified name.
    command: str = ""
    #: The packed workspace stored by the controller (``sha256:<hex>``), when the job has one.
    workspace_digest: str = ""
    #: How many processes each task runs (``JobRequest.processes_per_task``; see :mod:`fray.process._ranks`).
    processes_per_task: int = 1
    #: ``JobRequest.timeout`` in seconds: the controller fails the job (``JobTimeout``) that long after it first started.
    timeout_seconds: float | None = None
    #: The job's :class:`~fray.job.PriorityBand` (1 production, 2 interactive, 3 batch), resolved at submit.
    priority: int = 2

    @classmethod
    def from_request(cls, request: JobRequest, *, actor_name: str = "", command: str | None = None) -> JobSpec:
        """Encode ``request``; raises SerializationError naming what cannot be pickled.

        ``command`` describes the job for listings (default: the command line, or the
        callable's qualified name).
        """
        entry = request.entrypoint
        argv: tuple[str, ...] | None = None
        payload: bytes | None = None
        if isinstance(entry, BinaryEntrypoint):
            argv = tuple(entry.argv)
        else:
            payload = encode_callable(request.name, entry)
        return cls(
            name=request.name,
            resources=TaskResources.from_config(request.resources),
            environment=request.environment or EnvironmentConfig(),
            replicas=request.replicas,
            max_retries_failure=request.max_retries_failure,
            max_retries_preemption=request.max_retries_preemption,
            argv=argv,
            payload=payload,
            actor_name=actor_name,
            command=command if command is not None else describe_entrypoint(entry),
            processes_per_task=request.processes_per_task,
            timeout_seconds=request.timeout_seconds,
            priority=request.priority or 2,  # 0 only from a request built past the client's submit: interactive
        )


def describe_entrypoint(entry: BinaryEntrypoint | CallableEntrypoint) -> str:
    """A one-line description of what ``entry`` runs: ``python train.py --lr 3e-4`` or ``mymod.train``."""
    if isinstance(entry, BinaryEntrypoint):
        return shlex.join(entry.argv)
    fn = entry.callable
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module != "builtins" else str(name)


def max_argument_bytes() -> int:
    """The largest pickled entrypoint a cluster job may carry: ``FRAY_MAX_ARGUMENT_BYTES``, default 256 MiB."""
    configured = os.environ.get("FRAY_MAX_ARGUMENT_BYTES", "").strip()
    return parse_size(configured) if configured else DEFAULT_MAX_ARGUMENT_BYTES


def encode_callable(job_name: str, entry: CallableEntrypoint) -> bytes:
    """Cloudpickle a callable entrypoint, naming the offending part if that fails, refusing one too large."""
    try:
        payload = dumps(entry)
    except Exception as exc:
        check_picklable(f"job {job_name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
        if isinstance(exc, RecursionError):
            raise SerializationError(
                f"job {job_name!r}: its arguments are nested too deeply to pickle ({exc}); flatten them"
            ) from None
        raise
    limit = max_argument_bytes()
    if len(payload) > limit:
        raise SerializationError(
            f"job {job_name!r}: its callable and arguments take {format_size(len(payload))} pickled, over the "
            f"limit of {format_size(limit)} (FRAY_MAX_ARGUMENT_BYTES); put large data in shared storage and pass "
            "its path instead"
        )
    return payload


@dataclass(frozen=True)
class TaskAssignment:
    """Tells a worker to start one task.

    ``credential`` is the job's own credential (encoded, see :mod:`fray.cluster.protocol.credentials`)
    and ``actor_token`` its namespace's key for actor RPC: what the task gets in its
    environment instead of the cluster token.
    """

    key: TaskKey
    job_name: str
    namespace: str
    replica_index: int
    replica_count: int
    host_index: int
    spec: JobSpec
    credential: str = ""
    actor_token: str = ""
    #: What the placement tells the task about its device: for a TPU job the slice, the
    #: host's index in it and, for a multislice job, the ``MEGASCALE_*`` coordinator
    #: (see :mod:`fray.core.inside._tpu_env`); empty otherwise.
    device_env: Mapping[str, str] = field(default_factory=dict)
    #: ``spec`` in the one form it travels in: the bytes its client encoded, as the controller
    #: stores them (see :func:`fray.cluster.protocol._codec.encode_spec`); an assignment carries
    #: them instead of encoding ``spec`` again. Empty: encode ``spec`` (a test's hand-made assignment).
    encoded_spec: bytes = b""


@dataclass(frozen=True)
class TaskExit:
    """A task process ended with ``exit_code``; ``failure`` says why it failed.

    ``failure`` is a :class:`fray.core._lifecycle.Failure`, encoded (data only: the controller
    reads it without unpickling anything): the task process writes it for a Python
    exception, the worker for a non-zero exit (with the last lines of output).
    """

    key: TaskKey
    exit_code: int
    failure: bytes | None = None


@dataclass
class WorkerReport:
    """What a worker has to tell since its last report; ``health`` is "" or why it cannot run tasks now."""

    started: list[TaskKey] = field(default_factory=list)
    exited: list[TaskExit] = field(default_factory=list)
    logs: list[tuple[TaskKey, list[str]]] = field(default_factory=list)
    health: str = ""

    def __bool__(self) -> bool:
        return bool(self.started or self.exited or self.logs)


@dataclass(frozen=True)
class StacksAsk:
    """The controller asks a worker for the live stacks of some of its tasks (``stacks()``, issue 35).

    ``tasks`` pairs each task with the label its answer carries (``"replica 0"``); the worker
    asks each task's processes within ``timeout`` seconds and answers ``request_id`` with the
    controller's ``stacks_answer``.
    """

    request_id: int
    tasks: tuple[tuple[TaskKey, str], ...]
    timeout: float
    locals: bool = False


@dataclass(frozen=True)
class WorkerCommands:
    """What the controller wants a worker to do; ``reregister`` if it does not know the worker (any more).

    A registration's answer also carries the worker's new ``epoch`` (every report and poll
    names it; one from an earlier registration is refused, which is how a worker the
    controller gave up on is fenced) and ``lease_seconds``, how long the worker's tasks
    may run without the worker renewing its lease (see :mod:`fray.cluster.server.taskproc._forkserver`).
    """

    start: tuple[TaskAssignment, ...] = ()
    kill: tuple[TaskKey, ...] = ()
    reregister: bool = False
    epoch: int = 0
    lease_seconds: float = 0.0
    stacks: tuple[StacksAsk, ...] = ()


@dataclass(frozen=True)
class JobView:
    """A job as clients see it. ``settled`` is False while killed tasks may still be running.

    For a FAILED job, ``failure`` is its final :class:`fray.core._lifecycle.Failure`, encoded:
    :meth:`~fray.core._lifecycle.Failure.error` turns it into the exception ``wait()`` raises.
    """

    job_id: str
    name: str
    namespace: str
    state: JobStatus
    attempt: int
    pending_reason: str
    error: str
    failure: bytes | None
    settled: bool
    parent_id: str | None
    user: str
    submitted_at: float
    finished_at: float | None
    replicas: int
    label: str = ""
    band: int = 2  #: the job's priority band (1 production, 2 interactive, 3 batch)
