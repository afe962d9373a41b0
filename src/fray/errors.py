"""The exceptions Fray raises.

Every error Fray raises on purpose derives from :class:`FrayError`, so callers can
catch Fray's failures without catching their own bugs. Errors about bad input also
derive from the matching built-in (``ValueError``, ``TypeError``, ``KeyError``,
``TimeoutError``) so that generic code that validates input keeps working.

An exception raised by user code in another job, task or actor call reaches the
caller in one form on every backend (built by :mod:`fray.core._remote`): an instance of
:class:`JobFailed` (for ``job.wait()``) or :class:`RemoteError` (for an actor call)
that is *also* an instance of the user's own exception class, so both
``except ValueError:`` and ``except fray.JobFailed:`` work. Its ``traceback_text``
holds the remote traceback, which is also chained as ``__cause__`` so that an
uncaught error prints where it happened.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActorContextError",
    "ActorDiedError",
    "ActorUnavailableError",
    "AuthenticationError",
    "CallNotSentError",
    "CapacityUnavailable",
    "ConfigError",
    "ControllerUnreachable",
    "FrayError",
    "IllegalTransition",
    "JobAlreadyExists",
    "JobFailed",
    "JobTerminated",
    "JobTimeout",
    "LeaseError",
    "LeaseExpired",
    "NotFound",
    "ObjectLostError",
    "PermissionDenied",
    "ProtocolError",
    "ProviderError",
    "QueueAlreadyExists",
    "QuotaExceeded",
    "RemoteError",
    "RemoteTraceback",
    "RpcTimeoutError",
    "SerializationError",
    "StorageError",
    "StoreError",
    "TaskLostError",
    "VmNotFound",
]


class FrayError(Exception):
    """Base class of every error raised by Fray itself."""


class ConfigError(FrayError, ValueError):
    """A value given to Fray is malformed: a resource size, a device, a client spec, a job name.

    The message says what was given, what is accepted, and how to fix it.
    """


class SerializationError(FrayError, TypeError):
    """An argument, entrypoint or result cannot be pickled to cross a process boundary."""


class _Remote(FrayError):
    """What :class:`JobFailed` and :class:`RemoteError` share: the remote side of a failure.

    ``cause`` is the original exception when it could be rebuilt on this side,
    ``traceback_text`` the remote traceback (user frames only), ``type_name`` the
    qualified name of the original type (empty when the failure was not an exception,
    e.g. a binary job's exit code).
    """

    type_name: str = ""
    traceback_text: str = ""
    cause: BaseException | None = None

    def __str__(self) -> str:
        return str(getattr(self, "_text", "") or (self.args[0] if self.args else ""))

    def __reduce__(self) -> tuple[object, ...]:
        # The plain form, with the cause pickled as it is. Instances built by fray.core._remote
        # (those that are also the user's class) are pickled by the reducer it registers
        # with copyreg, which pickle consults before this method.
        if isinstance(self, JobFailed):
            fields = (self.job_id, self._reason, self.cause, self.traceback_text, self.exit_code, self.type_name)
            return (_plain_job_failed, fields)
        assert isinstance(self, RemoteError)
        return (_plain_remote_error, (self.type_name, self._reason, self.traceback_text, self.cause))


class RemoteTraceback(Exception):
    """The traceback of an exception raised elsewhere, chained as ``__cause__`` so that printing shows it."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class JobFailed(_Remote, RuntimeError):
    """A job ended in the FAILED state; raised by ``wait()`` and ``wait_all()``.

    When the job's Python code raised, the instance is also of that exception's class
    (``except ValueError`` works) and the original exception is both ``cause`` and
    ``__cause__`` (its own ``__cause__`` holds the remote traceback when it crossed a process
    boundary). ``status`` is the job's final status (marin's ``JobFailed(job_id, status)``),
    ``exit_code`` the process exit code for binary jobs, ``message`` the reason without the
    job id, ``last_output`` the failed replica's last output lines where its process died
    (at most 20; a signal, an exit code or "out of memory" is in ``message``). It is a
    ``RuntimeError`` too, as marin's is.
    """

    def __init__(
        self,
        job_id: str,
        status: str = "failed",
        *,
        message: str = "",
        cause: BaseException | None = None,
        traceback_text: str = "",
        exit_code: int | None = None,
        type_name: str = "",
    ) -> None:
        # marin builds JobFailed(job_id, status); Fray's earlier form gave the message second:
        # a string that names no status is that message.
        if status not in _STATUS_NAMES:
            status, message = "failed", message or str(status)
        message = message or f"status {status}"
        super().__init__(f"job {job_id!r} failed: {message}")
        self._init_job(job_id, message, cause=cause, traceback_text=traceback_text, exit_code=exit_code)
        self.status = str(status)
        self.type_name = type_name or (_qualified(type(cause)) if cause is not None else "")

    def _init_job(
        self,
        job_id: str,
        message: str,
        *,
        cause: BaseException | None,
        traceback_text: str,
        exit_code: int | None,
    ) -> None:
        self.job_id = job_id
        self.message = self._reason = message
        self.cause = cause
        self.traceback_text = traceback_text
        self.exit_code = exit_code
        #: The failed replica's last output lines, where its process died (empty where none were kept).
        self.last_output: tuple[str, ...] = ()
        # The job's final status, as a plain string: it equals the JobStatus member (a StrEnum).
        self.status = "failed"
        self._text = f"job {job_id!r} failed: {message}"
        _chain(self, cause, traceback_text)


class JobTimeout(JobFailed):
    """A job ran longer than its ``JobRequest.timeout`` after it first started: it was stopped and is FAILED.

    The clock starts when the job's first attempt starts running and a retry does not
    reset it (the limit bounds the job, not each attempt). ``timeout`` is the limit in seconds.
    """

    def __init__(self, job_id: str, timeout: float) -> None:
        super().__init__(job_id, "failed", message=timeout_message(timeout))
        self.timeout = timeout

    def __reduce__(self) -> tuple[object, ...]:
        return (JobTimeout, (self.job_id, self.timeout))


def timeout_message(timeout: float) -> str:
    """The one wording of a job stopped by its timeout (``JobTimeout``, ``fray job status``, the dashboard)."""
    return f"ran longer than its timeout of {timeout:g}s (JobRequest.timeout) and was stopped"


class RemoteError(_Remote):
    """An exception raised by user code on the other side of an actor call (or a task).

    The instance is also of the original exception's class when that class exists here;
    otherwise it is a plain ``RemoteError`` naming the type, message and traceback.
    """

    def __init__(
        self, type_name: str, message: str, traceback_text: str = "", *, cause: BaseException | None = None
    ) -> None:
        super().__init__(f"{type_name}: {message}")
        self._init_remote(type_name, message, traceback_text, cause)

    def _init_remote(self, type_name: str, message: str, traceback_text: str, cause: BaseException | None) -> None:
        self.type_name = type_name
        self.message = self._reason = message
        self.traceback_text = traceback_text
        self.cause = cause
        self._text = f"{_short(type_name)}: {message}" if message else _short(type_name)
        _chain(self, cause, traceback_text)


_STATUS_NAMES = frozenset({"pending", "running", "succeeded", "failed", "stopped"})


def _chain(err: BaseException, cause: BaseException | None, traceback_text: str) -> None:
    """Make the original exception ``err.__cause__`` (Ray's and marin's rule), with the remote traceback under it.

    Code that inspects ``__cause__`` finds the user's own exception; printing the error still
    shows where it was raised: the remote traceback is chained under the original when the
    original crossed a process boundary (it has no traceback of its own here).
    """
    if cause is None:
        if traceback_text:
            err.__cause__ = RemoteTraceback(traceback_text)
        return
    if traceback_text and cause.__traceback__ is None and cause.__cause__ is None:
        cause.__cause__ = RemoteTraceback(traceback_text)
    err.__cause__ = cause


def _plain_job_failed(
    job_id: str,
    message: str,
    cause: BaseException | None,
    traceback_text: str,
    exit_code: int | None,
    type_name: str,
) -> JobFailed:
    return JobFailed(
        job_id, message=message, cause=cause, traceback_text=traceback_text, exit_code=exit_code, type_name=type_name
    )


def _plain_remote_error(type_name: str, message: str, traceback_text: str, cause: BaseException | None) -> RemoteError:
    return RemoteError(type_name, message, traceback_text, cause=cause)


def _qualified(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _short(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


class JobAlreadyExists(FrayError, RuntimeError):
    """A job or actor with this name is already live where the backend requires unique names.

    ``job_name`` is the name that clashed; ``handle`` the live job's handle when the backend
    knows it (``submit(request, adopt_existing=False)`` found it), else None; ``reason`` says
    where the clash was and what to do. marin's constructor, ``JobAlreadyExists(job_name,
    handle=None)``, and its ``RuntimeError`` base, are kept.
    """

    job_name: str = ""
    handle: Any = None
    reason: str = ""

    def __init__(self, job_name: str, handle: Any = None, *, reason: str = "") -> None:
        self.job_name = job_name
        self.handle = handle
        self.reason = reason
        super().__init__(f"job {job_name!r} already exists" + (f": {reason}" if reason else ""))

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_already_exists, (self.job_name, self.handle, self.reason))


def _rebuild_already_exists(job_name: str, handle: Any, reason: str) -> JobAlreadyExists:
    return JobAlreadyExists(job_name, handle, reason=reason)


class JobTerminated(FrayError):
    """Raised inside a job (at its next Fray call) after the job was terminated from outside."""


class ActorUnavailableError(FrayError, RuntimeError):
    """The actor cannot serve the call: it could not be reached, was replaced by a new instance, or is dead.

    marin's contract (and its ``RuntimeError`` base): every failure to reach an actor is one
    of these, so ``except ActorUnavailableError`` also catches :class:`ActorDiedError`, the
    permanent kind. When raised for a call already sent, the call may or may not have run;
    :class:`CallNotSentError` says it did not.
    """


class ActorDiedError(ActorUnavailableError):
    """The actor is gone for good: its constructor raised, its process died, or it was shut down.

    Calls to it will never succeed; ``__cause__`` holds the original error when known
    (and travels with it when it is pickled, e.g. from an actor's process). A call made
    after the death was known never ran.
    """

    def __str__(self) -> str:
        # The message as given, also when the instance is of the user's class too (KeyError would quote it).
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_actor_died, (self.args, self.__cause__))


def _rebuild_actor_died(args: tuple[object, ...], cause: BaseException | None) -> ActorDiedError:
    err = ActorDiedError(*args)
    err.__cause__ = cause
    return err


class ActorContextError(FrayError, RuntimeError):
    """:func:`fray.current_actor` was used where it has no meaning.

    Raised when it is called outside an actor's constructor or method (in a plain job
    or in the driver), and when an actor asks to end twice (``exit()`` or ``fail()``
    after one of them was already called).
    """


class RpcTimeoutError(ActorUnavailableError, TimeoutError):
    """A call did not complete within ``RpcOptions.timeout``; if it was sent, it may or may not have run."""


class CallNotSentError(ActorUnavailableError):
    """The call provably never reached the actor: it did not run, and sending it again is safe.

    Every other :class:`ActorUnavailableError` about a call in flight means it may or may not have run.
    """


class ControllerUnreachable(CallNotSentError):
    """A client that has never reached its Fray controller gave up after a few seconds (nothing was sent).

    Its message names the address and how to fix it: start a cluster (``fray cluster up``)
    or point ``FRAY_CLIENT_SPEC`` at a running one. A client that has reached its
    controller once keeps retrying through a later outage (a restart) instead.
    """


class AuthenticationError(FrayError):
    """The peer did not prove it holds the cluster token (or refused ours).

    Raised by a client whose server refused its token (or has none while the client
    does); the call was not sent. Set the same ``FRAY_TOKEN`` on both sides.
    """


class PermissionDenied(FrayError, PermissionError):
    """The caller's credential does not allow this (e.g. stopping another user's job, registering a worker)."""


class ProtocolError(FrayError):
    """The peer sent bytes that are not a valid Fray frame: bad magic, version, or sizes."""


class StoreError(FrayError):
    """The cluster's store refused an operation (see the message for why)."""


class StorageError(StoreError):
    """The store's file could not be written (disk full, read-only, I/O error); nothing of the operation was.

    The message names the file and the free space on its filesystem. A controller that
    hits it stays up, read-only, and says so in its ``health()`` until writes work again.
    """


class IllegalTransition(StoreError):
    """A state change that the job, task or worker state machine does not allow."""


class NotFound(StoreError, KeyError):
    """No job, task or worker with that id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TaskLostError(FrayError):
    """A task did not finish because what ran it went away: its worker process died (killed, crashed,
    out of memory), or its context was shut down before it ran.

    Raised by ``get`` of the task's ref (and of refs of tasks that took it as an argument).
    Fray does not run a task twice behind your back: submit it again if it is safe to.
    """


class ObjectLostError(FrayError):
    """An object of a job context is gone: its owner (the job's process or object server) ended or freed it."""


class QueueAlreadyExists(FrayError):
    """``create_queue(name)`` for a name that already has a queue.

    Pass the existing :class:`~fray.queue.Queue` handle along (handles are picklable), use
    ``create_queue(name, exist_ok=True)`` to attach to it, or pick another name.
    """


class LeaseError(FrayError):
    """``done(lease)`` for a lease that is no longer held: already done, or unknown to the queue."""


class LeaseExpired(LeaseError):
    """``done(lease)`` after the lease timed out: the item went back to the queue for redelivery.

    Another consumer may process (or have processed) the item again; make the work
    idempotent, or use a longer ``lease_timeout``.
    """


class ProviderError(FrayError):
    """A VM provider (the cloud behind the autoscaler, or the simulated one) refused or failed a call.

    The autoscaler never lets one escape into scheduling: it records the error against the
    scale group (``fray status`` shows it) and tries again later or elsewhere.
    """


class QuotaExceeded(ProviderError):
    """The provider refused to create VMs because the project's quota for them is used up.

    The autoscaler blocks the scale group for a while and routes its demand to the next
    group by priority. Raise the quota, or add a group with another machine type or zone.
    """


class CapacityUnavailable(ProviderError):
    """The provider has no capacity for the requested VMs right now (a stocked-out zone or type)."""


class VmNotFound(ProviderError, KeyError):
    """No VM or slice with that id exists at the provider (already deleted, or never created)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
