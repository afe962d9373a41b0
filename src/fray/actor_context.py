"""What an actor knows about itself: :func:`current_actor` and the :class:`ActorContext` it returns.

Every backend builds one :class:`ActorContext` per actor instance (a restarted actor
gets a new one) and makes it current while the actor's constructor and methods run:
in a context variable for backends that run actors as threads of a shared process
(the local backend), and for the whole process where the actor owns its process (Ray,
the Fray cluster), so threads the actor starts see it too.

An actor ends itself with :meth:`ActorContext.exit` or :meth:`ActorContext.fail`: the
context records the request, and the backend acts on it once the call that made it
returns (:meth:`ActorContext.end_request`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fray.core._remote import copy_died, self_ended
from fray.errors import ActorContextError, ActorDiedError
from fray.job import current_job

__all__ = [
    "SHUTDOWN_GRACE",
    "ActorCalls",
    "ActorContext",
    "ActorEnd",
    "bind_actor",
    "current_actor",
    "set_process_actor",
]

SHUTDOWN_GRACE = 2.0
"""Seconds a terminated actor's running method is given, after ``shutdown_requested`` is set, before it is
stopped by force (a thread stopped, a process killed)."""


@dataclass(frozen=True)
class ActorEnd:
    """How an actor asked to end: ``error`` is None for ``exit()``, the exception given to ``fail()`` otherwise."""

    error: BaseException | None = None


class ActorContext:
    """Who the running actor is, and how it ends itself. Returned by :func:`current_actor`.

    * ``name``: the actor's name (``{group}-{index}`` for a member of a group);
    * ``group_name``: the group's name, or None for an actor created alone;
    * ``index``: the member's index in its group, 0 for an actor created alone;
    * ``handle``: a handle to this very actor, picklable: give it to jobs and other
      actors so they can call back (do not call it from the actor's own method when
      ``max_concurrency`` is 1: the call would wait for the method that makes it);
    * ``shutdown_requested``: a :class:`threading.Event` set when the actor's job is
      being terminated or its group shut down, so a long method can stop cleanly (the
      actor is stopped for good after a grace period);
    * ``exit()`` ends the actor's job as SUCCEEDED once the current call returns;
    * ``fail(exc)`` ends it as FAILED with ``exc`` once the current call returns: the
      job's ``wait()`` raises ``exc`` in Fray's one error form, and calls to the actor
      raise :class:`~fray.errors.ActorDiedError` whose ``__cause__`` is that error.

    After ``exit()`` or ``fail()`` no new call starts (each fails with
    ``ActorDiedError``) and the actor is not restarted.

    ``ActorContext(handle, index, group_name, shutdown_event=None)`` is marin's constructor,
    for tests that run actor code outside an actor (make it current with
    ``fray.actor._set_current_actor``); backends build theirs with :meth:`of_actor`.
    """

    def __init__(
        self,
        handle: Any = None,
        index: int = 0,
        group_name: str | None = None,
        shutdown_event: threading.Event | None = None,
        *,
        name: str | None = None,
    ) -> None:
        # marin's constructor (its test fixtures build contexts for code that calls
        # current_actor() outside an actor); backends use ActorContext.of_actor.
        self._name = name if name is not None else (f"{group_name}-{index}" if group_name else "actor")
        self._group_name = group_name
        self._index = index
        self._handle_source: Callable[[], Any] | None = None
        self._handle: Any = handle
        self.shutdown_requested = shutdown_event if shutdown_event is not None else threading.Event()
        self._lock = threading.Lock()
        self._end: ActorEnd | None = None

    @classmethod
    def of_actor(cls, name: str, group_name: str | None, index: int, handle: Callable[[], Any]) -> ActorContext:
        """The context a backend makes for one actor instance; ``handle()`` builds its handle on first use."""
        context = cls(None, index, group_name, name=name)
        context._handle_source = handle
        return context

    def __repr__(self) -> str:
        group = f", group={self._group_name!r}, index={self._index}" if self._group_name is not None else ""
        return f"ActorContext({self._name!r}{group})"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("an ActorContext belongs to its actor; pass current_actor().handle instead")

    @property
    def name(self) -> str:
        """The actor's name."""
        return self._name

    @property
    def group_name(self) -> str | None:
        """The name of the actor's group, None if it was created alone."""
        return self._group_name

    @property
    def index(self) -> int:
        """The actor's index in its group (0 if it was created alone)."""
        return self._index

    @property
    def shutdown_event(self) -> threading.Event:
        """marin's name for :attr:`shutdown_requested`."""
        return self.shutdown_requested

    @property
    def handle(self) -> Any:
        """A picklable handle to this actor (an :class:`~fray.actor.ActorHandle`)."""
        with self._lock:
            if self._handle is None and self._handle_source is not None:
                self._handle = self._handle_source()  # built on first use: it may connect to a controller
            return self._handle

    def exit(self) -> None:
        """End the actor's job as SUCCEEDED once the current call returns; ActorContextError if already ending."""
        self._request(ActorEnd(None), "exit()")

    def fail(self, exc: BaseException) -> None:
        """End the actor's job as FAILED with ``exc`` once the current call returns."""
        if not isinstance(exc, BaseException):
            raise ActorContextError(
                f"current_actor().fail() takes an exception instance, e.g. fail(RuntimeError('why')), got {exc!r}"
            )
        self._request(ActorEnd(exc), "fail()")

    def _request(self, end: ActorEnd, what: str) -> None:
        with self._lock:
            if self._end is not None:
                before = "exit()" if self._end.error is None else f"fail({self._end.error!r})"
                raise ActorContextError(
                    f"actor {self._name!r}: {what} called after {before} was already called; an actor ends once "
                    "(it ends when the call that asked returns)"
                )
            self._end = end

    def end_request(self) -> ActorEnd | None:
        """What the actor asked for (``exit()`` or ``fail()``), or None: read by the backend after each call."""
        with self._lock:
            return self._end


