"""Actor handles of the Ray backend: :class:`RayActorHandle`, its methods and their futures.

A call is one ``.remote()`` on the Ray actor; its :class:`~fray.actor.ActorFuture`
wraps the ``ObjectRef`` and fetches the value with ``ray.get`` on the caller's thread,
as raw Ray does. Errors reach the caller in Fray's one form (see ``_errors``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from fray.actor import ActorFuture, ActorHandleBase, check_actor_method
from fray.core._remote import RemoteFailure, actor_died
from fray.core._serialization import check_call_picklable
from fray.errors import ActorDiedError, ActorUnavailableError
from fray.ray._errors import constructor_failure, translate
from fray.ray._values import shield_call
from fray.ray.inside._actor_end import ended_death
from fray.stacks import ProcessStacks, ThreadStack

__all__ = ["RayActorHandle", "disown", "own", "when_done"]

# ----- completion callbacks ---------------------------------------------------------------------

_error_fetcher: concurrent.futures.ThreadPoolExecutor | None = None
_error_fetcher_lock = threading.Lock()


def when_done(ref: Any, callback: Callable[[Any, BaseException | None], None]) -> None:
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


# ----- actor handles -----------------------------------------------------------------------------


class _RayFuture(ActorFuture):
    """An ActorFuture backed by a Ray ObjectRef, resolved as lazily as the caller allows.

    ``result()`` fetches the value with ``ray.get`` on the caller's thread, as raw Ray
    does. Only when something must be told of completion without asking
    (``add_done_callback``, ``concurrent.futures.wait`` / ``as_completed``, which
    register waiters) does the future arm Ray's completion hook: a per-call callback
    costs a thread switch, which would cut call throughput noticeably.
    """

    def __init__(self, ref: Any, restarts: int, *, method: _RayActorMethod) -> None:
        super().__init__()
        self._ref = ref
        self._method = method
        self._restarts = restarts  # the actor's restarts known when the call was sent
        self._armed = False
        self._waiters = _ArmingList(self)

    def _arm(self) -> None:
        with self._condition:
            if self._armed or self._state != "PENDING":
                return
            self._armed = True
        when_done(self._ref, self._complete)

    def _complete(self, value: Any, exc: BaseException | None) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # resolved already, or cancelled
            if exc is None and self._method._handle._killed:
                self.set_exception(self._method._handle._killed_error())
            elif exc is None:
                self.set_result(value)
            else:
                self.set_exception(self._method._translate(exc, self._restarts))

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


class _RayActorMethod:
    """``handle.method``: ``.remote(...)`` returns an ActorFuture, calling it blocks."""

    __slots__ = ("_handle", "_name", "_ray_method")

    def __init__(self, handle: RayActorHandle, name: str) -> None:
        self._handle = handle
        self._name = name
        self._ray_method: Any = None

    def _translate(self, exc: BaseException, restarts: int) -> BaseException:
        handle = self._handle
        err = translate(exc, actor=handle._name, method=self._name, actor_class=handle._cls)
        if type(err) is ActorUnavailableError and handle._died_since(restarts):
            # Ray says "unavailable" when the socket to a restartable actor closes before the
            # GCS has marked it restarting; the instance the call went to is gone: it died.
            died = actor_died(f"actor {handle._name!r} died while the call was in flight: {err}", exc)
            err = died
        if isinstance(err, ActorDiedError) and err.__cause__ is exc and handle._job_id:
            # Dead: if it ended itself, say so, with what it failed with as the cause.
            ended = ended_death(handle._name, handle._job_id)
            if ended is not None:
                ended.__context__ = err
                return ended
        return err

    def _value(self, value: Any) -> Any:
        # A result that arrives after this process terminated the actor: the call died with it.
        if self._handle._killed:
            raise self._handle._killed_error()
        return value

    def _submit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, int]:
        """Send the call: its ObjectRef, and the actor's restarts known when it was sent."""
        method = self._ray_method
        if method is None:
            method = self._ray_method = getattr(self._handle._resolve(), self._name)
        restarts = self._handle._restarts
        try:
            args, kwargs = shield_call(args, kwargs)
            return method.remote(*args, **kwargs), restarts
        except Exception as exc:
            # Ray pickles the arguments here; only when that failed is each one checked, to name it.
            check_call_picklable(self._handle._name, self._name, args, kwargs)
            err = self._translate(exc, restarts)
            raise err from err.__cause__

    def submit(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """marin's name for :meth:`remote`: start the call, return its future."""
        return self.remote(*args, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Send the call; returns its future at once."""
        if self._handle._killed:
            future = ActorFuture()
            future.set_exception(self._handle._killed_error())
            return future
        return _RayFuture(*self._submit(args, kwargs), method=self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and wait for its result."""
        import ray

        if self._handle._killed:
            raise self._handle._killed_error()
        ref, restarts = self._submit(args, kwargs)
        try:
            return self._value(ray.get(ref))
        except ActorDiedError:
            raise
        except Exception as exc:
            err = self._translate(exc, restarts)
            raise err from err.__cause__


class RayActorHandle(ActorHandleBase):
    """Handle to a named Ray actor of a :class:`RayClient`.

    Picklable: it travels as (name, namespace, class) and finds the actor by name on
    first use in the other process, so it works inside jobs and other actors.
    """

    def __init__(self, name: str, namespace: str, cls: type, ray_handle: Any = None, *, job_id: str = "") -> None:
        self._name = name
        self._namespace = namespace
        self._cls = cls
        self._job_id = job_id
        self._ray_handle = ray_handle
        self._ready: concurrent.futures.Future[None] | None = None
        # What the constructor raised, once the actor is known to have died of it.
        self.start_failure: RemoteFailure | None = None
        self._lock = threading.Lock()
        # Set when this process terminated the actor: ray.kill is asynchronous, and a call
        # sent in the meantime could still be answered by the dying actor.
        self._killed = False
        # How often Ray had restarted the actor when this process last looked: a call that
        # fails as "unavailable" died with its instance if the count grew since it was sent.
        self._restarts = 0

    def _killed_error(self) -> ActorDiedError:
        return ActorDiedError(f"actor {self._name!r} was terminated")

    def __repr__(self) -> str:
        return f"RayActorHandle({self._name!r}, {self._cls.__name__}, namespace={self._namespace!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore_actor_handle, (self._name, self._namespace, self._cls, self._job_id))

    def __getattr__(self, method_name: str) -> _RayActorMethod:
        check_actor_method(self._cls, method_name)
        method = _RayActorMethod(self, method_name)
        self.__dict__[method_name] = method  # later lookups skip __getattr__ entirely
        return method

    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Start ``method(*args, **kwargs)``: the same path as ``handle.method.remote(...)``."""
        bound: _RayActorMethod = getattr(self, method)
        return bound.remote(*args, **kwargs)

    def _fray_call_sync(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make the call and wait for it: the same path as ``handle.method(...)``."""
        bound: _RayActorMethod = getattr(self, method)
        return bound(*args, **kwargs)

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
                    found = ray.get_actor(self._name, namespace=self._namespace)
                except ValueError as exc:
                    raise ActorDiedError(
                        f"actor {self._name!r} is not alive in Ray namespace {self._namespace!r}: it died, was "
                        "shut down, or its creator exited"
                    ) from exc
                # Set before the handle is published: a call reads the count once it has the handle.
                self._restarts = int(self._ray_info(str(found._actor_id.hex())).get("NumRestarts") or 0)
                self._ray_handle = found
            return self._ray_handle

    def _died_since(self, restarts: int, patience: float = 5.0) -> bool:
        """True if the actor's instance that was current at ``restarts`` restarts is gone.

        Asked when Ray reports a call as "unavailable": a closed socket to a restartable
        actor, before the GCS knows whether the process died. The GCS learns of a dead
        process within moments; a lost network may last, so after ``patience`` seconds
        of an unchanged, live actor the call stays "unavailable".
        """
        deadline = time.monotonic() + patience
        while True:
            info = self._ray_info()
            if not info:
                return False
            now = int(info.get("NumRestarts") or 0)
            if now > restarts or info.get("State") in ("RESTARTING", "DEAD"):
                with self._lock:
                    self._restarts = max(self._restarts, now)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # Ray has no event for "the GCS learned of this actor's death"

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
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # terminated meanwhile
                    ready.set_result(None)
                return
            self.start_failure = constructor_failure(exc, self._cls)
            err = translate(exc, actor=self._name, actor_class=self._cls)
            if not isinstance(err, ActorDiedError):
                died = actor_died(f"actor {self._name!r} did not start: {err}", err)
                err = died
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                ready.set_exception(err)

        when_done(ref, transfer)
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
        info = self._ray_info(actor_id)
        return str(info.get("State")) if info else None

    def _ray_info(self, actor_id: str | None = None) -> dict[str, Any]:
        """The actor's row in the GCS actor table ({} if unknown): State, NumRestarts, Pid, DeathCause, ..."""
        actor_id = actor_id or self._actor_id()
        with contextlib.suppress(Exception):
            from ray._private.state import state

            info = state.actor_table(actor_id)
            return dict(info) if info else {}
        return {}

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of the actor process's threads (see :mod:`fray.ray._stacks`).

        Asked through a method of the actor's control concurrency group, so it answers while
        every user call slot is taken. An actor that does not answer within ``timeout`` seconds,
        or is dead, is reported with ``error`` set (with its pid and host where Ray knows them).
        """
        import ray

        label = f"actor {self._name!r}"
        if self._killed:
            return (ProcessStacks(label, "", None, error=f"actor {self._name!r} was terminated"),)
        try:
            reply = ray.get(self._resolve().__fray_stacks__.remote(locals), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            why = f"did not answer within {timeout:g} s"
        except Exception as exc:  # dead, or never started
            why = f"no answer: {translate(exc, actor=self._name)}".splitlines()[0]
        else:
            threads = tuple(ThreadStack.from_json(thread) for thread in reply["threads"])
            return (ProcessStacks(label, str(reply["host"]), int(reply["pid"]), threads),)
        info = self._ray_info()
        pid = int(info["Pid"]) if info.get("Pid") else None
        host = str((info.get("Address") or {}).get("IPAddress") or "")
        where = f" (pid {pid} on host {host})" if pid is not None else ""
        return (ProcessStacks(label, host, pid, error=f"{why}{where}"),)

    def _fray_kill(self) -> None:
        """Kill the actor's worker process as a crash would (see :func:`fray.testing.kill_actor`).

        ``ray.kill(no_restart=False)`` is Ray's forced kill of the worker: Ray then restarts
        the actor if ``max_restarts`` allows, exactly as after a crash. Returns once Ray no
        longer runs the killed process.
        """
        import ray

        before = int(self._ray_info().get("NumRestarts") or 0)
        ray.kill(self._resolve(), no_restart=False)
        self._died_since(before, patience=60.0)

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


# The handles of the actors this process created, by (namespace, name): an unpickled handle
# reuses its creator's Ray actor handle (and knows when it was terminated) instead of
# looking the actor up again.
_OWNED: dict[tuple[str, str], RayActorHandle] = {}
_OWNED_LOCK = threading.Lock()


def own(handle: RayActorHandle) -> None:
    """Register ``handle`` as the one this process created."""
    with _OWNED_LOCK:
        _OWNED[(handle._namespace, handle._name)] = handle


def disown(handle: RayActorHandle) -> None:
    """Forget ``handle`` (its actor was terminated)."""
    with _OWNED_LOCK:
        if _OWNED.get((handle._namespace, handle._name)) is handle:
            del _OWNED[(handle._namespace, handle._name)]


def _restore_actor_handle(name: str, namespace: str, cls: type, job_id: str = "") -> RayActorHandle:
    with _OWNED_LOCK:
        owned = _OWNED.get((namespace, name))
    return owned if owned is not None else RayActorHandle(name, namespace, cls, job_id=job_id)
