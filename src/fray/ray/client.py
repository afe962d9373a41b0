"""The Ray backend: :class:`RayClient`, its job handles and its actor handles.

How Fray concepts map onto Ray:

* a callable job is one Ray task per replica; replicas of one job are gang-scheduled
  in a placement group (all start or none). Fray runs the retry loop itself, so user
  exceptions count against ``max_retries_failure`` and lost workers or nodes against
  ``max_retries_preemption``;
* a binary job is a Ray job (``JobSubmissionClient``) with the entrypoint resources
  and a runtime env carrying env vars, working dir and pip packages;
* an actor is a named Ray actor in the client's namespace.

Ray's connection is process-global: ``ray.init`` may run once per process and every
``RayClient`` of the process shares it (see :class:`RayClient`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import random
import shlex
import socket
import threading
import time
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import cloudpickle

from fray._serialization import call_parts, check_picklable
from fray.actor import ActorFuture, ActorGroup, check_actor_method, check_actor_request, group_member_names
from fray.client import ClientSpec
from fray.errors import (
    ActorDiedError,
    ConfigError,
    FrayError,
    JobAlreadyExists,
    JobFailed,
    SerializationError,
)
from fray.job import (
    BinaryEntrypoint,
    CallableEntrypoint,
    EnvironmentConfig,
    JobInfo,
    JobRequest,
    JobStatus,
    current_job,
    job_env,
    validate_name,
)
from fray.ray import _worker
from fray.ray._driver_exit import track
from fray.ray._errors import attach_traceback, is_preemption, translate
from fray.ray.resources import bundle, head_node_resource, ray_options
from fray.resources import ResourceConfig, TpuConfig

__all__ = ["RayActorHandle", "RayClient", "RayJobHandle"]

# Every live RayClient of this process by namespace, so unpickled handles reuse their
# client's Ray actor handles instead of looking the actor up again.
_CLIENTS: weakref.WeakValueDictionary[str, RayClient] = weakref.WeakValueDictionary()


# Ids need uniqueness, not secrecy: a PRNG seeded once from the OS. os.urandom (and so
# uuid4) can cost a fifth of a millisecond per call on some VMs, a tenth of a task's cost.
_ids = random.Random()


def _short_id() -> str:
    return f"{_ids.getrandbits(32):08x}"


# ----- the process-wide Ray connection ---------------------------------------------------------


class _Connection:
    """Ray's one connection per process, and whether Fray made it (then Fray also ends it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started_by_fray = False
        self.users = 0

    def acquire(self, address: str | None, namespace: str | None, init_kwargs: Mapping[str, Any]) -> None:
        import ray

        with self.lock:
            if ray.is_initialized():
                if init_kwargs:
                    raise ConfigError(
                        "RayClient(ray_init_kwargs=...) only applies when Fray connects to Ray, but this process "
                        "is already connected; drop the arguments or create the client before calling ray.init"
                    )
            else:
                _prepare_token_auth(address)
                try:
                    ray.init(address=address, namespace=namespace, **init_kwargs)
                except (ConnectionError, RuntimeError) as exc:
                    hint = _auth_hint(exc)
                    if hint is None:
                        raise
                    raise ConfigError(f"cannot connect to Ray at {address or 'the default address'}: {hint}") from exc
                self.started_by_fray = True
            self.users += 1

    def release(self) -> None:
        import ray

        with self.lock:
            self.users -= 1
            if self.users == 0 and self.started_by_fray:
                self.started_by_fray = False
                ray.shutdown()


_CONNECTION = _Connection()


def _prepare_token_auth(address: str | None) -> None:
    """Send this machine's Ray auth token to a local cluster, as Ray's CLI does, without user setup.

    Ray 2.60 starts clusters with token authentication on and keeps the token in
    ``~/.ray/auth_token``. A client process sends it only in ``RAY_AUTH_MODE=token``,
    which ``ray.init`` turns on by itself when it starts a cluster or finds one
    automatically, but not for an explicit address (argument or ``RAY_ADDRESS``): then
    ``ray.init`` fails with an authentication error. Fray turns token mode on when a
    token is available and the cluster is on this machine (the token file is then that
    cluster's); it never sends the local token to a remote address on its own. A
    token-mode client also talks to clusters without auth. An explicit
    ``RAY_AUTH_MODE`` always wins.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    if not (os.environ.get("RAY_AUTH_TOKEN") or Path(token_path).is_file()):
        return
    if not _is_local_address(address if address is not None else os.environ.get("RAY_ADDRESS")):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    with contextlib.suppress(Exception):
        # Ray caches its config (the auth mode included) at import: refresh it, as Ray itself does.
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")


def _is_local_address(address: str | None) -> bool:
    if address in (None, "", "auto", "local"):
        return True
    assert address is not None
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return True
    with contextlib.suppress(OSError):
        own = {socket.gethostname(), socket.getfqdn(), socket.gethostbyname(socket.gethostname())}
        own |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
        return host in own
    return False


def _auth_hint(exc: BaseException) -> str | None:
    text = f"{exc} {exc.__cause__}"
    if "uthenticat" in text or "auth token" in text.lower():
        return (
            "the Ray cluster requires token authentication: set RAY_AUTH_MODE=token and make its token "
            "available (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); Fray only does this by itself "
            "for clusters on this machine"
        )
    return None


# ----- completion callbacks --------------------------------------------------------------------

_error_fetcher: concurrent.futures.ThreadPoolExecutor | None = None
_error_fetcher_lock = threading.Lock()


def _when_done(ref: Any, callback: Callable[[Any, BaseException | None], None]) -> None:
    """Call ``callback(value, None)`` or ``callback(None, error)`` once ``ref`` is complete.

    Uses Ray's own completion hook (what ``ObjectRef.future()`` is built on) without
    the extra Future and thread hop of ``future()``, which costs a quarter of a
    millisecond per call. Errors are rare and are fetched with ``ray.get`` on a helper
    thread, so that Ray marks them as handled and hands over the exception it would raise.
    """
    import ray.exceptions

    def completed(data: Any) -> None:
        if isinstance(data, ray.exceptions.RayError):
            try:
                _fetch_error_executor().submit(_fetch_error, ref, callback)
            except RuntimeError:  # the interpreter is exiting: report what Ray handed over
                callback(None, data)
        else:
            callback(data, None)

    ref._on_completed(completed)


def _fetch_error_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _error_fetcher
    with _error_fetcher_lock:
        if _error_fetcher is None:
            _error_fetcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fray-ray-errors")
        return _error_fetcher


def _fetch_error(ref: Any, callback: Callable[[Any, BaseException | None], None]) -> None:
    import ray

    try:
        value = ray.get(ref)
    except BaseException as exc:
        callback(None, exc)
    else:  # pragma: no cover - Ray said it failed; trust get() if it disagrees
        callback(value, None)


# ----- failures --------------------------------------------------------------------------------


@dataclass
class _Failure:
    """Why a job failed; kept so every wait() raises a fresh JobFailed."""

    message: str
    cause: BaseException | None = None
    traceback_text: str = ""
    exit_code: int | None = None

    def error(self, job_id: str) -> JobFailed:
        return JobFailed(
            job_id, self.message, cause=self.cause, traceback_text=self.traceback_text, exit_code=self.exit_code
        )


# ----- job handles -----------------------------------------------------------------------------


class _JobState:
    """Status, failure and logs of one job; every transition to a final status happens once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.status = JobStatus.PENDING
        self.failure: _Failure | None = None
        self.done = threading.Event()
        self.log_lines: list[str] = []

    def finish(self, status: JobStatus, failure: _Failure | None = None) -> bool:
        with self.lock:
            if self.status.finished:
                return False
            self.status = status
            self.failure = failure
        self.done.set()
        return True

    def add_logs(self, text: str) -> None:
        if text:
            with self.lock:
                self.log_lines.extend(text.rstrip("\n").split("\n"))


