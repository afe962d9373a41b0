"""A job's life, written once for every backend.

* :data:`TRANSITIONS` is the job state machine (the cluster's gang retry, RUNNING →
  PENDING, included); :func:`check_transition` enforces it.
* :class:`Failure` is why one attempt failed, in one form: a user exception (as a
  :class:`~fray.core._remote.RemoteFailure`), a process exit code, or a lost host.
* :class:`RetryBudget` holds the two budgets (``failure``, ``preemption``), decides
  whether an attempt is retried, and words the outcome -- the same words on every
  backend.
* :class:`ActorRestartBudget` counts an actor's restarts and its calls' retries, and
  words the outcome, for every backend that restarts actors itself.
* :class:`JobLifecycle` is the thread-safe, finish-once state of one job for the
  backends that drive jobs from the client process (local, Ray, Monarch). The Fray
  cluster keeps the same states in SQLite and uses the same table and budget.

::

    PENDING ──► RUNNING ──► SUCCEEDED
       │  ▲        │  ├───► FAILED
       │  └────────┘  └───► STOPPED
       ├──────────────────► FAILED    (cannot start)
       └──────────────────► STOPPED   (terminated before it ran)

RUNNING → PENDING is a retry: the attempt failed (or its host was lost) and the
budget allows another; every replica of a gang goes back together.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from fray.core._deadlines import Deadlines
from fray.core._death import describe_exit, last_lines
from fray.core._lending import blocked
from fray.core._remote import RemoteFailure, job_failed
from fray.errors import IllegalTransition, JobFailed, JobTimeout, timeout_message
from fray.job import JobStatus

__all__ = [
    "TRANSITIONS",
    "ActorRestartBudget",
    "Failure",
    "FailureKind",
    "JobLifecycle",
    "RetryBudget",
    "check_transition",
    "exit_status",
]

P, R, S, F, X = (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)

#: Every allowed change of a job's status. Final statuses have no way out.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    P: frozenset({R, F, X}),
    R: frozenset({P, S, F, X}),
    S: frozenset(),
    F: frozenset(),
    X: frozenset(),
}


def exit_status(exc: BaseException) -> int | None:
    """The exit status a callable job asked for with ``sys.exit``; None if ``exc`` is no ``SystemExit``.

    A callable job ends as a program would: ``sys.exit()`` and ``sys.exit(0)`` are a
    success (status 0), ``sys.exit(3)`` a failure with status 3, and ``sys.exit("why")``
    a failure with status 1. Every backend that runs a callable replica applies this.
    """
    if not isinstance(exc, SystemExit):
        return None
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def _remote_exit_status(remote: RemoteFailure) -> int | None:
    """:func:`exit_status` of a failure shipped from another process (read from its header, nothing unpickled)."""
    if remote.type_name != "SystemExit":
        return None
    try:
        return int(remote.message or 0)
    except ValueError:
        return 1


def check_transition(old: JobStatus, new: JobStatus, what: str = "job") -> None:
    """Raise :class:`~fray.errors.IllegalTransition` unless ``old → new`` is in :data:`TRANSITIONS`."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{what}: {old.value} -> {new.value} is not allowed")


class FailureKind(StrEnum):
    """Which budget a failed attempt draws on."""

    FAILURE = "failure"  #: the job's own code failed (an exception, a non-zero exit)
    PREEMPTION = "preemption"  #: the host went away (preempted VM, lost worker or node)
    TIMEOUT = "timeout"  #: the job outlived its JobRequest.timeout: final, never retried


