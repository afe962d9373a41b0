"""Running an actor's methods, ``async def`` ones included: one shared implementation for every backend.

An actor with ``async def`` methods gets one event loop, on its own daemon thread,
for its whole life: state bound to the loop (queues, locks, tasks it started)
survives between calls, and with ``max_concurrency > 1`` several coroutines are in
flight on that one loop at once while the calling threads wait for their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable
from typing import Any

__all__ = ["ActorLoop", "invoke"]


class ActorLoop:
    """One asyncio event loop on a daemon thread, started on first use, kept until :meth:`close`."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._in_flight: set[concurrent.futures.Future[Any]] = set()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        # Caller holds the lock.
        if self._closed:
            raise RuntimeError(f"the event loop of actor {self._label!r} is closed")
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name=f"fray-actor-loop-{self._label}", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    @property
    def thread_ident(self) -> int | None:
        """The ident of the loop's thread, None until the loop first started (for ``stacks()``)."""
        thread = self._thread
        return thread.ident if thread is not None else None

    def submit(self, awaitable: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        """Start ``awaitable`` on the loop; its result arrives in the returned future."""
        with self._lock:
            # Registered under the lock that close() takes, so close() never misses a future.
            future = asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self._running_loop())
            self._in_flight.add(future)
        future.add_done_callback(self._discard)
        return future

    def _discard(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the loop and block the calling thread until it is done."""
        return self.submit(awaitable).result()

    def close(self, *, wait: bool = False, timeout: float | None = None) -> None:
        """Stop the loop; later calls raise RuntimeError.

        Coroutines still in flight are abandoned, and their futures cancelled, so a
        thread blocked in :meth:`run` gets ``concurrent.futures.CancelledError`` rather
        than waiting forever. With ``wait``, return only once the loop's thread has
        ended (the step running when the loop was told to stop runs to its next await), or
        ``timeout`` seconds have passed.
        """
        with self._lock:
            self._closed = True
            loop, self._loop = self._loop, None
            thread = self._thread
            in_flight, self._in_flight = self._in_flight, set()
        for future in in_flight:
            future.cancel()
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def invoke(instance: object, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], loop: ActorLoop) -> Any:
    """Call ``instance.method(*args, **kwargs)``; an awaitable result is run to completion on ``loop``."""
    result = getattr(instance, method)(*args, **kwargs)
    if inspect.isawaitable(result):
        return loop.run(result)
    return result
