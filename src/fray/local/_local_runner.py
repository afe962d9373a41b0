"""How the local backend runs a job: its one retry loop, thread slots, and the replicas of an attempt.

:class:`JobRunner` is what :class:`fray.local.LocalClient` hands each job to: a
callable replica runs on a thread of this process (its env vars overlaid on the
shared ``os.environ``, see :class:`_EnvOverlay`), a binary replica as a subprocess in
its own process group. An attempt ends when all its replicas have; the first failure
stops the others (a gang lives and dies together).

A replica of several processes (``JobRequest.processes_per_task``) is a subprocess
whatever its entrypoint: the supervisor of :mod:`fray.process._ranks` running the
binary, or the pickled callable with :mod:`fray.process._jobmain` (as on Monarch), N
times. :meth:`JobRunner.check` refuses at submit what the backend cannot run: GPUs
that ``processes_per_task`` does not divide, a callable that would not pickle for
them, and ``EnvironmentConfig.extras`` whose requirements are not installed here.
"""

from __future__ import annotations

import collections
import contextvars
import os
import queue
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from fray.actor_context import bind_actor
from fray.client import Client, _bind_client
from fray.cluster.server.envs._project import check_extras
from fray.core._codepickle import dumps
from fray.core._lending import lending_to
from fray.core._lifecycle import Failure, exit_status
from fray.core._private_files import write_private
from fray.core._serialization import call_parts, check_picklable
from fray.core.inside._logcapture import capture_to
from fray.core.inside._runtime import terminating_on
from fray.errors import ConfigError
from fray.job import BinaryEntrypoint, CallableEntrypoint, EnvironmentConfig, JobInfo, JobRequest
from fray.job_info import _current_job
from fray.local._local_job import Attempt, LocalJob
from fray.process._procjob import ReplicaProcess, callable_argv
from fray.process._ranks import check_processes
from fray.resources import CpuConfig, GpuConfig, ResourceConfig, device_name

__all__ = ["JobRunner", "check_extras", "local_device"]


class _EnvOverlay:
    """Environment variables of running callable jobs, applied to the shared ``os.environ``.

    Threads share one environment, so two concurrent jobs may not disagree on a
    variable: the second one fails with a clear error instead of silently changing
    what the first one sees.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, int, str | None]] = {}  # name -> (value, holders, value before)

    def acquire(self, env: dict[str, str]) -> None:
        with self._lock:
            for key, value in env.items():
                held = self._held.get(key)
                if held is not None and held[0] != value:
                    raise ConfigError(
                        f"env var {key}={value!r} conflicts with {key}={held[0]!r} of another running local job; "
                        "in-process jobs share one environment (use binary jobs or another backend to isolate them)"
                    )
            for key, value in env.items():
                held = self._held.get(key)
                if held is None:
                    self._held[key] = (value, 1, os.environ.get(key))
                    os.environ[key] = value
                else:
                    self._held[key] = (value, held[1] + 1, held[2])

    def release(self, env: dict[str, str]) -> None:
        with self._lock:
            for key in env:
                value, holders, before = self._held[key]
                if holders > 1:
                    self._held[key] = (value, holders - 1, before)
                    continue
                del self._held[key]
                if before is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = before


_ENV = _EnvOverlay()


def _replica_main(
    outcomes: queue.SimpleQueue[tuple[int, Failure | None]],
    index: int,
    runner: Callable[[Callable[[], Failure | None]], Failure | None],
    target: Callable[[], Failure | None],
) -> None:
    try:
        outcome = runner(target)
    except BaseException as exc:  # a bug in Fray itself must still end the attempt
        outcome = Failure.from_exception(exc).with_message(f"internal error: {exc!r}")
    outcomes.put((index, outcome))


def _process_replica(
    job: LocalJob,
    attempt: Attempt,
    request: JobRequest,
    environment: EnvironmentConfig,
    info: JobInfo,
    payload: Path | None,
) -> Failure | None:
    """A replica as a subprocess: a binary, or (``payload``: the pickled entrypoint) a callable's processes."""
    entry = request.entrypoint
    env = dict(environment.env_vars)
    if isinstance(entry, BinaryEntrypoint):
        argv, label, failure = entry.argv, entry.command, None
    else:
        assert payload is not None
        failure = payload.parent / f"failure-{info.attempt}-{info.replica_index}"
        argv = callable_argv(payload, failure)
        label = getattr(entry.callable, "__qualname__", type(entry.callable).__name__)
        env.setdefault("PYTHONPATH", _import_path())
    replica = ReplicaProcess(
        argv,
        info,
        "local",
        job.logs,
        label=label,
        user_env=env,
        cwd=environment.workspace,
        failure_path=failure,
        processes=request.processes_per_task,
        gpus=_gpus(request.resources),
    )
    attempt.add_process(replica, info.replica_index)
    return replica.run()


