"""Actors: handles with the ``handle.method.remote(...)`` calling convention, futures, and groups.

:class:`ActorHandle` and :class:`ActorMethod` are protocols each backend implements.
:class:`ActorFuture` is a :class:`concurrent.futures.Future`, so actor calls can be
waited on together with ``concurrent.futures.wait`` / ``as_completed``.
:class:`ActorGroup` is shared by all backends.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

from fray.actor_config import ActorConfig, check_actor_config
from fray.actor_context import ActorContext, current_actor

# marin's private hooks, which its test fixtures import from fray.actor (redundant aliases: re-exported).
from fray.actor_context import _current_actor_ctx as _current_actor_ctx
from fray.actor_context import _reset_current_actor as _reset_current_actor
from fray.actor_context import _set_current_actor as _set_current_actor
from fray.core._lending import blocked
from fray.core._progress import watch_ready
from fray.core._remote import actor_died
from fray.core._serialization import call_parts, check_picklable
from fray.core.inside._runtime import check_terminated
from fray.errors import ActorDiedError, ActorUnavailableError, ConfigError, JobFailed, RemoteError
from fray.job import JobHandle, JobStatus, validate_name
from fray.resources import ResourceConfig
from fray.stacks import ProcessStacks

__all__ = [
    "ActorContext",
    "ActorFuture",
    "ActorGroup",
    "ActorHandle",
    "ActorMethod",
    "ActorUnavailableError",
    "HostedActor",
    "RemoteMethod",
    "actor_resources",
    "check_actor_method",
    "check_actor_request",
    "constructor_error",
    "current_actor",
    "group_member_names",
    "public_methods",
]


class ActorFuture(concurrent.futures.Future[Any]):
    """The pending result of one actor call.

    ``result(timeout)`` returns the method's value or raises its exception (the
    original type, with the remote traceback attached where the call crossed a
    process boundary); ``TimeoutError`` if ``timeout`` passes first. Inside a job, a
    caller blocked on the result lends its CPU meanwhile (:mod:`fray.core._lending`).
    """

    def result(self, timeout: float | None = None) -> Any:
        if self.done():
            return super().result()
        with blocked():
            return super().result(timeout)


class ActorMethod(Protocol):
    """One method of an actor, bound to a handle."""

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the call and return its future at once."""
        ...

    def submit(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """The same as :meth:`remote` (marin's name)."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and block for its result."""
        ...


class ActorHandleBase(ABC):
    """The declared base of every backend's actor handle (the :class:`ActorHandle` protocol).

    ``handle.method`` is the backend's :class:`ActorMethod` (its ``__getattr__``; most use
    :class:`RemoteMethod`). The hooks below start calls, report readiness and crash the
    actor; they are named ``_fray_*`` so that they never shadow an actor's own methods.

    =====================================  ==============================================================
    ``_fray_call(method, args, kwargs)``   start a call; its :class:`ActorFuture`
    ``_fray_call_sync(...)``               make a call and block for its result. Default: the future's
    ``_fray_ready()``                      a future done once the actor serves; ActorDiedError if never
    ``_fray_kill()``                       crash the actor's process (:func:`fray.testing.kill_actor`).
                                           Default: ``ConfigError``, the backend cannot
    ``stacks(timeout, locals=)``           the live stacks of the actor's process (:mod:`fray.stacks`).
                                           Default: ``ConfigError``, the backend cannot
    =====================================  ==============================================================

    ``stacks`` is the one public name on the handle: an actor's own method called ``stacks``
    is reached with ``handle._fray_call("stacks", args, kwargs)``.
    """

    @abstractmethod
    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Start ``method(*args, **kwargs)`` on the actor; its future."""

    def _fray_call_sync(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make the call and block for its result (a backend whose blocking call needs no future overrides it)."""
        return self._fray_call(method, args, kwargs).result()

    @abstractmethod
    def _fray_ready(self) -> concurrent.futures.Future[None]:
        """Done once the actor is serving; failed with :class:`ActorDiedError` if it never will."""

    def _fray_kill(self) -> None:
        """Kill the actor's process as a crash would; this backend cannot."""
        raise ConfigError(
            f"kill_actor({self!r}): this backend ({type(self).__module__}) cannot kill one actor's process"
        )

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live Python stacks of every thread of the actor's process (one :class:`ProcessStacks`).

        Taken inside the process by Fray's runtime (no ptrace), while calls run; ``locals`` adds
        each frame's local variables (truncated reprs). A process that does not answer within
        ``timeout`` seconds is reported with :attr:`ProcessStacks.error` set, never a hang. This
        default says the backend cannot.
        """
        raise ConfigError(
            f"stacks({self!r}): this backend ({type(self).__module__}) cannot take an actor's live stacks yet; "
            "see docs/debugging.md for where it works"
        )


class RemoteMethod:
    """An :class:`ActorMethod` for handles that start a call with ``handle._fray_call(method, args, kwargs)``.

    ``.remote(...)`` starts the call and returns its future; calling blocks for the result,
    through ``handle._fray_call_sync(method, args, kwargs)`` (the future's result, unless
    the backend has a blocking call that needs no future, e.g. one that reads its own socket).
    A terminated job stops here, at its next Fray call.
    """

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: ActorHandleBase, name: str) -> None:
        self._handle = handle
        self._name = name

    def submit(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """marin's name for :meth:`remote`: start the call, return its future."""
        return self.remote(*args, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the call and return its future at once."""
        check_terminated()
        return self._handle._fray_call(self._name, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call and block for its result (inside a job, lending its CPU meanwhile)."""
        check_terminated()
        with blocked():
            return self._handle._fray_call_sync(self._name, args, kwargs)


@runtime_checkable
class ActorHandle(Protocol):
    """A deferred, picklable reference to a named actor.

    Usable as soon as it is returned; the first call waits until the actor is ready.
    Every backend's handle also has ``_fray_ready() -> Future[None]``, done once the
    actor is serving (or failed with :class:`ActorDiedError` if it never will).
    """

    def __getattr__(self, method_name: str) -> ActorMethod: ...

    def _fray_ready(self) -> concurrent.futures.Future[None]: ...

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of every thread of the actor's process (:mod:`fray.stacks`)."""
        ...


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


@dataclass(frozen=True)
class HostedActor:
    """An actor its creator hosts and stops (marin's ``Client.host_actor``): its handle, and how to stop it."""

    handle: ActorHandle
    stop: Callable[[], None] | None = None

    def shutdown(self) -> None:
        """Stop the actor and wait (up to a minute) for it to end; its calls then raise ``ActorDiedError``."""
        if self.stop is not None:
            self.stop()


def check_actor_request(
    actor_class: object,
    name: object,
    resources: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    actor_config: object = None,
    honoured: Collection[str] = (),
) -> tuple[ResourceConfig, ActorConfig]:
    """Validate ``create_actor``'s arguments the same way on every backend; raise ConfigError/SerializationError.

    Returns what the actor reserves (:func:`actor_resources`) and its config (the default for None).
    marin's ``ResourceConfig`` fields ``image``, ``target_cluster`` and ``container_profile`` are
    refused by name unless the backend honours them for actors (``honoured``: its ``HONOURS``,
    e.g. ``"ResourceConfig.image"``).
    """
    validate_name(name, "actor name")
    if not isinstance(actor_class, type):
        raise ConfigError(f"create_actor needs a class, got {type(actor_class).__name__}: {actor_class!r}")
    if resources is not None and not isinstance(resources, ResourceConfig):
        raise ConfigError(f"create_actor(resources={resources!r}) must be a ResourceConfig or None")
    config = check_actor_config(actor_config)
    refused = [
        f"{field}={getattr(resources, field)!r}"
        for field in ("image", "target_cluster", "container_profile")
        if isinstance(resources, ResourceConfig)
        and getattr(resources, field) is not None
        and f"ResourceConfig.{field}" not in honoured
    ]
    if refused:
        raise ConfigError(
            f"actor {name!r}: ResourceConfig({', '.join(refused)}) cannot be honoured for an actor on this "
            "backend (see docs/marin.md); leave it unset"
        )
    check_picklable(f"actor {name!r}", call_parts(actor_class, args, kwargs, "the class"))
    return actor_resources(resources), config


def actor_resources(resources: ResourceConfig | None) -> ResourceConfig:
    """What an actor reserves: exactly ``resources`` when given, nothing (no cpu, memory or disk) for None.

    An actor mostly waits for calls, so by default it takes no share of a host: a group
    of actors fits beside the jobs that call them. Give ``resources=`` to reserve what a
    busy actor needs, or :meth:`ResourceConfig.placement_only` to constrain where it runs
    without reserving anything.
    """
    return ResourceConfig.placement_only() if resources is None else resources


def group_member_names(name: str, count: object) -> list[str]:
    """``{name}-0`` ... ``{name}-{count-1}``, the names of an actor group's members; checks ``count``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"create_actor_group(count={count!r}) must be a whole number >= 1")
    return [f"{name}-{i}" for i in range(count)]


def constructor_error(exc: BaseException | None) -> BaseException | None:
    """The user's exception (in Fray's dual form) if ``exc`` says an actor's constructor raised, else None.

    Every backend fails a dead actor's readiness with :class:`ActorDiedError` whose
    ``__cause__`` is the constructor's exception as :func:`~fray.core._remote.remote_error`
    or :func:`~fray.core._remote.job_failed` builds it; other deaths have no such cause.
    """
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, RemoteError | JobFailed) and exc.type_name:
            return exc
        exc, seen = exc.__cause__, seen + 1
    return None


# How long wait_ready gives the handle of a member whose job FAILED to learn of it.
_SETTLE_SECONDS = 10.0


class ActorGroup:
    """``count`` instances of one actor class, each its own job, becoming ready independently.

    Intentionally thin: it hands out handles and jobs; callers decide how to spread
    work and what to do when a member dies. Handles are handed out exactly: a member
    is in a :meth:`wait_ready` or :meth:`discover_new` answer once it is ready, and
    :meth:`discover_new` returns only members not handed out before.
    """

    def __init__(self, handles: Sequence[ActorHandle], jobs: Sequence[JobHandle], name: str = "") -> None:
        if len(handles) != len(jobs):
            raise ValueError("ActorGroup needs one job per handle")
        self._handles = list(handles)
        self._jobs = list(jobs)
        self._name = name
        self._lock = threading.Lock()
        self._order: list[int] = []  # members in the order they became ready
        self._handed_out: set[int] = set()
        self._ready = [handle._fray_ready() for handle in self._handles]
        for index, future in enumerate(self._ready):
            future.add_done_callback(partial(self._on_ready, index))

    def __len__(self) -> int:
        return len(self._handles)

    def __repr__(self) -> str:
        return f"ActorGroup({self._name!r}, {len(self._handles)} members, {self.ready_count} ready)"

    def __reduce__(self) -> tuple[object, ...]:
        return (ActorGroup, (self._handles, self._jobs, self._name))

    def _on_ready(self, index: int, future: concurrent.futures.Future[None]) -> None:
        if future.exception() is None:
            with self._lock:
                self._order.append(index)

    @property
    def name(self) -> str:
        """The group's name (members are ``{name}-0`` ... ``{name}-{count-1}``)."""
        return self._name

    @property
    def ready_count(self) -> int:
        """How many members have started and are serving."""
        with self._lock:
            return len(self._order)

    def wait_ready(
        self, count: int | None = None, timeout: float | None = 300.0, *, progress: bool = False
    ) -> list[ActorHandle]:
        """Block until ``count`` members (default: all) are ready; return exactly ``count`` handles.

        The handles are the first ``count`` members to become ready, in member order; the
        list is a snapshot that does not grow later. Raises ``TimeoutError`` after
        ``timeout`` seconds; :class:`ActorDiedError` at once when a member's constructor
        raised (its message names the member's index, its ``__cause__`` is the
        constructor's exception in Fray's one error form, also of the user's class), and
        as soon as so many members died that ``count`` can no longer be reached.
        ``progress`` draws a progress bar on a terminal (nothing when stderr is not a TTY).
        """
        total = len(self._handles)
        want = total if count is None else count
        if isinstance(want, bool) or not isinstance(want, int) or not 0 <= want <= total:
            raise ValueError(f"wait_ready(count={count!r}): this group has {total} members")
        deadline = None if timeout is None else time.monotonic() + timeout
        if progress:
            watch_ready(self._ready, want, timeout)
        while True:
            self._raise_if_broken(want)
            with self._lock:
                enough = len(self._order) >= want
                ready = len(self._order)
            if enough:
                self._settle_failed_members(deadline)
                self._raise_if_broken(want)
                with self._lock:
                    chosen = sorted(self._order[:want])
                    self._handed_out.update(chosen)
                    return [self._handles[i] for i in chosen]
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"wait_ready: {ready} of {total} actors ready after {timeout}s, wanted {want}")
            pending = [f for f in self._ready if not f.done()]
            concurrent.futures.wait(pending, timeout=remaining, return_when=concurrent.futures.FIRST_COMPLETED)

    def _settle_failed_members(self, deadline: float | None) -> None:
        # A member whose job already FAILED may not have told its handle yet (a handle that
        # polls its backend learns it a moment later): let it, so that a constructor that
        # raised fails wait_ready even when enough other members are ready.
        failed = [
            future
            for future, job in zip(self._ready, self._jobs, strict=True)
            if not future.done() and job.status() == JobStatus.FAILED
        ]
        if failed:
            grace = _SETTLE_SECONDS if deadline is None else max(0.0, min(_SETTLE_SECONDS, deadline - time.monotonic()))
            concurrent.futures.wait(failed, timeout=grace)

    def _raise_if_broken(self, want: int) -> None:
        dead = [(i, f.exception()) for i, f in enumerate(self._ready) if f.done() and f.exception() is not None]
        for index, exc in dead:
            cause = constructor_error(exc)
            if cause is not None:
                raise actor_died(
                    f"{self._member(index)} of {len(self._handles)} died in its constructor: {cause}", cause
                )
        total = len(self._handles)
        if total - len(dead) < want:
            names = ", ".join(f"#{i}: {exc}" for i, exc in dead)
            raise ActorDiedError(
                f"only {total - len(dead)} of {total} actors can still become ready, {want} were asked for; "
                f"dead: {names}"
            ) from dead[0][1]

    def _member(self, index: int) -> str:
        return f"member {index} ({self._name}-{index})" if self._name else f"member {index}"

    def discover_new(self) -> list[ActorHandle]:
        """The members that are ready and were not handed out by an earlier ``wait_ready`` or ``discover_new``.

        Never blocks; in member order. Members that died are not reported here (see :meth:`statuses`).
        """
        with self._lock:
            fresh = sorted(set(self._order) - self._handed_out)
            self._handed_out.update(fresh)
        return [self._handles[i] for i in fresh]

    def is_done(self) -> bool:
        """True once every member's job has finished (stopped, failed, or ended itself)."""
        return all(job.status().finished for job in self._jobs)

    @property
    def handles(self) -> list[ActorHandle]:
        """Every member's handle, ready or not, in member order."""
        return list(self._handles)

    @property
    def jobs(self) -> list[JobHandle]:
        """The job hosting each member, in member order."""
        return list(self._jobs)

    def statuses(self) -> list[JobStatus]:
        """Each member's job status: FAILED or STOPPED members are dead."""
        return [job.status() for job in self._jobs]

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """Every member's :meth:`ActorHandle.stacks`, in member order, asked side by side (one ``timeout`` in all).

        A member that has ended is reported with :attr:`ProcessStacks.error` set, like one that did not answer.
        """
        if not self._handles:
            return ()
        with concurrent.futures.ThreadPoolExecutor(min(len(self._handles), 16), "fray-group-stacks") as pool:
            answers = [pool.submit(handle.stacks, timeout, locals=locals) for handle in self._handles]
            return tuple(process for answer in answers for process in answer.result())

    def shutdown(self) -> None:
        """Terminate every member, all at once (each sees ``current_actor().shutdown_requested`` first).

        Returns once every member's ``terminate()`` returned: a busy member may take its
        shutdown grace, and the members take theirs side by side.
        """
        if len(self._jobs) <= 1:
            for job in self._jobs:
                job.terminate()
            return
        with concurrent.futures.ThreadPoolExecutor(min(len(self._jobs), 16), "fray-group-stop") as pool:
            for future in [pool.submit(job.terminate) for job in self._jobs]:
                future.result()