class RayJobHandle:
    """Handle to a job submitted through a :class:`RayClient`.

    ``wait`` blocks without polling for callable jobs (it waits on Ray's own
    completion callbacks); binary jobs are watched through Ray's job API.
    """

    def __init__(self, client: RayClient, job_id: str, name: str) -> None:
        self._client = client
        self._job_id = job_id
        self._name = name
        self._state = _JobState()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._job_id!r}, {self._state.status.value})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_job_handle, (self._client.namespace, self._job_id))

    @property
    def job_id(self) -> str:
        """``{name}-{8 hex}``, prefixed by the parent job's id (and ``/``) for child jobs."""
        return self._job_id

    def status(self) -> JobStatus:
        """The job's current status."""
        return self._state.status

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise JobFailed if it failed and ``raise_on_failure``."""
        if not self._state.done.wait(timeout):
            raise TimeoutError(f"job {self._job_id!r} still {self.status().value} after {timeout}s")
        status = self._state.status
        if status == JobStatus.FAILED and raise_on_failure and self._state.failure is not None:
            raise self._state.failure.error(self._job_id)
        return status

    def terminate(self) -> None:
        """Stop every replica of the job (a no-op once it finished)."""
        raise NotImplementedError

    def logs(self, max_lines: int | None = None) -> list[str]:
        """The job's output lines so far, all attempts, stdout and stderr interleaved."""
        with self._state.lock:
            lines = list(self._state.log_lines)
        lines += self._live_logs()
        if max_lines is not None:
            lines = lines[-max_lines:] if max_lines > 0 else []
        return lines

    def _live_logs(self) -> list[str]:
        return []


def _restore_job_handle(namespace: str, job_id: str) -> RayJobHandle:
    client = _CLIENTS.get(namespace)
    job = client._jobs.get(job_id) if client is not None else None
    if job is None:
        raise FrayError(
            f"job {job_id!r} was submitted by another process; a Ray job handle can only be used in the process "
            "that submitted it (pass actor handles, or the data the job needs, instead)"
        )
    return job


