"""Jobs: what to run (:class:`JobRequest`), how to watch it (:class:`JobHandle`), and who am I (:func:`current_job`)."""

from __future__ import annotations

import dataclasses
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, overload, runtime_checkable

from fray.core._lending import blocked
from fray.core._progress import progress_bar
from fray.errors import ConfigError, JobFailed
from fray.job_info import JobInfo, current_job
from fray.priority import PriorityBand, check_band
from fray.resources import ResourceConfig
from fray.stacks import ProcessStacks

__all__ = [
    "BinaryEntrypoint",
    "CallableEntrypoint",
    "Duration",
    "Entrypoint",
    "EnvironmentConfig",
    "JobHandle",
    "JobInfo",
    "JobRequest",
    "JobStatus",
    "JobSummary",
    "PriorityBand",
    "SecretBehavior",
    "create_environment",
    "current_job",
    "wait_all",
]


class _Finished:
    """``JobStatus.finished``: a bool on a status (``status.finished``), a test on the class.

    ``JobStatus.finished(status)`` is marin's spelling; both read the same rule.
    """

    @overload
    def __get__(self, status: None, owner: type | None = None) -> Callable[[str], bool]: ...
    @overload
    def __get__(self, status: JobStatus, owner: type | None = None) -> bool: ...
    def __get__(self, status: JobStatus | None, owner: type | None = None) -> bool | Callable[[str], bool]:
        if status is None:
            return _is_finished
        return _is_finished(status)


def _is_finished(status: str) -> bool:
    """True once a job in ``status`` can no longer change state."""
    # A status is what every waiting loop asks about, so it is answered without a lookup; a plain
    # string goes through JobStatus, which refuses one that names no status.
    return (status if type(status) is JobStatus else JobStatus(status)) in _FINAL


