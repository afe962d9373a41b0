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
        self._closed = False

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the event loop of actor {self._label!r} is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=f"fray-actor-loop-{self._label}", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(self, awaitable: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        """Start ``awaitable`` on the loop; its result arrives in the returned future."""
        return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self._running_loop())

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the loop and block the calling thread until it is done."""
        return self.submit(awaitable).result()

    def close(self) -> None:
        """Stop the loop (coroutines still in flight are abandoned); later calls raise RuntimeError."""
        with self._lock:
            self._closed = True
            loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def invoke(instance: object, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], loop: ActorLoop) -> Any:
    """Call ``instance.method(*args, **kwargs)``; an awaitable result is run to completion on ``loop``."""
    result = getattr(instance, method)(*args, **kwargs)
    if inspect.isawaitable(result):
        return loop.run(result)
    return result