class _CallableJob(RayJobHandle):
    """A callable job: one Ray task per replica, retried by Fray with two separate budgets."""

    def __init__(self, client: RayClient, job_id: str, request: JobRequest, payload: tuple[bytes, bytes]) -> None:
        super().__init__(client, job_id, request.name)
        self._request = request
        self._payload = payload
        self._uid = f"{job_id}.{_ids.getrandbits(64):016x}"  # unique across every client of the cluster
        self._attempt = 0
        self._failures_used = 0
        self._preemptions_used = 0
        self._refs: list[Any] = []
        self._outcomes: dict[int, tuple[str, Any]] = {}
        self._placement_group: Any = None
        self._stopping = False
        self._started_at = 0.0
        self._seen_running = False
        self._settle_lock = threading.Lock()

    # Launching ---------------------------------------------------------------------------------

    def _launch(self) -> None:
        """Start one attempt: every replica at once, in a placement group when there are several."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        request = self._request
        client = self._client
        count = request.replicas
        options, configured = client._task_remote(request)
        strategies: list[Any] = [None] * count
        if count > 1:
            from ray.util.placement_group import placement_group

            # A placement group reserves every replica's resources at once: all start or none.
            self._placement_group = placement_group([bundle(options)] * count, strategy="PACK")
            strategies = [
                PlacementGroupSchedulingStrategy(self._placement_group, placement_group_bundle_index=i)
                for i in range(count)
            ]
        env_base = {**client._user_env(request), "FRAY_CLIENT_SPEC": client.spec}
        refs = []
        for index in range(count):
            info = JobInfo(self._job_id, request.name, index, count, client.namespace, self._attempt)
            env = {**env_base, **job_env(info)}
            remote = configured
            if strategies[index] is not None:
                remote = client._replica_fn().options(**options, scheduling_strategy=strategies[index])
            key = _worker.started_key(self._uid, self._attempt, index)
            pickled_fn, pickled_args = self._payload
            refs.append(remote.remote(pickled_fn, _worker.replica_arguments(pickled_args, env, key)))
        self._start_attempt(refs)

    def _start_attempt(self, refs: list[Any]) -> None:
        with self._state.lock:
            self._refs = refs
            self._outcomes = {}
            self._started_at = time.monotonic()
        self._client._watch(self)

    # Completion --------------------------------------------------------------------------------
    #
    # No callback per replica: Ray's per-object completion callbacks cost a thread switch
    # each and cut task throughput by a third. Instead whoever waits (wait(), status(), or
    # the client's reaper thread for jobs nobody watches) asks Ray with ray.wait and
    # settles the outcome itself, under one lock, exactly once per attempt.

    def _pending_refs(self) -> tuple[int, list[Any], list[Any]]:
        with self._state.lock:
            refs = list(self._refs)
            return self._attempt, refs, [r for i, r in enumerate(refs) if i not in self._outcomes]

    def _poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for replicas of the current attempt to finish, then act on them."""
        import ray

        attempt, refs, pending = self._pending_refs()
        if not pending or self._stopping:
            # No attempt running (slices being reserved, a retry starting), or terminate() is
            # finishing the job: either way ``done`` is set when it ends.
            if timeout is None:
                self._state.done.wait(0.05)
            elif timeout > 0:
                self._state.done.wait(min(timeout, 0.05))
                self._state.done.wait(min(timeout, 0.05))
            return
        if len(refs) == 1:
            # The common case costs what raw Ray costs: one ray.get on the caller's thread.
            try:
                fetched: tuple[str, Any] = ("returned", ray.get(refs[0], timeout=timeout))
            except ray.exceptions.GetTimeoutError:
                return
            except Exception as exc:
                fetched = ("raised", exc)
            self._collect(attempt, refs, refs, fetched)
            return
        # A gang is watched replica by replica, so one failure stops the others at once.
        if timeout is None or timeout > 0:
            ray.wait(pending, num_returns=1, timeout=timeout, fetch_local=False)
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        if ready:
            self._collect(attempt, refs, ready)

    def _collect(self, attempt: int, refs: list[Any], ready: list[Any], fetched: tuple[str, Any] | None = None) -> None:
        """Record the outcomes of the ``ready`` replicas (``fetched``: of the only one, already got)."""
        import ray

        with self._settle_lock:
            with self._state.lock:
                if attempt != self._attempt or self._state.status.finished or self._stopping:
                    return
            for ref in ready:
                index = refs.index(ref)
                if index in self._outcomes:
                    continue
                if fetched is not None:
                    outcome: tuple[str, Any] = fetched
                else:
                    try:
                        outcome = ("returned", ray.get(ref))
                    except Exception as exc:
                        outcome = ("raised", exc)
                if outcome[0] == "returned":
                    self._state.add_logs(outcome[1][1])
                with self._state.lock:
                    self._outcomes[index] = outcome
            outcomes = dict(self._outcomes)
            failures = {i: o for i, o in outcomes.items() if o[0] == "raised" or o[1][0] != "ok"}
            if failures or len(outcomes) == len(refs):
                self._settle(attempt, refs, outcomes, failures)

    def _settle(
        self, attempt: int, refs: list[Any], outcomes: dict[int, tuple[str, Any]], failures: dict[int, Any]
    ) -> None:
        """Decide what a finished (or partly failed) attempt means: success, retry, or failure."""
        import ray

        if failures and len(outcomes) < len(refs):
            # A gang lives and dies together: stop the replicas that are still running.
            for i, ref in enumerate(refs):
                if i not in outcomes:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)
        self._remove_placement_group()
        if not failures:
            if self._state.finish(JobStatus.SUCCEEDED):
                self._forget_started_keys()
            return
        index, (kind, value) = min(failures.items())
        failure, preempted = self._describe(kind, value)
        if len(refs) > 1:
            failure.message = f"replica {index} of {len(refs)}: {failure.message}"
        request = self._request
        if preempted and self._preemptions_used < request.max_retries_preemption:
            self._preemptions_used += 1
        elif not preempted and self._failures_used < request.max_retries_failure:
            self._failures_used += 1
        else:
            retries = self._failures_used + self._preemptions_used
            if retries:
                failure.message += (
                    f" (after {retries + 1} attempts: {self._failures_used} failure and "
                    f"{self._preemptions_used} preemption retries)"
                )
            if self._state.finish(JobStatus.FAILED, failure):
                self._forget_started_keys()
            return
        self._state.add_logs(f"[fray] attempt {attempt} failed: {failure.message.splitlines()[0]}; retrying\n")
        with self._state.lock:
            if self._stopping:
                return
            self._attempt += 1
            self._refs = []
            self._outcomes = {}
        self._launch()

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise JobFailed if it failed and ``raise_on_failure``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._state.status.finished:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {self._job_id!r} still {self.status().value} after {timeout}s")
            self._poll(remaining)
        return super().wait(0, raise_on_failure=raise_on_failure)

    def _describe(self, kind: str, value: Any) -> tuple[_Failure, bool]:
        """A failure record for one replica's outcome, and whether it was a preemption."""
        if kind == "returned":
            _, _, pickled, summary, text = value
            cause: BaseException | None = None
            if pickled is not None:
                with contextlib.suppress(Exception):
                    cause = cloudpickle.loads(pickled)
            if cause is not None:
                attach_traceback(cause, text)
            return _Failure(summary, cause, text), False
        exc: BaseException = value
        if is_preemption(exc):
            return _Failure(f"lost its worker or node ({type(exc).__name__}): {str(exc).splitlines()[0]}", exc), True
        fray_exc = translate(exc)
        return _Failure(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", fray_exc), False

    # Status ------------------------------------------------------------------------------------

    def status(self) -> JobStatus:
        """PENDING until a replica has run for a moment (see ``_worker.STARTED_AFTER``), then RUNNING."""
        state = self._state
        if not state.status.finished:
            self._poll(0)
        if state.status.finished or self._seen_running:
            return state.status if state.status.finished else JobStatus.RUNNING
        from ray.experimental import internal_kv

        with state.lock:
            attempt, count = self._attempt, len(self._refs)
        for index in range(count):
            key = _worker.started_key(self._uid, attempt, index)
            with contextlib.suppress(Exception):
                if internal_kv._internal_kv_exists(key, namespace=_worker.KV_NAMESPACE):
                    self._seen_running = True
                    break
        if state.status.finished:
            return state.status
        return JobStatus.RUNNING if self._seen_running else JobStatus.PENDING

    def _forget_started_keys(self) -> None:
        # Replicas that end normally delete their own key. Only replicas that were killed
        # (a lost worker, terminate()) may have left one behind.
        with self._state.lock:
            clean = all(o[0] == "returned" for o in self._outcomes.values()) and not self._stopping
            clean = clean and self._attempt == 0
        if not clean:
            self._client._monitor.submit(self._delete_started_keys)

    def _delete_started_keys(self) -> None:
        from ray.experimental import internal_kv

        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(
                f"started/{self._uid}/".encode(), del_by_prefix=True, namespace=_worker.KV_NAMESPACE
            )

    # Stopping ----------------------------------------------------------------------------------

    def terminate(self) -> None:
        """Cancel every replica with ``ray.cancel(force=True)`` (their worker processes are killed)."""
        import ray

        with self._state.lock:
            if self._state.status.finished:
                return
            self._stopping = True
            refs = list(self._refs)
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        # Return only once the work is really gone, so callers can rely on it.
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=30, fetch_local=False)
        self._remove_placement_group()
        if self._state.finish(JobStatus.STOPPED):
            self._forget_started_keys()

    def _remove_placement_group(self) -> None:
        with self._state.lock:
            group, self._placement_group = self._placement_group, None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(group)

    def _live_logs(self) -> list[str]:
        # Output of replicas still running, through Ray's log API (needs the dashboard);
        # finished replicas' output is already in the job's own log.
        if self._state.status.finished or not self._seen_running:
            return []
        with self._state.lock:
            pending = [ref for i, ref in enumerate(self._refs) if i not in self._outcomes]
        lines: list[str] = []
        with contextlib.suppress(Exception):
            from ray.util.state import get_log

            for ref in pending:
                for chunk in get_log(task_id=ref.task_id().hex(), tail=1000, timeout=5):
                    lines.extend(chunk.rstrip("\n").split("\n"))
        return lines