class JobStatus(StrEnum):
    """Where a job is in its life. PENDING and RUNNING may change; the other three are final."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    finished = _Finished()
    """True once the job can no longer change state: ``status.finished``, or ``JobStatus.finished(status)``."""


_FINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretBehavior(StrEnum):
    """Whether a job inherits the credentials its submitter has, or sees only its own ``secrets`` (marin's)."""

    INHERIT = "inherit"
    ISOLATE = "isolate"


@dataclass(frozen=True)
class Duration:
    """A length of time, in whole milliseconds (marin's ``fray.types.Duration``).

    ``JobRequest.timeout`` takes one, or a number of seconds, or any object with a
    ``to_seconds()`` method (marin's own ``rigging.timing.Duration``).
    """

    milliseconds: int

    @classmethod
    def from_ms(cls, milliseconds: float) -> Duration:
        """``milliseconds`` milliseconds."""
        return cls(int(milliseconds))

    @classmethod
    def from_seconds(cls, seconds: float) -> Duration:
        """``seconds`` seconds."""
        return cls(int(seconds * 1000))

    @classmethod
    def from_minutes(cls, minutes: float) -> Duration:
        """``minutes`` minutes."""
        return cls(int(minutes * 60_000))

    @classmethod
    def from_hours(cls, hours: float) -> Duration:
        """``hours`` hours."""
        return cls(int(hours * 3_600_000))

    def to_ms(self) -> int:
        """The length in milliseconds."""
        return self.milliseconds

    def to_seconds(self) -> float:
        """The length in seconds."""
        return self.milliseconds / 1000


def seconds_of(value: object, what: str) -> float | None:
    """``value`` (None, seconds, a :class:`Duration` or anything with ``to_seconds()``) in seconds; ConfigError else."""
    if value is None:
        return None
    to_seconds = getattr(value, "to_seconds", None)
    seconds = to_seconds() if callable(to_seconds) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ConfigError(f"{what}={value!r} must be a number of seconds > 0, a Duration, or None")
    return float(seconds)


@dataclass(frozen=True)
class EnvironmentConfig:
    """Where and with what a job runs: a workspace directory or a docker image, extra pip packages, env vars.

    ``secrets``, ``extras``, ``setup_scripts`` and ``sync_packages`` are marin's fields
    (Iris's uv-based environments, see ``docs/marin.md``): they may be written, and a
    backend that does not honour one refuses a job that sets it (empty ``setup_scripts``
    is Fray's behaviour anyway: no setup runs) rather than run it in another environment.
    ``extras`` names extras (``[project.optional-dependencies]``) or, failing that,
    dependency groups (``[dependency-groups]``) of the job's project: on ``fray://`` the
    workspace's, installed into the job's environment; on the local backend the
    workspace's or the current directory's, checked to be installed here.
    """

    workspace: str | None = None
    docker_image: str | None = None
    pip_packages: Sequence[str] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    secret_behavior: SecretBehavior = SecretBehavior.INHERIT
    extras: Sequence[str] = ()
    setup_scripts: Sequence[str] | None = None
    sync_packages: Sequence[str] = ()

    def marin_settings(self) -> dict[str, object]:
        """marin's settings made here, away from their defaults: ``{"EnvironmentConfig.extras": [...], ...}``."""
        found: dict[str, object] = {
            f"EnvironmentConfig.{name}": getattr(self, name)
            for name in ("secrets", "extras", "sync_packages")
            if getattr(self, name)
        }
        if self.setup_scripts:
            found["EnvironmentConfig.setup_scripts"] = self.setup_scripts
        if self.secret_behavior != SecretBehavior.INHERIT:
            found["EnvironmentConfig.secret_behavior"] = self.secret_behavior
        return found

    def __post_init__(self) -> None:
        for name in ("extras", "sync_packages"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"EnvironmentConfig({name}={value!r}) must be a list of strings")
            object.__setattr__(self, name, tuple(value))
        if self.setup_scripts is not None:
            if isinstance(self.setup_scripts, str) or not all(isinstance(v, str) for v in self.setup_scripts):
                raise ConfigError(f"EnvironmentConfig(setup_scripts={self.setup_scripts!r}) must be a list of strings")
            object.__setattr__(self, "setup_scripts", tuple(self.setup_scripts))
        if not isinstance(self.secrets, Mapping):
            raise ConfigError(f"EnvironmentConfig(secrets={self.secrets!r}) must be a mapping of str to str")
        object.__setattr__(self, "secrets", dict(self.secrets))
        try:
            object.__setattr__(self, "secret_behavior", SecretBehavior(self.secret_behavior))
        except ValueError:
            raise ConfigError(
                f"EnvironmentConfig(secret_behavior={self.secret_behavior!r}) must be one of "
                f"{[b.value for b in SecretBehavior]}"
            ) from None
        if isinstance(self.pip_packages, str):
            raise ConfigError(
                f"EnvironmentConfig(pip_packages={self.pip_packages!r}) must be a list, e.g. [{self.pip_packages!r}]"
            )
        packages = tuple(self.pip_packages)
        for pkg in packages:
            if not isinstance(pkg, str) or not pkg.strip():
                raise ConfigError(
                    f"EnvironmentConfig.pip_packages holds {pkg!r}; each entry must be a requirement string"
                )
        object.__setattr__(self, "pip_packages", packages)
        if not isinstance(self.env_vars, Mapping):
            raise ConfigError(f"EnvironmentConfig(env_vars={self.env_vars!r}) must be a mapping of str to str")
        for key, value in self.env_vars.items():
            if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
                raise ConfigError(f"EnvironmentConfig.env_vars: {key!r} is not a valid environment variable name")
            if not isinstance(value, str):
                raise ConfigError(
                    f"EnvironmentConfig.env_vars[{key!r}] = {value!r}: values must be strings (use str({value!r}))"
                )
        object.__setattr__(self, "env_vars", dict(self.env_vars))
        for name in ("workspace", "docker_image"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"EnvironmentConfig({name}={value!r}) must be a non-empty string or None")


def create_environment(
    workspace: str | None = None,
    docker_image: str | None = None,
    pip_packages: Sequence[str] | None = None,
    env_vars: Mapping[str, str] | None = None,
    extras: Sequence[str] | None = None,
    setup_scripts: Sequence[str] | None = None,
    sync_packages: Sequence[str] | None = None,
    secrets: Mapping[str, str] | None = None,
    secret_behavior: SecretBehavior = SecretBehavior.INHERIT,
) -> EnvironmentConfig:
    """An :class:`EnvironmentConfig` from optional parts (marin's ``fray.types.create_environment``)."""
    return EnvironmentConfig(
        workspace=workspace,
        docker_image=docker_image,
        pip_packages=tuple(pip_packages or ()),
        env_vars=dict(env_vars or {}),
        secrets=dict(secrets or {}),
        secret_behavior=secret_behavior,
        extras=tuple(extras or ()),
        setup_scripts=setup_scripts,
        sync_packages=tuple(sync_packages or ()),
    )


class Entrypoint:
    """What a job runs: a Python callable (:class:`CallableEntrypoint`) or a program (:class:`BinaryEntrypoint`).

    Build one with :meth:`from_callable` or :meth:`from_binary`. Every entrypoint is an
    ``Entrypoint`` and reads both of marin's attributes (``callable_entrypoint``,
    ``binary_entrypoint``: itself, or None); marin's ``Entrypoint(callable_entrypoint=...)``
    constructor is not offered (see ``docs/marin.md``).
    """

    __slots__ = ()

    @property
    def callable_entrypoint(self) -> CallableEntrypoint | None:
        """This entrypoint if it runs a callable, else None (marin's attribute)."""
        return self if isinstance(self, CallableEntrypoint) else None

    @property
    def binary_entrypoint(self) -> BinaryEntrypoint | None:
        """This entrypoint if it runs a program, else None (marin's attribute)."""
        return self if isinstance(self, BinaryEntrypoint) else None

    @staticmethod
    def from_callable(
        c: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> CallableEntrypoint:
        """A Python callable ``c`` and its arguments."""
        if not callable(c):
            raise ConfigError(f"Entrypoint.from_callable needs a callable, got {type(c).__name__}: {c!r}")
        # A tuple or list is the usual case, told apart without Sequence's slower ABC check.
        if type(args) not in (tuple, list) and (isinstance(args, str | bytes) or not isinstance(args, Sequence)):
            raise ConfigError(f"Entrypoint.from_callable(args={args!r}) must be a tuple or list of arguments")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ConfigError(f"Entrypoint.from_callable(kwargs={kwargs!r}) must be a dict")
        return CallableEntrypoint(c, tuple(args), dict(kwargs or {}))

    @staticmethod
    def from_binary(command: str, args: Sequence[str] = ()) -> BinaryEntrypoint:
        """A program and its arguments (no shell: pass ``"bash", ["-c", "..."]`` for one)."""
        if not isinstance(command, str) or not command:
            raise ConfigError(f"Entrypoint.from_binary(command={command!r}) must be a non-empty program name or path")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"Entrypoint.from_binary(args={args!r}) must be a list of strings")
        return BinaryEntrypoint(command, tuple(args))


@dataclass(frozen=True)
class CallableEntrypoint(Entrypoint):
    """Run ``callable(*args, **kwargs)`` in Python; the job fails if it raises."""

    callable: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BinaryEntrypoint(Entrypoint):
    """Run ``command`` with ``args`` as a process; the job fails if it exits non-zero."""

    command: str
    args: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        """The full argument vector."""
        return [self.command, *self.args]


EntrypointType = CallableEntrypoint | BinaryEntrypoint

_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_name(name: object, what: str = "job name") -> str:
    """Check a job or actor name: 1-128 characters of letters, digits, ``.``, ``_``, ``-``."""
    if not isinstance(name, str) or not _JOB_NAME_RE.match(name):
        raise ConfigError(
            f"{what} {name!r} is invalid: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (no '/': ids of child jobs are built from their parents' with '/')"
        )
    return name


_DEFAULT_RESOURCES = ResourceConfig()


@dataclass(frozen=True)
class JobRequest:
    """Everything needed to run a job: name, entrypoint, per-replica resources, environment, retries.

    ``replicas`` left at None takes ``resources.replicas`` (1 unless set, e.g. by
    ``ResourceConfig.with_tpu(..., slice_count=4)``); it is always a whole number once
    the request is built. ``resources.image``, when set, becomes the environment's
    ``docker_image``. ``max_task_failures`` is marin's name for the failure budget: it
    raises ``max_retries_failure`` to its value (a job tolerates that many failed
    attempts). ``priority`` is the job's :class:`PriorityBand` (Iris's numbers: 1 production,
    2 interactive, 3 batch; 0, the default, inherits the submitting job's band) and
    ``timeout`` the seconds (or a :class:`Duration`) it may run before it is stopped and FAILED
    with :class:`~fray.errors.JobTimeout`; both are honoured by every backend (``docs/scheduling.md``).

    ``processes_per_task=N`` (marin's) runs N processes of the entrypoint in each replica
    (on ``fray://``, local and Monarch; refused by name elsewhere). Each process sees its
    rank in ``current_job()`` and in ``FRAY_PROCESS_INDEX`` (``replica_index * N + local``),
    ``FRAY_PROCESS_COUNT`` (``replicas * N``), ``FRAY_LOCAL_PROCESS_INDEX`` and
    ``FRAY_LOCAL_PROCESS_COUNT``; N must divide a replica's GPUs, and each process gets its
    contiguous share in ``CUDA_VISIBLE_DEVICES``. The replica fails as soon as one process
    fails (the others are stopped: SIGTERM, then SIGKILL) with that process's error, and
    succeeds when all succeed; each output line is prefixed ``[proc I] ``, I the local
    index. Retries apply to the replica as a whole.
    """

    name: str
    entrypoint: EntrypointType
    # One shared default (it is frozen): building one per request cost a tenth of a quick job's submit.
    resources: ResourceConfig = _DEFAULT_RESOURCES
    environment: EnvironmentConfig | None = None
    replicas: int = None  # type: ignore[assignment]  # None: resources.replicas; an int once built
    processes_per_task: int = 1
    max_retries_failure: int = 0
    max_retries_preemption: int = 100
    max_task_failures: int = 0
    priority: int = 0
    timeout: float | Duration | None = None

    @property
    def timeout_seconds(self) -> float | None:
        """``timeout`` in seconds (None: no limit)."""
        return seconds_of(self.timeout, "JobRequest.timeout")

    def marin_settings(self) -> dict[str, object]:
        """marin's settings made here, away from their defaults, by qualified field name.

        ``{"JobRequest.priority": 1, "ResourceConfig.target_cluster": "x", ...}``: what a
        backend must honour or refuse by name (its ``HONOURS``, see ``docs/marin.md``).
        """
        found: dict[str, object] = {
            f"JobRequest.{name}": getattr(self, name)
            for name, default in (("processes_per_task", 1), ("priority", 0), ("timeout", None))
            if getattr(self, name) != default
        }
        for name in ("target_cluster", "container_profile"):
            if getattr(self.resources, name) is not None:
                found[f"ResourceConfig.{name}"] = getattr(self.resources, name)
        if self.environment is not None:
            found.update(self.environment.marin_settings())
        return found

    def unsupported(self, honoured: Collection[str] = ()) -> list[str]:
        """The marin settings made here that a backend honouring ``honoured`` must refuse (``[]`` when none)."""
        return [
            f"{field.replace('.', '(', 1)}={value!r})"
            for field, value in self.marin_settings().items()
            if field not in honoured
        ]

    def __post_init__(self) -> None:
        if self.replicas is None and isinstance(self.resources, ResourceConfig):
            object.__setattr__(self, "replicas", self.resources.replica_count)
        if isinstance(self.resources, ResourceConfig) and self.resources.image is not None:
            env = self.environment if isinstance(self.environment, EnvironmentConfig) else EnvironmentConfig()
            if env.docker_image not in (None, self.resources.image):
                raise ConfigError(
                    f"JobRequest: ResourceConfig(image={self.resources.image!r}) and "
                    f"EnvironmentConfig(docker_image={env.docker_image!r}) disagree; give the image once"
                )
            object.__setattr__(self, "environment", dataclasses.replace(env, docker_image=self.resources.image))
        validate_name(self.name)
        if not isinstance(self.entrypoint, CallableEntrypoint | BinaryEntrypoint):
            raise ConfigError(
                f"JobRequest(entrypoint={self.entrypoint!r}) must come from Entrypoint.from_callable(...) "
                "or Entrypoint.from_binary(...)"
            )
        if not isinstance(self.resources, ResourceConfig):
            raise ConfigError(f"JobRequest(resources={self.resources!r}) must be a ResourceConfig")
        if self.environment is not None and not isinstance(self.environment, EnvironmentConfig):
            raise ConfigError(f"JobRequest(environment={self.environment!r}) must be an EnvironmentConfig or None")
        for name in (
            "replicas",
            "max_retries_failure",
            "max_retries_preemption",
            "processes_per_task",
            "max_task_failures",
        ):
            value = getattr(self, name)
            least = 1 if name in ("replicas", "processes_per_task") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"JobRequest({name}={value!r}) must be a whole number >= {least}")
        check_band(self.priority, "JobRequest")
        seconds_of(self.timeout, "JobRequest.timeout")
        # One failure budget: marin's max_task_failures counts failed attempts, as max_retries_failure does.
        object.__setattr__(self, "max_retries_failure", max(self.max_retries_failure, self.max_task_failures))


