"""Handles to actors on a Fray cluster: found through the controller, called over ``fray.cluster.rpc`` directly.

A :class:`ClusterActorHandle` asks the controller where its actor serves (and, when a call's
connection breaks, whether the actor died, is restarting, or is only unreachable); the
calls themselves go straight to the actor's process. Calls made before the actor serves
wait in order in the handle; once it serves, a call takes the inner RPC client's own path
(a blocking call reads its own socket). ``ActorConfig.max_task_retries`` sends a call again
to a restarted instance.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import threading
import time
import weakref
from typing import Any

from fray.actor import ActorFuture, ActorHandleBase, RemoteMethod, check_actor_method
from fray.cluster.protocol.controller_client import CredentialLike, connect_controller, resolve_credential
from fray.cluster.protocol.messages import JobView
from fray.cluster.rpc.client import ActorClient, RpcOptions
from fray.cluster.rpc.resolver import FixedResolver
from fray.cluster.server.taskproc._actor_host import CONTROL_SUFFIX, control_url
from fray.core._deferred_calls import CallState, DeferredCalls, PendingCall
from fray.core._lifecycle import Failure
from fray.core._remote import actor_died
from fray.core._serialization import check_call_picklable
from fray.errors import ActorDiedError, ActorUnavailableError, FrayError, RemoteError
from fray.stacks import ProcessStacks

__all__ = ["ClusterActorHandle", "live_clients"]

# How long a call whose connection broke waits to learn whether its actor's job ended.
_DEATH_NOTICE_SECONDS = 5.0
# How soon a handle asks the controller again while an actor it was bound to restarts.
_RESOLVE_AGAIN = 0.05

# The cluster clients of this process (ClusterClient adds itself): a handle unpickled here
# uses the credential of a live client of the same cluster, if there is one.
live_clients: weakref.WeakSet[Any] = weakref.WeakSet()


class ClusterActorHandle(ActorHandleBase):
    """A deferred handle on an actor hosted by a cluster job.

    Calls made before the actor serves are queued and sent, in order, once it does.
    Picklable: it keeps the controller address, namespace, name, job id and class.
    """

    def __init__(
        self,
        address: str,
        namespace: str,
        name: str,
        job_id: str,
        cls: type,
        token: CredentialLike = None,
        *,
        max_task_retries: int = 0,
    ) -> None:
        self._address = address
        self._namespace = namespace
        self._name = name
        self._job_id = job_id
        self._cls = cls
        self._max_task_retries = max_task_retries
        self._token = resolve_credential(token)
        self._url = ""  # the endpoint calls go to, and the job attempt that serves it
        self._attempt = -1
        self._lock = threading.Lock()
        self._rpc: ActorClient[Any] | None = None
        # Calls wait here until the actor serves (the shared deferred part of every handle).
        self._calls = DeferredCalls(self._send)

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _restore_actor_handle,
            (self._address, self._namespace, self._name, self._job_id, self._cls, self._max_task_retries),
        )

    def __repr__(self) -> str:
        return f"ClusterActorHandle({self._name!r}, {self._cls.__name__}, namespace={self._namespace!r})"

    def __getattr__(self, method_name: str) -> RemoteMethod:
        check_actor_method(self._cls, method_name)
        return RemoteMethod(self, method_name)

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        return self._calls.watch(self._start_watching)

    def _start_watching(self) -> None:
        threading.Thread(target=self._wait_until_served, name=f"fray-actor-wait-{self._name}", daemon=True).start()

    def _wait_until_served(self, stale_url: str = "") -> None:
        controller = connect_controller(self._address, self._token)
        while True:
            try:
                state, detail, view = controller.wait_actor(self._namespace, self._name, self._job_id, 10.0)
            except FrayError as exc:
                self._settle(
                    None, ActorUnavailableError(f"cannot reach the controller for actor {self._name!r}: {exc}")
                )
                return
            if state == "ready" and detail == stale_url:
                # The dead instance's endpoint, until the controller hears of its exit: ask again shortly.
                time.sleep(_RESOLVE_AGAIN)
                continue
            if state == "ready":
                self._url, self._attempt = detail, view.attempt
                resolver = FixedResolver({self._name: detail}, namespace=self._namespace)
                try:  # actor servers authenticate with their namespace's key, which the controller hands out
                    actor_key = controller.namespace_token(self._namespace)
                except FrayError as exc:
                    self._settle(None, ActorUnavailableError(f"no access to actor {self._name!r}: {exc}"))
                    return
                self._settle(ActorClient(resolver, self._name, RpcOptions(), token=actor_key), None)
                return
            if state == "dead":
                self._settle(None, self._death(view))
                return

    def _death(self, view: JobView) -> ActorDiedError:
        cause = Failure.decode(view.failure).error(view.job_id) if view.failure is not None else None
        return actor_died(
            f"actor {self._name!r} is dead: its job {view.job_id!r} {view.state.value}: {view.error}", cause
        )

    def _settle(self, rpc: ActorClient[Any] | None, error: BaseException | None) -> None:
        if error is not None:
            self._calls.die(error)
            return
        with self._lock:
            self._rpc = rpc
        self._calls.serve()  # the waiting calls go out in the order they were made

    # Once the actor serves (and the calls queued before are sent), calls go straight to the
    # inner fray.cluster.rpc client: a blocking call reads its own socket, a .remote() call has the
    # client's one future, and only a broken connection costs a look at the controller.

    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Start a call and return its future (see :class:`fray.actor.RemoteMethod`)."""
        rpc = self._rpc
        if self._calls.state is CallState.SERVING and rpc is not None and not self._max_task_retries:
            return rpc._call_async(method, args, kwargs, functools.partial(self._explain_direct, rpc))
        return self._call(method, args, kwargs)

    def _fray_call_sync(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make a call and return its result, in this thread, without a future once the actor serves."""
        rpc = self._rpc
        if not (self._calls.state is CallState.SERVING and rpc is not None and not self._max_task_retries):
            return self._call(method, args, kwargs).result()
        try:
            return rpc._call(method, args, kwargs)
        except ActorUnavailableError as error:
            explained = self._explain_direct(rpc, error)
            if explained is error:
                raise
            raise explained from None

    def _explain_direct(self, rpc: ActorClient[Any], error: ActorUnavailableError) -> BaseException:
        # A fast-path call has no retries left to use: a restarting actor is reported dead for this
        # call, and the handle waits for the new instance for the calls that follow.
        outcome = self._explain_unavailable(error)
        if isinstance(outcome, _Restarting):
            self._reconnect(rpc)
            return outcome.died
        return outcome

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        future = ActorFuture()
        if self._calls.state is not CallState.SERVING:
            # Queued until the actor serves: refuse bad arguments now, as a direct call would
            # (direct calls find out while pickling, without a second pass).
            check_call_picklable(self._name, method, args, kwargs)
        if self._calls.submit(PendingCall(future, method, (args, kwargs))):
            self._fray_ready()
        return future

    def _send(self, call: PendingCall) -> None:
        # Calls queued before the actor served, and every call of a handle that may send a call
        # again (max_task_retries); the others take _fray_call's fast path.
        rpc = self._rpc
        if rpc is None:  # the actor began restarting since this call was let through: it waits again
            self._calls.submit(call)
            return
        args, kwargs = call.payload
        inner = getattr(rpc, call.method).remote(*args, **kwargs)

        def relay(done: concurrent.futures.Future[Any]) -> None:
            error = done.exception()
            if error is None:
                call.future.set_result(done.result())
            elif isinstance(error, ActorUnavailableError):
                # Finding out whether the actor died means asking the controller: not on the
                # thread that read the broken connection.
                threading.Thread(
                    target=self._after_broken_call,
                    args=(rpc, error, call),
                    name=f"fray-actor-died-{self._name}",
                    daemon=True,
                ).start()
            elif isinstance(error, RemoteError) and isinstance(error.cause, ActorDiedError):
                call.future.set_exception(error.cause)  # the actor refused it: it is ending (exit, fail, terminate)
            else:
                call.future.set_exception(error)

        inner.add_done_callback(relay)

    def _after_broken_call(self, rpc: ActorClient[Any], error: ActorUnavailableError, call: PendingCall) -> None:
        outcome = self._explain_unavailable(error)
        if not isinstance(outcome, _Restarting):
            call.future.set_exception(outcome)
            return
        self._reconnect(rpc)
        self._calls.retry(call, outcome.died, self._max_task_retries)  # sent again to the restarted instance

    def _reconnect(self, dead: ActorClient[Any]) -> None:
        """The instance behind ``dead`` died and the actor is restarting: queue calls until the new one serves."""
        with self._lock:
            if self._rpc is not dead:
                return  # done already, by another broken call
            self._calls.restarting()
            self._rpc, stale = None, self._url
        with contextlib.suppress(Exception):
            dead.close()
        threading.Thread(
            target=self._wait_until_served, args=(stale,), name=f"fray-actor-wait-{self._name}", daemon=True
        ).start()

    def _explain_unavailable(self, error: ActorUnavailableError) -> BaseException:
        # The connection broke. A killed actor's job ends (or, when it may restart, starts a new
        # attempt) as soon as its worker sees the exit: give that a moment, then say the actor
        # died -- or, if the same attempt still runs (a network fault), that it is unavailable.
        try:
            controller = connect_controller(self._address, self._token)
            deadline = time.monotonic() + _DEATH_NOTICE_SECONDS
            while True:
                view: JobView = controller.job(self._job_id)
                if view.state.finished or view.attempt != self._attempt or time.monotonic() >= deadline:
                    break
                time.sleep(_RESOLVE_AGAIN)
        except FrayError:
            return error
        if view.state.finished:
            death = self._death(view)
            death.__context__ = error
            self._calls.die(death)  # for good: later calls fail at once instead of trying the dead endpoint
            return death
        if view.attempt != self._attempt:
            died = ActorDiedError(
                f"actor {self._name!r} died while the call was in flight; it is restarting (attempt {view.attempt})"
            )
            died.__context__ = error
            return _Restarting(died)
        return error

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of the actor's process (asked through the controller and its worker).

        An actor that is not running (ended, or not started yet) is one :class:`ProcessStacks`
        whose ``error`` says so.
        """
        controller = connect_controller(self._address, self._token)
        label = f"actor {self._name!r}"
        found = controller.job_stacks(self._job_id, float(timeout), bool(locals))
        if not found:
            view = controller.job(self._job_id)
            why = f"its job {self._job_id!r} is {view.state.value}"
            if view.error:
                why += f": {view.error}"
            return (ProcessStacks(label, "", None, error=f"the actor is not running ({why})"),)
        own = [p for p in found if p.label == "replica 0"]
        return tuple(dataclasses.replace(p, label=label) for p in own) + tuple(p for p in found if p not in own)

    def _fray_kill(self) -> None:
        """Kill the actor's process with SIGKILL (see :func:`fray.testing.kill_actor`); returns once it is dead."""
        ready = self._fray_ready()
        ready.result(timeout=300)
        url, attempt = self._url, self._attempt
        controller = connect_controller(self._address, self._token)
        actor_key = controller.namespace_token(self._namespace)
        control_name = self._name + CONTROL_SUFFIX
        resolver = FixedResolver({control_name: control_url(url, self._name)}, namespace=self._namespace)
        control: ActorClient[Any] = ActorClient(resolver, control_name, RpcOptions(), token=actor_key)
        try:
            with contextlib.suppress(ActorUnavailableError):  # the process dies before it can answer
                control.crash()
        finally:
            control.close()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:  # the controller has no event for "that attempt's process is gone"
            view: JobView = controller.job(self._job_id)
            if view.state.finished or view.attempt != attempt:
                return
            time.sleep(_RESOLVE_AGAIN)


class _Restarting(Exception):
    """What :meth:`ClusterActorHandle._explain_unavailable` says of an actor that died and is restarting."""

    def __init__(self, died: ActorDiedError) -> None:
        super().__init__(str(died))
        self.died = died


def _restore_actor_handle(
    address: str, namespace: str, name: str, job_id: str, cls: type, max_task_retries: int = 0
) -> ClusterActorHandle:
    # A handle that comes back from a job or an actor (current_actor().handle) to a script whose
    # client was given its credential explicitly uses that client's; elsewhere, the environment's.
    token = next((c._token for c in list(live_clients) if c.address == address and not c.closed), None)
    return ClusterActorHandle(address, namespace, name, job_id, cls, token, max_task_retries=max_task_retries)