# Lines Ray's job manager writes to the top of every job log.
_RAY_JOB_PREAMBLE = ("Runtime env is setting up.", "Running entrypoint for job ")


def _submit_with_retry(jobs: Any, **kwargs: Any) -> None:
    """``jobs.submit_job(**kwargs)``, retried while Ray's job agent is still starting.

    Right after a cluster starts, the dashboard answers before the job agent on the head
    node does, and Ray refuses submissions with a server error for a few seconds.
    """
    deadline = time.monotonic() + 45
    delay = 0.1
    while True:
        try:
            jobs.submit_job(**kwargs)
            return
        except RuntimeError as exc:
            text = str(exc)
            transient = "already exists" not in text and any(
                marker in text for marker in ("503", "500", "502", "504", "agent", "not ready", "Timeout")
            )
            if not transient or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)  # backing off from a server that is still starting, not synchronisation
            delay = min(delay * 2, 2.0)


class _BinaryJob(RayJobHandle):
    """A binary job: one Ray job (``JobSubmissionClient``) per replica, watched by one thread."""

    _POLL = 0.2

    def __init__(self, client: RayClient, job_id: str, request: JobRequest) -> None:
        super().__init__(client, job_id, request.name)
        self._request = request
        self._attempt = 0
        self._failures_used = 0
        self._preemptions_used = 0
        self._submissions: list[str] = []
        self._old_submissions: list[str] = []
        self._stopping = False

    def _launch(self) -> None:
        request = self._request
        client = self._client
        entry = request.entrypoint
        assert isinstance(entry, BinaryEntrypoint)
        jobs = client._job_submission()
        options = ray_options(request.resources, pin_resource=client._pin_resource())
        environment = request.environment or EnvironmentConfig()
        submissions = []
        for index in range(request.replicas):
            info = JobInfo(self._job_id, request.name, index, request.replicas, client.namespace, self._attempt)
            runtime_env = client._runtime_env(request, {**job_env(info), "FRAY_CLIENT_SPEC": client.spec})
            runtime_env["env_vars"].update(environment.env_vars)
            submission_id = f"fray-{self._job_id.replace('/', '.')}-a{self._attempt}-r{index}"
            _submit_with_retry(
                jobs,
                entrypoint=shlex.join(entry.argv),
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata={"fray_job_id": self._job_id, "fray_namespace": client.namespace},
                entrypoint_num_cpus=options.get("num_cpus"),
                entrypoint_num_gpus=options.get("num_gpus"),
                entrypoint_memory=options.get("memory"),
                entrypoint_resources=options.get("resources"),
                entrypoint_label_selector=options.get("label_selector"),
            )
            submissions.append(submission_id)
        with self._state.lock:
            self._submissions = submissions

    def _start(self) -> None:
        self._launch()
        threading.Thread(target=self._watch, name=f"fray-ray-job-{self._job_id}", daemon=True).start()

    def _ray_statuses(self) -> list[Any]:
        jobs = self._client._job_submission()
        with self._state.lock:
            submissions = list(self._submissions)
        return [jobs.get_job_info(s) for s in submissions]

    def _watch(self) -> None:
        while not self._state.status.finished:
            try:
                infos = self._ray_statuses()
            except Exception:
                if self._state.done.wait(self._POLL):
                    return
                continue
            if self._stopping:
                return
            statuses = [str(i.status) for i in infos]
            failed = [(n, i) for n, i in enumerate(infos) if statuses[n] in ("FAILED", "STOPPED")]
            if failed:
                self._stop_submissions()
                index, info = failed[0]
                preempted = "SUPERVISOR" in str(info.error_type or "").upper() or info.driver_exit_code is None
                code = info.driver_exit_code
                tail = "\n".join(self.logs(5))
                message = f"{shlex.join(self._request.entrypoint.argv)!r} "  # type: ignore[union-attr]
                message += f"exit code {code}" if code is not None else f"failed: {info.message}"
                message += f"; last output:\n{tail}"
                if len(infos) > 1:
                    message = f"replica {index} of {len(infos)}: {message}"
                failure = _Failure(message, exit_code=code)
                if preempted and self._preemptions_used < self._request.max_retries_preemption:
                    self._preemptions_used += 1
                elif not preempted and self._failures_used < self._request.max_retries_failure:
                    self._failures_used += 1
                else:
                    self._state.finish(JobStatus.FAILED, failure)
                    return
                with self._state.lock:
                    self._old_submissions += self._submissions
                    self._attempt += 1
                self._launch()
                continue
            if statuses and all(s == "SUCCEEDED" for s in statuses):
                self._state.finish(JobStatus.SUCCEEDED)
                return
            if any(s == "RUNNING" for s in statuses):
                with self._state.lock:
                    if not self._state.status.finished:
                        self._state.status = JobStatus.RUNNING
            self._state.done.wait(self._POLL)

    def status(self) -> JobStatus:
        """Asks Ray's job API while the job is live (so RUNNING shows as soon as Ray says so)."""
        if self._state.status.finished:
            return self._state.status
        with contextlib.suppress(Exception):
            if any(str(i.status) == "RUNNING" for i in self._ray_statuses()):
                with self._state.lock:
                    if not self._state.status.finished:
                        self._state.status = JobStatus.RUNNING
        return self._state.status

    def _stop_submissions(self) -> None:
        jobs = self._client._job_submission()
        with self._state.lock:
            submissions = list(self._submissions)
        for submission in submissions:
            with contextlib.suppress(Exception):
                jobs.stop_job(submission)

    def terminate(self) -> None:
        """Ask Ray to stop every replica (SIGTERM, then SIGKILL) and wait until it has."""
        with self._state.lock:
            if self._state.status.finished:
                return
            self._stopping = True
        self._stop_submissions()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if all(i.status.is_terminal() for i in self._ray_statuses()):
                    break
            time.sleep(0.05)
        self._state.finish(JobStatus.STOPPED)

    def logs(self, max_lines: int | None = None) -> list[str]:
        """Every attempt's output, as Ray's job API returns it (without Ray's own preamble)."""
        jobs = self._client._job_submission()
        with self._state.lock:
            submissions = self._old_submissions + self._submissions
        lines: list[str] = []
        for submission in submissions:
            with contextlib.suppress(Exception):
                text = jobs.get_job_logs(submission)
                for line in text.splitlines():
                    if not any(marker in line for marker in _RAY_JOB_PREAMBLE):
                        lines.append(line)
        if max_lines is not None:
            lines = lines[-max_lines:] if max_lines > 0 else []
        return lines


