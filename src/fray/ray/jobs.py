"""Job handles of the Ray backend: callable jobs and the job hosting an actor.

Every kind keeps its state in a :class:`~fray.core._lifecycle.JobLifecycle` (the one state
machine, retry budget and failure wording of every backend); what every kind shares is
:class:`RayJobHandle` (in ``_job_handle.py``). Binary jobs live in ``binary.py`` and TPU
jobs, which are callable jobs placed on whole slices, in ``tpu.py``.

A callable job is one Ray task per replica; the replicas of one job are
gang-scheduled in a placement group (all start or none) and live and die together.
Fray runs the retry loop itself, so an exception raised by the job counts against
``max_retries_failure`` and a lost worker or node against ``max_retries_preemption``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from fray.actor_context import SHUTDOWN_GRACE
from fray.core._death import out_of_memory
from fray.core._lifecycle import ActorRestartBudget, Failure
from fray.core._remote import RemoteFailure
from fray.errors import FrayError
from fray.job import JobInfo, JobRequest, JobStatus, replicas_to_preempt, timeout_error
from fray.job_info import replica_env
from fray.ray._board import BOARD
from fray.ray._errors import first_line, is_preemption
from fray.ray._job_handle import LIVE, RayJobHandle
from fray.ray._launch import Launcher, unique_suffix, user_env
from fray.ray._stacks import job_stacks, task_prefix
from fray.ray.actors import RayActorHandle
from fray.ray.inside import _worker
from fray.ray.inside._actor_end import read_end
from fray.ray.resources import bundle, ray_options
from fray.resources import device_name
from fray.stacks import ProcessStacks

__all__ = ["ActorJob", "CallableJob", "RayJobHandle"]

# How long preempt() waits for a replica that was just launched to report where it runs.
_PREEMPT_WAIT = 60.0
_JOIN_TIMEOUT = 10.0  # seconds terminate() waits for an actor watcher's last look at Ray (it takes milliseconds)


# ----- callable jobs ---------------------------------------------------------------------------


class CallableJob(RayJobHandle):
    """A callable job: one Ray task per replica, retried by Fray within the job's two budgets.

    Subclasses (TPU jobs) change how an attempt is placed by overriding :meth:`_launch`
    and hand the attempt's tasks to :meth:`_start_attempt`; settling, retrying and
    stopping stay here.
    """

    def __init__(self, launcher: Launcher, job_id: str, request: JobRequest, payload: tuple[bytes, bytes]) -> None:
        super().__init__(
            job_id, request.name, request.max_retries_failure, request.max_retries_preemption, request.timeout_seconds
        )
        self._launcher = launcher
        self._request = request
        self._payload = payload
        self._uid = f"{job_id}.{unique_suffix()}"  # unique across every client of the cluster
        self._refs: list[Any] = []
        self._outcomes: dict[int, tuple[str, Any]] = {}
        self._placement_group: Any = None
        self._settle_lock = threading.Lock()
        self._armed: list[Any] | None = None  # the refs whose completion calls back (see _arm)
        self._completed = False  # a ref completed since the job last looked (set by those callbacks)

    def _needs(self) -> tuple[dict[str, float], int] | None:
        options = ray_options(self._request.resources, pin_resource=self._launcher.pin_resource())
        return bundle(options), self._request.replicas

    # Launching ---------------------------------------------------------------------------------

    def _replica_env(self, index: int, count: int, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of replica ``index`` of ``count`` in the current attempt."""
        launcher, request = self._launcher, self._request
        device = device_name(request.resources.device)
        info = JobInfo(
            self._job_id,
            request.name,
            index,
            count,
            launcher.namespace,
            self._lifecycle.attempt,
            device,
            priority_band=request.priority,
        )
        return replica_env(info, launcher.spec, {**(extra or {}), **user_env(request)})

    def _replica_arguments(self, index: int, env: dict[str, str]) -> tuple[bytes]:
        """The arguments of the Ray task running replica ``index`` (see ``_worker.run_job_replica``)."""
        key = _worker.started_key(self._uid, self._lifecycle.attempt, index)
        pickled_fn, pickled_args = self._payload
        return _worker.replica_arguments(pickled_fn, pickled_args, env, key)

    def _launch(self) -> None:
        """Start one attempt: every replica at once, in a placement group when there are several."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        count = self._request.replicas
        options, configured = self._launcher.task_remote(self._request)
        remotes = [configured] * count
        if count > 1:
            from ray.util.placement_group import placement_group

            # A placement group reserves every replica's resources at once: all start or none.
            self._placement_group = placement_group([bundle(options)] * count, strategy="PACK")
            remotes = [
                self._launcher.replica_fn().options(
                    **options,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._placement_group, placement_group_bundle_index=i
                    ),
                )
                for i in range(count)
            ]
        refs = [
            remote.remote(*self._replica_arguments(i, self._replica_env(i, count))) for i, remote in enumerate(remotes)
        ]
        self._start_attempt(refs)

    def _start_attempt(self, refs: list[Any]) -> None:
        """Watch the tasks of a new attempt; cancel them at once if terminate() came first."""
        with self._lock:
            stale = self._stopping or self._lifecycle.finished
            if not stale:
                self._refs = refs  # never changed in place: a new list per attempt
                self._outcomes = {}
            attempt = self._lifecycle.attempt
        if stale:
            _cancel(refs)
            self._remove_placement_group()
            return
        self._launcher.watch(self, attempt, refs)
        if self._on_board:
            self._arm()
        self._notify()

    # Completion --------------------------------------------------------------------------------
    #
    # No callback per replica: Ray's per-object completion callbacks cost a thread switch
    # each and cut task throughput by a third. Instead whoever waits (wait(), status(), or
    # the launcher's reaper thread for jobs nobody watches) asks Ray with ray.wait and
    # settles the outcome itself, under one lock, exactly once per attempt. Only while
    # wait_all watches many jobs at once do their replicas call back (see _arm).

    def _pending_refs(self) -> tuple[int, list[Any], list[Any]]:
        with self._lock:
            refs, outcomes = self._refs, self._outcomes
            return (
                self._lifecycle.attempt,
                refs,
                [r for i, r in enumerate(refs) if i not in outcomes] if outcomes else refs,
            )

    def _poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for replicas of the current attempt to finish, then act on them."""
        import ray

        attempt, refs, pending = self._pending_refs()
        if not pending or self._stopping:
            # No attempt running (slices being reserved, a retry starting), or terminate() is
            # finishing the job: wait for either to happen.
            if timeout != 0:
                self._wait_for_change(refs, timeout)
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

    def _wait_for_change(self, refs: list[Any], timeout: float | None) -> None:
        """Block until a new attempt started (or the job finished), or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._join_board()
        while True:
            generation = BOARD.generation
            with self._lock:
                if self._refs is not refs or self._lifecycle.finished:
                    return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            BOARD.wait(generation, remaining)

    def _collect(self, attempt: int, refs: list[Any], ready: list[Any], fetched: tuple[str, Any] | None = None) -> None:
        """Record the outcomes of the ``ready`` replicas (``fetched``: of the only one, already got)."""
        import ray

        with self._settle_lock:
            if attempt != self._lifecycle.attempt or self._lifecycle.finished or self._stopping:
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
                if outcome[0] == "returned" and outcome[1] is not None and outcome[1][1]:
                    self._log.write(outcome[1][1])
                with self._lock:
                    self._outcomes[index] = outcome
            outcomes = dict(self._outcomes)
            failures = {i: o for i, o in outcomes.items() if o[0] == "raised" or (o[1] is not None and o[1][0] != "ok")}
            if failures or len(outcomes) == len(refs):
                self._end_attempt(attempt, refs, outcomes, failures)

    def _end_attempt(
        self, attempt: int, refs: list[Any], outcomes: dict[int, tuple[str, Any]], failures: dict[int, Any]
    ) -> None:
        """Decide what a finished (or partly failed) attempt means: success, retry, or failure."""
        if failures and len(outcomes) < len(refs):
            # A gang lives and dies together: stop the replicas that are still running.
            _cancel([ref for i, ref in enumerate(refs) if i not in outcomes])
        self._remove_placement_group()
        self._lifecycle.start()  # the attempt ran, whether or not status() saw it running
        if not failures:
            # A first attempt that succeeded left no keys behind: each replica deleted its own.
            if self._lifecycle.succeed() and self._lifecycle.attempt > 0:
                self._forget_started_keys()
            return
        index = min(failures)
        failure = _failure_of(failures[index]).in_replica(index, len(refs))
        with self._lock:
            if self._stopping:  # terminate() is ending the job as STOPPED
                return
            retry = self._lifecycle.attempt_failed(failure)
            if retry:
                self._refs, self._outcomes = [], {}
        if not retry:
            self._forget_started_keys()
            return
        self._log.write(f"[fray] attempt {attempt} failed, {self._lifecycle.pending_reason.splitlines()[0]}")
        self._launch()

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finishes; raise JobFailed if it failed and ``raise_on_failure``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._lifecycle.finished:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise timeout_error(self.info(), timeout)
            self._poll(remaining)
        return self._lifecycle.result(raise_on_failure=raise_on_failure)

    # Waiting for many (fray.wait_all) ------------------------------------------------------------

    def _join_board(self) -> None:
        super()._join_board()
        self._arm()

    def _arm(self) -> None:
        """Have the current attempt's replicas call back when they complete (for jobs on the board)."""
        with self._lock:
            if not self._refs or self._armed is self._refs:
                return
            refs = self._armed = self._refs
        for ref in refs:
            ref._on_completed(self._ref_completed)

    def _ref_completed(self, _data: Any) -> None:
        self._completed = True
        self._notify()

    def _running_refs(self) -> list[Any] | None:
        _, refs, pending = self._pending_refs()
        return pending if refs and not self._stopping else None

    def _settle(self) -> JobStatus:
        if self._completed:
            self._completed = False
            self._poll(0)
        return self._lifecycle.status

    # Status ------------------------------------------------------------------------------------

    def status(self) -> JobStatus:
        """PENDING until a replica has run for a moment (see ``_worker.STARTED_AFTER``), then RUNNING."""
        lifecycle = self._lifecycle
        if not lifecycle.finished:
            self._poll(0)
        if lifecycle.status != JobStatus.PENDING:
            return lifecycle.status
        from ray.experimental import internal_kv

        attempt, refs, _ = self._pending_refs()
        for index in range(len(refs)):
            key = _worker.started_key(self._uid, attempt, index)
            with contextlib.suppress(Exception):
                if internal_kv._internal_kv_exists(key, namespace=_worker.KV_NAMESPACE):
                    lifecycle.start()
                    break
        return lifecycle.status

    def _forget_started_keys(self) -> None:
        # Replicas that end normally delete their own key. Only replicas that were killed
        # (a lost worker, a cancelled gang member, terminate()) may have left one behind.
        with self._lock:
            ended = len(self._outcomes) == len(self._refs) and all(o[0] == "returned" for o in self._outcomes.values())
            clean = ended and not self._stopping and self._lifecycle.attempt == 0
        if not clean:
            with contextlib.suppress(RuntimeError):  # the client is shutting down
                self._launcher.monitor.submit(self._delete_started_keys)

    def _delete_started_keys(self) -> None:
        from ray.experimental import internal_kv

        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(
                f"started/{self._uid}/".encode(), del_by_prefix=True, namespace=_worker.KV_NAMESPACE
            )
            # And those of job-context tasks killed with the job (tasks that end delete their own).
            internal_kv._internal_kv_del(task_prefix(self._job_id), del_by_prefix=True, namespace=_worker.KV_NAMESPACE)

    # Stopping ----------------------------------------------------------------------------------

    def terminate(self) -> None:
        """Cancel every replica with ``ray.cancel(force=True)`` (their worker processes are killed)."""
        import ray

        if not self._begin_stop():
            return
        with self._lock:
            refs = self._refs
        _cancel(refs)
        # Return only once the work is really gone, so callers can rely on it.
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=30, fetch_local=False)
        self._remove_placement_group()
        if self._lifecycle.stop():
            self._forget_started_keys()

    # Live stacks -------------------------------------------------------------------------------

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """Each replica of the running attempt, then each job-context task running (``fray.ray._stacks``)."""
        if self._lifecycle.finished:
            return ()
        attempt, refs, _ = self._pending_refs()
        with self._lock:
            ended = set(self._outcomes)
        keys = [_worker.started_key(self._uid, attempt, index) for index in range(len(refs))]
        return job_stacks(self._job_id, keys, ended, timeout, locals)

    # Fault injection ---------------------------------------------------------------------------

    def _fray_preempt(self, replica: int | None) -> None:
        """SIGKILL the replicas' Ray worker processes (see :func:`fray.testing.preempt`).

        Ray reports each as a crashed worker, which :func:`~fray.ray._errors.is_preemption`
        counts as a preemption. The pid and node come from the replica's started key, so a
        replica is preempted once it has run for :data:`~fray.ray.inside._worker.STARTED_AFTER`.
        """
        from ray.experimental import internal_kv
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        import ray

        self.status()
        attempt, refs, _ = self._pending_refs()
        if self._lifecycle.finished or not refs or self._stopping:
            raise FrayError(
                f"job {self._job_id!r} is {self._lifecycle.status.value} with no attempt running: nothing to preempt"
            )
        targets: list[tuple[bytes, int, str]] = []
        deadline = time.monotonic() + _PREEMPT_WAIT
        for index in replicas_to_preempt(self._job_id, len(refs), replica):
            key = _worker.started_key(self._uid, attempt, index)
            while not (value := internal_kv._internal_kv_get(key, namespace=_worker.KV_NAMESPACE)):
                with self._lock:
                    ended = index in self._outcomes or self._refs is not refs
                if ended or time.monotonic() > deadline:
                    raise FrayError(f"job {self._job_id!r}: replica {index} of attempt {attempt} is not running")
                time.sleep(0.02)
            pid, node = value.decode().split()
            targets.append((key, int(pid), node))
        killer = ray.remote(num_cpus=0, max_retries=0)(_worker.kill_replica)
        ray.get(
            [
                killer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(key, pid)
                for key, pid, node in targets
            ]
        )

    def _remove_placement_group(self) -> None:
        with self._lock:
            group, self._placement_group = self._placement_group, None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(group)

    def _live_logs(self) -> list[str]:
        # Output of replicas still running, through Ray's log API (needs the dashboard);
        # finished replicas' output is already in the job's own log.
        if self._lifecycle.status != JobStatus.RUNNING:
            return []
        with self._lock:
            pending = [ref for i, ref in enumerate(self._refs) if i not in self._outcomes]
        return [line for ref in pending for line in _ray_log(task_id=ref.task_id().hex())]


