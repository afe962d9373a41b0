"""Actor classes the RPC tests serve (importable by the server processes too)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any


class Counter:
    """Counts; records the order in which calls ran."""

    def __init__(self) -> None:
        self.value = 0
        self.seen: list[int] = []

    def incr(self, by: int = 1) -> int:
        """Add ``by`` and return the new value."""
        self.value += by
        return self.value

    def record(self, i: int) -> None:
        self.seen.append(i)

    def order(self) -> list[int]:
        return list(self.seen)

    def pid(self) -> int:
        return os.getpid()

    def echo(self, value: Any) -> Any:
        return value

    def apply(self, fn: Any, value: Any) -> Any:
        return fn(value)

    async def aincr(self, by: int = 1) -> int:
        await asyncio.sleep(0)
        self.value += by
        return self.value

    def fail(self, message: str) -> None:
        raise KeyError(message)

    def fail_unpicklable(self) -> None:
        raise TwoArgError("a", "b")

    def unpicklable_result(self) -> Any:
        return threading.Lock()

    def _private(self) -> None:
        raise AssertionError("private methods must not be callable")


class TwoArgError(Exception):
    """An exception whose constructor does not match its args, so it cannot be unpickled."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}+{b}")


class Gate:
    """Calls that block until another call opens the gate (shows calls run concurrently)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._running = 0
        self.opened = 0
        self.waiting = 0

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until :meth:`open` is called (from another connection or actor)."""
        self.waiting += 1
        return self._event.wait(timeout)

    def open(self) -> None:
        """Let every wait() return."""
        self.opened += 1
        self._event.set()

    def ping(self) -> str:
        return "pong"

    def block_forever(self) -> None:
        """Never return (until the process dies)."""
        self._running += 1
        threading.Event().wait()

    def running(self) -> int:
        """How many block_forever calls have started."""
        return self._running


class Rendezvous:
    """Two calls that can only both return if they run at the same time."""

    def __init__(self) -> None:
        self._barrier = threading.Barrier(2)
        self._async_barrier_count = 0
        self._async_event: asyncio.Event | None = None

    def meet(self, timeout: float = 20.0) -> bool:
        try:
            self._barrier.wait(timeout)
        except threading.BrokenBarrierError:
            return False
        return True

    async def ameet(self, timeout: float = 20.0) -> bool:
        if self._async_event is None:
            self._async_event = asyncio.Event()
        self._async_barrier_count += 1
        if self._async_barrier_count == 2:
            self._async_event.set()
        try:
            await asyncio.wait_for(self._async_event.wait(), timeout)
        except TimeoutError:
            return False
        return True


ACTOR_CLASSES = {"Counter": Counter, "Gate": Gate, "Rendezvous": Rendezvous}