class _ActorJob(RayJobHandle):
    """The job hosting one actor: RUNNING while alive, FAILED if it died, STOPPED once terminated."""

    def __init__(self, client: RayClient, job_id: str, handle: RayActorHandle) -> None:
        super().__init__(client, job_id, handle._name)
        self._handle = handle
        self._terminated = False

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_actor_job, (self._job_id, self._handle))

    def status(self) -> JobStatus:
        """From the actor's state in Ray's control store (GCS)."""
        if self._state.status.finished:
            return self._state.status
        ready = self._handle._fray_ready()
        if ready.done() and ready.exception() is not None:
            self._finish_dead(ready.exception())
            return self._state.status
        state = self._handle._ray_state()
        if state == "DEAD":
            self._finish_dead(ActorDiedError(f"actor {self._name!r} died"))
            return self._state.status
        if state == "ALIVE" or ready.done():
            return JobStatus.RUNNING
        return JobStatus.PENDING

    def _finish_dead(self, exc: BaseException | None) -> None:
        if self._terminated:
            self._state.finish(JobStatus.STOPPED)
            return
        cause = exc.__cause__ if exc is not None and exc.__cause__ is not None else exc
        self._state.finish(JobStatus.FAILED, _Failure(f"actor {self._name!r} died: {exc}", cause))

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the actor is gone (it was terminated or died)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while not self.status().finished:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"actor job {self._job_id!r} still {self.status().value} after {timeout}s")
            self._state.done.wait(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 2, 0.2)
        if self._terminated:
            # ray.kill only asks; wait (bounded) until Ray says the actor is gone, so that
            # after wait() no other process can still reach it.
            gone_by = time.monotonic() + (10.0 if deadline is None else max(0.0, deadline - time.monotonic()))
            while self._handle._ray_state() not in ("DEAD", None) and time.monotonic() < gone_by:
                time.sleep(0.01)
        return super().wait(0, raise_on_failure=raise_on_failure)

    def terminate(self) -> None:
        """Kill the actor process (``ray.kill``); pending and later calls raise ActorDiedError."""
        self._terminated = True
        self._handle._kill()
        self._state.finish(JobStatus.STOPPED)
        self._client._forget_actor(self._job_id)

    def _live_logs(self) -> list[str]:
        actor_id = self._handle._actor_id()
        if actor_id is None:
            return []
        lines: list[str] = []
        with contextlib.suppress(Exception):
            from ray.util.state import get_log

            for chunk in get_log(actor_id=actor_id, tail=1000, timeout=5):
                lines.extend(chunk.rstrip("\n").split("\n"))
        return lines


def _restore_actor_job(job_id: str, handle: RayActorHandle) -> _ActorJob:
    client = _CLIENTS.get(handle._namespace)
    if client is not None and job_id in client._jobs:
        job = client._jobs[job_id]
        assert isinstance(job, _ActorJob)
        return job
    if client is None:
        client = RayClient._attach(handle._namespace)
    return _ActorJob(client, job_id, handle)


# ----- actor handles ---------------------------------------------------------------------------


class _RayFuture(ActorFuture):
    """An ActorFuture backed by a Ray ObjectRef, resolved as lazily as the caller allows.

    ``result()`` fetches the value with ``ray.get`` on the caller's thread, as raw Ray
    does. Only when something must be told of completion without asking
    (``add_done_callback``, ``concurrent.futures.wait`` / ``as_completed``, which
    register waiters) does the future arm Ray's completion hook: a per-call callback
    costs a thread switch, which would cut call throughput noticeably.
    """

    def __init__(self, ref: Any, actor: str) -> None:
        super().__init__()
        self._ref = ref
        self._actor = actor
        self._armed = False
        self._waiters = _ArmingList(self)

    def _arm(self) -> None:
        with self._condition:
            if self._armed or self._state != "PENDING":
                return
            self._armed = True
        _when_done(self._ref, self._complete)

    def _complete(self, value: Any, exc: BaseException | None) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # resolved already, or cancelled
            if exc is None:
                self.set_result(value)
            else:
                self.set_exception(translate(exc, actor=self._actor))

    def _resolve(self, timeout: float | None) -> None:
        if super().done():
            return
        import ray

        try:
            value = ray.get(self._ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            return  # the caller's timeout: Future.result/exception raise TimeoutError below
        except Exception as exc:
            self._complete(None, exc)
        else:
            self._complete(value, None)

    def done(self) -> bool:
        """True once the call finished (asks Ray, without blocking)."""
        if not super().done():
            import ray

            ready, _ = ray.wait([self._ref], timeout=0, fetch_local=False)
            if ready:
                self._resolve(None)
        return super().done()

    def result(self, timeout: float | None = None) -> Any:
        """The call's value, or its exception raised; ``TimeoutError`` after ``timeout`` seconds."""
        self._resolve(timeout)
        return super().result(timeout=0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's exception (None if it returned); ``TimeoutError`` after ``timeout`` seconds."""
        self._resolve(timeout)
        return super().exception(timeout=0)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[Any]], object]) -> None:
        """Call ``fn(future)`` once the call finished (at once if it already has)."""
        self._arm()
        super().add_done_callback(fn)


class _ArmingList(list[Any]):
    """A future's waiter list that arms the future when ``concurrent.futures.wait`` adds a waiter."""

    def __init__(self, future: _RayFuture) -> None:
        super().__init__()
        self._future = future

    def append(self, item: Any) -> None:
        super().append(item)  # first, so a completion that fires at once finds the waiter
        self._future._arm()


def _bridge(ref: Any, actor: str) -> ActorFuture:
    """An ActorFuture for the Ray ObjectRef ``ref``, errors translated to Fray's."""
    return _RayFuture(ref, actor)


