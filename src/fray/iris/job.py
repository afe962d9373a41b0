"""A Fray job handle over an Iris job: status, wait, logs and terminate are Iris's own.

The status is Iris's job state through :data:`~fray.iris.mapping.JOB_STATES`. Iris
retries failed tasks itself, under the two budgets Fray passed at submit; what it
does not send back is why the last attempt failed. :meth:`IrisJobHandle.wait` rebuilds
that once, when the job has FAILED: the failing task's last attempt, its exception
from the tagged log line the task wrote (``fray.iris._task``) or else its exit code and
last output, and the counts of failed and preempted attempts Iris reports, worded by
:class:`~fray.core._lifecycle.RetryBudget` like on every other backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from iris.client.workload import TaskStatus
from iris.cluster.types import JobName
from iris.resources.state import JobState, TaskState

from fray.core._lifecycle import Failure, FailureKind, RetryBudget
from fray.errors import FrayError, NotFound
from fray.iris import _connect
from fray.iris._task import END_TAG, FAILURE_TAG, decode_failure_line
from fray.iris.mapping import fray_status
from fray.job import JobStatus, JobSummary, timeout_error

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib
    from iris.client.workload import JobStatus as IrisJobStatus

__all__ = ["IrisJobHandle", "JobMeta"]

#: Upper bound of the backoff between state polls while waiting (Iris starts at 0.1 s).
POLL_INTERVAL = 0.25
#: How long a finished job's logs may take to reach Iris's log store (see ``fray.iris._task``).
LOG_GRACE = 10.0
#: Lines of output quoted in the message of a process that exited non-zero.
LAST_LINES = 10
#: Task states that count against the preemption budget rather than the failure budget.
_LOST = frozenset({TaskState.WORKER_FAILED, TaskState.PREEMPTED})
_FAILED_TASK = frozenset({TaskState.FAILED, TaskState.WORKER_FAILED, TaskState.PREEMPTED, TaskState.COSCHED_FAILED})
#: Final task states whose process ended by itself, so that it wrote its end lines.
_ENDED = frozenset({TaskState.SUCCEEDED, TaskState.FAILED})
_OUTPUT = frozenset({"stdout", "stderr"})
_FOREVER = 10.0 * 365 * 24 * 3600

_terminated_lock = threading.Lock()
_terminated: set[str] = set()


def terminated_here(job_id: str) -> bool:
    """True if this process asked Iris to terminate ``job_id`` (its actor, if any, is then refused at once)."""
    with _terminated_lock:
        return job_id in _terminated


def forget_terminated(job_id: str) -> None:
    """A new job took the id ``job_id`` (Iris reuses the ids of finished jobs)."""
    with _terminated_lock:
        _terminated.discard(job_id)


@contextmanager
def iris_errors(job_id: str) -> Iterator[None]:
    """Iris's RPC errors about one job as Fray errors: NotFound for a job Iris does not know."""
    try:
        yield
    except ConnectError as exc:
        if exc.code == Code.NOT_FOUND:
            raise NotFound(f"Iris knows no job {job_id!r}: {exc.message}") from exc
        raise FrayError(f"Iris: job {job_id!r}: {exc.code.name}: {exc.message}") from exc


@dataclass(frozen=True)
class JobMeta:
    """What a handle must know about its request to word the job's failure, wherever it is unpickled."""

    name: str
    label: str  #: the binary's command, or the callable's qualified name
    binary: bool
    replicas: int
    hosts_per_replica: int
    max_retries_failure: int
    max_retries_preemption: int