class ActorCalls:
    """An actor host's calls: how many run, and whether new ones may start. Every backend's host uses one.

    ``enter()`` and ``leave()`` bracket each call. ``check_end()``, after the constructor
    and after each call, acts on an actor that asked to end (``exit()`` / ``fail()``):
    ``on_end(end)`` runs once (the backend records the end, tells its creator, exits),
    then the actor is refused as ``refuse(death)`` refuses it for any other reason (its
    job is being terminated): every later ``enter()`` raises a copy of ``death`` (one per
    caller) and ``done`` is set. ``wait_idle`` waits for the calls still running.

    ============  ==========================  ===========================================
    state         entered by                  ``enter()``
    ============  ==========================  ===========================================
    serving       the constructor returned    counts the call in
    ended         ``check_end`` / ``refuse``  raises the actor's death; ``done`` is set
    ============  ==========================  ===========================================
    """

    def __init__(self, context: ActorContext, on_end: Callable[[ActorEnd], None] | None = None) -> None:
        self.context = context
        self.done = threading.Event()
        self._on_end = on_end
        self._idle = threading.Condition()
        self._running = 0
        self._ending = False
        self._death: ActorDiedError | None = None

    @property
    def death(self) -> ActorDiedError | None:
        """Why calls are refused, once they are."""
        return self._death

    def enter(self) -> None:
        """A call starts; raises the actor's death (a fresh copy) once it ended."""
        with self._idle:
            death = self._death
            if death is None:
                self._running += 1
                return
        raise copy_died(death)

    def leave(self) -> None:
        """A call that ``enter`` let in has returned."""
        with self._idle:
            self._running -= 1
            if self._running == 0:
                self._idle.notify_all()

    def refuse(self, death: ActorDiedError) -> bool:
        """Refuse every later call with ``death``; False if the actor had ended already (its first death stays)."""
        with self._idle:
            first = self._death is None
            if first:
                self._death = death
        self.done.set()
        return first

    def check_end(self) -> None:
        """If the actor asked to end, end it: ``on_end`` first (so what it records is there for refused calls)."""
        end = self.context.end_request()
        if end is None:
            return
        with self._idle:
            if self._ending or self._death is not None:
                return
            self._ending = True
        if self._on_end is not None:
            self._on_end(end)
        self.refuse(self_ended(self.context.name, end.error))

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call runs; False if some still ran after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True


#: The actor of the running code, where actors are threads of a shared process (marin's name).
_current_actor_ctx: contextvars.ContextVar[ActorContext | None] = contextvars.ContextVar(
    "fray_current_actor", default=None
)
_process_actor: ActorContext | None = None


def current_actor() -> ActorContext:
    """The actor whose constructor or method is running; :class:`~fray.errors.ActorContextError` elsewhere."""
    context = _current_actor_ctx.get() or _process_actor
    if context is None:
        job = current_job()
        where = f"job {job.name!r}, which is not an actor" if job is not None else "code outside any actor"
        raise ActorContextError(
            f"current_actor() was called from {where}; it works only inside an actor's constructor or methods "
            "(create one with client.create_actor), so pass what a job needs as its arguments"
        )
    return context


def bind_actor(context: ActorContext | None) -> contextvars.Token[ActorContext | None]:
    """Make ``context`` the current actor in this context (None: no actor, e.g. a job started from an actor)."""
    return _current_actor_ctx.set(context)


def _set_current_actor(ctx: ActorContext) -> contextvars.Token[ActorContext | None]:
    """Make ``ctx`` what :func:`current_actor` returns in this context; undo with :func:`_reset_current_actor`.

    marin's private hook, which its test fixtures use to run actor code outside an actor.
    """
    return _current_actor_ctx.set(ctx)


def _reset_current_actor(token: contextvars.Token[ActorContext | None]) -> None:
    """Undo a :func:`_set_current_actor` (marin's private hook)."""
    _current_actor_ctx.reset(token)


def set_process_actor(context: ActorContext | None) -> None:
    """Make ``context`` the current actor of the whole process (backends whose actor owns its process)."""
    global _process_actor
    _process_actor = context