class _RayActorMethod:
    """``handle.method``: ``.remote(...)`` returns an ActorFuture, calling it blocks."""

    __slots__ = ("_handle", "_name", "_ray_method")

    def __init__(self, handle: RayActorHandle, name: str) -> None:
        self._handle = handle
        self._name = name
        self._ray_method: Any = None

    def _submit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        method = self._ray_method
        if method is None:
            method = self._ray_method = getattr(self._handle._resolve(), self._name)
        try:
            return method.remote(*args, **kwargs)
        except TypeError as exc:
            if "serializ" in str(exc).lower() or "pickle" in str(exc).lower():
                raise SerializationError(
                    f"call {self._handle._name}.{self._name}: an argument cannot be pickled: {exc}"
                ) from exc
            raise
        except Exception as exc:
            err = translate(exc, actor=self._handle._name)
            raise err from err.__cause__

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Send the call; returns its future at once."""
        if self._handle._killed:
            future = ActorFuture()
            future.set_exception(self._handle._killed_error())
            return future
        return _bridge(self._submit(args, kwargs), self._handle._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and wait for its result."""
        import ray

        if self._handle._killed:
            raise self._handle._killed_error()
        ref = self._submit(args, kwargs)
        try:
            return ray.get(ref)
        except Exception as exc:
            err = translate(exc, actor=self._handle._name)
            raise err from err.__cause__


class RayActorHandle:
    """Handle to a named Ray actor of a :class:`RayClient`.

    Picklable: it travels as (name, namespace, class) and finds the actor by name on
    first use in the other process, so it works inside jobs and other actors.
    """

    def __init__(self, name: str, namespace: str, cls: type, ray_handle: Any = None) -> None:
        self._name = name
        self._namespace = namespace
        self._cls = cls
        self._ray_handle = ray_handle
        self._ready: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()
        # Set when this process terminated the actor: ray.kill is asynchronous, and a call
        # sent in the meantime could still be answered by the dying actor.
        self._killed = False

    def _killed_error(self) -> ActorDiedError:
        return ActorDiedError(f"actor {self._name!r} was terminated")

    def __repr__(self) -> str:
        return f"RayActorHandle({self._name!r}, {self._cls.__name__}, namespace={self._namespace!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_actor_handle, (self._name, self._namespace, self._cls))

    def __getattr__(self, method_name: str) -> _RayActorMethod:
        check_actor_method(self._cls, method_name)
        method = _RayActorMethod(self, method_name)
        self.__dict__[method_name] = method  # later lookups skip __getattr__ entirely
        return method

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RayActorHandle) and (other._name, other._namespace) == (self._name, self._namespace)

    def __hash__(self) -> int:
        return hash((self._name, self._namespace))

    def _resolve(self) -> Any:
        """The Ray actor handle, looked up by name the first time (handles that were unpickled)."""
        handle = self._ray_handle
        if handle is not None:
            return handle
        import ray

        with self._lock:
            if self._ray_handle is None:
                try:
                    self._ray_handle = ray.get_actor(self._name, namespace=self._namespace)
                except ValueError as exc:
                    raise ActorDiedError(
                        f"actor {self._name!r} is not alive in Ray namespace {self._namespace!r}: it died, was "
                        "shut down, or its creator exited"
                    ) from exc
            return self._ray_handle

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        """Done once the actor's constructor has returned; ActorDiedError if it never will."""
        with self._lock:
            if self._ready is not None:
                return self._ready
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._ready = ready
        try:
            ref = self._resolve().__ray_ready__.remote()
        except Exception as exc:
            ready.set_exception(translate(exc, actor=self._name))
            return ready

        def transfer(value: Any, exc: BaseException | None) -> None:
            if exc is None:
                ready.set_result(None)
                return
            err = translate(exc, actor=self._name)
            if not isinstance(err, ActorDiedError):
                died = ActorDiedError(f"actor {self._name!r} did not start: {err}")
                died.__cause__ = err
                err = died
            ready.set_exception(err)

        _when_done(ref, transfer)
        return ready

    def _actor_id(self) -> str | None:
        with contextlib.suppress(Exception):
            return str(self._resolve()._actor_id.hex())
        return None

    def _ray_state(self) -> str | None:
        """The actor's state in the GCS (ALIVE, DEAD, PENDING_CREATION, ...), None if unknown."""
        actor_id = self._actor_id()
        if actor_id is None:
            return "DEAD"
        with contextlib.suppress(Exception):
            from ray._private.state import state

            info = state.actor_table(actor_id)
            return str(info.get("State")) if info else None
        return None

    def _kill(self) -> None:
        import ray

        self._killed = True
        with contextlib.suppress(Exception):
            ray.kill(self._resolve(), no_restart=True)
        with self._lock:
            ready = self._ready
        if ready is not None and not ready.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                ready.set_exception(ActorDiedError(f"actor {self._name!r} was terminated"))


def _restore_actor_handle(name: str, namespace: str, cls: type) -> RayActorHandle:
    client = _CLIENTS.get(namespace)
    if client is not None:
        owned = client._actor_handles.get(name)
        if owned is not None:
            return owned
    return RayActorHandle(name, namespace, cls)


# ----- the client ------------------------------------------------------------------------------