@dataclass(frozen=True)
class JobSummary:
    """What :meth:`JobHandle.info` returns: a job's status now and, while it is PENDING, why.

    ``pending_reason`` is what the backend knows of why nothing runs the job yet (what it
    needs and the largest worker or node there is, the retry it waits for), "" when the
    job is not PENDING or the backend cannot tell.
    """

    job_id: str
    status: JobStatus
    pending_reason: str = ""

    def describe(self) -> str:
        """``"train-ab12 pending (no worker has 64 cores ...)"``: the id, the status, and the reason if any."""
        text = f"{self.job_id} {self.status.value}"
        return f"{text} ({self.pending_reason})" if self.pending_reason else text


def timeout_error(summary: JobSummary, timeout: float | None) -> TimeoutError:
    """The ``TimeoutError`` of a ``JobHandle.wait`` that ran out: the job's state and why it is pending."""
    why = f": {summary.pending_reason}" if summary.pending_reason else ""
    return TimeoutError(f"job {summary.job_id!r} still {summary.status.value} after {timeout}s{why}")


def summarize(job: JobHandle) -> JobSummary:
    """``job.info()``, or what can be read without it (a handle that has no ``info``, a backend gone)."""
    try:
        return job.info()
    except Exception:  # the summary only words an error being raised: it must not replace it
        try:
            return JobSummary(job.job_id, job.status())
        except Exception:
            return JobSummary(job.job_id, JobStatus.RUNNING, "state unknown: its backend did not answer")


