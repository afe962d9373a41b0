"""A Fray job handle over an Iris job (``iris.client.Job``): status, wait, logs and terminate are Iris's own.

The status is Iris's job state through :data:`~fray.iris.mapping.JOB_STATES`. Iris
retries failed tasks itself, under the two budgets Fray passed at submit; what it
does not send back is why the last attempt failed. :meth:`IrisJobHandle.wait` rebuilds
that once, when the job has FAILED: the failing task's last attempt, its exception
from the tagged log line the task wrote (``fray.iris._task``) or else its exit code and
last output, and the counts of failed and preempted attempts Iris reports, worded by
:class:`~fray.core._lifecycle.RetryBudget` like on every other backend.

The reading of a task's failure and of its output is shared with the members of actor
groups (``fray.iris.members``), whose "job" is one task of their group's job.
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

from fray.core._death import LAST_LINES as _LAST_LINES
from fray.core._lifecycle import Failure, FailureKind, RetryBudget
from fray.core.inside._logcapture import log_tail
from fray.errors import FrayError, NotFound
from fray.iris import _connect
from fray.iris._stacks import ask_tasks, task_target
from fray.iris._task import END_TAG, FAILURE_TAG, decode_failure_line, untagged
from fray.iris.mapping import fray_status, member_status
from fray.job import JobHandleBase, JobStatus, JobSummary, timeout_error
from fray.stacks import ProcessStacks

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib
    from iris.client.client import Job as IrisJob
    from iris.client.workload import JobStatus as IrisJobStatus

__all__ = ["IrisJobHandle", "JobMeta", "forget_terminated", "mark_terminated", "terminated_here"]

#: Upper bound of the backoff between state polls while waiting (Iris starts at 0.1 s).
POLL_INTERVAL = 0.25
#: How long a finished job's logs may take to reach Iris's log store (see ``fray.iris._task``).
LOG_GRACE = 10.0
#: Lines of output quoted in the message of a process that exited non-zero: as on every backend.
LAST_LINES = _LAST_LINES
#: Task states that count against the preemption budget rather than the failure budget.
LOST = frozenset({TaskState.WORKER_FAILED, TaskState.PREEMPTED})
FAILED_TASK = frozenset({TaskState.FAILED, TaskState.WORKER_FAILED, TaskState.PREEMPTED, TaskState.COSCHED_FAILED})
#: Final task states whose process ended by itself, so that it wrote its end lines.
ENDED = frozenset({TaskState.SUCCEEDED, TaskState.FAILED})
#: Job states after which every task's end lines are due.
_SETTLED_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED})
#: Iris's log sources that are not the task's own output (its environment's build).
_NOT_OUTPUT = frozenset({"build"})
_FOREVER = 10.0 * 365 * 24 * 3600

_terminated_lock = threading.Lock()
_terminated: set[str] = set()


def terminated_here(job_id: str) -> bool:
    """True if this process asked Iris to terminate ``job_id`` (its actor, if any, is then refused at once)."""
    with _terminated_lock:
        return job_id in _terminated


def mark_terminated(*job_ids: str) -> None:
    """This process terminates these jobs (or actor-group members): their actors' calls are refused from now on."""
    with _terminated_lock:
        _terminated.update(job_ids)


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
    timeout: float | None = None  #: JobRequest.timeout, which Iris enforces per task


def iris_client_of(job: IrisJob) -> IrisLib:
    """The Iris client an Iris ``Job`` was made by (it keeps it; marin's handle is built from the job alone)."""
    client: IrisLib = job._client
    return client


