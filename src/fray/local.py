"""The embedded local backend: jobs as threads (callables) or subprocesses (binaries), actors as objects.

It needs no setup and honours the whole :class:`~fray.client.Client` protocol, so a
pipeline or RL loop can be developed and tested with nothing else installed. What
cannot be isolated inside one process is documented on :class:`LocalClient`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import importlib.metadata
import inspect
import os
import queue
import re
import signal
import subprocess
import threading
import traceback
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fray._logcapture import LogBuffer, capture_to
from fray._process import describe_exit, kill_process_group
from fray._runtime import check_terminated, terminating_on
from fray._serialization import call_parts, check_picklable
from fray.actor import ActorFuture, ActorGroup, check_actor_method, check_actor_request, group_member_names
from fray.client import ClientSpec, _bind_client
from fray.errors import (
    ActorDiedError,
    ActorUnavailableError,
    ConfigError,
    FrayError,
    JobAlreadyExists,
    JobFailed,
)
from fray.job import (
    BinaryEntrypoint,
    CallableEntrypoint,
    EnvironmentConfig,
    JobInfo,
    JobRequest,
    JobStatus,
    _current_job,
    job_env,
)
from fray.resources import ResourceConfig

__all__ = ["LocalActorHandle", "LocalClient", "LocalJobHandle"]

# Every live LocalClient, so that pickled handles can find their client again in this
# process and so that no subprocess outlives the interpreter.
_CLIENTS: weakref.WeakValueDictionary[str, LocalClient] = weakref.WeakValueDictionary()


def _short_id() -> str:
    return uuid.uuid4().hex[:8]


@dataclass
class _Failure:
    """Why an attempt failed, kept so that every wait() can raise a fresh JobFailed."""

    message: str
    cause: BaseException | None = None
    traceback_text: str = ""
    exit_code: int | None = None

    def error(self, job_id: str) -> JobFailed:
        return JobFailed(
            job_id, self.message, cause=self.cause, traceback_text=self.traceback_text, exit_code=self.exit_code
        )


class _JobRecord:
    """The state of one job (or actor-hosting job); all transitions go through ``_finish``/``_set_running``."""

    def __init__(self, job_id: str, name: str, echo: bool) -> None:
        self.job_id = job_id
        self.name = name
        self.status = JobStatus.PENDING
        self.failure: _Failure | None = None
        self.logs = LogBuffer(echo=echo)
        self.done = threading.Event()
        self.cancel = threading.Event()  # set by terminate(); replicas stop at their next Fray call
        self.processes: list[subprocess.Popen[bytes]] = []
        self.lock = threading.Lock()

    def set_running(self) -> bool:
        with self.lock:
            if self.status.finished:
                return False
            self.status = JobStatus.RUNNING
            return True

    def finish(self, status: JobStatus, failure: _Failure | None = None) -> bool:
        """Move to a final status once; later calls lose (a terminated job stays STOPPED)."""
        with self.lock:
            if self.status.finished:
                return False
            self.status = status
            self.failure = failure
        self.done.set()
        return True


class LocalJobHandle:
    """Handle to a job of a :class:`LocalClient`. Picklable within the process that created it."""

    def __init__(self, client: LocalClient, record: _JobRecord) -> None:
        self._client = client
        self._record = record

    def __repr__(self) -> str:
        return f"LocalJobHandle({self.job_id!r}, {self._record.status.value})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_job_handle, (self._client.client_id, self.job_id))

    @property
    def job_id(self) -> str:
        """The job's id: ``{name}-{8 hex}``, prefixed by the parent job's id for child jobs."""
        return self._record.job_id

    def status(self) -> JobStatus:
        """The job's current status."""
        return self._record.status

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise JobFailed if it failed and ``raise_on_failure``."""
        if not self._record.done.wait(timeout):
            raise TimeoutError(f"job {self.job_id!r} still {self._record.status.value} after {timeout}s")
        status = self._record.status
        if status == JobStatus.FAILED and raise_on_failure and self._record.failure is not None:
            raise self._record.failure.error(self.job_id)
        return status

    def terminate(self) -> None:
        """Stop the job: binary replicas are killed with their children, callables stop at their next Fray call."""
        self._client._terminate(self._record)

    def logs(self, max_lines: int | None = None) -> list[str]:
        """The job's output lines (all attempts, stdout and stderr interleaved)."""
        return self._record.logs.lines(max_lines)