def _in_threads(request: JobRequest) -> bool:
    """Whether the job's replicas run on threads of this process (else each is a subprocess)."""
    return isinstance(request.entrypoint, CallableEntrypoint) and request.processes_per_task == 1


def _import_path() -> str:
    """This process's import path as a ``PYTHONPATH``: a callable's processes unpickle it as this process would.

    The interpreter's own directories (the standard library, site-packages) are left to the
    child's interpreter, which finds them itself.
    """
    own = tuple(os.path.join(prefix, "") for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    kept = [p for p in paths if not os.path.join(p, "").startswith(own)]
    return os.pathsep.join(dict.fromkeys([*kept, *filter(None, [os.environ.get("PYTHONPATH")])]))


def _gpus(resources: ResourceConfig) -> int:
    """The GPUs a replica reports holding (see :func:`local_device`), shared out among its processes."""
    choices = resources.device_choices
    if any(isinstance(d, CpuConfig) for d in choices) or not isinstance(choices[0], GpuConfig):
        return 0
    return choices[0].count


class JobRunner:
    """Runs a local client's jobs: at most ``max_threads`` callable replicas at once (None: no bound).

    ``client`` is what ``current_client()`` returns inside its jobs; ``namespace()``, called in
    the submitter's context, the namespace its jobs run in.
    """

    def __init__(self, client: Client, namespace: Callable[[], str], max_threads: int | None) -> None:
        self._client = client
        self._namespace = namespace
        self._max_threads = max_threads
        self._slots = threading.Condition()
        self._busy_threads = 0
        self._waiting = collections.Counter[int]()  # jobs waiting for slots, by priority band

    def check(self, request: JobRequest) -> None:
        """Refuse, at submit, what this backend cannot run of ``request`` (see the module docstring)."""
        check_processes(request)
        check_extras(request.name, request.environment or EnvironmentConfig(), "local")
        entry = request.entrypoint
        if isinstance(entry, CallableEntrypoint) and not _in_threads(request):
            # Its processes run the callable from a pickle, whatever LocalClient(check_pickling) says.
            check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))

    def wake(self) -> None:
        """Wake jobs waiting for thread slots (a job told to stop may be one of them)."""
        with self._slots:
            self._slots.notify_all()

    def run_job(
        self, job: LocalJob, request: JobRequest, environment: EnvironmentConfig, context: contextvars.Context
    ) -> None:
        """The job's one retry loop: attempts until one succeeds, the budget runs out, or the job is stopped."""
        namespace = context.run(self._namespace)
        # A callable run as processes is pickled there once (every replica and attempt runs the same bytes).
        files = None if _in_threads(request) else Path(tempfile.mkdtemp(prefix="fray-local-job-"))

        def attempt(_: int) -> Failure | None:
            failure = self._run_attempt(job, request, environment, context, namespace, files)
            if job.cancel.is_set():
                job.lifecycle.stop()
            return failure

        try:
            job.lifecycle.run_attempts(
                attempt,
                job.logs.write,
                admit=lambda: self._acquire_slots(job, request),
                release=lambda: self._release_slots(request),
            )
        finally:
            if files is not None:
                shutil.rmtree(files, ignore_errors=True)

    def _threads_needed(self, request: JobRequest) -> int:
        return request.replicas if _in_threads(request) else 0

    def _acquire_slots(self, job: LocalJob, request: JobRequest) -> bool:
        # Dispatch order is by priority band: while a job of a better band waits for slots, no
        # job of a worse band takes any (jobs of one band fill free slots as they fit, as before).
        need = self._threads_needed(request)
        band = request.priority or 2
        with self._slots:
            self._waiting[band] += 1
            try:
                while not job.cancel.is_set() and self._max_threads is not None:
                    free = self._max_threads - self._busy_threads
                    better = sum(self._waiting[b] for b in range(1, band))
                    if need <= free and (need == 0 or not better):
                        break
                    job.waiting_for = (
                        f"needs {need} thread(s) at once; {free} of LocalClient(max_threads={self._max_threads}) "
                        "are free, the others run earlier jobs"
                        if need > free
                        else f"waits behind {better} job(s) of a better priority band"
                    )
                    self._slots.wait()  # woken by a finished attempt, a job of a better band starting, or terminate()
            finally:
                self._waiting[band] -= 1
                self._slots.notify_all()  # a worse band may go now
            job.waiting_for = ""
            if job.cancel.is_set():
                return False
            self._busy_threads += need
        return True

    def _release_slots(self, request: JobRequest) -> None:
        with self._slots:
            self._busy_threads -= self._threads_needed(request)
            self._slots.notify_all()

    def _lend_slot(self) -> None:
        with self._slots:
            self._busy_threads -= 1
            self._slots.notify_all()

    def _reclaim_slot(self) -> None:
        with self._slots:
            self._busy_threads += 1  # at once, even past max_threads: a resumed replica never waits (as on Ray)

    def _run_attempt(
        self,
        job: LocalJob,
        request: JobRequest,
        environment: EnvironmentConfig,
        context: contextvars.Context,
        namespace: str,
        files: Path | None,
    ) -> Failure | None:
        """Run all replicas of one attempt until every one has exited; the first failure, or None."""
        count = request.replicas
        entry = request.entrypoint
        payload = None
        if files is not None and isinstance(entry, CallableEntrypoint):
            payload = files / "payload.pkl"
            try:
                if not payload.exists():
                    write_private(payload, dumps(entry))
            except Exception as exc:  # checked at submit; what still will not pickle fails the attempt
                return Failure.from_exception(exc)
        attempt = job.new_attempt(count)
        outcomes: queue.SimpleQueue[tuple[int, Failure | None]] = queue.SimpleQueue()
        threads = []
        for index in range(count):
            info = JobInfo(
                job.job_id,
                request.name,
                index,
                count,
                namespace,
                job.lifecycle.attempt,
                local_device(request.resources),
                priority_band=request.priority,
            )
            target: Callable[[], Failure | None]
            if isinstance(entry, CallableEntrypoint) and payload is None:
                target = partial(self._callable_replica, job, attempt, entry, environment, info)
                runner = context.copy().run
            else:
                target = partial(_process_replica, job, attempt, request, environment, info, payload)
                runner = contextvars.Context().run
            thread = threading.Thread(
                target=_replica_main, args=(outcomes, index, runner, target), name=f"fray-{job.job_id}-r{index}"
            )
            thread.daemon = True
            thread.start()
            threads.append(thread)
        first: Failure | None = None
        for _ in range(count):
            index, failure = outcomes.get()
            if index in attempt.preempted:
                # fray.testing.preempt ended it: whatever it raised, its host was "lost".
                failure = Failure.lost("preempted (fray.testing.preempt)")
            if failure is not None and first is None and not attempt.stopping.is_set():
                first = failure.in_replica(index, count)
                attempt.stop()  # a gang lives and dies together
        for thread in threads:
            thread.join()
        return first

    def _callable_replica(
        self, job: LocalJob, attempt: Attempt, entry: CallableEntrypoint, environment: EnvironmentConfig, info: JobInfo
    ) -> Failure | None:
        _bind_client(self._client)
        _current_job.set(info)
        bind_actor(None)  # a job started from an actor's method is not that actor
        env = dict(environment.env_vars)
        run = attempt.stoppable(info.replica_index)
        # Blocked on its own work, the replica gives its thread slot to the jobs waiting for one.
        lender = _SlotLender(self) if self._max_threads is not None else None
        with capture_to(job.logs), terminating_on(job.job_id, attempt.stopping), lending_to(lender):
            try:
                _ENV.acquire(env)
            except ConfigError as exc:
                return Failure.from_exception(exc)
            try:
                run.run(entry.callable, *entry.args, **entry.kwargs)
            except BaseException as exc:
                if exit_status(exc) == 0:  # sys.exit(0) ends a job as cleanly as returning does
                    return None
                failure = Failure.from_exception(exc)
                if failure.remote is not None and not attempt.stopping.is_set() and not run.stopped:
                    job.logs.write(failure.remote.traceback_text)
                return failure
            finally:
                _ENV.release(env)
        return None


@dataclass(frozen=True)
class _SlotLender:
    """Lends one replica's thread slot while it blocks on its own work (:mod:`fray.core._lending`)."""

    runner: JobRunner

    def lend(self) -> None:
        self.runner._lend_slot()

    def reclaim(self) -> None:
        self.runner._reclaim_slot()


def local_device(resources: ResourceConfig) -> str:
    """The device a local replica reports: this backend detects no accelerator, so CPU when that is a choice.

    Devices are not enforced here (nothing is reserved); without a CPU choice it reports the
    first one asked for, as if it had been placed on it.
    """
    choices = resources.device_choices
    return device_name(next((d for d in choices if isinstance(d, CpuConfig)), choices[0]))
