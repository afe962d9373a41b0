"""Actors on Iris, the caller's side: :class:`IrisActorHandle`. The host's side is ``fray.iris._actor_host``.

Each actor is served by Iris's ``ActorServer`` in a task of an Iris job (one job per actor
group, one task per member) and registered in Iris's endpoint registry as
``{job id}/{group name}-{index}``. A handle calls the instance's methods by name through Iris's
``ActorClient`` (``handle.ping()`` is ``ActorClient(resolver, endpoint).ping(...)``), with
Fray's rules on top (``fray.iris._wire``): arguments pickled by the caller, the value pickled by
the host, a method's exception raised as Fray's dual ``RemoteError``.

The handle is deferred (the shared :class:`~fray.core._deferred_calls.DeferredCalls`): it is
returned at once, and calls wait, in order, until its group finds the member serving
(``fray.iris.group``), or fail with ActorDiedError when the member ended first. ``.remote()``
is a direct call, sent by up to ``max_concurrency`` sender threads; ``.submit()`` starts one of
Iris's long-running operations and returns an :class:`~fray.iris.operation.OperationFuture`.
It pickles by name (the endpoint, and what Fray knows of the actor); unpickled, it finds the
actor itself.

When a call's connection breaks, the handle asks Iris and the actor which of three things
happened: the actor's task ended (the call fails with ActorDiedError, and so does every later
one), the actor restarted (a new instance id answers: the call fails with ActorDiedError, or is
sent again within ``ActorConfig.max_task_retries``), or neither within :data:`DEATH_NOTICE`
seconds (ActorUnavailableError: the instance may still be there).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle
from iris.actor.client import ActorClient as IrisActorClient
from iris.actor.client import _RpcMethod
from iris.cluster.types import JobName

from fray.actor import ActorFuture, ActorHandleBase, RemoteMethod, check_actor_method
from fray.core._deferred_calls import DeferredCalls, PendingCall, copy_death
from fray.core._remote import actor_died
from fray.core._serialization import actor_call_label, check_call_picklable
from fray.core.inside._runtime import check_terminated
from fray.errors import ActorDiedError, ActorUnavailableError, SerializationError
from fray.iris._seams import seam
from fray.iris._stacks import ask_actor
from fray.iris._wire import CallFailed, Pickled, raised, unpickled
from fray.iris.job import IrisJobHandle
from fray.iris.members import IrisMemberJob
from fray.iris.operation import OperationFuture
from fray.job import JobStatus
from fray.stacks import ProcessStacks

if TYPE_CHECKING:
    from iris.actor.resolver import Resolver

__all__ = ["DEATH_NOTICE", "ActorInfo", "IrisActorHandle"]

#: Upper bound of the backoff between endpoint lookups while an unpickled handle's actor starts.
READY_POLL = 0.25
#: How long a call whose connection broke waits to learn whether its actor died or restarted.
DEATH_NOTICE = 10.0
#: A handle's sender thread ends after this long without calls (the next call starts another).
SENDER_IDLE = 30.0
#: The first poll of a ``.submit()`` operation comes this soon; later ones back off to marin's 1 s.
OPERATION_POLL = 1.0


def actor_client(resolver: Resolver, endpoint_name: str) -> Any:
    """Iris's ``ActorClient`` for ``endpoint_name``, looked up as ``fray.iris_backend.ActorClient``.

    Looked up there at call time, not imported once: it is marin's seam (its tests replace
    ``iris_backend.ActorClient`` to stand in for the actor), so a replacement takes effect in this
    code path. Iris's own class is asked for one attempt per call: a broken call is explained by
    the handle (died, restarted, unreachable) and never sent again behind its back; a stand-in is
    built with marin's two arguments.
    """
    factory = seam("ActorClient")
    if factory is IrisActorClient:
        return factory(resolver, endpoint_name, max_call_attempts=1)
    return factory(resolver, endpoint_name)


def _method(rpc: Any, name: str) -> Any:
    """``rpc``'s call of actor method ``name``; Iris's call object when ``ActorClient`` has a method of that name."""
    if isinstance(rpc, IrisActorClient) and hasattr(IrisActorClient, name):
        return _RpcMethod(rpc, name)  # e.g. an actor method named start_operation: not ActorClient's own
    return getattr(rpc, name)


@dataclass(frozen=True)
class ActorInfo:
    """What Fray knows of the actor behind a handle, beyond its endpoint; it travels with a pickled handle."""

    name: str  #: the actor's name in messages: ``"ctr"``, or a member's ``"grp-1"``
    actor_class: type | None
    job: IrisJobHandle | IrisMemberJob | None  #: the actor's job (a member's task, in a group)
    max_concurrency: int = 1
    max_task_retries: int = 0

    def group_job(self) -> IrisJobHandle | None:
        """The Iris job that serves the actor (a group's one job, for a member)."""
        return self.job.group_job if isinstance(self.job, IrisMemberJob) else self.job


def _rebuild(endpoint_name: str, actor: ActorInfo | None) -> IrisActorHandle:
    handle = IrisActorHandle(endpoint_name)
    handle._actor = actor
    return handle


class IrisActorHandle(ActorHandleBase):
    """A deferred, picklable handle to the actor registered as ``endpoint_name`` (marin's constructor).

    ``resolver`` finds the endpoint (Iris's resolver for the actor's job); without one it is
    found from the actor's job, or inside an Iris task from the task's context. ``_client`` is
    the ``ActorClient`` once made; a pickled handle carries neither.
    """

    def __init__(self, endpoint_name: str, resolver: Resolver | None = None) -> None:
        self._endpoint_name = endpoint_name
        self._resolver = resolver
        self._client: Any = None
        self._actor: ActorInfo | None = None
        self._group: Any = None  # the IrisActorGroup that finds this member serving (where it was created)
        self._lock = threading.Lock()
        self._instance = ""  # the id of the instance the handle last saw serving (see fray.iris._actor_host)
        # Calls wait here until the actor serves (the shared deferred part of every handle) ...
        self._calls = DeferredCalls(self._send)
        # ... then go to the sender threads, which make the blocking Iris calls.
        self._outbox: queue.SimpleQueue[PendingCall] = queue.SimpleQueue()
        self._senders = 0

    @classmethod
    def _of_actor(cls, endpoint_name: str, actor: ActorInfo, group: Any = None) -> IrisActorHandle:
        """A handle to an actor Fray started (``group``: its IrisActorGroup, which watches it start)."""
        handle = cls(endpoint_name)
        handle._actor = actor
        handle._group = group
        return handle

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._endpoint_name, self._actor))

    def __repr__(self) -> str:
        return f"IrisActorHandle({self._endpoint_name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IrisActorHandle) and other._endpoint_name == self._endpoint_name

    def __hash__(self) -> int:
        return hash(self._endpoint_name)

    def __getattr__(self, method: str) -> _IrisActorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        actor = self.__dict__.get("_actor")
        actor_class = actor.actor_class if actor is not None else None
        # A class of `object` itself says nothing about the methods (marin's tests stand it in for one).
        if actor_class is not None and actor_class is not object:
            check_actor_method(actor_class, method)
        return _IrisActorMethod(self, method)

    @property
    def _label(self) -> str:
        """The actor's name in messages (a member's is ``{group}-{index}``); the endpoint when Fray did not start it.

        Private, as every attribute of a handle but ``job``: a public one would hide the actor's method of that name.
        """
        return self._actor.name if self._actor is not None else self._endpoint_name

    @property
    def job(self) -> IrisJobHandle | IrisMemberJob | None:
        """The job hosting the actor (a member's task, in a group), when known."""
        return self._actor.job if self._actor is not None else None

    # ----- becoming ready ---------------------------------------------------------------------------

    def _fray_ready(self) -> Future[None]:
        return self._calls.watch(self._start_watching)

    def _start_watching(self) -> None:
        if self._group is not None:
            self._group._watch()  # one lookup of every member's endpoint at a time, for the whole group
        elif self.job is not None:
            threading.Thread(target=self._await_endpoint, name=f"fray-iris-wait-{self._label}", daemon=True).start()
        else:
            # Nothing tells when a bare handle's actor serves, or died: its calls go out at once.
            self._calls.serve()

    def _serving(self, instance: str) -> None:
        """The actor answers as ``instance``: send the waiting calls (its group found it)."""
        self._instance = instance
        self._calls.serve()

    def _await_endpoint(self) -> None:
        """Wait until the endpoint is registered and answers, or the actor's job ended (an unpickled handle)."""
        job = self.job
        assert job is not None
        delay = 0.02
        while True:
            try:
                if job._terminated_here():
                    self._calls.die(self._death(JobStatus.STOPPED))
                    return
                if not self._resolve().resolve(self._endpoint_name).is_empty:
                    instance = self._ask_instance()
                    if instance is not None:
                        self._serving(instance)
                        return
                status = job.status()
                if status.finished:
                    self._calls.die(self._death(status))
                    return
            except Exception as exc:  # the controller is unreachable: say so rather than wait forever
                self._calls.die(ActorUnavailableError(f"actor {self._label!r}: cannot reach Iris: {exc}"))
                return
            time.sleep(delay)
            delay = min(delay * 1.5, READY_POLL)

    # ----- the connection ---------------------------------------------------------------------------

    def _resolve(self) -> Resolver:
        """The resolver of the actor's endpoint: given, the group's, the job's, or the Iris task's."""
        with self._lock:
            if self._resolver is None:
                self._resolver = self._find_resolver()
            return self._resolver

    def _find_resolver(self) -> Resolver:
        if self._group is not None:
            resolver: Resolver = self._group._resolver()
            return resolver
        job = self._actor.group_job() if self._actor is not None else None
        if job is not None:
            return job._iris().resolver_for_job(JobName.from_wire(job.job_id))
        found: Resolver = seam("iris_ctx")().resolver
        return found

    def _rpc(self) -> Any:
        resolver = self._resolve()
        with self._lock:  # several senders: one client
            if self._client is None:
                self._client = actor_client(resolver, self._endpoint_name)
            return self._client

    def _ask_instance(self) -> str | None:
        """The id of the instance serving now, or None if none answers."""
        try:
            return str(self._rpc().fray_instance())
        except Exception:
            self._client = None  # resolve again next time: a restarted actor may answer elsewhere
            return None

    # ----- calls ------------------------------------------------------------------------------------

    def _terminated(self) -> bool:
        job = self.job
        return job is not None and job._terminated_here()

    def _pickled(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        try:
            return cloudpickle.dumps((args, kwargs))
        except Exception as exc:
            check_call_picklable(self._label, method, args, kwargs)
            raise SerializationError(f"{actor_call_label(self._label, method)}: arguments cannot be pickled") from exc

    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Queue one call behind this handle's earlier ones (what ``handle.method.remote`` does)."""
        payload = self._pickled(method, args, kwargs)
        future = ActorFuture()
        if self._terminated():
            future.set_exception(self._death(JobStatus.STOPPED))
            return future
        if self._calls.submit(PendingCall(future, method, payload)):
            self._fray_ready()
        return future

    def _fray_submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Start ``method`` as one of Iris's long-running operations (what ``handle.method.submit`` does).

        Waits until the actor serves, starts the operation (one short RPC) and returns its
        :class:`OperationFuture`, which polls it. It is not ordered behind the handle's queued
        ``.remote()`` calls, and is not sent again when the actor restarts.
        """
        payload = self._pickled(method, args, kwargs)
        try:
            self._fray_ready().result()
            if self._terminated():
                raise self._death(JobStatus.STOPPED)
            death = self._calls.death
            if death is not None:
                raise copy_death(death)
            sent_to = self._instance
            rpc = self._rpc()
            try:
                operation = rpc.start_operation(method, Pickled(payload))
            except Exception as exc:
                self._client = None
                raise _died(self._unreachable(method, exc, sent_to)) from exc
        except BaseException as exc:
            failed = ActorFuture()
            failed.set_exception(exc)
            return failed
        future = OperationFuture(rpc, operation, poll_interval=OPERATION_POLL)
        future._convert = lambda exc: self._operation_error(method, exc, sent_to)
        return future

    def _operation_error(self, method: str, exc: BaseException, sent_to: str) -> BaseException:
        if isinstance(exc, CallFailed):
            error = raised(exc)
            return self._ended(error) if isinstance(error, ActorDiedError) else error
        return _died(self._unreachable(method, exc, sent_to))

    # The sender threads send the calls the endpoint serves. With max_concurrency 1 there is one,
    # which sends them one by one, in order; with N, up to N calls are in flight at once.

    def _send(self, call: PendingCall) -> None:
        concurrency = self._actor.max_concurrency if self._actor is not None else 1
        with self._lock:  # with the sender's idle check: a queued call always has a sender
            if self._senders < concurrency:
                self._senders += 1
                threading.Thread(target=self._send_loop, name=f"fray-iris-{self._label}", daemon=True).start()
            self._outbox.put(call)

    def _send_loop(self) -> None:
        retries = self._actor.max_task_retries if self._actor is not None else 0
        while True:
            try:
                call = self._outbox.get(timeout=SENDER_IDLE)
            except queue.Empty:
                with self._lock:
                    if self._outbox.empty():
                        self._senders -= 1
                        return
                continue
            if not (call.retries or call.future.set_running_or_notify_cancel()):  # a resent call is running already
                continue
            try:
                call.future.set_result(self._call(call.method, call.payload))
            except _Restarted as restarted:
                # Sent again to the new instance within max_task_retries; else it died with the old one.
                self._calls.retry(call, restarted.died, retries)
            except BaseException as exc:
                call.future.set_exception(exc)

    def _call(self, method: str, payload: bytes) -> Any:
        death = self._calls.death
        if death is not None:
            raise copy_death(death)
        if self._terminated():
            raise self._death(JobStatus.STOPPED)
        sent_to = self._instance
        error: BaseException | None = None
        try:
            reply = _method(self._rpc(), method)(Pickled(payload))
        except CallFailed as failed:
            # Raised below, outside this block: the error's __cause__ is the user's exception, not the carrier.
            error = raised(failed)
            if isinstance(error, ActorDiedError):  # the actor ended itself: say so, with its cause
                error = self._ended(error)
        except Exception as exc:
            self._client = None  # resolve again next time
            error = self._unreachable(method, exc, sent_to)
            if error.__cause__ is None:
                error.__cause__ = exc
        if error is not None:
            raise error
        return unpickled(reply, actor_call_label(self._label, method))

    def _ended(self, refusal: ActorDiedError) -> ActorDiedError:
        # The host's refusal crossed the wire pickled, which drops its __cause__ (why the actor
        # failed itself); once its job has finished, the job's failure says it again.
        job = self.job
        if job is None:
            return refusal
        try:
            status = job.status()
        except Exception:
            return refusal
        return self._death(status) if status.finished else refusal

    def _unreachable(self, method: str, exc: BaseException, sent_to: str) -> BaseException:
        # The connection broke: give Iris and the actor a moment to say whether the task ended or the
        # actor restarted (its supervisor starts a new instance in about a second); else it is unavailable.
        job = self.job
        deadline = time.monotonic() + DEATH_NOTICE
        while True:
            status = JobStatus.RUNNING
            if job is not None:
                with contextlib.suppress(Exception):
                    status = job.status()
            if status.finished:
                death = self._death(status)
                self._calls.die(death)  # for good: later calls fail at once instead of trying the dead endpoint
                return death
            instance = self._ask_instance()
            if instance is not None and sent_to and instance != sent_to:  # the call went to an instance that is gone
                self._instance = instance
                return _Restarted(
                    ActorDiedError(f"actor {self._label!r} died while the call was in flight; it has restarted")
                )
            if instance is not None or job is None or time.monotonic() >= deadline:
                return ActorUnavailableError(
                    f"{actor_call_label(self._label, method)}: the actor did not answer: {exc}"
                )
            time.sleep(READY_POLL)

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of the actor process's threads, from the actor itself (``fray.iris._stacks``).

        Answered by a control method on a server thread kept beside the actor's ``max_concurrency``,
        so it answers while every call slot is taken; a terminated actor answers at once, with why.
        """
        label = f"actor {self._label!r}"
        if self._terminated():
            return (ProcessStacks(label, "", None, error=f"{label} was terminated"),)
        started = time.monotonic()
        try:
            self._fray_ready().result(timeout=timeout)
        except FutureTimeout:
            return (ProcessStacks(label, "", None, error=f"{label} is not serving yet (waited {timeout:g} s)"),)
        except Exception as exc:
            return (ProcessStacks(label, "", None, error=f"{label} is dead: {exc}"),)
        return (ask_actor(self._rpc, label, max(0.1, timeout - (time.monotonic() - started)), locals),)

    def _fray_kill(self) -> None:
        """SIGKILL the actor's process (see :func:`fray.testing.kill_actor`); returns once it is dead."""
        self._fray_ready().result(timeout=300)
        before = self._instance
        with contextlib.suppress(Exception):  # the process dies before it can answer
            self._rpc().fray_crash()
        self._client = None
        deadline = time.monotonic() + 60.0
        job = self.job
        while time.monotonic() < deadline:  # until the old instance no longer answers
            if self._ask_instance() != before or (job is not None and job.status().finished):
                return
            time.sleep(0.05)

    def _death(self, status: JobStatus) -> ActorDiedError:
        job = self.job
        job_id = job.job_id if job is not None else self._endpoint_name
        if status == JobStatus.FAILED and job is not None:
            try:
                failure = job.failure()
            except Exception as exc:  # the controller is gone too: still a dead actor
                return ActorDiedError(f"actor {self._label!r} died: its job {job_id!r} failed ({exc})")
            return actor_died(f"actor {self._label!r} died: {failure.message}", failure.error(job_id))
        return ActorDiedError(f"actor {self._label!r} is dead: its job {job_id!r} was {status.value}")


class _IrisActorMethod(RemoteMethod):
    """One method of an Iris actor: ``.remote()`` a direct call, ``.submit()`` a long-running operation.

    ``.remote(...)`` and calling it go through the handle's queue (in order, one Iris ``Call``
    each); ``.submit(...)`` starts one of Iris's operations (``StartOperation``) and returns an
    :class:`OperationFuture` that polls it: for methods that run for minutes or hours.
    """

    __slots__ = ()

    def __init__(self, handle: IrisActorHandle, method_name: str) -> None:
        super().__init__(handle, method_name)

    def submit(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the method as a long-running operation; its :class:`OperationFuture`."""
        check_terminated()
        handle: IrisActorHandle = self._handle  # type: ignore[assignment]  # always an IrisActorHandle here
        return handle._fray_submit(self._name, args, kwargs)


class _Restarted(Exception):
    """What :meth:`IrisActorHandle._unreachable` says of an actor that restarted under a call."""

    def __init__(self, died: ActorDiedError) -> None:
        super().__init__(str(died))
        self.died = died


def _died(error: BaseException) -> BaseException:
    """What a call that is never sent again raises: the death of the instance it went to, if it restarted."""
    return error.died if isinstance(error, _Restarted) else error
