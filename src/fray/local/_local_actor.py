"""The local backend's actors: one object served by its own threads, and the handle that calls it.

Arguments and return values are passed as they are, unpickled. With the client's
``check_pickling`` they are checked the way every other backend checks them -- arguments
must pickle (refused in the caller, nothing queued), return values must pickle (the
caller gets the :class:`~fray.errors.SerializationError`). A method's exception reaches
the caller in the one remote form (:func:`~fray.core._remote.remote_error`) either way, so
code that passes here does not fail later on a cluster.

An actor lives as a series of *incarnations* (:class:`_Incarnation`): one instance of
the class with its threads (``max_concurrency`` of them, all taking calls from one
FIFO queue) and its event loop. The local backend's stand-in for a process death
(:func:`fray.testing.kill_actor`) ends the current incarnation at once; the actor
then starts a new one, its constructor run again, while ``ActorConfig.max_restarts``
allows (counted by :class:`~fray.core._lifecycle.ActorRestartBudget`), or stays dead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import os
import queue
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any

from fray.actor import ActorFuture, ActorHandleBase, RemoteMethod, check_actor_method
from fray.actor_config import ActorConfig
from fray.actor_context import SHUTDOWN_GRACE, ActorContext, ActorEnd, bind_actor
from fray.client import Client, _bind_client
from fray.core._lifecycle import ActorRestartBudget, Failure
from fray.core._remote import RemoteFailure, actor_died, copy_died, remote_error, self_ended
from fray.core._serialization import check_call_picklable, check_result_picklable
from fray.core.inside._eventloop import ActorLoop, invoke
from fray.core.inside._logcapture import capture_to
from fray.core.inside._runtime import StoppableRun, terminating_on
from fray.errors import ActorDiedError, ActorUnavailableError, SerializationError
from fray.job import JobInfo
from fray.job_info import _current_job
from fray.local._local_job import LocalJob
from fray.local._local_stacks import thread_stacks
from fray.stacks import ProcessStacks

__all__ = ["LocalActor", "LocalActorHandle"]

# Every live actor, so that a handle unpickled in this process finds its actor again.
_ACTORS: weakref.WeakValueDictionary[tuple[str, str], LocalActor] = weakref.WeakValueDictionary()

_STOP = object()


class _Call:
    """One call: its future, what to run, and how many times it was sent again after a death."""

    __slots__ = ("args", "future", "kwargs", "method", "retries", "started")

    def __init__(self, future: ActorFuture, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.future = future
        self.method = method
        self.args = args
        self.kwargs = kwargs
        self.retries = 0
        self.started = False


# How long a terminated actor's last thread waits for its event loop's thread to end.
_LOOP_STOP_SECONDS = 10.0


class _Incarnation:
    """One instance of the actor with its threads, event loop and :class:`ActorContext`."""

    def __init__(self, number: int, label: str, context: ActorContext, calls: list[_Call]) -> None:
        self.number = number
        self.context = context
        self.loop = ActorLoop(label)
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for call in calls:
            self.calls.put(call)
        self.running: dict[_Call, None] = {}  # an ordered set, guarded by the actor's lock
        self.runs: list[StoppableRun] = []
        self.idents: set[int] = set()  # its threads' idents (for stacks()), guarded by the actor's lock
        self.threads = 0  # started and not yet ended
        self.instance: object = None
        self.dead = False

    def stop(self, *, hard: bool) -> None:
        """Tell its threads to finish; ``hard`` also stops the code they run now (and the loop)."""
        for _ in range(max(self.threads, 1)):
            self.calls.put(_STOP)
        if hard:
            for run in list(self.runs):
                run.stop()  # a method in progress gets JobTerminated at its next Python instruction
            self.loop.close()  # an async method stops at its next await


class LocalActor:
    """One actor: its job, its current incarnation, its restart budget, and its final death."""

    def __init__(
        self,
        client: Client,
        job: LocalJob,
        cls: type,
        info: JobInfo,
        on_gone: Callable[[LocalActor], None],
        config: ActorConfig,
        group: tuple[str, int] | None = None,
        *,
        check_pickling: bool = False,
    ) -> None:
        self.client = client
        self.check_pickling = check_pickling
        self.job = job
        self.name = job.name
        self.cls = cls
        self.info = info
        self.config = config
        self.group = group
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.death: ActorDiedError | None = None
        self._lock = threading.Lock()
        self._budget = ActorRestartBudget(config.max_restarts, config.max_task_retries)
        self._terminated = False
        self._on_gone = on_gone
        self._incarnation: _Incarnation | None = None
        self._start: tuple[tuple[Any, ...], dict[str, Any], contextvars.Context] | None = None
        _ACTORS[(job.client_id, job.job_id)] = self
        job.actor_stacks = self.stacks
        job.on_stop(lambda: self.stop("was terminated"))

    # ----- starting --------------------------------------------------------------------------

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any], context: contextvars.Context) -> None:
        """Start the first incarnation: its thread builds the instance, then serves calls."""
        self._start = (args, kwargs, context)
        with self._lock:
            incarnation = self._incarnation = self._new_incarnation(0, [])
        self._launch(incarnation)

    def _new_incarnation(self, number: int, calls: list[_Call]) -> _Incarnation:
        group_name, index = self.group if self.group is not None else (None, 0)
        handle = LocalActorHandle(self, self.cls, self.name, self.job.client_id)
        context = ActorContext.of_actor(self.name, group_name, index, lambda: handle)
        return _Incarnation(number, self.name, context, calls)

    def _launch(self, incarnation: _Incarnation) -> None:
        assert self._start is not None
        args, kwargs, context = self._start
        self._spawn(incarnation, context, self._host, args, kwargs)

    def _spawn(self, incarnation: _Incarnation, context: contextvars.Context, *target: Any) -> None:
        with self._lock:
            incarnation.threads += 1
        thread = threading.Thread(
            target=context.copy().run,
            args=(self._thread_main, incarnation, *target),
            name=f"fray-actor-{self.name}",
            daemon=True,
        )
        thread.start()

    def _thread_main(self, incarnation: _Incarnation, body: Callable[..., None], *args: Any) -> None:
        _bind_client(self.client)
        _current_job.set(self.info if incarnation.number == 0 else _attempt(self.info, incarnation.number))
        bind_actor(incarnation.context)
        run = StoppableRun()
        with self._lock:
            incarnation.runs.append(run)
            incarnation.idents.add(threading.get_ident())
            stopped = incarnation.dead and self._terminated
        if stopped:
            run.stop()
        try:
            with capture_to(self.job.logs), terminating_on(self.job.job_id, self.job.cancel):
                body(incarnation, run, *args)
        finally:
            with self._lock:
                incarnation.idents.discard(threading.get_ident())
            self._thread_ended(incarnation)

    def _host(
        self, incarnation: _Incarnation, run: StoppableRun, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if incarnation.number == 0:
            self.job.lifecycle.start()
        try:
            instance = run.run(self.cls, *args, **kwargs)
        except BaseException as exc:
            self._init_failed(incarnation, run, exc)
            return
        with self._lock:
            if incarnation.dead:
                return
            incarnation.instance = instance
        end = incarnation.context.end_request()
        if end is not None:
            self._end(incarnation, end)
            return
        _settle(self.ready, None, None)
        assert self._start is not None
        for _ in range(self.config.max_concurrency - 1):
            self._spawn(incarnation, self._start[2], self._serve)
        self._serve(incarnation, run)

    def stacks(self, locals: bool) -> ProcessStacks:
        """The stacks of the threads serving the actor now (its method threads and its event loop's)."""
        label = f"actor {self.name!r}"
        with self._lock:
            incarnation = self._incarnation
            alive = incarnation is not None and not incarnation.dead
            idents = set(incarnation.idents) if incarnation is not None else set()
        if not alive or incarnation is None:
            host, pid = socket.gethostname(), os.getpid()
            why = self.death or ("it has ended" if incarnation is not None else "it has not started")
            return ProcessStacks(label, host, pid, error=f"the actor is not running: {why} (pid {pid} on host {host})")
        loop = incarnation.loop.thread_ident
        if loop is not None:
            idents.add(loop)
        return thread_stacks([(label, frozenset(idents), None)], locals)[0]

    # ----- serving ---------------------------------------------------------------------------

    def submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Queue a call; its future fails at once with ActorDiedError if the actor is gone."""
        future = ActorFuture()
        with self._lock:
            death, incarnation = self.death, self._incarnation
            if death is None and incarnation is not None:
                incarnation.calls.put(_Call(future, method, args, kwargs))
        if death is not None:
            future.set_exception(copy_died(death))
        return future

    def _serve(self, incarnation: _Incarnation, run: StoppableRun) -> None:
        while True:
            item = incarnation.calls.get()
            if item is _STOP:
                return
            call: _Call = item
            if not call.started:
                if not call.future.set_running_or_notify_cancel():
                    continue  # cancelled by the caller before it started
                call.started = True
            with self._lock:
                gone = incarnation.dead
                if not gone:
                    incarnation.running[call] = None
            if gone:  # taken off the queue just as the incarnation died
                self._in_flight_died(incarnation, call)
                return
            value, error = self._call(incarnation, run, call)
            with self._lock:
                if call not in incarnation.running:
                    return  # the incarnation died meanwhile and settled this call already
                del incarnation.running[call]
            _settle(call.future, value, error)
            end = incarnation.context.end_request()
            if end is not None:
                self._end(incarnation, end)
                return

    def _call(self, incarnation: _Incarnation, run: StoppableRun, call: _Call) -> tuple[Any, BaseException | None]:
        try:
            value = run.run(invoke, incarnation.instance, call.method, call.args, call.kwargs, incarnation.loop)
        except BaseException as exc:
            return None, remote_error(RemoteFailure.capture(exc), original=exc)
        if self.check_pickling:
            try:
                check_result_picklable(self.name, call.method, value)
            except SerializationError as exc:
                return None, exc
        return value, None

    def _thread_ended(self, incarnation: _Incarnation) -> None:
        with self._lock:
            incarnation.threads -= 1
            last = incarnation.threads == 0 and incarnation.dead
            final = last and self._incarnation is incarnation and self._terminated
        if last:
            # Terminated: STOPPED only once the loop's thread has ended too (an async method stops
            # at its next await; one that never awaits is not waited for beyond the grace).
            incarnation.loop.close(wait=final, timeout=_LOOP_STOP_SECONDS)
        if final:
            self.job.lifecycle.stop()  # terminated: STOPPED once its last thread has ended

    # ----- dying -----------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Terminate: calls in flight and queued fail now; the code gets ``shutdown_requested``, then is stopped."""
        with self._lock:
            if self.death is not None or self._incarnation is None:
                return
            self.death = ActorDiedError(f"actor {self.name!r} {reason}")
            self._terminated = True
            incarnation = self._incarnation
            incarnation.dead = True
            calls = self._take_calls(incarnation)
            busy = bool(calls[0]) or incarnation.instance is None
        incarnation.context.shutdown_requested.set()
        # Callers must not wait on code that may take time to stop: their calls fail now,
        # as they would if a process had died.
        for call in calls[0] + calls[1]:
            _settle(call.future, None, copy_died(self.death))
        _settle(self.ready, None, copy_died(self.death))
        self._on_gone(self)
        if busy:
            incarnation.stop(hard=False)
            threading.Thread(
                target=self._stop_after_grace, args=(incarnation,), name=f"fray-stop-{self.name}", daemon=True
            ).start()
        else:
            incarnation.stop(hard=True)
        with self._lock:
            idle = incarnation.threads == 0
        if idle:
            self.job.lifecycle.stop()

    def _stop_after_grace(self, incarnation: _Incarnation) -> None:
        # A method that watches shutdown_requested may finish on its own within the grace.
        ended = threading.Event()
        self.job.lifecycle.add_done_callback(lambda _: ended.set())
        if not ended.wait(SHUTDOWN_GRACE):
            incarnation.stop(hard=True)

    def kill(self, reason: str = "its process was killed by fray.testing.kill_actor") -> None:
        """The stand-in for a process death: in-flight calls fail (or go to the restarted actor); restart or die."""
        with self._lock:
            incarnation = self._incarnation
            if self.death is not None or incarnation is None:
                return
            incarnation.dead = True
            running, queued = self._take_calls(incarnation)
            self._budget, restart, message = self._budget.decide(self.name, reason)
            if restart:
                retried = [c for c in running + queued if self._budget.retries_call(c.retries)]
                for call in retried:
                    call.retries += 1
                failed = [c for c in running + queued if c not in retried]
                self._incarnation = self._new_incarnation(incarnation.number + 1, retried)
            else:
                self.death = ActorDiedError(message)
                failed = running + queued
        incarnation.stop(hard=True)
        note = "; the actor is restarting" if restart else ""
        for call in failed:
            _settle(call.future, None, ActorDiedError(f"actor {self.name!r} died while the call was in flight{note}"))
        if restart:
            self.job.logs.write(f"[fray] {message}\n")
            assert self._incarnation is not None
            self._launch(self._incarnation)
        else:
            self._finish(lambda: self.job.lifecycle.fail(Failure.lost(message)))

    def _take_calls(self, incarnation: _Incarnation) -> tuple[list[_Call], list[_Call]]:
        # Caller holds the lock: the calls running, then those queued, in the order they were made.
        running = list(incarnation.running)
        incarnation.running.clear()
        queued = []
        while True:
            try:
                item = incarnation.calls.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                queued.append(item)
        return running, queued

    def _in_flight_died(self, incarnation: _Incarnation, call: _Call) -> None:
        # A call one of a dead incarnation's threads took off its queue just as it died.
        with self._lock:
            current, death = self._incarnation, self.death
            if death is None and current is not incarnation and self._budget.retries_call(call.retries):
                assert current is not None
                call.retries += 1
                current.calls.put(call)
                return
        error = copy_died(death) if death is not None else ActorDiedError(f"actor {self.name!r} died")
        _settle(call.future, None, error)

    def _end(self, incarnation: _Incarnation, end: ActorEnd) -> None:
        """The actor asked to end (``exit()`` / ``fail()``) and the call that asked has returned."""
        death = self_ended(self.name, end.error)
        with self._lock:
            if self.death is not None or incarnation.dead:
                return
            self.death = death
            incarnation.dead = True
            running, queued = self._take_calls(incarnation)
        incarnation.stop(hard=True)
        for call in running + queued:
            _settle(call.future, None, copy_died(death))
        if end.error is None:
            self._finish(self.job.lifecycle.succeed)
        else:
            failure = Failure.from_exception(end.error)
            self._finish(
                lambda: self.job.lifecycle.fail(failure.with_message(f"actor failed itself: {failure.message}"))
            )

    def _init_failed(self, incarnation: _Incarnation, run: StoppableRun, exc: BaseException) -> None:
        with self._lock:
            stale = incarnation.dead or run.stopped
        if stale:  # killed or terminated while the constructor ran: that path settles everything
            return
        remote = RemoteFailure.capture(exc)
        self.job.logs.write(remote.traceback_text)
        death = actor_died(
            f"actor {self.name!r} died in __init__: {remote.summary}", remote_error(remote, original=exc)
        )
        with self._lock:
            if self.death is not None:
                return
            self.death = death
            incarnation.dead = True
            running, queued = self._take_calls(incarnation)
        for call in running + queued:
            _settle(call.future, None, copy_died(death))
        failure = Failure(f"actor __init__ raised {remote.summary}", remote=remote, original=exc)
        self._finish(lambda: self.job.lifecycle.fail(failure))

    def _finish(self, move: Callable[[], object]) -> None:
        assert self.death is not None
        _settle(self.ready, None, copy_died(self.death))
        move()
        self._on_gone(self)


def _attempt(info: JobInfo, number: int) -> JobInfo:
    return dataclasses.replace(info, attempt=number)


def _settle(future: concurrent.futures.Future[Any], value: Any, error: BaseException | None) -> None:
    # A future may already be settled by the other side of a race (stop() against the call ending).
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


class LocalActorHandle(ActorHandleBase):
    """Handle to an actor of a :class:`~fray.local.LocalClient`; calls run on the actor's own threads."""

    def __init__(self, actor: LocalActor | None, cls: type, name: str, client_id: str, missing: str = "") -> None:
        self._actor = actor
        self._cls = cls
        self._name = name
        self._client_id = client_id
        self._missing = missing

    def __repr__(self) -> str:
        return f"LocalActorHandle({self._name!r}, {self._cls.__name__})"

    def __getattr__(self, method_name: str) -> RemoteMethod:
        check_actor_method(self._cls, method_name)
        return RemoteMethod(self, method_name)

    def __reduce__(self) -> tuple[object, ...]:
        job_id = self._actor.job.job_id if self._actor is not None else ""
        return (_restore_actor_handle, (self._client_id, job_id, self._cls, self._name))

    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        actor = self._actor_or_raise()
        if actor.check_pickling:
            # Checked here, in the caller, exactly as other backends ship it: nothing is queued on failure.
            check_call_picklable(self._name, method, args, kwargs)
        return actor.submit(method, args, kwargs)

    def _actor_or_raise(self) -> LocalActor:
        if self._actor is None:
            raise ActorUnavailableError(self._missing)
        return self._actor

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        if self._actor is None:
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            future.set_exception(ActorUnavailableError(self._missing))
            return future
        return self._actor.ready

    def _fray_kill(self) -> None:
        """Kill the actor's "process" (its threads): see :func:`fray.testing.kill_actor`."""
        self._actor_or_raise().kill()

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of the actor's threads (threads of this process: nothing to wait for)."""
        return (self._actor_or_raise().stacks(locals),)


def _restore_actor_handle(client_id: str, job_id: str, cls: type, name: str) -> LocalActorHandle:
    actor = _ACTORS.get((client_id, job_id))
    if actor is None:
        missing = (
            f"local actor {name!r} lives in another process (or was shut down); handles of the local backend "
            "only work in the process that created them: use a cluster backend to share actors between processes"
        )
        return LocalActorHandle(None, cls, name, client_id, missing)
    return LocalActorHandle(actor, cls, name, client_id)
