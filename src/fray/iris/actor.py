"""Actors on Iris: each actor is an Iris job serving its instance with Iris's actor server.

The host side (:func:`host_actor`, run as the job's callable) constructs the instance
(a raising constructor fails the job at once, with the exception on its failure line),
serves it with ``iris.actor.server.ActorServer`` on the port Iris allocated (``ports=
["actor"]``) and registers the address in Iris's endpoint registry under the
namespace-qualified name ``/user/root-job/<actor name>``. Calls run on up to
``ActorConfig.max_concurrency`` server threads (one: in arrival order); ``async def``
methods run on the actor's own loop. ``current_actor()`` works in the constructor and
methods; an actor that ends itself stops its server gracefully, then its task ends
(SUCCEEDED, or FAILED with the exception given to ``fail()``).

The caller side (:class:`IrisActorHandle`) is deferred: it is returned at once and its
first call waits until the endpoint is registered, or fails with ActorDiedError when
the job ended first. It pickles by name (plus the actor's job id and class); inside an
Iris task it resolves through the task's Iris context. Calls travel over Iris's
``ActorClient``; a method's exception comes back as a :class:`RemoteFailure` and is
raised as the shared dual ``RemoteError``.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import cloudpickle
from iris.cluster.types import JobName

from fray.actor import ActorFuture, RemoteMethod, check_actor_method
from fray.actor_context import ActorContext, set_process_actor
from fray.core._deferred_calls import DeferredCalls, PendingCall, copy_death
from fray.core._eventloop import ActorLoop, invoke
from fray.core._remote import RemoteFailure, actor_died, remote_error
from fray.core._serialization import actor_call_label, check_call_picklable, check_result_picklable
from fray.errors import ActorDiedError, ActorUnavailableError, SerializationError
from fray.iris import _connect, _task
from fray.iris.job import IrisJobHandle, JobMeta, terminated_here
from fray.job import JobStatus

if TYPE_CHECKING:
    from iris.actor.client import ActorClient
    from iris.client import IrisClient as IrisLib

__all__ = ["IrisActorHandle", "endpoint_name", "host_actor"]

#: Upper bound of the backoff between endpoint lookups while an actor starts.
READY_POLL = 0.25
#: A handle's sender thread ends after this long without calls (the next call starts another).
SENDER_IDLE = 30.0


def endpoint_name(job_id: str, actor_name: str) -> str:
    """The registry name of actor ``actor_name`` hosted by job ``job_id``: its namespace, then its name."""
    return f"{JobName.from_wire(job_id).namespace}/{actor_name}"


# ----- host side: runs inside the actor's Iris task -------------------------------------------------


class _Dispatch:
    """What Iris's actor server serves for one Fray actor: a single method that runs the actor's methods.

    Arguments arrive pickled by the caller (so an unpicklable one is refused there,
    before anything is sent); results and exceptions leave as bytes, so that a result
    that cannot be pickled and a method that raised are told apart from transport errors.
    Once the actor ended itself (``current_actor().exit()`` / ``fail()``), calls are
    answered with :class:`~fray.errors.ActorDiedError` and the host's main thread is woken.
    """

    def __init__(self, name: str, instance: object, context: ActorContext) -> None:
        self._name = name
        self._instance = instance
        self._context = context
        self._loop = ActorLoop(name)
        self._lock = threading.Lock()
        self._death: ActorDiedError | None = None
        self.ended = threading.Event()

    def fray_call(self, method: str, payload: bytes) -> tuple[bool, bytes]:
        with self._lock:
            death = self._death
        if death is not None:
            return False, RemoteFailure.capture(death).encode()
        try:
            args, kwargs = cloudpickle.loads(payload)
            value = invoke(self._instance, method, args, kwargs, self._loop)
        except Exception as exc:
            return False, RemoteFailure.capture(exc).encode()
        finally:
            self.check_end()
        try:
            return True, cloudpickle.dumps(value)
        except Exception as exc:
            try:
                check_result_picklable(self._name, method, value)
            except SerializationError as err:
                return False, RemoteFailure.capture(err).encode()
            return False, RemoteFailure.capture(exc).encode()

    def check_end(self) -> None:
        """After a call (or the constructor): if the actor asked to end, refuse later calls and wake the host."""
        end = self._context.end_request()
        if end is None:
            return
        if end.error is None:
            death = ActorDiedError(f"actor {self._name!r} ended itself (current_actor().exit())")
        else:
            remote = RemoteFailure.capture(end.error)
            death = actor_died(
                f"actor {self._name!r} failed itself: {remote.summary}", remote_error(remote, original=end.error)
            )
        with self._lock:
            if self._death is None:
                self._death = death
        self.ended.set()


def host_actor(payload: bytes, name: str, options: dict[str, Any] | None = None) -> None:
    """Iris's entrypoint for a Fray actor job: construct, serve, register, then serve until it ends.

    ``options`` carries the actor's group and index, ``max_concurrency`` and the
    controller address its own handle uses.
    """
    from iris.actor.server import ActorServer
    from iris.client.client import iris_ctx
    from iris.cluster.client import get_job_info

    opts = options or {}
    info = _task.enter()
    try:
        actor_class, args, kwargs = cloudpickle.loads(payload)
        meta = JobMeta(name, actor_class.__qualname__, False, 1, 1, 0, 0)
        address = opts.get("address")
        concurrency = int(opts.get("max_concurrency", 1))
        context = ActorContext(
            name,
            opts.get("group"),
            int(opts.get("index", 0)),
            lambda: IrisActorHandle(
                name, IrisJobHandle(info.job_id, meta, address), actor_class, address, None, concurrency
            ),
        )
        set_process_actor(context)
        instance = actor_class(*args, **kwargs)
    except BaseException as exc:
        _task.exit_with_failure(exc)
    dispatch = _Dispatch(name, instance, context)
    dispatch.check_end()
    try:
        ctx = iris_ctx()
        job_info = get_job_info()
        assert job_info is not None  # enter() succeeded, so this is an Iris task
        # Bind only the address Iris advertises for this task: peers are told to use it, nothing else needs it.
        host = job_info.advertise_host
        endpoint = endpoint_name(info.job_id, name)
        server = ActorServer(host=host, port=ctx.get_port("actor"), max_concurrency=int(opts.get("max_concurrency", 1)))
        server.register(endpoint, dispatch)
        port = server.serve_background()
        ctx.registry.register(endpoint, f"http://{host}:{port}")
    except BaseException as exc:  # callers must learn why the actor never served, as for its constructor
        _task.exit_with_failure(exc)
    print(f"[fray] actor {name!r} serving at {host}:{port}", flush=True)
    dispatch.ended.wait()  # until the actor ends itself, or Iris kills the job (terminate / shutdown)
    server.stop()  # graceful: the answer to the call that asked goes out first
    end = context.end_request()
    if end is not None and end.error is not None:
        _task.exit_with_failure(end.error)
    _task.write_end()


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
    ) -> None:
        self._name = name
        self._concurrency = max_concurrency  # sender threads: one keeps this handle's calls in order
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
        return (IrisActorHandle, (self._name, self._job, self._class, self._address, None, self._concurrency))

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
            if not call.future.set_running_or_notify_cancel():
                continue
            try:
                call.future.set_result(self._call(call.method, call.payload))
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
        try:
            ok, blob = self._client().fray_call(method, payload)
        except Exception as exc:
            self._rpc = None  # resolve again next time: a retried actor registers a new address
            error = self._explain_unreachable(method, exc)
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

    def _explain_unreachable(self, method: str, exc: Exception) -> BaseException:
        try:
            status = self._job.status()
        except Exception:
            status = JobStatus.RUNNING
        if status.finished:
            death = self._death(status)
            self._calls.die(death)  # for good: later calls fail at once instead of trying the dead endpoint
            return death
        return ActorUnavailableError(f"{actor_call_label(self._name, method)}: the actor did not answer: {exc}")

    def _death(self, status: JobStatus) -> ActorDiedError:
        if status == JobStatus.FAILED:
            try:
                failure = self._job.failure()
            except Exception as exc:  # the controller is gone too: still a dead actor
                return ActorDiedError(f"actor {self._name!r} died: its job {self._job.job_id!r} failed ({exc})")
            died = actor_died(f"actor {self._name!r} died: {failure.message}", failure.error(self._job.job_id))
            return died
        return ActorDiedError(f"actor {self._name!r} is dead: its job {self._job.job_id!r} was {status.value}")