class IrisJobHandle:
    """A submitted Fray job running as an Iris job; picklable (it reconnects where it is unpickled)."""

    def __init__(self, job_id: str, meta: JobMeta, address: str | None, iris: IrisLib | None = None) -> None:
        self._job_id = job_id
        self._meta = meta
        self._address = address
        self._client = iris
        self._lock = threading.Lock()
        self._final: IrisJobStatus | None = None
        self._failure: Failure | None = None
        self._settled = False  # every finished task's output is in Iris's log store

    def __reduce__(self) -> tuple[Any, ...]:
        return (IrisJobHandle, (self._job_id, self._meta, self._address))

    def __repr__(self) -> str:
        return f"IrisJobHandle({self._job_id!r})"

    @property
    def job_id(self) -> str:
        """Iris's id of the job, ``/user/[parent/...]name``."""
        return self._job_id

    @property
    def meta(self) -> JobMeta:
        """What the request asked for (name, budgets, replicas)."""
        return self._meta

    def _iris(self) -> IrisLib:
        if self._client is None:
            self._client = _connect.iris_client(self._address)
        return self._client

    def _name(self) -> JobName:
        return JobName.from_wire(self._job_id)

    def _known_finished(self) -> bool:
        """Whether a wait already saw the job finish (no call to Iris)."""
        return self._final is not None

    def status(self) -> JobStatus:
        """The job's current status: one state query to the controller."""
        if self._final is not None:
            return fray_status(self._final.state)
        with iris_errors(self._job_id):
            return fray_status(self._iris().job_state(self._name()))

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, Iris's own reason (one status query to the controller)."""
        if self._final is not None:
            return JobSummary(self._job_id, fray_status(self._final.state))
        with iris_errors(self._job_id):
            current = self._iris().job_status(self._name())
        status = fray_status(current.state)
        reason = current.pending_reason if status == JobStatus.PENDING else ""
        return JobSummary(self._job_id, status, reason or "")

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finished; raise the job's failure (JobFailed) if it failed, unless told not to."""
        final = self._final
        if final is None:
            try:
                final = (
                    self._iris()
                    .job(self._name())
                    .wait(
                        timeout=_FOREVER if timeout is None else max(0.0, timeout),
                        poll_interval=POLL_INTERVAL,
                        raise_on_failure=False,
                    )
                )
            except TimeoutError:
                raise timeout_error(self.info(), timeout) from None
            self._final = final
        status = fray_status(final.state)
        if status == JobStatus.FAILED and raise_on_failure:
            raise self.failure().error(self._job_id)
        return status

    def terminate(self) -> None:
        """Cancel the job (every task) through Iris; a no-op for a finished job."""
        if self._final is not None:
            return
        with _terminated_lock:
            _terminated.add(self._job_id)
        with iris_errors(self._job_id):
            if not fray_status(self._iris().job_state(self._name())).finished:
                self._iris().cancel_job(self._name())

    def logs(self, max_lines: int | None = None) -> list[str]:
        """The job's stdout and stderr lines (every task and attempt, by time), the last ``max_lines`` if given.

        For a finished job this waits (briefly) until each task's last lines reached Iris's log store.
        """
        if max_lines is not None and max_lines <= 0:
            return []
        with iris_errors(self._job_id):
            return self._logs(max_lines)

    def _logs(self, max_lines: int | None) -> list[str]:
        if not self._settled and self.status() in (JobStatus.SUCCEEDED, JobStatus.FAILED):
            tasks = self._iris().list_tasks(self._name())
            self._await_end({t.task_id: t.current_attempt_number for t in tasks if t.state in _ENDED})
            self._settled = True
        job = self._iris().job(self._name())
        want = 1_000_000 if max_lines is None else max_lines + 8
        while True:
            entries = job.logs(max_lines=want, tail=True)
            lines = [text for e in entries if e.source in _OUTPUT for text in _visible(e.data)]
            # Hidden lines (failure and end lines, build output) may have taken some of the places asked for.
            if max_lines is None or len(lines) >= max_lines or len(entries) < want:
                return lines if max_lines is None else lines[-max_lines:]
            want *= 4

    def _await_end(self, attempts: dict[JobName, int]) -> bool:
        """Wait until the end lines of these (task, attempt)s are in Iris's log store; False after LOG_GRACE."""
        if not attempts:
            return True
        job = self._iris().job(self._name())
        deadline = time.monotonic() + LOG_GRACE
        while True:
            seen: dict[tuple[str, int], int] = {}
            for entry in job.logs(substring=END_TAG, max_lines=4 * len(attempts) + 64, tail=True):
                key = (entry.task_id.to_wire(), entry.attempt_id)
                seen[key] = seen.get(key, 0) + 1
            if all(seen.get((task.to_wire(), attempt), 0) >= 2 for task, attempt in attempts.items()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    @classmethod
    def _fray_wait_some(cls, jobs: Sequence[IrisJobHandle], timeout: float | None) -> list[JobStatus]:
        """Poll the jobs' states until one finished or ``timeout`` passed (``fray.wait_all`` calls this)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            statuses = [job.status() for job in jobs]
            remaining = None if deadline is None else deadline - time.monotonic()
            if any(s.finished for s in statuses) or (remaining is not None and remaining <= 0):
                return statuses
            time.sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 1.5, POLL_INTERVAL * 2)

    # ----- why a job failed ---------------------------------------------------------------------

    def failure(self) -> Failure:
        """Why the (FAILED) job failed, worded by the shared retry budget; computed once."""
        with self._lock, iris_errors(self._job_id):
            if self._failure is None:
                final = self._final or self._iris().job_status(self._name())
                self._failure = self._explain(final)
            return self._failure

    def _explain(self, final: IrisJobStatus) -> Failure:
        meta = self._meta
        tasks = self._iris().list_tasks(self._name())
        failed = [t for t in tasks if t.state in _FAILED_TASK and t.attempts]
        if JobState(final.state) == JobState.UNSCHEDULABLE or not failed:
            reason = final.error_message or final.pending_reason or f"Iris job state {JobState(final.state).value}"
            return Failure(f"Iris could not run the job: {reason}")
        task = max(failed, key=_finished_ms)
        attempt = task.current_attempt_number
        index = task.task_id.task_index or 0
        if TaskState(task.state) in _LOST or any(a.is_worker_failure for a in task.attempts[-1:]):
            base = Failure.lost(f"host lost: {task.error_message or 'the worker went away'}")
        else:
            base = self._attempt_failure(task, attempt)
        base = base.in_replica(index // meta.hosts_per_replica, meta.replicas)
        lost = base.kind == FailureKind.PREEMPTION
        budget = RetryBudget(
            meta.max_retries_failure,
            meta.max_retries_preemption,
            failures=max(0, final.failure_count - (0 if lost else 1)),
            preemptions=max(0, final.preemption_count - (1 if lost else 0)),
        )
        return base.with_message(budget.exhausted_message(base))

    def _attempt_failure(self, task: TaskStatus, attempt: int) -> Failure:
        """One failed attempt: the exception its Python code raised, else how its process exited."""
        self._await_end({task.task_id: attempt})
        entries = self._iris().task(task.task_id).attempt(attempt).logs(tail=True, max_lines=LAST_LINES * 4)
        output = [entry.data for entry in entries if entry.source in _OUTPUT]
        if not self._meta.binary:
            for line in reversed(output):
                remote = decode_failure_line(line)
                if remote is not None:
                    return Failure.from_remote(remote)
        last = [text for line in output for text in _visible(line)][-LAST_LINES:]
        if task.exit_code == 0 and task.error_message:
            return Failure(f"{self._meta.label!r} failed: {task.error_message}")
        return Failure.from_exit(self._meta.label, task.exit_code, last)


def _visible(line: str) -> list[str]:
    """``line`` as ``logs()`` shows it: nothing for Fray's own lines, the user's text before an end tag."""
    if line.startswith(FAILURE_TAG):
        return []
    if line.endswith(END_TAG):
        line = line[: -len(END_TAG)]
        return [line] if line else []
    return [line]


def _finished_ms(task: TaskStatus) -> int:
    stamp = task.finished_at or (task.attempts[-1].finished_at if task.attempts else None)
    return stamp.epoch_ms() if stamp is not None else 0