def _ray_log(*, task_id: str | None = None, actor_id: str | None = None) -> list[str]:
    """The last lines Ray's log API has for a task or actor (none when it has no dashboard)."""
    lines: list[str] = []
    with contextlib.suppress(Exception):
        from ray.util.state import get_log

        import ray

        # The connected cluster's GCS names its dashboard; Ray alone gives up when a machine runs several.
        address = ray.get_runtime_context().gcs_address
        for chunk in get_log(address=address, task_id=task_id, actor_id=actor_id, tail=1000, timeout=5):
            lines.extend(chunk.rstrip("\n").split("\n"))
    return lines


def _cancel(refs: list[Any]) -> None:
    """Kill the tasks of ``refs`` (``ray.cancel(force=True)`` ends their worker processes)."""
    import ray

    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)


def _failure_of(outcome: tuple[str, Any]) -> Failure:
    """Why one replica's attempt failed: its own exception, a lost worker or node, or another Ray error."""
    kind, value = outcome
    if kind == "returned":  # ("error", logs, the encoded RemoteFailure) from the worker
        return Failure.from_remote(RemoteFailure.decode(value[2]))
    if is_preemption(value):
        # Ray does not say which signal or exit ended a crashed worker: a preempted node looks the same.
        return Failure.lost(f"lost its worker or node ({type(value).__name__}): {first_line(value)}")
    import ray.exceptions

    if isinstance(value, ray.exceptions.OutOfMemoryError):  # Ray's memory monitor killed it: the job's own doing
        return Failure(out_of_memory(f"Ray's memory monitor killed its worker ({first_line(value)})"))
    return Failure(f"{type(value).__name__}: {first_line(value)}")


