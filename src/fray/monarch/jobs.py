"""Jobs of the Monarch backend (the seed's ClusterContext part): processes on this host, driven from the client.

Each job is a :class:`MonarchJob`: its :class:`~fray.core._lifecycle.JobLifecycle`, its
log, and the replicas of its current attempt, each a
:class:`~fray.process._procjob.ReplicaProcess` in its own session. One thread per job runs
the shared retry loop (:meth:`~fray.core._lifecycle.JobLifecycle.run_attempts`) over its
attempts: all replicas start together, and the first failure ends the attempt. Callables run with :mod:`fray.process._jobmain`, so their exception comes back as
the user's own class. Inside a job ``FRAY_CLIENT_SPEC`` names this backend and the
``FRAY_JOB_*`` variables its identity.

:class:`MonarchJobHandle` is the one handle class for jobs and for the job of each
actor (anything with a lifecycle, logs and a way to terminate it).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from fray.core._codepickle import dumps
from fray.core._lifecycle import Failure, JobLifecycle
from fray.core.inside._logcapture import LogBuffer
from fray.errors import ActorUnavailableError, ConfigError
from fray.job import (
    BinaryEntrypoint,
    CallableEntrypoint,
    EnvironmentConfig,
    JobHandleBase,
    JobInfo,
    JobRequest,
    JobStatus,
    JobSummary,
    timeout_error,
)
from fray.monarch._stacks import actor_stacks, job_stacks
from fray.monarch.actors import _RECORDS, ActorRecord
from fray.process._process import KILL_GRACE
from fray.process._procjob import ReplicaProcess, callable_argv
from fray.stacks import ProcessStacks

__all__ = ["MonarchJob", "MonarchJobHandle"]

# The jobs this process submitted, by id: a job handle unpickled here finds its job.
_JOBS: weakref.WeakValueDictionary[str, MonarchJob] = weakref.WeakValueDictionary()


class _Tracked(Protocol):
    """What a job handle needs of the thing it tracks: a job's or an actor's state in this process."""

    job_id: str
    lifecycle: JobLifecycle

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]: ...

    def terminate(self) -> None: ...


class MonarchJob:
    """One submitted job in the client process: lifecycle, log, and the replicas of the running attempt."""

    def __init__(
        self,
        job_id: str,
        request: JobRequest,
        namespace: str,
        client_spec: str,
        workdir: Path,
        *,
        echo: bool = False,
    ) -> None:
        self.job_id = job_id
        self.request = request
        self.namespace = namespace
        self.client_spec = client_spec
        self.workdir = workdir
        self.lifecycle = JobLifecycle(
            job_id, request.max_retries_failure, request.max_retries_preemption, timeout=request.timeout_seconds
        )
        self.lifecycle.on_timeout = self.terminate
        self.log = LogBuffer(echo=echo)
        self.environment = request.environment or EnvironmentConfig()
        self._lock = threading.Lock()
        self._replicas: list[ReplicaProcess] = []
        self._threads: list[threading.Thread] = []
        self._payload: Path | None = None
        entry = request.entrypoint
        if isinstance(entry, CallableEntrypoint):
            # Pickled once, here: every replica and attempt runs the same bytes.
            self._payload = workdir / "payload.pkl"
            self._payload.write_bytes(dumps(entry))
        _JOBS[job_id] = self

    def __repr__(self) -> str:
        return f"MonarchJob({self.job_id!r}, {self.lifecycle.status.value})"

    def start(self) -> None:
        """Run the job on its own thread; returns at once."""
        threading.Thread(target=self._run, name=f"fray-job-{self.job_id}", daemon=True).start()

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """All replicas' output lines, every attempt, and Fray's notes about retries."""
        return self.log.lines(max_lines)

    def terminate(self) -> None:
        """End the job STOPPED and kill the replicas of its attempt; returns once they have exited."""
        if not self.lifecycle.stop():
            return
        with self._lock:
            replicas, threads = list(self._replicas), list(self._threads)
        for replica in replicas:
            replica.kill()
        for thread in threads:  # their output is all in the log once they are done
            thread.join(KILL_GRACE + 5)

    def replica_pids(self) -> list[tuple[int | None, int]]:
        """Each replica's process id (None: not started) and processes per task; empty once finished.

        With several processes per task the process is the ranks' supervisor and its children the ranks.
        """
        if self.lifecycle.finished:
            return []
        with self._lock:
            return [(replica.pid, replica.processes) for replica in self._replicas]

    # ----- the retry loop ----------------------------------------------------------------------

    def _run(self) -> None:
        self.lifecycle.run_attempts(self._run_attempt, self.log.write)

    def _run_attempt(self, attempt: int) -> Failure | None:
        """Run every replica of one attempt; the first failure kills the rest (a gang lives and dies together)."""
        count = self.request.replicas
        replicas = [self._replica(index, count, attempt) for index in range(count)]
        outcomes: queue.SimpleQueue[tuple[int, Failure | None]] = queue.SimpleQueue()
        threads = [
            threading.Thread(
                target=lambda i=index, r=replica: outcomes.put((i, _run_replica(r))),
                name=f"fray-{self.job_id}-r{index}",
                daemon=True,
            )
            for index, replica in enumerate(replicas)
        ]
        with self._lock:  # terminate() sees either none of this attempt's replicas or all of them, started
            if self.lifecycle.finished:
                return None
            self._replicas, self._threads = replicas, threads
            for thread in threads:
                thread.start()
        first: Failure | None = None
        for _ in range(count):
            index, failure = outcomes.get()
            if failure is not None and first is None:
                first = failure.in_replica(index, count)
                for replica in replicas:
                    replica.kill()
        for thread in threads:
            thread.join()
        return first

    def _replica(self, index: int, count: int, attempt: int) -> ReplicaProcess:
        info = JobInfo(
            self.job_id,
            self.request.name,
            index,
            count,
            self.namespace,
            attempt,
            "cpu",
            priority_band=self.request.priority,
        )
        env, cwd = self.environment.env_vars, self.environment.workspace
        entry = self.request.entrypoint
        processes = self.request.processes_per_task  # run under fray.process._ranks when > 1
        if isinstance(entry, BinaryEntrypoint):
            return ReplicaProcess(
                entry.argv,
                info,
                self.client_spec,
                self.log,
                label=entry.command,
                user_env=env,
                cwd=cwd,
                processes=processes,
            )
        assert isinstance(entry, CallableEntrypoint) and self._payload is not None
        failure = self.workdir / f"failure-{attempt}-{index}"
        return ReplicaProcess(
            callable_argv(self._payload, failure),
            info,
            self.client_spec,
            self.log,
            label=getattr(entry.callable, "__qualname__", type(entry.callable).__name__),
            user_env=env,
            cwd=cwd,
            failure_path=failure,
            processes=processes,
        )


def _run_replica(replica: ReplicaProcess) -> Failure | None:
    try:
        return replica.run()
    except Exception as exc:  # a bug in Fray itself must still end the attempt, not hang it
        return Failure.from_exception(exc)


class MonarchJobHandle(JobHandleBase):
    """Handle to a job (or an actor's job) of a :class:`~fray.monarch.MonarchClient`.

    Picklable; it works in the process that created the job (the job's state lives
    there). Elsewhere, every method raises :class:`~fray.errors.ActorUnavailableError`.
    """

    def __init__(self, tracked: _Tracked | None, job_id: str) -> None:
        self._tracked = tracked
        self._job_id = job_id

    def __repr__(self) -> str:
        status = self._tracked.lifecycle.status.value if self._tracked is not None else "elsewhere"
        return f"MonarchJobHandle({self._job_id!r}, {status})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_job_handle, (self._job_id,))

    def _get(self) -> _Tracked:
        if self._tracked is None:
            raise ActorUnavailableError(
                f"Monarch job {self._job_id!r} was submitted by another process; job handles of the Monarch "
                "backend work in the process whose client submitted the job (actor handles work anywhere on "
                "the host)"
            )
        return self._tracked

    @property
    def job_id(self) -> str:
        """``{name}-{8 hex}``, prefixed by the parent job's id and ``/`` for jobs submitted inside a job."""
        return self._job_id

    def status(self) -> JobStatus:
        """The job's current status."""
        return self._get().lifecycle.status

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, why (Monarch starts a job at once: only a retry waits)."""
        lifecycle = self._get().lifecycle
        status = lifecycle.status
        retry = lifecycle.pending_reason if status == JobStatus.PENDING else ""
        reason = retry.splitlines()[0] if retry else ""
        return JobSummary(self._job_id, status, reason)

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise :class:`~fray.errors.JobFailed` if it failed (unless told not to)."""
        lifecycle = self._get().lifecycle
        if not lifecycle.wait_done(timeout):
            raise timeout_error(self.info(), timeout)
        return lifecycle.result(raise_on_failure=raise_on_failure)

    def terminate(self) -> None:
        """Stop the job (every replica, and every process it started). A no-op for a finished job."""
        self._get().terminate()

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The job's output lines so far (the last ``max_lines`` if given)."""
        return self._get().logs(max_lines)

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """Each replica's stacks, then its running job-context tasks' (an actor's job: the actor's); ``fray.monarch._stacks``."""
        tracked = self._get()
        if isinstance(tracked, MonarchJob):
            return job_stacks(tracked.replica_pids(), timeout, locals)
        if not isinstance(tracked, ActorRecord) or tracked.lifecycle.finished:
            return ()
        return (actor_stacks(f"actor {tracked.name!r}", tracked.pid, None, timeout, locals),)

    def _fray_preempt(self, replica: int | None) -> None:
        """Refused by name: see :func:`fray.testing.preempt` and ``docs/testing.md``."""
        raise ConfigError(
            f"preempt({self!r}): the Monarch backend does not preempt replicas on purpose: Monarch (0.7.0) exits "
            "the client's process about 30 s after a process that had called an actor dies abruptly (its actors' "
            "supervision messages become undeliverable); test preemption on local, fray:// or Ray"
        )

    @classmethod
    def _fray_wait_some(cls, jobs: Sequence[MonarchJobHandle], timeout: float | None) -> list[JobStatus]:
        """Block until one of ``jobs`` finished or ``timeout`` passed; their statuses (for :func:`fray.wait_all`)."""
        tracked = [job._get() for job in jobs]
        event = threading.Event()
        for item in tracked:
            item.lifecycle.add_done_callback(lambda _: event.set())
        event.wait(timeout)
        return [item.lifecycle.status for item in tracked]


def _restore_job_handle(job_id: str) -> MonarchJobHandle:
    tracked: _Tracked | None = _JOBS.get(job_id) or _RECORDS.get(job_id)
    return MonarchJobHandle(tracked, job_id)