class IrisJobHandle(JobHandleBase):
    """A submitted job running as an Iris job: ``IrisJobHandle(job)`` wraps an ``iris.client`` ``Job``.

    ``meta`` (what Fray's request said: its label, replicas and budgets) words the job's
    failure; without it the job's name is used. Picklable: it reconnects, through the
    controller at ``address`` (or the Iris task it is unpickled in), on first use.
    """

    def __init__(self, job: IrisJob, meta: JobMeta | None = None, *, address: str | None = None) -> None:
        self._job: IrisJob | None = job
        self._job_id: str | None = None
        self._meta = meta
        self._address = address
        self._lock = threading.Lock()
        self._final: IrisJobStatus | None = None
        self._failure: Failure | None = None
        self._settled = False  # every finished task's output is in Iris's log store

    @classmethod
    def _by_id(cls, job_id: str, meta: JobMeta | None, address: str | None) -> IrisJobHandle:
        """The handle of job ``job_id``, connected on first use (how a pickled handle comes back)."""
        handle = cls(None, meta, address=address)  # the job is looked up on first use
        handle._job_id = job_id
        return handle

    def __reduce__(self) -> tuple[Any, ...]:
        return (IrisJobHandle._by_id, (self.job_id, self._meta, self._address))

    def __repr__(self) -> str:
        return f"IrisJobHandle({self.job_id!r})"

    @property
    def job_id(self) -> str:
        """Iris's id of the job, ``/user/[parent/...]name``."""
        if self._job_id is None:
            assert self._job is not None
            self._job_id = str(self._job.job_id)
        return self._job_id

    @property
    def iris_job(self) -> IrisJob:
        """Iris's ``Job`` (looked up through the controller once, for a handle that was unpickled)."""
        if self._job is None:
            self._job = _connect.iris_client(self._address).job(JobName.from_wire(self.job_id))
        return self._job

    @property
    def address(self) -> str | None:
        """``HOST:PORT`` of the controller, where the client that made the handle knew it."""
        return self._address

    @property
    def meta(self) -> JobMeta:
        """What the request asked for (name, budgets, replicas); the job's name alone when not known."""
        if self._meta is None:
            name = self.job_id.rstrip("/").rsplit("/", 1)[-1]
            self._meta = JobMeta(name, name, False, 1, 1, 0, 0)
        return self._meta

    def _iris(self) -> IrisLib:
        return iris_client_of(self.iris_job)

    def _name(self) -> JobName:
        return JobName.from_wire(self.job_id)

    def _known_finished(self) -> bool:
        """Whether a wait already saw the job finish (no call to Iris)."""
        return self._final is not None

    def _terminated_here(self) -> bool:
        return terminated_here(self.job_id)

    def status(self) -> JobStatus:
        """The job's current status: one state query to the controller (``Job.state_only()``)."""
        if self._final is not None:
            return fray_status(self._final.state)
        with iris_errors(self.job_id):
            return fray_status(self.iris_job.state_only())

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, Iris's own reason (one status query to the controller)."""
        if self._final is not None:
            return JobSummary(self.job_id, fray_status(self._final.state))
        with iris_errors(self.job_id):
            current = self.iris_job.status()
        status = fray_status(current.state)
        reason = current.pending_reason if status == JobStatus.PENDING else ""
        return JobSummary(self.job_id, status, reason or "")

    def wait(
        self, timeout: float | None = None, *, raise_on_failure: bool = True, stream_logs: bool = False
    ) -> JobStatus:
        """Block until the job finished; raise the job's failure (JobFailed) if it failed, unless told not to.

        ``stream_logs`` prints the tasks' output while waiting (Iris's ``Job.wait(stream_logs=True)``).
        """
        final = self._final
        if final is None:
            try:
                final = self.iris_job.wait(
                    timeout=_FOREVER if timeout is None else max(0.0, timeout),
                    poll_interval=POLL_INTERVAL,
                    raise_on_failure=False,
                    stream_logs=stream_logs,
                )
            except TimeoutError:
                raise timeout_error(self.info(), timeout) from None
            self._final = final
        status = fray_status(final.state)
        if status == JobStatus.FAILED and raise_on_failure:
            raise self.failure().error(self.job_id)
        return status

    def terminate(self) -> None:
        """Cancel the job (every task, and its child jobs) through Iris; a no-op for a finished job."""
        if self._final is not None:
            return
        mark_terminated(self.job_id)
        with iris_errors(self.job_id):
            if not fray_status(self.iris_job.state_only()).finished:
                self.iris_job.cancel()

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The last ``max_lines`` lines the job's tasks wrote (all of them for None or 0), in time order.

        One bounded query to Iris (asked again, for more, only when hidden lines took some of the
        places). For a finished job this first waits (briefly) until each task's last lines
        reached Iris's log store. Lines come without their newline; Fray's own are hidden.
        """
        with iris_errors(self.job_id):
            if not self._settled and self.iris_job.state_only() in _SETTLED_STATES:
                tasks = self._iris().list_tasks(self._name())
                await_end(self.iris_job, {t.task_id: t.current_attempt_number for t in tasks if t.state in ENDED})
                self._settled = True
            return read_logs(self.iris_job, max_lines)

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """Each replica's stacks (each host's, with several per replica), then its context's tasks'; ``fray.iris._stacks``.

        Asked in the tasks' own containers through Iris; empty once every task has finished.
        """
        started = time.monotonic()
        if self._final is not None:
            return ()
        with iris_errors(self.job_id):
            tasks = sorted(self._iris().list_tasks(self._name()), key=lambda task: task.task_id.task_index or 0)
        if all(member_status(task.state).finished for task in tasks):
            return ()
        hosts = self.meta.hosts_per_replica
        targets = []
        for task in tasks:
            index = task.task_id.task_index or 0
            label = f"replica {index // hosts}" + (f" host {index % hosts}" if hosts > 1 else "")
            targets.append(task_target(task, label))
        return ask_tasks(self._iris(), targets, max(0.1, timeout - (time.monotonic() - started)), locals)

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
        with self._lock, iris_errors(self.job_id):
            if self._failure is None:
                final = self._final or self.iris_job.status()
                self._failure = self._explain(final)
            return self._failure

    def _explain(self, final: IrisJobStatus) -> Failure:
        meta = self.meta
        tasks = self._iris().list_tasks(self._name())
        failed = [t for t in tasks if t.state in FAILED_TASK and t.attempts]
        if JobState(final.state) == JobState.UNSCHEDULABLE or not failed:
            reason = final.error_message or final.pending_reason or f"Iris job state {JobState(final.state).value}"
            return Failure(f"Iris could not run the job: {reason}")
        task = _root_cause(failed)
        index = task.task_id.task_index or 0
        base = task_failure(self._iris(), task, meta).in_replica(index // meta.hosts_per_replica, meta.replicas)
        lost = base.kind == FailureKind.PREEMPTION
        budget = RetryBudget(
            meta.max_retries_failure,
            meta.max_retries_preemption,
            failures=max(0, final.failure_count - (0 if lost else 1)),
            preemptions=max(0, final.preemption_count - (1 if lost else 0)),
        )
        return base.with_message(budget.exhausted_message(base))


# ----- shared with actor-group members: a task's failure and output --------------------------------


# How Iris words a task it killed at its execution timeout (iris.cluster.controller: TerminalKind.TIMEOUT).
_IRIS_TIMEOUT = "Execution timeout exceeded"


def task_failure(iris: IrisLib, task: TaskStatus, meta: JobMeta) -> Failure:
    """Why ``task`` failed: its host was lost, or its last attempt's exception, or how its process exited."""
    if TaskState(task.state) in LOST or any(a.is_worker_failure for a in task.attempts[-1:]):
        return Failure.lost(f"host lost: {task.error_message or 'the worker went away'}")
    if meta.timeout is not None and _IRIS_TIMEOUT in (task.error_message or ""):
        return Failure.timed_out(meta.timeout)  # Iris killed it at the execution timeout Fray forwarded
    attempt = task.current_attempt_number
    await_end(iris.task(task.task_id), {task.task_id: attempt})
    entries = iris.task(task.task_id).attempt(attempt).logs(tail=True, max_lines=LAST_LINES * 4)
    output = [entry.data for entry in entries if entry.source not in _NOT_OUTPUT]
    if not meta.binary:
        for line in reversed(output):
            remote = decode_failure_line(line)
            if remote is not None:
                return Failure.from_remote(remote)
    last = [text for line in output for text in _visible(line)][-LAST_LINES:]
    if task.exit_code == 0 and task.error_message:
        return Failure(f"{meta.label!r} failed: {task.error_message}")
    return Failure.from_exit(meta.label, task.exit_code, last)