# ----- the job hosting an actor ----------------------------------------------------------------


class ActorJob(RayJobHandle):
    """The job hosting one actor: RUNNING while alive, FAILED if it died, STOPPED once terminated.

    Ray does not tell anyone that an actor died, so while someone waits for the job a
    watcher thread asks Ray's control store (GCS), more rarely the longer the actor lives.
    """

    _WATCH_MAX = 0.2  # seconds between two looks at a long-lived actor

    def __init__(
        self,
        job_id: str,
        handle: RayActorHandle,
        on_terminate: Callable[[str], None] | None = None,
        *,
        max_restarts: int = 0,
        detached: bool = False,
    ) -> None:
        super().__init__(job_id, handle._name)
        self._handle = handle
        self._on_terminate = on_terminate
        self._max_restarts = max_restarts
        self.detached = detached
        self._terminated = False
        self._watcher: threading.Thread | None = None

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_actor_job, (self._job_id, self._handle))

    def status(self) -> JobStatus:
        """From the actor's state in Ray's control store (GCS)."""
        if self._lifecycle.finished:
            return self._lifecycle.status
        ready = self._handle._fray_ready()
        if ready.done() and ready.exception() is not None:
            self._finish_dead(ready.exception())
            return self._lifecycle.status
        state = self._handle._ray_state()
        if state == "DEAD":
            self._finish_dead(None)
        elif state == "ALIVE" or ready.done():
            self._lifecycle.start()
        return self._lifecycle.status

    def _finish_dead(self, exc: BaseException | None) -> None:
        if self._terminated:
            self._lifecycle.stop()
            return
        started = self._handle.start_failure
        if started is not None:
            message = f"actor {self._name!r} did not start: {started.summary}"
            self._lifecycle.fail(Failure.from_remote(started).with_message(message))
            return
        ended, failure = read_end(self._job_id)
        if ended:
            if failure is None:
                self._lifecycle.succeed()
            else:
                self._lifecycle.fail(failure)
            return
        # Ray restarted it as often as allowed (it counts restarts itself): word the end as every backend does.
        info = self._handle._ray_info()
        reason = str(exc) if exc is not None else "Ray reports it dead"
        budget = ActorRestartBudget(self._max_restarts, restarts=int(info.get("NumRestarts") or 0))
        self._lifecycle.fail(Failure.lost(budget.decide(self._name, reason)[2]))

    def _watch(self) -> None:
        with self._lock:
            if self._watcher is not None or self._lifecycle.finished:
                return
            self._watcher = threading.Thread(target=self._watch_death, name=f"fray-actor-{self._name}", daemon=True)
        self._watcher.start()

    def _watch_death(self) -> None:
        delay = 0.01
        while not self._lifecycle.wait_done(delay):
            with contextlib.suppress(Exception):  # Ray shutting down: the job ends with the client
                self.status()
            delay = min(delay * 2, self._WATCH_MAX)

    def _join_board(self) -> None:
        super()._join_board()
        self._watch()

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the actor is gone (it was terminated or died)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._watch()
        if not self._lifecycle.wait_done(timeout):
            raise timeout_error(self.info(), timeout)
        if self._terminated:
            # ray.kill only asks; wait (bounded) until Ray says the actor is gone, so that
            # after wait() no other process can still reach it. Ray has no event for this.
            gone_by = time.monotonic() + 10.0 if deadline is None else deadline
            while self._handle._ray_state() not in ("DEAD", None) and time.monotonic() < gone_by:
                time.sleep(0.01)
        return self._lifecycle.result(raise_on_failure=raise_on_failure)

    def terminate(self) -> None:
        """Stop the actor: calls fail with ActorDiedError; its code sees ``shutdown_requested``, then it is killed.

        A method still running is given up to ``SHUTDOWN_GRACE`` seconds to end after
        ``current_actor().shutdown_requested`` is set; then the process is killed
        (``ray.kill``).
        """
        self._terminated = True
        self._handle._killed = True  # calls from here fail at once, and results still to come are dropped
        if not self._lifecycle.finished and self._handle._fray_ready().done():
            with contextlib.suppress(Exception):  # dead already, or Ray going away: kill it regardless
                import ray

                ref = self._handle._resolve().__fray_shutdown__.remote(SHUTDOWN_GRACE)
                ray.wait([ref], timeout=SHUTDOWN_GRACE + 5.0)
        self._handle._kill()
        self._lifecycle.stop()
        with self._lock:
            watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            # Its look at Ray ends within one call: a caller may shut Ray down next, and a Ray call
            # still in flight then ends the whole process.
            watcher.join(timeout=_JOIN_TIMEOUT)
        if self._on_terminate is not None:
            self._on_terminate(self._job_id)

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The actor's stacks (:meth:`RayActorHandle.stacks`); none once the job finished."""
        if self._lifecycle.finished:
            return ()
        return self._handle.stacks(timeout, locals=locals)

    def _live_logs(self) -> list[str]:
        actor_id = self._handle._actor_id()
        return [] if actor_id is None else _ray_log(actor_id=actor_id)


def _restore_actor_job(job_id: str, handle: RayActorHandle) -> ActorJob:
    job = LIVE.get(job_id)
    return job if isinstance(job, ActorJob) else ActorJob(job_id, handle)
