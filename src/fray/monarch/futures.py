"""``concurrent.futures`` futures completed from Monarch futures, with no thread and no poll per call.

A Monarch ``Future`` has no done-callback: it can be waited on (``get``), polled
through its ``Handle``, or turned into an asyncio future on a running loop. So:

* :func:`when_done` pushes: one asyncio loop per process, on a daemon thread (the
  *bridge*), observes a Monarch future and calls back when it is done. Used for
  readiness checks and supervision probes, and for calls someone waits on
  collectively.
* :class:`CallFuture` (the :class:`~fray.actor.ActorFuture` of ``.remote()``) is
  completed by whoever needs it first. ``result()``/``exception()`` pull the answer
  on the caller's own thread, as raw Monarch does; ``done()`` polls it; waiting with
  ``concurrent.futures.wait``/``as_completed`` or ``add_done_callback`` arms the
  bridge, which pushes it. Pushing every call through the bridge cost ~30 % of
  throughput with 64 calls in flight (``benchmarks/monarch.py``); pulling costs
  nothing over raw Monarch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from fray.actor import ActorFuture

__all__ = ["CallFuture", "send_then", "when_done"]

Callback = Callable[[Any, BaseException | None], None]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="fray-monarch-futures", daemon=True).start()
            _loop = loop
        return _loop


def when_done(future: Any, callback: Callback) -> None:
    """Call ``callback(result, None)`` or ``callback(None, exception)`` once ``future`` is done.

    ``future`` is a Monarch ``Future`` or ``Handle``. The callback runs on the bridge's
    thread: it must be quick and never block.
    """
    _running_loop().call_soon_threadsafe(_attach, future, callback)


def send_then(send: Callable[[], Any], callback: Callback) -> None:
    """Run ``send()`` (which starts a Monarch call and returns its future) on the bridge's thread, then
    :func:`when_done` it. For code running on Monarch's own threads (supervision callbacks), which must
    not start calls there.
    """

    def start() -> None:
        try:
            future = send()
        except BaseException as exc:
            callback(None, exc)
            return
        _attach(future, callback)

    _running_loop().call_soon_threadsafe(start)


def _attach(future: Any, callback: Callback) -> None:
    try:
        observed = future.as_asyncio()
    except BaseException as exc:  # a future already consumed, or Monarch shutting down
        callback(None, exc)
        return

    def done(result: asyncio.Future[Any]) -> None:
        if result.cancelled():
            callback(None, asyncio.CancelledError())
            return
        exc = result.exception()
        if exc is not None:
            callback(None, exc)
        else:
            callback(result.result(), None)

    observed.add_done_callback(done)


class _ArmingWaiters(list[Any]):
    """``Future._waiters``: ``concurrent.futures.wait`` and ``as_completed`` append a waiter here, which arms
    the bridge, so that the waiter is woken without anyone pulling."""

    def __init__(self, arm: Callable[[], None]) -> None:
        super().__init__()
        self._arm = arm

    def append(self, waiter: Any) -> None:
        super().append(waiter)  # first: if arming finds the call done already, this waiter hears of it
        self._arm()


class CallFuture(ActorFuture):
    """The future of one ``.remote()`` call (see the module docstring for who completes it).

    ``convert(reply, exc)`` turns the Monarch outcome into the call's value, or raises
    the Fray error the caller sees.
    """

    def __init__(self, monarch_future: Any, convert: Callable[[Any, BaseException | None], Any]) -> None:
        super().__init__()
        # A Handle can be observed by several parties (a puller and the bridge) without being consumed.
        self._handle = monarch_future._as_handle()
        self._convert = convert
        self._armed = False
        self._waiters = _ArmingWaiters(self._arm)

    def _arm(self) -> None:
        # A call already answered is settled here and now (most are, by the time a batch is waited on);
        # only the others go through the bridge.
        if not self._armed and not self.done():
            self._armed = True
            when_done(self._handle, self._settle)

    def _settle(self, reply: Any, exc: BaseException | None) -> None:
        try:
            value = self._convert(reply, exc)
        except BaseException as err:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # settled already, or cancelled
                self.set_exception(err)
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.set_result(value)

    def _pull(self, timeout: float | None) -> None:
        if super().done():
            return
        try:
            reply = self._handle.get(timeout)
        except TimeoutError:
            raise
        except Exception as exc:
            self._settle(None, exc)
        else:
            self._settle(reply, None)

    def result(self, timeout: float | None = None) -> Any:
        """The call's value; raises its error, or ``TimeoutError`` after ``timeout`` seconds."""
        self._pull(timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error (None if it returned); ``TimeoutError`` after ``timeout`` seconds."""
        self._pull(timeout)
        return super().exception(0)

    def done(self) -> bool:
        """True once the call finished (or was cancelled); asks Monarch without blocking."""
        if super().done():
            return True
        try:
            reply = self._handle.poll()
        except Exception as exc:
            self._settle(None, exc)
            return True
        if reply is None:  # replies are tuples: None means "not yet"
            return False
        self._settle(reply, None)
        return True

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[Any]], object]) -> None:
        """Call ``fn(self)`` when the call finishes (arms the bridge, so nobody has to pull)."""
        self._arm()
        super().add_done_callback(fn)
