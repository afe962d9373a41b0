"""What every job handle of the Ray backend shares: :class:`RayJobHandle`.

The job kinds are in :mod:`fray.ray.jobs` (callable jobs and the job hosting an actor),
:mod:`fray.ray.binary` and :mod:`fray.ray.tpu`. A handle can only be used in the process
that submitted its job: unpickling one there gives back the live handle.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from fray.core._lifecycle import JobLifecycle
from fray.core.inside._logcapture import LogBuffer, log_tail
from fray.errors import FrayError
from fray.job import JobHandleBase, JobStatus, JobSummary, timeout_error
from fray.ray._board import BOARD
from fray.ray._pending import placement_reason

__all__ = ["LIVE", "RayJobHandle"]

#: Every job handle of this process by id, so that an unpickled handle is the live one.
LIVE: weakref.WeakValueDictionary[str, RayJobHandle] = weakref.WeakValueDictionary()

# Seconds ``_fray_wait_some`` waits for more jobs to finish after the first one did (see there).
_GATHER = 0.02


class RayJobHandle(JobHandleBase):
    """Handle to a job submitted through a :class:`~fray.ray.RayClient`.

    ``wait`` blocks without polling for callable jobs (it waits on Ray itself); binary
    jobs are watched through Ray's job API, actor jobs through the actor's state.
    """

    def __init__(
        self,
        job_id: str,
        name: str,
        max_retries_failure: int = 0,
        max_retries_preemption: int = 0,
        timeout: float | None = None,
    ) -> None:
        self._job_id = job_id
        self._name = name
        self._lifecycle = JobLifecycle(job_id, max_retries_failure, max_retries_preemption, timeout=timeout)
        self._lifecycle.on_timeout = self.terminate  # dropped by the lifecycle when the job ends
        self._output: LogBuffer | None = None  # made at the first line: most quick jobs print nothing
        # Reentrant: the lifecycle calls back (self._notify) from whichever thread ends the job.
        self._lock = threading.RLock()
        self._on_board = False  # tells the board when it moves on (see _join_board)
        self._moved = 0  # the board's generation when it last did
        self._stopping = False  # terminate() began: nothing of this job may start any more
        LIVE[job_id] = self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._job_id!r}, {self._lifecycle.status.value})"

    @property
    def _log(self) -> LogBuffer:
        """The job's own output, all attempts (finished replicas' output, Fray's notes)."""
        if self._output is None:
            with self._lock:
                if self._output is None:
                    self._output = LogBuffer(echo=False)
        return self._output

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_job_handle, (self._job_id,))

    @property
    def job_id(self) -> str:
        """``{name}-{8 hex}``, prefixed by the parent job's id (and ``/``) for child jobs."""
        return self._job_id

    @property
    def finished(self) -> bool:
        """True once the job's status is final."""
        return self._lifecycle.finished

    def status(self) -> JobStatus:
        """The job's current status."""
        return self._lifecycle.status

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, why: its request against Ray's nodes, or its retry."""
        status = self.status()
        reason = ""
        if status == JobStatus.PENDING:
            needs = self._needs()
            if needs is not None:
                with contextlib.suppress(Exception):  # Ray's state API unreachable: the retry reason, if any
                    reason = placement_reason(*needs)
            if not reason and self._lifecycle.pending_reason:
                reason = self._lifecycle.pending_reason.splitlines()[0]
        return JobSummary(self._job_id, status, reason)

    def _needs(self) -> tuple[dict[str, float], int] | None:
        """What one replica asks Ray for (a bundle), and how many replicas start together; None if unknown."""
        return None

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise JobFailed if it failed and ``raise_on_failure``."""
        if not self._lifecycle.wait_done(timeout):
            raise timeout_error(self.info(), timeout)
        return self._lifecycle.result(raise_on_failure=raise_on_failure)

    def terminate(self) -> None:
        """Stop every replica of the job (a no-op once it finished)."""
        raise NotImplementedError

    def _begin_stop(self) -> bool:
        """Mark the job as stopping; False if it already finished (then there is nothing to stop)."""
        with self._lock:
            if self._lifecycle.finished:
                return False
            self._stopping = True
            return True

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The job's output lines so far, all attempts, stdout and stderr interleaved."""
        kept = self._output.lines() if self._output is not None else ()
        return log_tail([*kept, *self._live_logs()], max_lines)

    def _live_logs(self) -> list[str]:
        return []

    # ----- waiting for many jobs at once ------------------------------------------------------

    def _notify(self) -> None:
        if self._on_board:
            BOARD.moved(self)

    def _join_board(self) -> None:
        """From now on, tell the board whenever this job may have moved on (its end included)."""
        if self._on_board:
            return
        self._on_board = True
        # Only now, not for every job: most are waited on one by one and never need it.
        self._lifecycle.add_done_callback(lambda _: self._notify())

    def _settle(self) -> JobStatus:
        """Act on whatever Ray reported since the job last looked (cheap when nothing did)."""
        return self._lifecycle.status

    def _running_refs(self) -> list[Any] | None:
        """The refs of the current attempt's unfinished replicas (None: the job has none to wait on in Ray)."""
        return None

    def _ref_completed(self, _data: Any) -> None:
        """One of its replicas completed: the job may have moved on."""
        self._notify()

    @classmethod
    def _fray_wait_some(cls, jobs: Sequence[RayJobHandle], timeout: float | None) -> list[JobStatus]:
        """Block until one of ``jobs`` finished or ``timeout`` passed; their statuses (for ``fray.wait_all``).

        No polling: each job tells the board when it may have moved on (a replica
        completed, an attempt started, the job finished), and only those jobs are
        looked at again.

        Once one job finished, the others that finish within :data:`_GATHER` seconds are
        returned with it (at once if one failed or all finished): each return costs the
        caller a pass over every job it waits for, and a pass per finished job made
        ``wait_all`` quadratic in the number of jobs.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in jobs:
            if not job._on_board:
                job._join_board()
        seen = -1  # at first every job: some moved before they joined
        distinct = len({id(job) for job in jobs})
        finished: set[int] = set()
        gather_until: float | None = None  # once a job finished: when to return at the latest
        while True:
            generation = BOARD.generation
            failed = False
            for job in jobs:
                if job._moved > seen:
                    status = job._settle()
                    if status.finished:
                        finished.add(id(job))
                        failed = failed or status == JobStatus.FAILED
            if failed or len(finished) == distinct:
                break
            if finished and gather_until is None:
                gather_until = time.monotonic() + _GATHER
            until = deadline
            if gather_until is not None and (until is None or gather_until < until):
                until = gather_until
            remaining = None if until is None else until - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            _block(jobs, generation, remaining)
            seen = generation
        return [job._lifecycle.status for job in jobs]


#: How long one lending ray.wait blocks before the board is looked at again (a new attempt's refs).
_LEND_SLICE = 1.0


def _block(jobs: Sequence[RayJobHandle], generation: int, remaining: float | None) -> None:
    """Wait for the board to move past ``generation`` (or ``remaining`` seconds).

    Inside a Ray task, Ray lends the task's CPU only while its main thread blocks in
    ``ray.get``/``ray.wait`` (a background thread's lends nothing): a job waiting there on its
    own child jobs would otherwise hold its CPU, and on a full cluster they would never start.
    So there, when every job waited on has replicas running in Ray, the wait is a ``ray.wait``
    on their refs, in slices (a retry's new refs are picked up at the next).
    """
    refs = _lendable_refs(jobs)
    if not refs:
        BOARD.wait(generation, remaining)
        return
    import ray

    budget = _LEND_SLICE if remaining is None else max(0.0, min(_LEND_SLICE, remaining))
    ready, _ = ray.wait(list(refs), num_returns=1, timeout=budget, fetch_local=False)
    for ref in ready:
        refs[ref]._ref_completed(None)  # the completion callback may come later: this job moved now


def _lendable_refs(jobs: Sequence[RayJobHandle]) -> dict[Any, RayJobHandle]:
    if threading.current_thread() is not threading.main_thread() or not _in_ray_task():
        return {}
    out: dict[Any, RayJobHandle] = {}
    for job in jobs:
        if job._lifecycle.finished:
            continue
        refs = job._running_refs()
        if not refs:
            return {}  # a job Ray cannot wake us for (an actor, a binary job, between attempts): the board waits
        out.update((ref, job) for ref in refs)
    return out


def _in_ray_task() -> bool:
    import ray

    try:
        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:
        return False


def _restore_job_handle(job_id: str) -> RayJobHandle:
    job = LIVE.get(job_id)
    if job is None:
        raise FrayError(
            f"job {job_id!r} was submitted by another process; a Ray job handle can only be used in the process "
            "that submitted it (pass actor handles, or the data the job needs, instead)"
        )
    return job