def _restore_job_handle(client_id: str, job_id: str) -> LocalJobHandle:
    client = _CLIENTS.get(client_id)
    record = client._records.get(job_id) if client is not None else None
    if client is None or record is None:
        raise ActorUnavailableError(
            f"local job {job_id!r} lives in another process; handles of the local backend only work in the "
            "process that created them (use a cluster backend to share jobs between processes)"
        )
    return LocalJobHandle(client, record)


class _LocalActor:
    """One actor instance with its own thread and a FIFO call queue (one call at a time)."""

    _STOP = object()

    def __init__(self, client: LocalClient, record: _JobRecord, cls: type, info: JobInfo) -> None:
        self.client = client
        self.record = record
        self.cls = cls
        self.info = info
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.death: ActorDiedError | None = None
        self.running: ActorFuture | None = None
        self._lock = threading.Lock()

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any], context: contextvars.Context) -> None:
        thread = threading.Thread(
            target=context.run, args=(self._main, args, kwargs), name=f"fray-actor-{self.record.name}", daemon=True
        )
        thread.start()

    def submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        future = ActorFuture()
        with self._lock:
            death = self.death
            if death is None:
                self.calls.put((future, method, args, kwargs))
        if death is not None:
            future.set_exception(_died_copy(death))
        return future

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.death is not None:
                return
            self.death = ActorDiedError(f"actor {self.record.name!r} {reason}")
            running = self.running
        # The thread cannot be interrupted, but callers must not wait on it: the call in
        # progress and every queued call fail now, as they would if a process had died.
        if running is not None and not running.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                running.set_exception(_died_copy(self.death))
        self._fail_queued()
        self.calls.put(self._STOP)
        if not self.ready.done():
            self.ready.set_exception(_died_copy(self.death))

    def _main(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _bind_client(self.client)
        _current_job.set(self.info)
        loop: asyncio.AbstractEventLoop | None = None
        with capture_to(self.record.logs), terminating_on(self.info.job_id, self.record.cancel):
            self.record.set_running()
            try:
                instance = self.cls(*args, **kwargs)
            except BaseException as exc:
                self._die_in_init(exc)
                return
            if not self.ready.done():
                self.ready.set_result(None)
            while True:
                item = self.calls.get()
                if item is self._STOP:
                    break
                future, method, call_args, call_kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                with self._lock:
                    self.running = future
                try:
                    result = getattr(instance, method)(*call_args, **call_kwargs)
                    if inspect.isawaitable(result):
                        # One loop per actor, kept for its life, so actor state bound to the loop
                        # (queues, locks, tasks) survives between calls.
                        loop = loop or asyncio.new_event_loop()
                        result = loop.run_until_complete(result)
                except BaseException as exc:
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        future.set_exception(exc)
                else:
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        future.set_result(result)
            if loop is not None:
                loop.close()
        self._fail_queued()

    def _die_in_init(self, exc: BaseException) -> None:
        text = _user_traceback(exc)
        self.record.logs.write(text)
        death = ActorDiedError(f"actor {self.record.name!r} died in __init__: {type(exc).__name__}: {exc}")
        death.__cause__ = exc
        with self._lock:
            self.death = death
        if not self.ready.done():
            self.ready.set_exception(_died_copy(death))
        self.record.finish(JobStatus.FAILED, _Failure(f"actor __init__ raised {type(exc).__name__}: {exc}", exc, text))
        self.client._forget_actor(self)
        self._fail_queued()

    def _fail_queued(self) -> None:
        assert self.death is not None
        while True:
            try:
                item = self.calls.get_nowait()
            except queue.Empty:
                return
            if item is not self._STOP and not item[0].done():
                item[0].set_exception(_died_copy(self.death))


def _user_traceback(exc: BaseException) -> str:
    """The traceback of an exception raised by user code, without Fray's own calling frame."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _died_copy(death: ActorDiedError) -> ActorDiedError:
    # A fresh exception per caller: raising one shared object from many threads tangles tracebacks.
    copy = ActorDiedError(*death.args)
    copy.__cause__ = death.__cause__
    return copy


class _LocalActorMethod:
    """``handle.method``: ``.remote(...)`` returns a future, calling it blocks."""

    def __init__(self, handle: LocalActorHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Queue the call and return its future."""
        check_terminated()
        return self._handle._actor_or_raise().submit(self._name, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and wait for its result."""
        return self.remote(*args, **kwargs).result()


class LocalActorHandle:
    """Handle to an actor of a :class:`LocalClient`; calls run on the actor's own thread, in order."""

    def __init__(self, actor: _LocalActor | None, cls: type, name: str, client_id: str, missing: str = "") -> None:
        self._actor = actor
        self._cls = cls
        self._name = name
        self._client_id = client_id
        self._missing = missing

    def __repr__(self) -> str:
        return f"LocalActorHandle({self._name!r}, {self._cls.__name__})"

    def __getattr__(self, method_name: str) -> _LocalActorMethod:
        check_actor_method(self._cls, method_name)
        return _LocalActorMethod(self, method_name)

    def __reduce__(self) -> tuple[object, ...]:
        job_id = self._actor.record.job_id if self._actor is not None else ""
        return (_restore_actor_handle, (self._client_id, job_id, self._cls, self._name))

    def _actor_or_raise(self) -> _LocalActor:
        if self._actor is None:
            raise ActorUnavailableError(self._missing)
        return self._actor

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        if self._actor is None:
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            future.set_exception(ActorUnavailableError(self._missing))
            return future
        return self._actor.ready


def _restore_actor_handle(client_id: str, job_id: str, cls: type, name: str) -> LocalActorHandle:
    client = _CLIENTS.get(client_id)
    actor = client._actors_by_job.get(job_id) if client is not None else None
    if actor is None:
        missing = (
            f"local actor {name!r} lives in another process (or was shut down); handles of the local backend "
            "only work in the process that created them: use a cluster backend to share actors between processes"
        )
        return LocalActorHandle(None, cls, name, client_id, missing)
    return LocalActorHandle(actor, cls, name, client_id)


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


_REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _check_packages(name: str, packages: tuple[str, ...]) -> None:
    # Callable jobs run in this interpreter, so packages cannot be installed per job;
    # a missing one is reported at submit rather than as an ImportError mid-run.
    missing = []
    for requirement in packages:
        match = _REQ_NAME_RE.match(requirement)
        if match is None:
            raise ConfigError(f"job {name!r}: pip package {requirement!r} is not a requirement string")
        try:
            importlib.metadata.distribution(match.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    if missing:
        raise ConfigError(
            f"job {name!r} needs pip packages {missing} that are not installed; the local backend runs jobs in "
            f"this Python environment, so install them first: pip install {' '.join(missing)}"
        )


class LocalClient:
    """Runs everything inside this process: callable jobs in threads, binary jobs as subprocesses,
    actors as objects each served by its own thread.

    ``max_threads`` bounds how many callable replicas run at once (others stay PENDING);
    actors do not count against it. Limits of running in one process: resources are
    not enforced; ``max_retries_preemption`` never applies (nothing is preempted);
    ``docker_image`` is ignored (noted in the job's log); ``pip_packages`` must already
    be installed; env vars of callable jobs are set process-wide while they run.
    """

    def __init__(self, max_threads: int | None = None, *, namespace: str | None = None, echo_logs: bool = True) -> None:
        if max_threads is not None and (
            isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1
        ):
            raise ConfigError(f"LocalClient(max_threads={max_threads!r}) must be a whole number >= 1 or None")
        self.client_id = _short_id()
        self.namespace = namespace or f"local-{self.client_id}"
        self.max_threads = max_threads
        self._echo = echo_logs
        self._records: dict[str, _JobRecord] = {}
        self._actors_by_job: dict[str, _LocalActor] = {}
        self._actors_by_name: dict[str, _LocalActor] = {}
        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)
        self._busy_threads = 0
        self._closed = False
        _CLIENTS[self.client_id] = self

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> LocalClient:
        """Build from ``local`` or ``local?threads=N``."""
        if spec.address is not None:
            raise spec.invalid("the local backend takes no address")
        unknown = set(spec.options) - {"threads"}
        if unknown:
            raise spec.invalid(f"unknown option(s) {sorted(unknown)} for local")
        threads = spec.options.get("threads")
        if threads is None:
            return cls()
        if not threads.isdigit() or int(threads) < 1:
            raise spec.invalid(f"threads={threads!r} must be a whole number >= 1")
        return cls(max_threads=int(threads))

    def __repr__(self) -> str:
        return f"LocalClient(namespace={self.namespace!r}, max_threads={self.max_threads})"

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` was called; a closed client accepts no more work."""
        return self._closed

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # After an error nobody will wait for the remaining work, so stop it instead of hanging.
        self.shutdown(wait=exc_type is None)

    # ----- jobs -------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> LocalJobHandle:
        """Start a job; returns at once. See the class docstring for what runs where."""
        check_terminated()
        if not isinstance(request, JobRequest):
            raise ConfigError(f"submit() takes a JobRequest, got {type(request).__name__}")
        entry = request.entrypoint
        environment = request.environment or EnvironmentConfig()
        if isinstance(entry, CallableEntrypoint):
            check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
            _check_packages(request.name, tuple(environment.pip_packages))
            if self.max_threads is not None and request.replicas > self.max_threads:
                raise ConfigError(
                    f"job {request.name!r} asks for {request.replicas} replicas, which start all together, but this "
                    f"LocalClient runs at most {self.max_threads} threads; raise threads or lower replicas"
                )
        record = self._new_record(request.name)
        if environment.docker_image:
            record.logs.write(f"[fray] the local backend ignores docker_image={environment.docker_image!r}\n")
        context = contextvars.copy_context()
        launcher = threading.Thread(
            target=self._run_job,
            args=(record, request, environment, context),
            name=f"fray-job-{record.job_id}",
            daemon=True,
        )
        launcher.start()
        return LocalJobHandle(self, record)

    def _new_record(self, name: str) -> _JobRecord:
        parent = _current_job.get()
        local_id = f"{name}-{_short_id()}"
        job_id = f"{parent.job_id}/{local_id}" if parent is not None else local_id
        record = _JobRecord(job_id, name, self._echo)
        with self._lock:
            if self._closed:
                raise FrayError("this LocalClient is shut down; create a new one")
            self._records[job_id] = record
        return record

    def _parent_namespace(self) -> str:
        parent = _current_job.get()
        return parent.namespace if parent is not None else self.namespace

    def _run_job(
        self, record: _JobRecord, request: JobRequest, environment: EnvironmentConfig, context: contextvars.Context
    ) -> None:
        namespace = context.run(self._parent_namespace)
        attempts = request.max_retries_failure + 1
        for attempt in range(attempts):
            if attempt:
                record.logs.write(f"[fray] attempt {attempt + 1} of {attempts}\n")
            if not self._acquire_slots(record, request):
                return
            try:
                failure = self._run_attempt(record, request, environment, context, namespace, attempt)
            finally:
                self._release_slots(request)
            if record.cancel.is_set():
                record.finish(JobStatus.STOPPED)
                return
            if failure is None:
                record.finish(JobStatus.SUCCEEDED)
                return
            record.logs.write(f"[fray] attempt {attempt + 1} of {attempts} failed: {failure.message}\n")
            if attempt + 1 == attempts:
                if attempts > 1:
                    failure.message += f" (after {attempts} attempts)"
                record.finish(JobStatus.FAILED, failure)

    def _threads_needed(self, request: JobRequest) -> int:
        return request.replicas if isinstance(request.entrypoint, CallableEntrypoint) else 0

    def _acquire_slots(self, record: _JobRecord, request: JobRequest) -> bool:
        need = self._threads_needed(request)
        with self._slots:
            while self.max_threads is not None and self._busy_threads + need > self.max_threads:
                if record.cancel.is_set():
                    return False
                self._slots.wait(timeout=0.1)  # also wakes to notice terminate()
            if record.cancel.is_set():
                return False
            self._busy_threads += need
        if not record.set_running():
            self._release_slots(request)
            return False
        return True

    def _release_slots(self, request: JobRequest) -> None:
        with self._slots:
            self._busy_threads -= self._threads_needed(request)
            self._slots.notify_all()

    def _run_attempt(
        self,
        record: _JobRecord,
        request: JobRequest,
        environment: EnvironmentConfig,
        context: contextvars.Context,
        namespace: str,
        attempt: int,
    ) -> _Failure | None:
        """Run all replicas of one attempt; return the first failure, or None if all succeeded."""
        outcomes: queue.SimpleQueue[tuple[int, _Failure | None]] = queue.SimpleQueue()
        count = request.replicas
        for index in range(count):
            info = JobInfo(record.job_id, request.name, index, count, namespace, attempt)
            if isinstance(request.entrypoint, CallableEntrypoint):
                target: Callable[[], _Failure | None] = self._callable_replica(
                    record, request.entrypoint, environment, info
                )
                runner = context.copy().run
            else:
                target = self._binary_replica(record, request.entrypoint, environment, info)
                runner = contextvars.Context().run

            def run(target: Callable[[], _Failure | None] = target, index: int = index, runner: Any = runner) -> None:
                try:
                    outcomes.put((index, runner(target)))
                except BaseException as exc:  # a bug in Fray itself must still end the attempt
                    outcomes.put((index, _Failure(f"internal error: {exc!r}", exc, traceback.format_exc())))

            threading.Thread(target=run, name=f"fray-{record.job_id}-r{index}", daemon=True).start()
        for _ in range(count):
            index, failure = outcomes.get()
            if failure is not None and not record.cancel.is_set():
                if count > 1:
                    failure.message = f"replica {index} of {count}: {failure.message}"
                self._stop_replicas(record)  # a gang lives and dies together
                return failure
        return None

    def _callable_replica(
        self, record: _JobRecord, entry: CallableEntrypoint, environment: EnvironmentConfig, info: JobInfo
    ) -> Callable[[], _Failure | None]:
        def run() -> _Failure | None:
            _bind_client(self)
            _current_job.set(info)
            env = dict(environment.env_vars)
            with capture_to(record.logs), terminating_on(record.job_id, record.cancel):
                try:
                    _ENV.acquire(env)
                except ConfigError as exc:
                    return _Failure(str(exc), exc)
                try:
                    entry.callable(*entry.args, **entry.kwargs)
                except BaseException as exc:
                    text = _user_traceback(exc)
                    record.logs.write(text)
                    return _Failure(f"{type(exc).__name__}: {exc}", exc, text)
                finally:
                    _ENV.release(env)
            return None

        return run

    def _binary_replica(
        self, record: _JobRecord, entry: BinaryEntrypoint, environment: EnvironmentConfig, info: JobInfo
    ) -> Callable[[], _Failure | None]:
        def run() -> _Failure | None:
            env = {**os.environ, **job_env(info), "FRAY_CLIENT_SPEC": "local", "PYTHONUNBUFFERED": "1"}
            env.update(environment.env_vars)
            try:
                proc = subprocess.Popen(
                    entry.argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=environment.workspace,
                    start_new_session=True,  # its own process group, so terminate() reaches its children too
                )
            except OSError as exc:
                return _Failure(f"cannot start {entry.command!r}: {exc}", exc)
            with record.lock:
                record.processes.append(proc)
                cancelled = record.cancel.is_set()
            if cancelled:
                kill_process_group(proc)
            assert proc.stdout is not None
            writer = record.logs.writer()
            for raw in proc.stdout:
                text = raw.decode(errors="replace")
                writer.write(text)
                if record.logs.echo:
                    print(text, end="", flush=True)
            code = proc.wait()
            if code == 0:
                return None
            reason = describe_exit(code)
            tail = "\n".join(record.logs.lines(5))
            return _Failure(f"{entry.command!r} {reason}; last output:\n{tail}", exit_code=code)

        return run

    def _stop_replicas(self, record: _JobRecord) -> None:
        with record.lock:
            processes = list(record.processes)
        for proc in processes:
            kill_process_group(proc)

    def _terminate(self, record: _JobRecord) -> None:
        record.cancel.set()
        stopped = record.finish(JobStatus.STOPPED)
        actor = self._actors_by_job.get(record.job_id)
        if actor is not None:
            actor.stop("was terminated")
            self._forget_actor(actor)
        if stopped:
            self._stop_replicas(record)
        with self._slots:
            self._slots.notify_all()

    # ----- actors -----------------------------------------------------------------------------

    def create_actor(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        resources: ResourceConfig = ResourceConfig(),  # noqa: B008 - frozen, so sharing the default is safe
        **kwargs: Any,
    ) -> LocalActorHandle:
        """Start the actor ``name`` on its own thread; the handle is usable at once."""
        check_terminated()
        check_actor_request(actor_class, name, resources, args, kwargs)
        with self._lock:
            if name in self._actors_by_name:
                raise JobAlreadyExists(
                    f"an actor named {name!r} is already running in this client; shut it down first or pick "
                    "another name"
                )
        record = self._new_record(name)
        info = JobInfo(record.job_id, name, 0, 1, self._parent_namespace(), 0)
        actor = _LocalActor(self, record, actor_class, info)
        with self._lock:
            if name in self._actors_by_name:  # lost a race with another creator
                self._records.pop(record.job_id, None)
                raise JobAlreadyExists(f"an actor named {name!r} is already running in this client")
            self._actors_by_name[name] = actor
            self._actors_by_job[record.job_id] = actor
        actor.start(args, kwargs, contextvars.copy_context())
        return LocalActorHandle(actor, actor_class, name, self.client_id)

    def create_actor_group(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        count: int,
        resources: ResourceConfig = ResourceConfig(),  # noqa: B008
        **kwargs: Any,
    ) -> ActorGroup:
        """Start ``count`` actors ``{name}-0`` ... ``{name}-{count-1}``; returns at once."""
        handles = [
            self.create_actor(actor_class, *args, name=member, resources=resources, **kwargs)
            for member in group_member_names(name, count)
        ]
        jobs = [LocalJobHandle(self, h._actor_or_raise().record) for h in handles]
        return ActorGroup(handles, jobs)

    def _forget_actor(self, actor: _LocalActor) -> None:
        with self._lock:
            if self._actors_by_name.get(actor.record.name) is actor:
                del self._actors_by_name[actor.record.name]

    # ----- lifecycle --------------------------------------------------------------------------

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait``, let running jobs finish first; then stop everything."""
        with self._lock:
            self._closed = True
            records = list(self._records.values())
        # Jobs first, actors after: running jobs may still be calling the actors.
        jobs = [r for r in records if r.job_id not in self._actors_by_job]
        for record in jobs:
            if wait:
                record.done.wait()
            else:
                self._terminate(record)
        for record in records:
            if not record.status.finished:
                self._terminate(record)


@atexit.register
def _reap_at_exit() -> None:
    # Daemon threads die with the interpreter but subprocesses would not: never leave orphans.
    for client in list(_CLIENTS.values()):
        for record in list(client._records.values()):
            with record.lock:
                processes = list(record.processes)
            for proc in processes:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