@dataclass(frozen=True)
class Failure:
    """Why one attempt of a job failed.

    ``message`` is the one-line reason ("ValueError: boom", "'train' exit code 3; last
    output: ..."); ``remote`` the user's exception when Python code raised; ``original``
    the live exception object where the failure happened in this very process.
    """

    message: str
    kind: FailureKind = FailureKind.FAILURE
    remote: RemoteFailure | None = None
    exit_code: int | None = None
    original: BaseException | None = field(default=None, compare=False, repr=False)
    timeout: float | None = None
    """The limit a TIMEOUT failure exceeded, in seconds."""
    last_lines: tuple[str, ...] = ()
    """The replica's last output lines (at most :data:`fray.core._death.LAST_LINES`), where a process died."""
    peak_rss: int | None = None
    """The most memory (bytes resident) the replica was seen holding, where it was measured."""

    @classmethod
    def from_exception(cls, exc: BaseException, kind: FailureKind = FailureKind.FAILURE) -> Failure:
        """An attempt whose Python code raised ``exc`` (captured here, where it was raised).

        A ``sys.exit(code)`` keeps its exit status as :attr:`exit_code`, as a program's would.
        """
        remote = RemoteFailure.capture(exc)
        return cls(remote.summary, kind, remote, exit_code=exit_status(exc), original=exc)

    @classmethod
    def from_remote(cls, remote: RemoteFailure, kind: FailureKind = FailureKind.FAILURE) -> Failure:
        """An attempt whose Python code raised in another process."""
        return cls(remote.summary, kind, remote, exit_code=_remote_exit_status(remote))

    @classmethod
    def from_exit(
        cls,
        command: str,
        exit_code: int,
        last_output: list[str] | None = None,
        *,
        oom_limit: int | None = None,
        used: int | None = None,
        peak_rss: int | None = None,
    ) -> Failure:
        """A process that exited non-zero, was killed by a signal, or by Fray's memory limit (``oom_limit``).

        The words are :func:`fray.core._death.describe_exit`'s, the same on every backend.
        """
        tail = last_lines(last_output or ())
        words = describe_exit(exit_code, oom_limit=oom_limit, used=used, peak_rss=peak_rss, stderr_tail=tail)
        return cls(f"{command!r} {words}", FailureKind.FAILURE, exit_code=exit_code, last_lines=tail, peak_rss=peak_rss)

    def with_last_lines(self, last_output: list[str] | tuple[str, ...], peak_rss: int | None = None) -> Failure:
        """The same failure carrying the replica's last output lines (its message unchanged: an exception says why)."""
        return replace(self, last_lines=last_lines(last_output), peak_rss=peak_rss or self.peak_rss)

    @classmethod
    def timed_out(cls, timeout: float) -> Failure:
        """A job stopped because it ran longer than its ``JobRequest.timeout``: ``wait()`` raises JobTimeout."""
        return cls(timeout_message(timeout), FailureKind.TIMEOUT, exit_code=None, original=None, timeout=timeout)

    @classmethod
    def lost(cls, reason: str) -> Failure:
        """An attempt whose host went away: counts against the preemption budget."""
        return cls(reason, FailureKind.PREEMPTION)

    def in_replica(self, index: int, count: int) -> Failure:
        """The same failure, saying which replica of a gang it came from."""
        if count <= 1:
            return self
        return replace(self, message=f"replica {index} of {count}: {self.message}")

    def with_message(self, message: str) -> Failure:
        """The same failure with another one-line reason."""
        return replace(self, message=message)

    def error(self, job_id: str) -> JobFailed:
        """The exception ``wait()`` raises: a fresh one per call (raising one object from many threads tangles)."""
        if self.kind == FailureKind.TIMEOUT and self.timeout is not None:
            return JobTimeout(job_id, self.timeout)
        error = job_failed(job_id, self.message, self.remote, original=self.original, exit_code=self.exit_code)
        error.last_output = self.last_lines
        return error

    def encode(self) -> bytes:
        """Data-only bytes (JSON, then the remote failure's own encoding) for stores and wires."""
        fields: dict[str, object] = {"message": self.message, "kind": self.kind.value, "exit_code": self.exit_code}
        if self.timeout is not None:
            fields["timeout"] = self.timeout
        if self.last_lines:
            fields["last_lines"] = list(self.last_lines)
        if self.peak_rss is not None:
            fields["peak_rss"] = self.peak_rss
        head = json.dumps(fields).encode()
        tail = self.remote.encode() if self.remote is not None else b""
        return len(head).to_bytes(4, "big") + head + tail

    @classmethod
    def decode(cls, data: bytes) -> Failure:
        """The failure :meth:`encode` wrote; ``ValueError`` if ``data`` is not one."""
        length = int.from_bytes(data[:4], "big")
        head = json.loads(bytes(data[4 : 4 + length]))
        tail = bytes(data[4 + length :])
        exit_code, timeout = head.get("exit_code"), head.get("timeout")
        return cls(
            str(head["message"]),
            FailureKind(head.get("kind", "failure")),
            RemoteFailure.decode(tail) if tail else None,
            int(exit_code) if exit_code is not None else None,
            timeout=float(timeout) if timeout is not None else None,
            last_lines=tuple(str(line) for line in head.get("last_lines", ())),
            peak_rss=int(head["peak_rss"]) if head.get("peak_rss") is not None else None,
        )


