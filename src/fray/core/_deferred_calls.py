"""The deferred part of an actor handle, written once: calls wait in order until the actor serves.

``create_actor`` returns a handle at once (seed 003: "the first call blocks until the actor
is registered and serving"). Where the engine does not queue calls itself (a Fray cluster,
Iris), the handle keeps them in a :class:`DeferredCalls`:

* while the actor is not serving yet (or is restarting), calls wait, in the order they
  were made;
* once it serves, the waiting calls are sent in that order -- calls made meanwhile join the
  end of the queue until it is drained, so none overtakes an earlier one -- and later calls
  go straight to the engine's ``send``;
* once it is dead, every waiting and later call fails with a fresh copy of the death
  (:class:`~fray.errors.ActorDiedError`, also an instance of the user's exception class
  when a constructor raised);
* a call whose actor died while it was in flight is sent again to the restarted instance
  when ``ActorConfig.max_task_retries`` allows (:meth:`DeferredCalls.retry`).

The engine's part of a handle is small: how to send a call, how to learn that the actor
serves or died, and how to explain a broken connection.

The states and their transitions::

    WAITING --serve--> SERVING --restarting--> WAITING
       |                  |
       +------die---------+-----> DEAD   (final)
"""

from __future__ import annotations

import concurrent.futures
import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fray.actor import ActorFuture
from fray.core._remote import copy_died
from fray.errors import ActorDiedError

__all__ = ["TRANSITIONS", "CallState", "DeferredCalls", "PendingCall", "copy_death"]


class CallState(enum.Enum):
    """Where a handle's calls go: into the queue, straight to the actor, or nowhere."""

    WAITING = "waiting"
    SERVING = "serving"
    DEAD = "dead"


#: Every transition a handle's call state may take.
TRANSITIONS: dict[CallState, frozenset[CallState]] = {
    CallState.WAITING: frozenset({CallState.SERVING, CallState.DEAD}),
    CallState.SERVING: frozenset({CallState.WAITING, CallState.DEAD}),
    CallState.DEAD: frozenset(),
}


@dataclass
class PendingCall:
    """One call of a handle: its future, the method, what the engine sends, and how often it was sent again."""

    future: ActorFuture
    method: str
    payload: Any
    """The engine's form of the arguments (``(args, kwargs)``, or bytes already pickled)."""
    retries: int = field(default=0)


def copy_death(error: BaseException) -> BaseException:
    """A fresh exception for each failed call: one object raised from many threads tangles its traceback."""
    return copy_died(error) if isinstance(error, ActorDiedError) else error


class DeferredCalls:
    """The calls of one actor handle, by state (see the module docstring).

    ``send(call)`` is the engine's: it starts the call and settles ``call.future`` when the
    answer comes. It runs outside this object's lock. ``ready`` is done once the actor
    first serves, or failed with the error when it died before that.
    """

    def __init__(self, send: Callable[[PendingCall], None]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._state = CallState.WAITING
        self._queue: list[PendingCall] = []
        self._death: BaseException | None = None
        self._watching = False
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()

    def watch(self, start: Callable[[], None]) -> concurrent.futures.Future[None]:
        """``ready``; the first call also runs ``start``, the engine's way of finding out when the actor serves."""
        with self._lock:
            first, self._watching = not self._watching, True
        if first:
            start()
        return self.ready

    @property
    def state(self) -> CallState:
        """The current state (read without the lock: for fast paths that recheck through :meth:`submit`)."""
        return self._state

    @property
    def death(self) -> BaseException | None:
        """Why the actor is dead, once it is."""
        return self._death

    def _move(self, to: CallState) -> None:
        # Caller holds self._lock.
        if to not in TRANSITIONS[self._state]:
            raise RuntimeError(f"actor handle: no transition from {self._state.value} to {to.value}")
        self._state = to

    def submit(self, call: PendingCall) -> bool:
        """Queue, send, or fail ``call`` by the state; True if it was queued (the actor does not serve yet).

        A call sent at once may raise what ``send`` raises (its arguments cannot be sent),
        to the caller, as a direct call would.
        """
        with self._lock:
            state, death = self._state, self._death
            if state is CallState.WAITING:
                self._queue.append(call)
                return True
        if state is CallState.DEAD:
            assert death is not None
            call.future.set_exception(copy_death(death))
        else:
            self._send(call)
        return False

    def serve(self) -> None:
        """The actor serves: send the waiting calls in order, then let later calls go straight out."""
        while True:
            with self._lock:
                if self._state is not CallState.WAITING:
                    return  # died meanwhile: die() failed the queue
                batch, self._queue = self._queue, []
                if not batch:
                    self._move(CallState.SERVING)
                    break
            for call in batch:
                try:
                    self._send(call)
                except Exception as exc:  # e.g. arguments over the frame limit: that call fails, not the others
                    call.future.set_exception(exc)
        if not self.ready.done():  # done already when a restarted actor serves again
            self.ready.set_result(None)

    def restarting(self) -> bool:
        """The instance died and the actor restarts: calls wait again. False if it was waiting or dead already."""
        with self._lock:
            if self._state is not CallState.SERVING:
                return False
            self._move(CallState.WAITING)
            return True

    def die(self, error: BaseException) -> None:
        """The actor is dead for good: fail every waiting call, and every later one at once."""
        with self._lock:
            if self._state is CallState.DEAD:
                return
            self._move(CallState.DEAD)
            self._death = error
            queued, self._queue = self._queue, []
        if not self.ready.done():
            self.ready.set_exception(error)
        for call in queued:
            call.future.set_exception(copy_death(error))

    def retry(self, call: PendingCall, died: BaseException, max_task_retries: int) -> None:
        """``call``'s actor died while it was in flight: send it again if the budget allows, else fail it."""
        if call.retries >= max_task_retries:
            call.future.set_exception(died)
            return
        call.retries += 1
        try:
            self.submit(call)
        except Exception as exc:
            call.future.set_exception(exc)