class RayClient:
    """Runs Fray jobs and actors on a Ray cluster.

    ``address`` is what ``ray.init`` takes: None connects to the running cluster (from
    ``RAY_ADDRESS`` or the latest ``ray start`` on this machine) or starts a local one,
    ``"auto"`` requires a running cluster, ``"ray://host:port"`` uses Ray Client.
    ``namespace`` scopes actor names; it defaults to the namespace of the Ray
    connection. ``ray_init_kwargs`` are passed to ``ray.init`` when this client makes
    the connection.

    Ray allows one connection per process. The first RayClient that finds Ray
    unconnected calls ``ray.init`` and the connection lives until the last RayClient of
    the process shuts down; a process that called ``ray.init`` itself keeps control of
    its connection (Fray never shuts it down). Several RayClients may share the
    connection with different namespaces: each puts its actors into its own namespace
    (Ray's per-actor ``namespace`` option), while tasks, which have no namespace in Ray,
    simply run on the shared cluster.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        namespace: str | None = None,
        ray_init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        import ray

        if namespace is not None:
            validate_name(namespace, "Ray namespace")
        _CONNECTION.acquire(address, namespace, dict(ray_init_kwargs or {}))
        self.address = address
        self.namespace: str = namespace or ray.get_runtime_context().namespace
        self.spec = f"ray?namespace={quote(self.namespace)}"
        # Weak: a finished job the caller dropped must not be kept forever. Running jobs stay
        # alive through whoever drives them (the reaper, a binary job's watcher thread).
        self._jobs: weakref.WeakValueDictionary[str, RayJobHandle] = weakref.WeakValueDictionary()
        self._actor_handles: dict[str, RayActorHandle] = {}
        self._actor_jobs: dict[str, _ActorJob] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._pin: str | None = None
        self._jobs_api: Any = None
        self._remote_replica: Any = None
        self._options_cache: dict[tuple[str, ResourceConfig], tuple[dict[str, Any], Any]] = {}
        self._actor_classes: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()
        self._function_pickles: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
        self._monitor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fray-ray-monitor")
        self._watched: set[_CallableJob] = set()
        self._reaper: threading.Thread | None = None
        self._reaper_wake = threading.Event()
        _CLIENTS.setdefault(self.namespace, self)

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> RayClient:
        """Build from ``ray``, ``ray?namespace=NAME`` or ``ray://HOST:PORT[?namespace=NAME]``."""
        unknown = set(spec.options) - {"namespace"}
        if unknown:
            raise spec.invalid(f"unknown option(s) {sorted(unknown)} for ray (it takes namespace=NAME)")
        namespace = spec.options.get("namespace") or None
        if namespace is not None:
            try:
                validate_name(namespace, "Ray namespace")
            except ConfigError as exc:
                raise spec.invalid(str(exc)) from None
        address = f"ray://{spec.address}" if spec.address else None
        return cls(address, namespace=namespace)

    @classmethod
    def _attach(cls, namespace: str) -> RayClient:
        """The client of this process for ``namespace`` (used when handles are unpickled)."""
        client = _CLIENTS.get(namespace)
        return client if client is not None else cls(namespace=namespace)

    def __reduce__(self) -> tuple[object, ...]:
        return (RayClient._attach, (self.namespace,))

    def __repr__(self) -> str:
        return f"RayClient(address={self.address!r}, namespace={self.namespace!r})"

    def __enter__(self) -> RayClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown(wait=exc_type is None)

    # ----- helpers ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise FrayError("this RayClient is shut down; create a new one")

    def _pin_resource(self) -> str:
        if self._pin is None:
            import ray

            self._pin = head_node_resource(ray.cluster_resources())
        return self._pin

    def _new_job_id(self, name: str) -> str:
        parent = current_job()
        local_id = f"{name}-{_short_id()}"
        return f"{parent.job_id}/{local_id}" if parent is not None else local_id

    def _replica_fn(self) -> Any:
        if self._remote_replica is None:
            import ray

            # Fray runs the retry loop itself (two budgets); Ray must not retry behind its back.
            self._remote_replica = ray.remote(max_retries=0)(_worker.run_job_replica)
        return self._remote_replica

    def _user_env(self, request: JobRequest) -> dict[str, str]:
        return dict(request.environment.env_vars) if request.environment is not None else {}

    def _runtime_env(self, request: JobRequest, env: dict[str, str]) -> dict[str, Any]:
        """The Ray runtime env for ``request``: env vars, working dir, pip packages, container image."""
        runtime_env: dict[str, Any] = {"env_vars": dict(env)}
        environment = request.environment
        if environment is not None:
            if environment.workspace:
                runtime_env["working_dir"] = environment.workspace
            if environment.pip_packages:
                runtime_env["pip"] = list(environment.pip_packages)
            if environment.docker_image:
                runtime_env["image_uri"] = environment.docker_image
        return runtime_env

    def _task_remote(self, request: JobRequest) -> tuple[dict[str, Any], Any]:
        """The Ray options for ``request``'s replicas, and the replica function with them applied.

        Cached per job name and resources: Ray validates options on every ``.options()``
        call, and repeated submissions of the same kind of job are the common case.
        """
        environment = request.environment
        if environment is not None and (environment.workspace or environment.pip_packages or environment.docker_image):
            options = self._task_options(request)
            return options, self._replica_fn().options(**options)
        key = (request.name, request.resources)
        cached = self._options_cache.get(key)
        if cached is None:
            if len(self._options_cache) >= 256:
                self._options_cache.clear()
            options = self._task_options(request)
            cached = self._options_cache[key] = (options, self._replica_fn().options(**options))
        return cached

    def _task_options(self, request: JobRequest) -> dict[str, Any]:
        options = ray_options(request.resources, pin_resource=self._pin_resource())
        options["name"] = request.name
        environment = request.environment
        if environment is not None and (environment.workspace or environment.pip_packages or environment.docker_image):
            runtime_env = self._runtime_env(request, {})
            del runtime_env["env_vars"]
            options["runtime_env"] = runtime_env
        return options

    def _job_submission(self) -> Any:
        if self._jobs_api is None:
            from ray.job_submission import JobSubmissionClient

            _prepare_token_auth(self.address)
            address = None
            if self.address and self.address.startswith("ray://"):
                host = self.address[len("ray://") :].rsplit(":", 1)[0]
                address = os.environ.get("RAY_API_SERVER_ADDRESS") or f"http://{host}:8265"
            self._jobs_api = JobSubmissionClient(address)
        return self._jobs_api

    # ----- watching running jobs --------------------------------------------------------------

    _REAP_PERIOD = 0.1  # seconds; how soon a job nobody waits on notices it finished or must retry

    def _watch(self, job: _CallableJob) -> None:
        """Make sure ``job``'s attempt is settled (and retried) even if nobody waits on it."""
        with self._lock:
            self._watched.add(job)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="fray-ray-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        import ray

        while True:
            with self._lock:
                jobs = [j for j in self._watched if not j._state.status.finished]
                self._watched = set(jobs)
                if not jobs:  # _watch() starts a new reaper with the next job
                    self._reaper = None
                    return
            try:
                # One ray.wait over every pending replica of every job: cheap even with thousands.
                owners: dict[Any, tuple[_CallableJob, int, list[Any]]] = {}
                for job in jobs:
                    attempt, refs, pending = job._pending_refs()
                    for ref in pending:
                        owners[ref] = (job, attempt, refs)
                if owners:
                    ready, _ = ray.wait(list(owners), num_returns=len(owners), timeout=0, fetch_local=False)
                    by_job: dict[_CallableJob, list[Any]] = {}
                    for ref in ready:
                        by_job.setdefault(owners[ref][0], []).append(ref)
                    for job, refs_ready in by_job.items():
                        _, attempt, refs = owners[refs_ready[0]]
                        job._collect(attempt, refs, refs_ready)
            except Exception:  # Ray shutting down under us, or a bug: never let the reaper die
                pass
            self._reaper_wake.wait(self._REAP_PERIOD)

    # ----- jobs -------------------------------------------------------------------------------

    def submit(self, request: JobRequest, *, detached: bool = True) -> RayJobHandle:
        """Start a job on the cluster; returns at once.

        Binary jobs outlive this script unless ``detached=False``; callable jobs are Ray
        tasks of this driver and end with it (see :mod:`fray.ray._driver_exit`).
        """
        job = self._submit(request)
        track(job, self.namespace, detached=detached, outlives_driver=isinstance(job, _BinaryJob))
        return job

    def _submit(self, request: JobRequest) -> RayJobHandle:
        self._check_open()
        if not isinstance(request, JobRequest):
            raise ConfigError(f"submit() takes a JobRequest, got {type(request).__name__}")
        entry = request.entrypoint
        job_id = self._new_job_id(request.name)
        if isinstance(request.resources.device, TpuConfig):
            from fray.ray.tpu import TpuJob

            tpu_job = TpuJob(self, job_id, request, self._pickle_entry(request))
            self._register(tpu_job)
            tpu_job._launch()
            return tpu_job
        if isinstance(entry, CallableEntrypoint):
            job: RayJobHandle = _CallableJob(self, job_id, request, self._pickle_entry(request))
            self._register(job)
            job._launch()  # type: ignore[attr-defined]
            return job
        binary = _BinaryJob(self, job_id, request)
        self._register(binary)
        try:
            binary._start()
        except Exception as exc:
            with self._lock:
                self._jobs.pop(job_id, None)
            raise FrayError(f"job {request.name!r}: Ray's job API refused it: {exc}") from exc
        return binary

    def _pickle_entry(self, request: JobRequest) -> tuple[bytes, bytes]:
        entry = request.entrypoint
        if not isinstance(entry, CallableEntrypoint):
            raise ConfigError(f"job {request.name!r}: TPU jobs on Ray need a callable entrypoint")
        try:
            # Pickled once here, both to check it and to ship it: Ray then moves plain bytes.
            # The callable travels apart from its arguments so workers can reuse it unpickled.
            return self._pickled_callable(entry.callable), cloudpickle.dumps((entry.args, dict(entry.kwargs)))
        except Exception:
            check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
            raise

    def _pickled_callable(self, fn: Any) -> bytes:
        """``fn`` pickled, once per function: what Ray does when it exports a remote function.

        As with ``ray.remote``, a function defined in ``__main__`` is captured with the
        values of its globals at its first submission. Other callables (bound methods,
        partials, callable objects) are pickled at every submission.
        """
        if not isinstance(fn, types.FunctionType):
            return bytes(cloudpickle.dumps(fn))
        pickled = self._function_pickles.get(fn)
        if pickled is None:
            pickled = self._function_pickles[fn] = bytes(cloudpickle.dumps(fn))
        return pickled

    def _register(self, job: RayJobHandle) -> None:
        with self._lock:
            self._check_open()
            self._jobs[job.job_id] = job

    # ----- actors -----------------------------------------------------------------------------

    def _ray_class(self, cls: type) -> Any:
        ray_cls = self._actor_classes.get(cls)
        if ray_cls is None:
            import ray

            ray_cls = ray.remote(_worker.actor_class_for(cls))
            self._actor_classes[cls] = ray_cls
        return ray_cls

    def create_actor(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        resources: ResourceConfig = ResourceConfig(),  # noqa: B008 - frozen, so sharing the default is safe
        **kwargs: Any,
    ) -> RayActorHandle:
        """Create the named Ray actor ``name`` in this client's namespace; the handle is usable at once."""
        self._check_open()
        check_actor_request(actor_class, name, resources, args, kwargs)
        if isinstance(resources.device, TpuConfig):
            raise ConfigError(f"actor {name!r}: actors cannot take a TpuConfig on Ray; submit a TPU job instead")
        job_id = self._new_job_id(name)
        info = JobInfo(job_id, name, 0, 1, self.namespace, 0)
        env = {**job_env(info), "FRAY_CLIENT_SPEC": self.spec}
        options = ray_options(resources, pin_resource=self._pin_resource())
        # Fray reports a dead actor instead of restarting it behind the caller's back.
        options.update(name=name, namespace=self.namespace, max_restarts=0)
        try:
            ray_handle = self._ray_class(actor_class).options(**options).remote(env, *args, **kwargs)
        except ValueError as exc:
            if "already" in str(exc) or "taken" in str(exc):
                raise JobAlreadyExists(
                    f"an actor named {name!r} is already alive in Ray namespace {self.namespace!r}; shut it down "
                    "first or pick another name"
                ) from None
            raise
        handle = RayActorHandle(name, self.namespace, actor_class, ray_handle)
        job = _ActorJob(self, job_id, handle)
        with self._lock:
            self._jobs[job_id] = job
            self._actor_jobs[job_id] = job
            self._actor_handles[name] = handle
        return handle

    def create_actor_group(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        count: int,
        resources: ResourceConfig = ResourceConfig(),  # noqa: B008
        **kwargs: Any,
    ) -> ActorGroup:
        """Create ``count`` actors ``{name}-0`` ... ``{name}-{count-1}``; returns at once."""
        handles = [
            self.create_actor(actor_class, *args, name=member, resources=resources, **kwargs)
            for member in group_member_names(name, count)
        ]
        with self._lock:
            jobs = [next(j for j in self._actor_jobs.values() if j._handle is h) for h in handles]
        return ActorGroup(handles, jobs)

    def _forget_actor(self, job_id: str) -> None:
        with self._lock:
            job = self._actor_jobs.pop(job_id, None)
            if job is not None and self._actor_handles.get(job._name) is job._handle:
                del self._actor_handles[job._name]

    # ----- lifecycle --------------------------------------------------------------------------

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait`` let running jobs finish; then kill this client's actors.

        Disconnects from Ray when this was the last RayClient and Fray made the connection.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs = [j for j in self._jobs.values() if not isinstance(j, _ActorJob)]
            actors = list(self._actor_jobs.values())
        # Jobs first, actors after: running jobs may still be calling the actors.
        for job in jobs:
            if wait:
                job.wait(raise_on_failure=False)
            else:
                job.terminate()
        for actor in actors:
            actor.terminate()
        self._reaper_wake.set()
        self._monitor.shutdown(wait=True)
        if _CLIENTS.get(self.namespace) is self:
            del _CLIENTS[self.namespace]
        _CONNECTION.release()
