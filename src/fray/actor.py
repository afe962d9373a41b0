"""Actors: handles with the ``handle.method.remote(...)`` calling convention, futures, and groups.

:class:`ActorHandle` and :class:`ActorMethod` are protocols each backend implements.
:class:`ActorFuture` is a :class:`concurrent.futures.Future`, so actor calls can be
waited on together with ``concurrent.futures.wait`` / ``as_completed``.
:class:`ActorGroup` is shared by all backends.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from fray._progress import watch_ready
from fray._runtime import check_terminated
from fray._serialization import call_parts, check_picklable
from fray.errors import ActorDiedError, ConfigError
from fray.job import JobHandle, JobStatus, validate_name
from fray.resources import ResourceConfig

__all__ = [
    "ActorFuture",
    "ActorGroup",
    "ActorHandle",
    "ActorMethod",
    "RemoteMethod",
    "check_actor_method",
    "check_actor_request",
    "group_member_names",
    "public_methods",
]


class ActorFuture(concurrent.futures.Future[Any]):
    """The pending result of one actor call.

    ``result(timeout)`` returns the method's value or raises its exception (the
    original type, with the remote traceback attached where the call crossed a
    process boundary); ``TimeoutError`` if ``timeout`` passes first.
    """


class ActorMethod(Protocol):
    """One method of an actor, bound to a handle."""

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the call and return its future at once."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and block for its result."""
        ...


class _Caller(Protocol):
    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture: ...


class RemoteMethod:
    """An :class:`ActorMethod` for handles that start a call with ``handle._fray_call(method, args, kwargs)``.

    ``.remote(...)`` starts the call and returns its future; calling blocks for the result,
    through ``handle._fray_call_sync(method, args, kwargs)`` when the handle has one (a
    blocking call that needs no future, e.g. one that reads its own socket).
    A terminated job stops here, at its next Fray call.
    """

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: _Caller, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the call and return its future at once."""
        check_terminated()
        return self._handle._fray_call(self._name, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and block for its result."""
        call_sync = getattr(self._handle, "_fray_call_sync", None)
        if call_sync is not None:
            check_terminated()
            return call_sync(self._name, args, kwargs)
        return self.remote(*args, **kwargs).result()


@runtime_checkable
class ActorHandle(Protocol):
    """A deferred, picklable reference to a named actor.

    Usable as soon as it is returned; the first call waits until the actor is ready.
    Every backend's handle also has ``_fray_ready() -> Future[None]``, done once the
    actor is serving (or failed with :class:`ActorDiedError` if it never will).
    """

    def __getattr__(self, method_name: str) -> ActorMethod: ...

    def _fray_ready(self) -> concurrent.futures.Future[None]: ...


def public_methods(cls: type) -> list[str]:
    """The names of ``cls``'s methods that may be called remotely (no leading underscore)."""
    return sorted(name for name, value in inspect.getmembers(cls) if not name.startswith("_") and callable(value))


def check_actor_method(cls: type, name: str) -> None:
    """Raise ``AttributeError`` at once if ``cls`` has no remotely callable method ``name``."""
    if name.startswith("_") or not callable(getattr(cls, name, None)):
        methods = ", ".join(public_methods(cls)) or "(none)"
        reason = "private methods cannot be called remotely" if name.startswith("_") else "no such method"
        raise AttributeError(
            f"actor class {cls.__name__!r} has no remote method {name!r} ({reason}); methods: {methods}"
        )


def check_actor_request(
    actor_class: object, name: object, resources: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Validate ``create_actor``'s arguments the same way on every backend; raise ConfigError/SerializationError."""
    validate_name(name, "actor name")
    if not isinstance(actor_class, type):
        raise ConfigError(f"create_actor needs a class, got {type(actor_class).__name__}: {actor_class!r}")
    if not isinstance(resources, ResourceConfig):
        raise ConfigError(f"create_actor(resources={resources!r}) must be a ResourceConfig")
    check_picklable(f"actor {name!r}", call_parts(actor_class, args, kwargs, "the class"))


def group_member_names(name: str, count: object) -> list[str]:
    """``{name}-0`` ... ``{name}-{count-1}``, the names of an actor group's members; checks ``count``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"create_actor_group(count={count!r}) must be a whole number >= 1")
    return [f"{name}-{i}" for i in range(count)]


class ActorGroup:
    """``count`` instances of one actor class, each its own job, becoming ready independently.

    Intentionally thin: it hands out handles and jobs; callers decide how to spread
    work and what to do when a member dies.
    """

    def __init__(self, handles: Sequence[ActorHandle], jobs: Sequence[JobHandle]) -> None:
        if len(handles) != len(jobs):
            raise ValueError("ActorGroup needs one job per handle")
        self._handles = list(handles)
        self._jobs = list(jobs)
        self._ready = [handle._fray_ready() for handle in self._handles]

    def __len__(self) -> int:
        return len(self._handles)

    def __reduce__(self) -> tuple[object, ...]:
        return (ActorGroup, (self._handles, self._jobs))

    @property
    def ready_count(self) -> int:
        """How many members have started and are serving."""
        return sum(1 for f in self._ready if f.done() and f.exception() is None)

    def wait_ready(
        self, count: int | None = None, timeout: float | None = 300.0, *, progress: bool = False
    ) -> list[ActorHandle]:
        """Block until at least ``count`` members (default: all) are ready; return the ready handles.

        The returned list is a snapshot in member order; it does not grow later. Raises
        ``TimeoutError`` after ``timeout`` seconds and :class:`ActorDiedError` as soon
        as so many members died that ``count`` can no longer be reached. ``progress``
        draws a progress bar on a terminal (nothing when stderr is not a TTY).
        """
        total = len(self._handles)
        want = total if count is None else count
        if isinstance(want, bool) or not isinstance(want, int) or not 0 <= want <= total:
            raise ValueError(f"wait_ready(count={count!r}): this group has {total} members")
        deadline = None if timeout is None else time.monotonic() + timeout
        if progress:
            watch_ready(self._ready, want, timeout)
        while True:
            ready = [i for i, f in enumerate(self._ready) if f.done() and f.exception() is None]
            if len(ready) >= want:
                return [self._handles[i] for i in ready]
            dead = [(i, f.exception()) for i, f in enumerate(self._ready) if f.done() and f.exception() is not None]
            if total - len(dead) < want:
                names = ", ".join(f"#{i}: {exc}" for i, exc in dead)
                raise ActorDiedError(
                    f"only {total - len(dead)} of {total} actors can still become ready, {want} were asked for; "
                    f"dead: {names}"
                ) from dead[0][1]
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"wait_ready: {len(ready)} of {total} actors ready after {timeout}s, wanted {want}")
            pending = [f for f in self._ready if not f.done()]
            concurrent.futures.wait(pending, timeout=remaining, return_when=concurrent.futures.FIRST_COMPLETED)

    @property
    def jobs(self) -> list[JobHandle]:
        """The job hosting each member, in member order."""
        return list(self._jobs)

    def statuses(self) -> list[JobStatus]:
        """Each member's job status: FAILED or STOPPED members are dead."""
        return [job.status() for job in self._jobs]

    def shutdown(self) -> None:
        """Terminate every member."""
        for job in self._jobs:
            job.terminate()
