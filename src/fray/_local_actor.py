"""The local backend's actors: one object served by its own thread, and the handle that calls it.

Calls are checked the way every backend checks them -- arguments must pickle (refused
in the caller, nothing queued), return values must pickle (the caller gets the
:class:`~fray.errors.SerializationError`) -- and a method's exception reaches the
caller in the one remote form (:func:`~fray._remote.remote_error`), so code that
passes here does not fail later on a cluster.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from fray._eventloop import ActorLoop, invoke
from fray._lifecycle import Failure
from fray._local_job import LocalJob
from fray._logcapture import capture_to
from fray._remote import RemoteFailure, remote_error
from fray._runtime import StoppableRun, terminating_on
from fray._serialization import check_call_picklable, check_result_picklable
from fray.actor import ActorFuture, RemoteMethod, check_actor_method
from fray.client import Client, _bind_client
from fray.errors import ActorDiedError, ActorUnavailableError, SerializationError
from fray.job import JobInfo, _current_job

__all__ = ["LocalActor", "LocalActorHandle"]

# Every live actor, so that a handle unpickled in this process finds its actor again.
_ACTORS: weakref.WeakValueDictionary[tuple[str, str], LocalActor] = weakref.WeakValueDictionary()

_STOP = object()


class LocalActor:
    """One actor instance with its own thread and a FIFO call queue (one call at a time)."""

    def __init__(
        self, client: Client, job: LocalJob, cls: type, info: JobInfo, on_gone: Callable[[LocalActor], None]
    ) -> None:
        self.client = client
        self.job = job
        self.name = job.name
        self.cls = cls
        self.info = info
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.death: ActorDiedError | None = None
        self.running: ActorFuture | None = None
        self._lock = threading.Lock()
        self._run = StoppableRun()
        self._loop = ActorLoop(job.name)
        self._on_gone = on_gone
        _ACTORS[(job.client_id, job.job_id)] = self
        job.on_stop(lambda: self.stop("was terminated"))

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any], context: contextvars.Context) -> None:
        """Start the actor's thread: it builds the instance, then serves calls in order."""
        thread = threading.Thread(
            target=context.run, args=(self._main, args, kwargs), name=f"fray-actor-{self.name}", daemon=True
        )
        thread.start()

    def submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Queue a call; its future fails at once with ActorDiedError if the actor is gone."""
        future = ActorFuture()
        with self._lock:
            death = self.death
            if death is None:
                self.calls.put((future, method, args, kwargs))
        if death is not None:
            future.set_exception(_died_copy(death))
        return future

    def stop(self, reason: str) -> None:
        """The actor dies: the call in progress and every queued call fail now, and its code is stopped."""
        with self._lock:
            if self.death is not None:
                return
            self.death = ActorDiedError(f"actor {self.name!r} {reason}")
            running = self.running
        # Callers must not wait on a thread that may take time to stop: their calls fail
        # now, as they would if a process had died.
        if running is not None:
            _settle(running, None, _died_copy(self.death))
        self._fail_queued()
        self.calls.put(_STOP)
        _settle(self.ready, None, _died_copy(self.death))
        self._run.stop()  # a method in progress gets JobTerminated at its next Python instruction
        self._loop.close()  # an async method stops at its next await
        self._on_gone(self)

    def _main(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _bind_client(self.client)
        _current_job.set(self.info)
        with capture_to(self.job.logs), terminating_on(self.job.job_id, self.job.cancel):
            self.job.lifecycle.start()
            try:
                instance = self._run.run(self.cls, *args, **kwargs)
            except BaseException as exc:
                self._die_in_init(exc)
                return
            _settle(self.ready, None, None)
            try:
                self._serve(instance)
            finally:
                self._loop.close(wait=True)
        self._fail_queued()
        self.job.lifecycle.stop()

    def _serve(self, instance: object) -> None:
        while True:
            item = self.calls.get()
            if item is _STOP:
                return
            future, method, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                death = self.death
                if death is None:
                    self.running = future
            if death is not None:
                _settle(future, None, _died_copy(death))
                return
            value, error = self._call(instance, method, args, kwargs)
            with self._lock:
                self.running = None
                if self.death is not None:
                    return  # stop() has failed this call already
            _settle(future, value, error)

    def _call(
        self, instance: object, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, BaseException | None]:
        try:
            value = self._run.run(invoke, instance, method, args, kwargs, self._loop)
        except BaseException as exc:
            return None, remote_error(RemoteFailure.capture(exc), original=exc)
        try:
            check_result_picklable(self.name, method, value)
        except SerializationError as exc:
            return None, exc
        return value, None

    def _die_in_init(self, exc: BaseException) -> None:
        if self._run.stopped:  # terminated while the constructor ran
            self._fail_queued()
            self.job.lifecycle.stop()
            return
        remote = RemoteFailure.capture(exc)
        self.job.logs.write(remote.traceback_text)
        death = ActorDiedError(f"actor {self.name!r} died in __init__: {remote.summary}")
        death.__cause__ = remote_error(remote, original=exc)
        with self._lock:
            if self.death is None:
                self.death = death
        _settle(self.ready, None, _died_copy(death))
        self.job.lifecycle.fail(Failure(f"actor __init__ raised {remote.summary}", remote=remote, original=exc))
        self._on_gone(self)
        self._fail_queued()

    def _fail_queued(self) -> None:
        assert self.death is not None
        while True:
            try:
                item = self.calls.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                _settle(item[0], None, _died_copy(self.death))


def _settle(future: concurrent.futures.Future[Any], value: Any, error: BaseException | None) -> None:
    # A future may already be settled by the other side of a race (stop() against the call ending).
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


def _died_copy(death: ActorDiedError) -> ActorDiedError:
    # A fresh exception per caller: raising one shared object from many threads tangles tracebacks.
    copy = ActorDiedError(*death.args)
    copy.__cause__ = death.__cause__
    return copy


class LocalActorHandle:
    """Handle to an actor of a :class:`~fray.local.LocalClient`; calls run on the actor's own thread, in order."""

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
        # Checked here, in the caller, exactly as other backends ship it: nothing is queued on failure.
        check_call_picklable(self._name, method, args, kwargs)
        return self._actor_or_raise().submit(method, args, kwargs)

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


def _restore_actor_handle(client_id: str, job_id: str, cls: type, name: str) -> LocalActorHandle:
    actor = _ACTORS.get((client_id, job_id))
    if actor is None:
        missing = (
            f"local actor {name!r} lives in another process (or was shut down); handles of the local backend "
            "only work in the process that created them: use a cluster backend to share actors between processes"
        )
        return LocalActorHandle(None, cls, name, client_id, missing)
    return LocalActorHandle(actor, cls, name, client_id)
