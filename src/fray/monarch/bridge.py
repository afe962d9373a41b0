"""Completing ``concurrent.futures`` futures from Monarch futures, without a thread or a poll per call.

A Monarch ``Future`` has no done-callback; it can be waited on (``get``) or turned
into an asyncio future on a running loop (``as_asyncio``). One asyncio loop per
process, on a daemon thread, observes every pending call: :func:`when_done`
attaches the callback there, so thousands of calls in flight cost no threads.
Blocking calls do not come here at all: they ``get()`` on the caller's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["send_then", "when_done"]

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


def when_done(future: Any, callback: Callable[[Any, BaseException | None], None]) -> None:
    """Call ``callback(result, None)`` or ``callback(None, exception)`` once the Monarch ``future`` is done.

    The callback runs on the bridge's loop thread: it must be quick and never block.
    """
    _running_loop().call_soon_threadsafe(_attach, future, callback)


def _attach(future: Any, callback: Callable[[Any, BaseException | None], None]) -> None:
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
        callback(None, exc) if exc is not None else callback(result.result(), None)

    observed.add_done_callback(done)


def send_then(send: Callable[[], Any], callback: Callable[[Any, BaseException | None], None]) -> None:
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
