"""The local backend's jobs: the state of one job and its attempts, and the handle users hold.

A job's status lives in a shared :class:`~fray.core._lifecycle.JobLifecycle`. Each attempt
knows what runs for it -- the :class:`~fray.core.inside._runtime.StoppableRun` of every replica
thread, the subprocess of every binary replica -- so that stopping an attempt (a
gang member failed) or the whole job (``terminate()``) reaches all of it.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from fray.core._lifecycle import JobLifecycle
from fray.core._remote import RemoteFailure, job_failed
from fray.core.inside._logcapture import LogBuffer
from fray.core.inside._runtime import StoppableRun, check_terminated
from fray.errors import ActorUnavailableError, FrayError, JobFailed
from fray.job import JobHandleBase, JobStatus, JobSummary, replicas_to_preempt, timeout_error
from fray.job_info import _current_job
from fray.local._local_stacks import job_stacks
from fray.process._procjob import ReplicaProcess
from fray.stacks import ProcessStacks

__all__ = ["STOP_GRACE", "Attempt", "LocalJob", "LocalJobHandle", "stop_deadline", "wait_for_stop"]

#: Seconds ``terminate()`` waits for a job's threads and processes to end before it returns.
STOP_GRACE = 5.0

# Every live job, so that a handle unpickled in this process finds its job again.
_JOBS: weakref.WeakValueDictionary[tuple[str, str], LocalJob] = weakref.WeakValueDictionary()
# Notified whenever any local job finishes: what LocalJobHandle._fray_wait_some blocks on.
_FINISHED = threading.Condition()


def _notify_finished(_: JobLifecycle) -> None:
    with _FINISHED:
        _FINISHED.notify_all()


class Attempt:
    """One attempt of a job: what runs for it, and the flag that stops it all.

    ``preempted`` holds the replicas that :meth:`preempt` ended: their end is a lost
    host's (preemption budget), not a failure of their code.
    """

    def __init__(self, replicas: int = 1) -> None:
        self.stopping = threading.Event()
        self.replicas = replicas
        self.preempted: set[int] = set()
        self._lock = threading.Lock()
        self._runs: dict[int, StoppableRun] = {}
        self._threads: dict[int, int] = {}  # replica index -> ident of the thread running it (for stacks())
        self._processes: dict[int, ReplicaProcess] = {}

    def stoppable(self, index: int = 0) -> StoppableRun:
        """A new :class:`StoppableRun` for replica ``index``'s thread (already stopped if the attempt is)."""
        run = StoppableRun()
        with self._lock:
            self._runs[index] = run
            self._threads[index] = threading.get_ident()  # called on the replica's own thread
            stopping = self.stopping.is_set() or index in self.preempted
        if stopping:
            run.stop()
        return run

    def add_process(self, replica: ReplicaProcess, index: int = 0) -> None:
        """Track replica ``index``'s process before it starts (it never starts if the attempt is stopping)."""
        with self._lock:
            self._processes[index] = replica
            stopping = self.stopping.is_set() or index in self.preempted
        if stopping:
            replica.kill()

    def running(self) -> tuple[dict[int, int], dict[int, ReplicaProcess]]:
        """What runs each replica now: thread idents and processes by replica index (for ``stacks()``)."""
        with self._lock:
            return dict(self._threads), dict(self._processes)

    def preempt(self, replicas: Sequence[int]) -> None:
        """End ``replicas`` as a preemption would: stop their threads, SIGKILL their processes."""
        with self._lock:
            self.preempted.update(replicas)
            runs = [self._runs[i] for i in replicas if i in self._runs]
            processes = [self._processes[i] for i in replicas if i in self._processes]
        for run in runs:
            run.stop()
        for replica in processes:
            # A lost host gives no warning: SIGKILL, not terminate()'s SIGTERM first.
            replica.kill(at_once=True)

    def stop(self) -> None:
        """Stop every replica: an asynchronous JobTerminated in each thread, SIGTERM to each process group."""
        with self._lock:
            self.stopping.set()
            runs, processes = list(self._runs.values()), list(self._processes.values())
        for run in runs:
            run.stop()
        for replica in processes:
            replica.kill()


