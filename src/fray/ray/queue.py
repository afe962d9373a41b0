"""Queues with leases on Ray: each queue is one named async Ray actor holding a :class:`~fray.queue.QueueCore`.

The actor is async so that a blocking ``pop`` waits inside it (on an asyncio
condition, woken by a push or by the earliest lease running out) without holding up
other callers. It lives in the client's Ray namespace as ``fray-queue-NAME`` and,
like the client's actors, ends when the client that created it shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from fray.queue import Lease, QueueClient, QueueCore, QueueCounts, check_queue_name, counts_from, queue_exists
from fray.ray._errors import translate
from fray.ray._values import shield

__all__ = ["RayQueue", "create_queue"]

T = TypeVar("T")


class _QueueActor:
    """The Ray actor behind a :class:`RayQueue` (async: many callers may wait in ``pop`` at once)."""

    def __init__(self, name: str) -> None:
        self._core = QueueCore(name)
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made on the actor's event loop, at the first call
            self._changed = asyncio.Condition()
        return self._changed

    async def push_many(self, items: list[Any]) -> None:
        self._core.push_many(items)
        changed = self._condition()
        async with changed:
            changed.notify_all()

    async def peek(self) -> tuple[bool, Any]:
        return self._core.peek(time.monotonic())

    async def pop_many(self, max_items: int, lease_timeout: float, timeout: float | None) -> list[Lease[Any]]:
        return await self._wait_for(lambda now: self._core.pop_many(max_items, lease_timeout, now), timeout)

    async def _wait_for(self, take: Callable[[float], list[Lease[Any]]], timeout: float | None) -> list[Lease[Any]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        changed = self._condition()
        while True:
            now = time.monotonic()
            leases = take(now)
            if leases or (deadline is not None and now >= deadline):
                return leases
            wake = [t for t in (deadline, self._core.next_deadline()) if t is not None]
            async with changed:
                with contextlib.suppress(TimeoutError):  # woken by the clock: a lease may have run out
                    await asyncio.wait_for(changed.wait(), max(0.0, min(wake) - now) if wake else None)

    async def done_many(self, lease_ids: list[str]) -> list[str]:
        return self._core.done_many(lease_ids, time.monotonic())

    async def counts(self) -> tuple[int, int]:
        counts = self._core.counts(time.monotonic())
        return counts.pending, counts.in_flight


_REMOTE: Any = None


def _actor_class() -> Any:
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(_QueueActor)
    return _REMOTE


def _actor_name(name: str) -> str:
    return f"fray-queue-{name}"


class RayQueue(QueueClient[T]):
    """A queue with leases on Ray (see :mod:`fray.queue`); picklable, usable from any task or actor."""

    def __init__(self, name: str, namespace: str, actor: Any) -> None:
        super().__init__(name)
        self._namespace = namespace
        self._actor = actor

    def __repr__(self) -> str:
        return f"RayQueue({self._name!r}, namespace={self._namespace!r})"

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self._actor, method).remote(*(shield(a) for a in args)))
        except ray.exceptions.RayError as exc:
            raise translate(exc, actor=_actor_name(self._name), method=method) from None

    def _push(self, items: list[T]) -> None:
        self._call("push_many", items)

    def _peek(self) -> tuple[bool, T | None]:
        found, item = self._call("peek")
        return bool(found), item

    def _take(self, max_items: int, lease_timeout: float, wait: float | None) -> list[Lease[T]]:
        # The actor is async: it waits for an item without holding up other callers.
        leases: list[Lease[T]] = self._call("pop_many", max_items, lease_timeout, wait)
        return leases

    def _done(self, lease_ids: list[str]) -> list[str]:
        statuses: list[str] = self._call("done_many", lease_ids)
        return statuses

    def _counts(self) -> QueueCounts:
        return counts_from(self._call("counts"))

    def _kill(self) -> None:
        ray.kill(self._actor, no_restart=True)


def create_queue(name: str, namespace: str, *, exist_ok: bool) -> tuple[RayQueue[Any], bool]:
    """Create (or with ``exist_ok`` attach to) the queue ``name`` in ``namespace``; True if it was created."""
    check_queue_name(name)
    if exist_ok:
        try:
            return RayQueue(name, namespace, ray.get_actor(_actor_name(name), namespace=namespace)), False
        except ValueError:
            pass  # not there yet: create it below (a creator that wins the race is attached to then)
    try:
        actor = (
            _actor_class()
            .options(name=_actor_name(name), namespace=namespace, num_cpus=0, max_restarts=0, max_concurrency=1000)
            .remote(name)
        )
    except ValueError as exc:
        if "already" not in str(exc) and "taken" not in str(exc):
            raise
        if exist_ok:
            return RayQueue(name, namespace, ray.get_actor(_actor_name(name), namespace=namespace)), False
        raise queue_exists(name, f"in Ray namespace {namespace!r}") from None
    return RayQueue(name, namespace, actor), True