@dataclass(frozen=True)
class RetryBudget:
    """The two retry budgets of a job and how much of each is used."""

    max_failure: int
    max_preemption: int
    failures: int = 0
    preemptions: int = 0

    @property
    def attempts(self) -> int:
        """Attempts made so far, counting the current one."""
        return self.failures + self.preemptions + 1

    def limit(self, kind: FailureKind) -> int:
        """How many retries ``kind`` allows in all."""
        return self.max_failure if kind == FailureKind.FAILURE else self.max_preemption

    def used(self, kind: FailureKind) -> int:
        """How many retries of ``kind`` were used."""
        return self.failures if kind == FailureKind.FAILURE else self.preemptions

    def charge(self, kind: FailureKind) -> RetryBudget:
        """The budget after one more failed attempt of ``kind``."""
        if kind == FailureKind.FAILURE:
            return replace(self, failures=self.failures + 1)
        return replace(self, preemptions=self.preemptions + 1)

    def decide(self, failure: Failure) -> tuple[RetryBudget, Failure | None, str]:
        """Charge ``failure`` to its budget.

        Returns the new budget, then either ``None`` and the reason the job is pending
        again (retry), or the final failure (its message says the budget ran out) and "".
        """
        after = self.charge(failure.kind)
        used, limit = after.used(failure.kind), after.limit(failure.kind)
        if used <= limit:
            return after, None, f"retrying after {failure.kind.value} {used} of {limit} allowed: {failure.message}"
        return after, failure.with_message(self.exhausted_message(failure)), ""

    def exhausted_message(self, failure: Failure) -> str:
        """The final reason of a job whose last attempt failed with ``failure`` and may not be retried."""
        limit = self.limit(failure.kind)
        if limit == 0 and self.attempts == 1:
            return failure.message
        return (
            f"{failure.message} (gave up after {self.attempts} attempts: {failure.kind.value} retries "
            f"exhausted, {limit} allowed; {self.failures} failure and {self.preemptions} preemption retries used)"
        )


@dataclass(frozen=True)
class ActorRestartBudget:
    """How many times an actor may still be restarted, and which of its calls may be sent again.

    Only the death of the actor's process (or host) draws on it: an actor whose
    constructor raised, that ended itself, or that was terminated is never restarted.
    """

    max_restarts: int
    max_task_retries: int = 0
    restarts: int = 0

    def decide(self, actor: str, reason: str) -> tuple[ActorRestartBudget, bool, str]:
        """The actor's process died of ``reason``: the new budget, whether to restart, and the words for it.

        The words are the reason the actor is restarting, or the final reason it is dead
        (what every later call's :class:`~fray.errors.ActorDiedError` says).
        """
        if self.restarts < self.max_restarts:
            after = replace(self, restarts=self.restarts + 1)
            return after, True, f"actor {actor!r} died ({reason}); restart {after.restarts} of {self.max_restarts}"
        if self.max_restarts == 0:
            return self, False, f"actor {actor!r} died ({reason}); it allows no restarts (ActorConfig.max_restarts=0)"
        return (
            self,
            False,
            f"actor {actor!r} died ({reason}) after {self.restarts} restarts; all {self.max_restarts} allowed "
            "restarts are used up (ActorConfig.max_restarts)",
        )

    def retries_call(self, retries_so_far: int) -> bool:
        """True if a call in flight when the actor died, already sent again ``retries_so_far`` times, is sent again."""
        return retries_so_far < self.max_task_retries