def await_end(source: Any, attempts: dict[JobName, int]) -> bool:
    """Wait until the end lines of these (task, attempt)s are in Iris's log store; False after LOG_GRACE.

    ``source`` is Iris's ``Job`` or ``Task`` whose log query covers them.
    """
    if not attempts:
        return True
    deadline = time.monotonic() + LOG_GRACE
    while True:
        seen: dict[tuple[str, int], int] = {}
        for entry in source.logs(substring=END_TAG, max_lines=4 * len(attempts) + 64, tail=True):
            key = (entry.task_id.to_wire(), entry.attempt_id)
            seen[key] = seen.get(key, 0) + 1
        if all(seen.get((task.to_wire(), attempt), 0) >= 2 for task, attempt in attempts.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def read_logs(source: Any, max_lines: int | None) -> tuple[str, ...]:
    """The last ``max_lines`` output lines of an Iris ``Job`` or ``Task`` (all for None or 0), Fray's hidden.

    Asks for exactly ``max_lines`` first; only when Fray's hidden lines took some of those
    places does it ask again, for four times as many.
    """
    log_tail((), max_lines)  # the shared check: a negative or non-whole number is a ConfigError naming it
    want = max_lines if max_lines else 1_000_000
    while True:
        entries = source.logs(max_lines=want, tail=True)
        lines = [text for e in entries if e.source not in _NOT_OUTPUT for text in _visible(e.data)]
        if not max_lines or len(lines) >= max_lines or len(entries) < want:
            return log_tail(lines, max_lines)
        want *= 4


def _visible(line: str) -> list[str]:
    """``line`` as ``logs()`` shows it: nothing for Fray's own lines, the user's text before an end tag.

    The lines of a multi-process replica keep their process's ``[proc I]`` tag; Fray's own are
    hidden with it.
    """
    line = line.rstrip("\n")
    text, tag = untagged(line)
    if text.startswith(FAILURE_TAG.strip()):
        return []
    if text.endswith(END_TAG):
        text = text[: -len(END_TAG)]
        return [tag + text] if text else []
    return [line]


def _root_cause(failed: Sequence[TaskStatus]) -> TaskStatus:
    """The failed task that made the job fail: the last to fail by itself.

    When a task of a gang fails, Iris ends its siblings as COSCHED_FAILED. A sibling's attempt
    finishes when its worker confirms the kill, which can be after the task that caused it, so the
    most recent failure alone may be a sibling's (and the job would blame "replica 0" for replica
    1's exception). A sibling is blamed only if no task failed by itself.
    """
    own = [task for task in failed if task.state != TaskState.COSCHED_FAILED]
    return max(own or failed, key=_finished_ms)


def _finished_ms(task: TaskStatus) -> int:
    stamp = task.finished_at or (task.attempts[-1].finished_at if task.attempts else None)
    return stamp.epoch_ms() if stamp is not None else 0