@runtime_checkable
class JobHandle(Protocol):
    """A submitted job. Every backend's handle is picklable."""

    @property
    def job_id(self) -> str:
        """The backend's id for the job; contains the request's name."""
        ...

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise :class:`JobFailed` if it failed (unless told not to).

        Raises ``TimeoutError`` if ``timeout`` seconds pass first.
        """
        ...

    def status(self) -> JobStatus:
        """The job's current status."""
        ...

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, why it is (see :class:`JobSummary`)."""
        ...

    def terminate(self) -> None:
        """Stop the job (all replicas). A no-op for a finished job."""
        ...

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The job's stdout and stderr lines so far: the last ``max_lines``, or all for None or 0."""
        ...

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of every thread of each replica and job-context task (:mod:`fray.stacks`)."""
        ...


class JobHandleBase(ABC):
    """The declared base of every backend's job handle (the :class:`JobHandle` protocol, implemented).

    A backend implements the six public members; the two hooks have defaults:

    ======================================  ==============================================================
    ``_fray_wait_some(jobs, timeout)``      block until one of ``jobs`` finished (or ``timeout``); their
                                            statuses in order. Default: poll each job's ``status()``
    ``_fray_preempt(replica)``              end a replica as a preemption does (:func:`fray.testing.preempt`).
                                            Default: ``ConfigError``, the backend cannot
    ``stacks(timeout, locals=)``            the live stacks of every replica and job-context task
                                            (:mod:`fray.stacks`). Default: ``ConfigError``, the backend cannot
    ======================================  ==============================================================
    """

    @property
    @abstractmethod
    def job_id(self) -> str:
        """The backend's id for the job; contains the request's name."""

    @abstractmethod
    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise :class:`JobFailed` if it failed (unless told not to)."""

    @abstractmethod
    def status(self) -> JobStatus:
        """The job's current status."""

    @abstractmethod
    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, why it is (see :class:`JobSummary`)."""

    @abstractmethod
    def terminate(self) -> None:
        """Stop the job (all replicas). A no-op for a finished job."""

    @abstractmethod
    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The job's stdout and stderr lines so far: the last ``max_lines``, or all for None or 0."""

    @classmethod
    def _fray_wait_some(cls, jobs: Sequence[Any], timeout: float | None) -> list[JobStatus]:
        """Block until one of ``jobs`` (all of this backend) finished or ``timeout`` passed; their statuses.

        This default reads each job's status, backing off to 50 ms between rounds; a
        backend that can wait for many jobs in one go (one long-poll, a condition) overrides it.
        """
        return _poll_some(list(jobs), timeout)

    def _fray_preempt(self, replica: int | None) -> None:
        """End replica ``replica`` (all if None) as a preemption would; this backend cannot."""
        raise ConfigError(
            f"preempt({self!r}): this backend ({type(self).__module__}) cannot preempt a job's replica; "
            "see docs/testing.md for where fray.testing.preempt works"
        )

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live Python stacks of every thread of each process running this job: one per replica, one per task.

        Taken inside each process by Fray's runtime (no ptrace); ``locals`` adds each frame's local
        variables (truncated reprs). A process that does not answer within ``timeout`` seconds is
        reported with :attr:`ProcessStacks.error` set (its pid and host), never a hang. Empty for a
        job that is not running. This default says the backend cannot.
        """
        raise ConfigError(
            f"stacks({self!r}): this backend ({type(self).__module__}) cannot take a job's live stacks yet; "
            "see docs/debugging.md for where it works"
        )


def _poll_some(jobs: list[Any], timeout: float | None) -> list[JobStatus]:
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while True:
        statuses: list[JobStatus] = [job.status() for job in jobs]
        if any(status.finished for status in statuses) or (deadline is not None and time.monotonic() >= deadline):
            return statuses
        time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)


def replicas_to_preempt(job_id: str, count: int, replica: int | None) -> tuple[int, ...]:
    """The replica indices :func:`preempt` means for a job of ``count`` replicas (backends call it in ``_fray_preempt``)."""
    if replica is None:
        return tuple(range(count))
    if replica >= count:
        raise ConfigError(f"preempt(replica={replica}): job {job_id!r} has {count} replica(s), numbered from 0")
    return (replica,)


def waiter_groups(jobs: Sequence[JobHandle]) -> list[tuple[Callable[..., list[JobStatus]], list[int]]]:
    """``jobs`` split by how they are waited on: each ``(wait_some, indices)`` (see ``_fray_wait_some``).

    One backend's handles may be of several classes (one per job kind) sharing one wait;
    a handle that is not a :class:`JobHandleBase` (a duck-typed one) is polled.
    """
    groups: dict[object, tuple[Callable[..., list[JobStatus]], list[int]]] = {}
    for index, job in enumerate(jobs):
        cls = type(job)
        method = cls._fray_wait_some if issubclass(cls, JobHandleBase) else JobHandleBase._fray_wait_some
        key = getattr(method, "__func__", method)
        groups.setdefault(key, (method, []))[1].append(index)
    return list(groups.values())


def wait_all(
    jobs: Sequence[JobHandle],
    *,
    timeout: float | None = None,
    raise_on_failure: bool = True,
    progress: bool = False,
) -> list[JobStatus]:
    """Wait for all ``jobs`` to finish, watching them all at once.

    Raises :class:`JobFailed` as soon as any job fails (not after the earlier ones
    finish) when ``raise_on_failure``, and ``TimeoutError`` when ``timeout`` seconds
    pass first, naming each unfinished job, its status and why it is pending. Returns
    the final statuses in input order. ``progress`` draws a progress bar of finished jobs
    on a terminal (nothing when stderr is not a TTY).

    Each backend waits for its own jobs in one go (``JobHandleBase._fray_wait_some``:
    one long-poll per controller on ``fray://``, a condition on local); jobs of several
    backends are polled.
    """
    jobs = list(jobs)
    with progress_bar("jobs finished", len(jobs), progress) as update, blocked():
        return _wait_all(jobs, timeout, raise_on_failure, update)


def _wait_all(
    jobs: list[JobHandle], timeout: float | None, raise_on_failure: bool, update: Callable[[int], None]
) -> list[JobStatus]:
    deadline = None if timeout is None else time.monotonic() + timeout
    final: dict[int, JobStatus] = {}
    delay = 0.001
    while True:
        pending = [i for i in range(len(jobs)) if i not in final]
        groups = waiter_groups([jobs[i] for i in pending])
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        for wait_some, indices in groups:
            # One backend: block in its wait. Several: read each at once, and back off below.
            statuses = wait_some([jobs[pending[i]] for i in indices], remaining if len(groups) == 1 else 0.0)
            for local, status in zip(indices, statuses, strict=True):
                index = pending[local]
                if status == JobStatus.FAILED and raise_on_failure:
                    jobs[index].wait(timeout=0, raise_on_failure=True)  # raises JobFailed with the job's own details
                    raise JobFailed(jobs[index].job_id, "failed")  # pragma: no cover - a backend that did not raise
                if status.finished:
                    final[index] = status
        update(len(final))
        if len(final) == len(jobs):
            return [final[i] for i in range(len(jobs))]
        if deadline is not None and time.monotonic() >= deadline:
            waiting = [summarize(jobs[i]) for i in range(len(jobs)) if i not in final]
            raise TimeoutError(
                f"wait_all: {len(waiting)} of {len(jobs)} jobs unfinished after {timeout}s: "
                + "; ".join(summary.describe() for summary in waiting)
            )
        if len(groups) > 1:
            time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)