class JobLifecycle:
    """The thread-safe, finish-once state of one job driven from the client process.

    Every status change goes through :data:`TRANSITIONS`; once final, nothing changes it
    again (a job terminated while its last attempt was failing stays STOPPED).

    ``timeout`` (``JobRequest.timeout``, seconds) starts counting when the job first
    starts RUNNING; a retry does not reset it. When it runs out before the job finished,
    ``on_timeout()`` is called -- the backend's ``terminate``, which stops the replicas and
    calls :meth:`stop` -- and the job ends FAILED with :meth:`Failure.timed_out` instead of
    STOPPED (``wait()`` raises :class:`~fray.errors.JobTimeout`).
    """

    def __init__(
        self,
        job_id: str,
        max_retries_failure: int = 0,
        max_retries_preemption: int = 0,
        *,
        timeout: float | None = None,
    ) -> None:
        self.job_id = job_id
        self.timeout = timeout
        #: Stops the job's replicas when its timeout runs out (set by the backend; called once). Dropped
        #: once the job finished: it is usually the handle's own ``terminate``, and the cycle it makes
        #: (handle -> lifecycle -> handle) would leave every finished job to the cyclic garbage collector.
        self.on_timeout: Callable[[], object] = _no_timeout
        self._timed_out: Failure | None = None
        self._lock = threading.Lock()
        # Made by the first thread that blocks on the job: most jobs are never waited on that way
        # (Ray waits on its own futures), and an Event costs a fifth of a Ray job's handle.
        self._done: threading.Event | None = None
        self._finished = False
        self._status = JobStatus.PENDING
        self._failure: Failure | None = None
        self._budget = RetryBudget(max_retries_failure, max_retries_preemption)
        self._attempt = 0
        self._pending_reason = ""
        self._callbacks: list[Callable[[JobLifecycle], None]] = []

    def __repr__(self) -> str:
        return f"JobLifecycle({self.job_id!r}, {self._status.value}, attempt={self._attempt})"

    @property
    def status(self) -> JobStatus:
        """The current status."""
        return self._status

    @property
    def attempt(self) -> int:
        """The current attempt, from 0."""
        return self._attempt

    @property
    def failure(self) -> Failure | None:
        """The final failure of a FAILED job (else None)."""
        return self._failure

    @property
    def budget(self) -> RetryBudget:
        """The retry budgets and what was used of them."""
        return self._budget

    @property
    def pending_reason(self) -> str:
        """Why the job is PENDING again (after a retry), else ""."""
        return self._pending_reason

    @property
    def finished(self) -> bool:
        """True once the status is final."""
        return self._finished

    def _move(self, new: JobStatus) -> bool:
        # Caller holds the lock. A finished job never moves: that is the "finish once" rule.
        if self._status.finished:
            return False
        check_transition(self._status, new, f"job {self.job_id!r}")
        self._status = new
        return True

    def start(self) -> bool:
        """PENDING → RUNNING; False if the job already finished (e.g. was terminated meanwhile)."""
        with self._lock:
            if self._status == JobStatus.RUNNING:
                return True
            ok = self._move(JobStatus.RUNNING)
            if ok:
                self._pending_reason = ""
            first = ok and self._attempt == 0
        if first and self.timeout is not None:
            _DEADLINES.schedule(time.monotonic() + self.timeout, self._time_out)
        return ok

    def succeed(self) -> bool:
        """End as SUCCEEDED (if nothing ended it first)."""
        return self._finish(JobStatus.SUCCEEDED, None)

    def stop(self) -> bool:
        """End as STOPPED (if nothing ended it first); FAILED with the timeout once the timeout stopped it."""
        if self._timed_out is not None:
            return self._finish(JobStatus.FAILED, self._timed_out)
        return self._finish(JobStatus.STOPPED, None)

    def _time_out(self) -> None:
        # The deadline thread: stop the job (the backend's terminate calls stop(), which records the timeout).
        if self._finished or self.timeout is None:
            return
        self._timed_out = Failure.timed_out(self.timeout)
        try:
            self.on_timeout()
        finally:
            self.stop()  # in case the backend's terminate left it to a thread that is gone

    def fail(self, failure: Failure) -> bool:
        """End as FAILED without consulting the budget (the job cannot run at all)."""
        return self._finish(JobStatus.FAILED, failure)

    def attempt_failed(self, failure: Failure) -> bool:
        """The current attempt failed: True if it is retried (the job is PENDING again), else the job FAILED.

        Returns False, and changes nothing, if the job already finished (terminated meanwhile).
        """
        with self._lock:
            if self._status.finished:
                return False
            budget, final, reason = self._budget.decide(failure)
            self._budget = budget
            if final is None:
                self._move(JobStatus.PENDING)
                self._attempt += 1
                self._pending_reason = reason
                return True
        self._finish(JobStatus.FAILED, final)
        return False

    def run_attempts(
        self,
        run_attempt: Callable[[int], Failure | None],
        log: Callable[[str], object],
        *,
        admit: Callable[[], bool] = lambda: True,
        release: Callable[[], object] = lambda: None,
    ) -> None:
        """The one retry loop of a job driven from this process, for every backend that drives one.

        Until an attempt succeeds, the budget runs out or the job is stopped: ``admit()``
        (False: the job was stopped while it waited for room), then the job is RUNNING and
        ``run_attempt(attempt)`` returns the attempt's failure or None; ``release()`` gives
        back what ``admit`` took, whether the attempt ran or not. A failure is charged
        to the budget (:meth:`attempt_failed`) and both it and the retry are written to the
        job's log with ``log``. A job terminated during an attempt stays STOPPED, and an error
        of Fray's own ends the job FAILED rather than leave it hanging.
        """
        try:
            while True:
                if not admit():
                    self.stop()
                    return
                try:
                    if not self.start():  # terminated while it was admitted
                        return
                    attempt = self._attempt
                    failure = run_attempt(attempt)
                finally:
                    release()
                if self.finished:  # terminated meanwhile: STOPPED stands
                    return
                if failure is None:
                    self.succeed()
                    return
                log(f"[fray] attempt {attempt + 1} failed: {failure.message}\n")
                if not self.attempt_failed(failure):
                    return
                log(f"[fray] {self._pending_reason}\n")
        except BaseException as exc:
            self.fail(Failure.from_exception(exc).with_message(f"internal error: {exc!r}"))

    def _finish(self, status: JobStatus, failure: Failure | None) -> bool:
        with self._lock:
            if not self._move(status):
                return False
            self._failure = failure
            self._finished = True  # after the failure: whoever sees the job finished can read it
            callbacks, self._callbacks = self._callbacks, []
            done = self._done
            self.on_timeout = _no_timeout
        if done is not None:
            done.set()
        for callback in callbacks:
            callback(self)
        return True

    def add_done_callback(self, callback: Callable[[JobLifecycle], None]) -> None:
        """Call ``callback(self)`` once the job finished (at once if it has)."""
        with self._lock:
            if not self._status.finished:
                self._callbacks.append(callback)
                return
        callback(self)

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until the job finished or ``timeout`` passed; True if it finished."""
        if self._finished:
            return True
        with self._lock:
            if self._finished:
                return True
            if self._done is None:
                self._done = threading.Event()
            done = self._done
        with blocked():  # inside a job, waiting on a job it submitted lends its CPU (fray.core._lending)
            return done.wait(timeout)

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """What ``JobHandle.wait`` does: block, then raise JobFailed for a failed job (unless told not to)."""
        if not self.wait_done(timeout):
            raise TimeoutError(f"job {self.job_id!r} still {self._status.value} after {timeout}s")
        return self.result(raise_on_failure=raise_on_failure)

    def result(self, *, raise_on_failure: bool = True) -> JobStatus:
        """The final status of a finished job; raises JobFailed for a failed one (unless told not to)."""
        status = self._status
        if status == JobStatus.FAILED and raise_on_failure and self._failure is not None:
            raise self._failure.error(self.job_id)
        return status


def _no_timeout() -> None:
    """What a job without a timeout (or finished) does when its timeout runs out: nothing."""


_DEADLINES = Deadlines("fray-job-timeouts")