class LocalJob:
    """One job (or actor-hosting job) of a local client: its lifecycle, log and current attempt."""

    def __init__(
        self,
        client_id: str,
        job_id: str,
        name: str,
        *,
        echo: bool,
        wake: Callable[[], None],
        max_retries_failure: int = 0,
        max_retries_preemption: int = 0,
        timeout: float | None = None,
    ) -> None:
        self.client_id = client_id
        self.job_id = job_id
        self.name = name
        self.lifecycle = JobLifecycle(job_id, max_retries_failure, max_retries_preemption, timeout=timeout)
        self.lifecycle.on_timeout = self.terminate
        self.lifecycle.add_done_callback(_notify_finished)
        self.logs = LogBuffer(echo=echo)
        self.cancel = threading.Event()  # set by terminate(); checked at every Fray call
        self.waiting_for = ""  # why the client holds the job back (no free threads), "" when it does not
        self._lock = threading.Lock()
        self._attempt: Attempt | None = None
        self._on_stop: list[Callable[[], None]] = [wake]
        #: The stacks of the actor this job hosts (set by the actor): what the job's own stacks() shows.
        self.actor_stacks: Callable[[bool], ProcessStacks] | None = None
        _JOBS[(client_id, job_id)] = self

    def new_attempt(self, replicas: int = 1) -> Attempt:
        """Start tracking a new attempt of ``replicas`` replicas (stopped from the outset if the job was terminated)."""
        attempt = Attempt(replicas)
        with self._lock:
            self._attempt = attempt
            cancelled = self.cancel.is_set()
        if cancelled:
            attempt.stop()
        return attempt

    def current_attempt(self) -> Attempt | None:
        """The attempt running now (None before the first, or once the job finished)."""
        with self._lock:
            attempt = self._attempt
        return None if self.lifecycle.finished else attempt

    def preempt(self, replica: int | None) -> None:
        """End the current attempt's ``replica`` (every replica if None) as a preemption would."""
        with self._lock:
            attempt = self._attempt
        running = self.lifecycle.status == JobStatus.RUNNING and attempt is not None
        if not running or attempt is None or attempt.stopping.is_set():
            raise FrayError(
                f"job {self.job_id!r} is {self.lifecycle.status.value} with no attempt running: nothing to preempt "
                "(an actor's job is crashed with fray.testing.kill_actor)"
            )
        attempt.preempt(replicas_to_preempt(self.job_id, attempt.replicas, replica))

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` when the job is told to stop (e.g. to stop the actor it hosts)."""
        with self._lock:
            self._on_stop.append(hook)

    def request_stop(self) -> None:
        """Tell everything running for the job to stop; returns at once."""
        with self._lock:
            self.cancel.set()
            attempt, hooks = self._attempt, list(self._on_stop)
        if attempt is not None:
            attempt.stop()
        for hook in hooks:
            hook()

    def terminate(self) -> None:
        """Stop the job: wait up to :data:`STOP_GRACE` seconds for its threads and processes to end, then
        record it STOPPED whatever still runs (the status is final once ``terminate()`` returns)."""
        if self.lifecycle.finished:
            return
        self.request_stop()
        info = _current_job.get()
        if info is not None and info.job_id == self.job_id:
            # The job terminates itself: it cannot wait for its own thread, so it stops here.
            self.lifecycle.stop()
            check_terminated()
            return
        if not self.lifecycle.wait_done(STOP_GRACE):
            # A thread inside one long C call ends when that call returns; its outcome no longer counts.
            self.lifecycle.stop()


def stop_deadline() -> float:
    """The ``time.monotonic()`` by which jobs told to stop now should have stopped."""
    return time.monotonic() + STOP_GRACE


def wait_for_stop(jobs: Sequence[LocalJob], deadline: float) -> None:
    """Wait until every one of ``jobs`` finished or the ``time.monotonic()`` ``deadline`` passed."""
    for job in jobs:
        job.lifecycle.wait_done(max(0.0, deadline - time.monotonic()))


class _FutureLifecycle:
    """A job's status read from a :class:`concurrent.futures.Future` (marin's ``LocalJobHandle(job_id, future)``)."""

    def __init__(self, job_id: str, future: concurrent.futures.Future[object]) -> None:
        self._job_id = job_id
        self._future = future
        self.stopped = False  # terminated: STOPPED from then on, whatever the future still does
        future.add_done_callback(_notify_future_done)

    @property
    def status(self) -> JobStatus:
        future = self._future
        if future.cancelled() or self.stopped:
            return JobStatus.STOPPED
        if not future.done():
            return JobStatus.RUNNING if future.running() else JobStatus.PENDING
        return JobStatus.FAILED if future.exception() is not None else JobStatus.SUCCEEDED

    @property
    def finished(self) -> bool:
        return self.stopped or self._future.done()

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        if not self.stopped:
            concurrent.futures.wait([self._future], timeout)
        if not self.finished:
            raise TimeoutError(f"job {self._job_id!r} still running after {timeout}s")
        status = self.status
        if status == JobStatus.FAILED and raise_on_failure:
            exc = self._future.exception()
            assert exc is not None
            failure = RemoteFailure.capture(exc)
            raise job_failed(self._job_id, failure.summary, failure, original=exc)
        return status


class _FutureJob:
    """The part of a :class:`LocalJob` a handle reads, for a job that is a future run elsewhere."""

    client_id = ""

    def __init__(self, job_id: str, future: concurrent.futures.Future[object]) -> None:
        if not isinstance(job_id, str) or not isinstance(future, concurrent.futures.Future):
            raise TypeError(
                f"LocalJobHandle(job_id, future) takes a str and a concurrent.futures.Future, got {job_id!r}, {future!r}"
            )
        self.job_id = job_id
        self.name = job_id
        self.lifecycle = _FutureLifecycle(job_id, future)
        self.logs = LogBuffer()
        self._future = future

    def terminate(self) -> None:
        """Cancel the future if it has not started; a running one cannot be stopped from outside, so the
        job reads STOPPED from now on and the future's outcome is ignored."""
        if not self._future.done():
            self._future.cancel()
            self.lifecycle.stopped = True
            _notify_future_done(None)

    def preempt(self, replica: int | None) -> None:
        raise FrayError(f"job {self.job_id!r} is a plain future: it cannot be preempted")


def _notify_future_done(_: object) -> None:
    with _FINISHED:
        _FINISHED.notify_all()


class LocalJobHandle(JobHandleBase):
    """Handle to a job of a :class:`~fray.local.LocalClient`. Picklable within the process that created it.

    ``LocalJobHandle(job_id, future)`` (marin's constructor) wraps any
    :class:`concurrent.futures.Future` as a job: SUCCEEDED when it returns, FAILED when it
    raises, STOPPED when cancelled. Such a handle is not picklable.
    """

    def __init__(self, job_id: LocalJob | str, future: concurrent.futures.Future[object] | None = None) -> None:
        # The first argument is the client's LocalJob, or (marin's form) the id of the job ``future`` runs.
        self._job: LocalJob | _FutureJob
        if isinstance(job_id, LocalJob):
            self._job = job_id
        else:
            self._job = _FutureJob(job_id, future)  # type: ignore[arg-type]  # checked there

    def __repr__(self) -> str:
        return f"LocalJobHandle({self.job_id!r}, {self.status().value})"

    def __reduce__(self) -> tuple[object, ...]:
        if isinstance(self._job, _FutureJob):
            raise TypeError(f"LocalJobHandle({self.job_id!r}, future) wraps a future and cannot be pickled")
        return (_restore_job_handle, (self._job.client_id, self.job_id))

    @property
    def job_id(self) -> str:
        """The job's id: ``{name}-{8 hex}``, prefixed by the parent job's id for child jobs."""
        return self._job.job_id

    def status(self) -> JobStatus:
        """The job's current status."""
        return self._job.lifecycle.status

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, why (waiting for free threads, or for its retry)."""
        status = self.status()
        reason = ""
        if status == JobStatus.PENDING:
            reason = getattr(self._job, "waiting_for", "") or getattr(self._job.lifecycle, "pending_reason", "")
        return JobSummary(self.job_id, status, reason)

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise JobFailed if it failed and ``raise_on_failure``."""
        try:
            return self._job.lifecycle.wait(timeout, raise_on_failure=raise_on_failure)
        except TimeoutError as exc:
            if isinstance(exc, JobFailed):  # the job's own TimeoutError, not the wait's
                raise
            raise timeout_error(self.info(), timeout) from None

    def terminate(self) -> None:
        """Stop the job: a callable job's threads by raising :class:`~fray.errors.JobTerminated` in each.

        The exception is raised with ``PyThreadState_SetAsyncExc``: it lands at the thread's
        next Python instruction, and again at every Fray call the job makes. A thread
        blocked inside one C call (``time.sleep(600)``, a socket read, a lock) stops only
        when that call returns. This waits up to :data:`STOP_GRACE` seconds for every
        thread and process to end; either way the job reads STOPPED when it returns (as on
        every backend), and a thread still inside a C call ends when that call returns,
        its outcome ignored. Binary jobs' process groups get SIGTERM, then SIGKILL.
        """
        self._job.terminate()

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The job's output lines (all attempts, stdout and stderr interleaved)."""
        return self._job.logs.lines(max_lines)

    def _fray_preempt(self, replica: int | None) -> None:
        """End a replica's thread (or process) as a preemption would (see :func:`fray.testing.preempt`)."""
        self._job.preempt(replica)

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of each replica (its thread, or its processes) and of the job's running tasks.

        A replica on a thread of this process shows that thread; a replica run as processes
        is asked over its stack socket (:mod:`fray.core.inside._stacks`). Empty once the job finished,
        and for a job wrapping a plain future (its thread is unknown).
        """
        if isinstance(self._job, _FutureJob):
            return ()
        if self._job.actor_stacks is not None:  # the job hosts an actor: its stacks are the actor's threads
            return (self._job.actor_stacks(locals),)
        attempt = self._job.current_attempt()
        if attempt is None:
            return ()
        threads, processes = attempt.running()
        return job_stacks(self.job_id, attempt.replicas, threads, processes, timeout, locals)

    @classmethod
    def _fray_wait_some(cls, jobs: Sequence[LocalJobHandle], timeout: float | None) -> list[JobStatus]:
        """Block until one of ``jobs`` finished or ``timeout`` passed; the statuses (for ``wait_all``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with _FINISHED:
            while not any(job._job.lifecycle.finished for job in jobs):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                _FINISHED.wait(remaining)
        return [job.status() for job in jobs]


def _restore_job_handle(client_id: str, job_id: str) -> LocalJobHandle:
    job = _JOBS.get((client_id, job_id))
    if job is None:
        raise ActorUnavailableError(
            f"local job {job_id!r} lives in another process; handles of the local backend only work in the "
            "process that created them (use a cluster backend to share jobs between processes)"
        )
    return LocalJobHandle(job)
