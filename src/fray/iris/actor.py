"""Actors on Iris, the caller's side: :class:`IrisActorHandle`. The host's side is ``fray.iris._actor_host``.

Each actor is an Iris job serving its instance with Iris's actor server, registered in
Iris's endpoint registry. The handle is deferred (the shared
:class:`~fray.core._deferred_calls.DeferredCalls`): it is returned at once, and calls wait,
in order, until the endpoint is registered, or fail with ActorDiedError when the job ended
first. It pickles by name (plus the actor's job id and class); inside an Iris task it
resolves through the task's Iris context. Calls travel over Iris's ``ActorClient``, sent by
up to ``max_concurrency`` sender threads; a method's exception comes back as a
:class:`RemoteFailure` and is raised as the shared dual ``RemoteError``.

When a call's connection breaks, the handle asks Iris and the actor which of three things
happened: the actor's job ended (the call fails with ActorDiedError, and so does every later
one), the actor restarted (a new instance id answers: the call fails with ActorDiedError, or
is sent again within ``ActorConfig.max_task_retries``), or neither within
:data:`DEATH_NOTICE` seconds (ActorUnavailableError: the instance may still be there).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import cloudpickle
from iris.cluster.types import JobName

from fray.actor import ActorFuture, RemoteMethod, check_actor_method
from fray.core._deferred_calls import DeferredCalls, PendingCall, copy_death
from fray.core._remote import RemoteFailure, actor_died, remote_error
from fray.core._serialization import actor_call_label, check_call_picklable
from fray.errors import ActorDiedError, ActorUnavailableError, SerializationError
from fray.iris import _connect
from fray.iris.job import IrisJobHandle, terminated_here
from fray.job import JobStatus

if TYPE_CHECKING:
    from iris.actor.client import ActorClient
    from iris.client import IrisClient as IrisLib

__all__ = ["DEATH_NOTICE", "IrisActorHandle", "endpoint_name"]

#: Upper bound of the backoff between endpoint lookups while an actor starts.
READY_POLL = 0.25
#: How long a call whose connection broke waits to learn whether its actor died or restarted.
DEATH_NOTICE = 10.0
#: A handle's sender thread ends after this long without calls (the next call starts another).
SENDER_IDLE = 30.0


def endpoint_name(job_id: str, actor_name: str) -> str:
    """The registry name of actor ``actor_name`` hosted by job ``job_id``: its namespace, then its name."""
    return f"{JobName.from_wire(job_id).namespace}/{actor_name}"


# ----- caller side ---------------------------------------------------------------------------------


class IrisActorHandle:
    """A deferred, picklable handle to a Fray actor running as an Iris job."""

    def __init__(
        self,
        name: str,
        job: IrisJobHandle,
        actor_class: type,
        address: str | None,
        iris: IrisLib | None = None,
        max_concurrency: int = 1,
        max_task_retries: int = 0,
    ) -> None:
        self._name = name
        self._concurrency = max_concurrency  # sender threads: one keeps this handle's calls in order
        self._max_task_retries = max_task_retries
        self._instance = ""  # the id of the instance the handle last saw serving (see fray.iris._actor_host)
        self._job = job
        self._class = actor_class
        self._address = address
        self._iris_client = iris
        self._endpoint = endpoint_name(job.job_id, name)
        self._lock = threading.Lock()
        # Calls wait here until the endpoint is registered (the shared deferred part of every handle) ...
        self._calls = DeferredCalls(self._send)
        self._watching = False
        # ... then go to the sender threads, which make the blocking Iris calls.
        self._outbox: queue.SimpleQueue[PendingCall] = queue.SimpleQueue()
        self._senders = 0
        self._rpc: ActorClient | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            IrisActorHandle,
            (self._name, self._job, self._class, self._address, None, self._concurrency, self._max_task_retries),
        )

    def __repr__(self) -> str:
        return f"IrisActorHandle({self._name!r}, job={self._job.job_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IrisActorHandle) and (other._name, other._job.job_id) == (self._name, self._job.job_id)

    def __hash__(self) -> int:
        return hash((self._name, self._job.job_id))

    def __getattr__(self, method: str) -> RemoteMethod:
        actor_class = self.__dict__.get("_class")
        if actor_class is None or method.startswith("__"):
            raise AttributeError(method)
        check_actor_method(actor_class, method)
        return RemoteMethod(self, method)

    @property
    def job(self) -> IrisJobHandle:
        """The Iris job hosting the actor."""
        return self._job

    def _fray_ready(self) -> Future[None]:
        self._watch()
        return self._calls.ready

    def _iris(self) -> IrisLib:
        if self._iris_client is None:
            self._iris_client = _connect.iris_client(self._address)
        return self._iris_client

    def _watch(self) -> None:
        with self._lock:
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._await_endpoint, name=f"fray-iris-wait-{self._name}", daemon=True).start()

    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Queue one call behind this handle's earlier ones (what ``handle.method.remote`` does)."""
        try:
            payload = cloudpickle.dumps((args, kwargs))
        except Exception as exc:
            check_call_picklable(self._name, method, args, kwargs)
            raise SerializationError(f"{actor_call_label(self._name, method)}: arguments cannot be pickled") from exc
        future = ActorFuture()
        if terminated_here(self._job.job_id):
            future.set_exception(self._death(JobStatus.STOPPED))
            return future
        if self._calls.submit(PendingCall(future, method, payload)):
            self._watch()
        return future

    # The sender threads send the calls the endpoint serves. With max_concurrency 1 there is one,
    # which sends them one by one, in order; with N, up to N calls are in flight at once.

    def _send(self, call: PendingCall) -> None:
        with self._lock:  # with the sender's idle check: a queued call always has a sender
            if self._senders < self._concurrency:
                self._senders += 1
                threading.Thread(target=self._send_loop, name=f"fray-iris-{self._name}", daemon=True).start()
            self._outbox.put(call)

    def _send_loop(self) -> None:
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
                self._calls.retry(call, restarted.died, self._max_task_retries)
            except BaseException as exc:
                call.future.set_exception(exc)

    def _await_endpoint(self) -> None:
        delay = 0.02
        while True:
            try:
                if terminated_here(self._job.job_id):
                    self._calls.die(self._death(JobStatus.STOPPED))
                    return
                if (
                    not self._iris()
                    .resolver_for_job(JobName.from_wire(self._job.job_id))
                    .resolve(self._endpoint)
                    .is_empty
                ):
                    instance = self._ask_instance()
                    if instance is not None:
                        self._instance = instance
                        self._calls.serve()
                        return
                status = self._job.status()
                if status.finished:
                    self._calls.die(self._death(status))
                    return
            except Exception as exc:  # the controller is unreachable: say so rather than wait forever
                self._calls.die(ActorUnavailableError(f"actor {self._name!r}: cannot reach Iris: {exc}"))
                return
            time.sleep(delay)
            delay = min(delay * 1.5, READY_POLL)

    def _client(self) -> ActorClient:
        with self._lock:  # several senders: one client
            return self._client_locked()

    def _client_locked(self) -> ActorClient:
        if self._rpc is None:
            from iris.actor.client import ActorClient

            resolver = self._iris().resolver_for_job(JobName.from_wire(self._job.job_id))
            self._rpc = ActorClient(resolver, self._endpoint, max_call_attempts=1)
        return self._rpc

    def _call(self, method: str, payload: bytes) -> Any:
        death = self._calls.death
        if death is not None:
            raise copy_death(death)
        if terminated_here(self._job.job_id):
            raise self._death(JobStatus.STOPPED)
        sent_to = self._instance
        try:
            ok, blob = self._client().fray_call(method, payload)
        except Exception as exc:
            self._rpc = None  # resolve again next time
            error = self._explain_unreachable(method, exc, sent_to)
            if isinstance(error, _Restarted):
                raise error from exc
            if error.__cause__ is None:
                raise error from exc
            raise error from error.__cause__  # a dead actor's cause is why it died, not the refused connection
        if not ok:
            failure = RemoteFailure.decode(blob)
            original = failure.original()
            if isinstance(original, ActorDiedError):  # the actor ended itself: say so, with its cause
                raise self._ended(original)
            raise remote_error(failure, original=original)
        try:
            return cloudpickle.loads(blob)
        except Exception as exc:
            label = actor_call_label(self._name, method)
            raise SerializationError(f"{label}: the return value cannot be unpickled here ({exc})") from exc

    def _ended(self, refusal: ActorDiedError) -> ActorDiedError:
        # The host's refusal crossed the wire pickled, which drops its __cause__ (why the actor
        # failed itself); once its job has finished, the job's failure says it again.
        try:
            status = self._job.status()
        except Exception:
            return refusal
        return self._death(status) if status.finished else refusal

    def _explain_unreachable(self, method: str, exc: Exception, sent_to: str) -> BaseException:
        # The connection broke: give Iris and the actor a moment to say whether the job ended or the
        # actor restarted (its supervisor starts a new instance in about a second); else it is unavailable.
        deadline = time.monotonic() + DEATH_NOTICE
        while True:
            try:
                status = self._job.status()
            except Exception:
                status = JobStatus.RUNNING
            if status.finished:
                death = self._death(status)
                self._calls.die(death)  # for good: later calls fail at once instead of trying the dead endpoint
                return death
            instance = self._ask_instance()
            if instance is not None and instance != sent_to:  # the call went to an instance that is gone
                self._instance = instance
                return _Restarted(
                    ActorDiedError(f"actor {self._name!r} died while the call was in flight; it has restarted")
                )
            if instance is not None or time.monotonic() >= deadline:
                label = actor_call_label(self._name, method)
                return ActorUnavailableError(f"{label}: the actor did not answer: {exc}")
            time.sleep(READY_POLL)

    def _ask_instance(self) -> str | None:
        """The id of the instance serving now, or None if none answers."""
        try:
            return str(self._client().fray_instance())
        except Exception:
            self._rpc = None  # resolve again next time: a restarted actor may answer elsewhere
            return None

    def _fray_kill(self) -> None:
        """SIGKILL the actor's process (see :func:`fray.testing.kill_actor`); returns once it is dead."""
        self._fray_ready().result(timeout=300)
        before = self._instance
        with contextlib.suppress(Exception):  # the process dies before it can answer
            self._client().fray_crash()
        self._rpc = None
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:  # until the old instance no longer answers
            if self._ask_instance() != before or self._job.status().finished:
                return
            time.sleep(0.05)

    def _death(self, status: JobStatus) -> ActorDiedError:
        if status == JobStatus.FAILED:
            try:
                failure = self._job.failure()
            except Exception as exc:  # the controller is gone too: still a dead actor
                return ActorDiedError(f"actor {self._name!r} died: its job {self._job.job_id!r} failed ({exc})")
            died = actor_died(f"actor {self._name!r} died: {failure.message}", failure.error(self._job.job_id))
            return died
        return ActorDiedError(f"actor {self._name!r} is dead: its job {self._job.job_id!r} was {status.value}")


class _Restarted(Exception):
    """What :meth:`IrisActorHandle._explain_unreachable` says of an actor that restarted under a call."""

    def __init__(self, died: ActorDiedError) -> None:
        super().__init__(str(died))
        self.died = died
