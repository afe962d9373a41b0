"""Queues with leases: ``client.create_queue(name)`` on every backend.

A consumer ``pop``\\ s an item with a *lease*: the item is hidden from other consumers
until the consumer calls ``done(lease)`` or the lease times out, when the item goes
back to the front of the queue to be delivered again (at-least-once delivery; a
redelivered lease has ``deliveries > 1``). ``done`` after the lease timed out raises
:class:`~fray.errors.LeaseExpired` (someone else may process the item again), ``done``
twice :class:`~fray.errors.LeaseError`. Queue handles are picklable: pass them to jobs
and actors.

The batch forms ``push_many``, ``pop_many`` and ``done_many`` do the same for several
items in one call (one round trip, and on the cluster one transaction): they are how a
queue reaches thousands of items per second. ``done_many`` finishes every lease it
still holds and then raises for those it does not (see :meth:`Queue.done_many`).

:class:`QueueCore` is the in-memory state machine shared by the local queue, the Ray
queue's actor and the generic actor-backed queue; the Fray cluster keeps the same
state in its controller's database (durable).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from fray.core._queue_checks import (
    check_items,
    check_max_items,
    check_pop_arguments,
    check_queue_name,
    lease_error,
    queue_exists,
    sequence,
)
from fray.core.inside._runtime import check_terminated
from fray.errors import ConfigError, JobAlreadyExists, LeaseError

__all__ = [
    "DEFAULT_LEASE_TIMEOUT",
    "ActorQueue",
    "Lease",
    "LocalQueue",
    "Queue",
    "QueueClient",
    "QueueCore",
    "QueueCounts",
    "QueueService",
    "actor_queue",
    "check_items",
    "check_leases",
    "check_max_items",
    "check_pop_arguments",
    "counts_from",
    "done_many_error",
    "lease_error",
    "queue_exists",
]

T = TypeVar("T")

#: Seconds a popped item stays leased when ``pop`` is not told otherwise.
DEFAULT_LEASE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Lease(Generic[T]):
    """One delivery of one item: give it back to ``queue.done(lease)`` once the item is processed.

    ``deliveries`` counts how many times the item was handed out (1 the first time);
    ``timeout`` is how many seconds the consumer had.
    """

    item: T
    lease_id: str
    queue: str
    deliveries: int = 1
    timeout: float = DEFAULT_LEASE_TIMEOUT


@dataclass(frozen=True)
class QueueCounts:
    """How many items a queue holds, read at one instant: ``queue.counts()``.

    Read ``pending()`` and then ``in_flight()`` and an item can be counted twice or
    not at all: a lease that runs out in between moves its item from leased to
    waiting. "Is everything processed?" is ``counts().unfinished == 0``.
    """

    pending: int  # waiting to be popped (items whose lease ran out included)
    in_flight: int  # leased and not yet done

    @property
    def unfinished(self) -> int:
        """Items pushed and not yet done: waiting plus leased."""
        return self.pending + self.in_flight


@runtime_checkable
class Queue(Protocol[T]):
    """A named queue with leases (see the module docstring)."""

    @property
    def name(self) -> str:
        """The queue's name."""
        ...

    def push(self, item: T) -> None:
        """Append ``item`` (it must be picklable on every backend but the local one)."""
        ...

    def peek(self) -> T | None:
        """The item the next ``pop`` would lease, without leasing it; None when there is none."""
        ...

    def pop(self, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0) -> Lease[T] | None:
        """Lease the next item for ``lease_timeout`` seconds.

        ``timeout=0`` (default) returns None at once when the queue is empty; a number
        waits up to that many seconds for an item; None waits as long as it takes.
        """
        ...

    def done(self, lease: Lease[T]) -> None:
        """The item of ``lease`` is processed: remove it for good.

        Raises :class:`~fray.errors.LeaseExpired` when the lease timed out first and
        :class:`~fray.errors.LeaseError` when it was already done or is not this queue's.
        """
        ...

    def push_many(self, items: Iterable[T]) -> None:
        """Append every item of ``items`` (a list or tuple, say), in order, in one call; all or none are pushed."""
        ...

    def pop_many(
        self, max_items: int, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0
    ) -> list[Lease[T]]:
        """Lease up to ``max_items`` items at once, each for ``lease_timeout`` seconds, in queue order.

        As :meth:`pop`, but a list: at least one lease unless ``timeout`` ran out
        (then ``[]``); it does not wait for more once one item is there.
        """
        ...

    def done_many(self, leases: Iterable[Lease[T]]) -> None:
        """Remove the items of every lease in ``leases`` for good, in one call.

        Every lease the queue still holds is done, even when others are not: then it
        raises, after the others are done, the error ``done`` would raise for the first
        lease not held (:class:`~fray.errors.LeaseExpired` for one that timed out), its
        message naming every lease that was not done and why. Anything in ``leases``
        that is not a :class:`Lease` of this queue is refused
        (:class:`~fray.errors.LeaseError`) before any lease is done.
        """
        ...

    def pending(self) -> int:
        """How many items wait to be popped (items whose lease expired included; leased ones not)."""
        ...

    def in_flight(self) -> int:
        """How many items are leased and not yet done."""
        ...

    def counts(self) -> QueueCounts:
        """Waiting and leased items, both read at the same instant (see :class:`QueueCounts`)."""
        ...


# ----- checks of leases, shared by every backend (the others: fray.core._queue_checks) ----------------


def check_lease(lease: object, queue: str, method: str = "done") -> Lease[Any]:
    """``lease`` checked to be a :class:`Lease` of ``queue``."""
    if not isinstance(lease, Lease):
        raise LeaseError(f"{method}() takes the Lease that pop() returned, got {type(lease).__name__}: {lease!r}")
    if lease.queue != queue:
        raise LeaseError(
            f"lease {lease.lease_id!r} is of queue {lease.queue!r}, not {queue!r}: call {method}() on that queue"
        )
    return lease


def check_leases(leases: object, queue: str) -> list[Lease[Any]]:
    """``done_many``'s leases, each checked as ``done`` checks one."""
    return [check_lease(lease, queue, "done_many") for lease in sequence(leases, "done_many", "leases")]


def done_many_error(leases: list[Lease[Any]], statuses: list[str], queue: str) -> LeaseError | None:
    """The error for ``done_many`` given each lease's status (``"ok"`` or why not held); None when all are ok.

    Its type and first sentence are those of ``done`` for the first lease not held; it
    then names the others not held and says how many were done.
    """
    failed = [(lease.lease_id, status) for lease, status in zip(leases, statuses, strict=True) if status != "ok"]
    if not failed:
        return None
    first = lease_error(failed[0][1], failed[0][0], queue)
    extra = ""
    if len(failed) > 1:
        extra = "; not done either: " + ", ".join(f"{lease_id!r} ({status})" for lease_id, status in failed[1:])
    done = len(leases) - len(failed)
    return type(first)(f"done_many(): {first}{extra}; the other {done} lease(s) of this call are done")


# ----- the client side, written once -------------------------------------------------------------


class QueueClient(ABC, Generic[T]):
    """The declared base of every backend's queue handle: the :class:`Queue` methods, written once.

    The public methods check their arguments, stop a terminated job, wait for leases
    and word lease errors here; a backend supplies only the transport, five calls to
    wherever its queue's state lives:

    ==========================================  ======================================================
    ``_push(items)``                            append a non-empty list of items, in order
    ``_peek()``                                 ``(True, item)`` for the next item, ``(False, None)``
    ``_take(max_items, lease_timeout, wait)``   lease up to ``max_items``; may wait up to ``wait``
                                                seconds (None: as long as it takes) for the first
    ``_done(lease_ids)``                        end the leases; each one's status (``"ok"`` or why not)
    ``_counts()``                               waiting and leased items at one instant
    ==========================================  ======================================================

    A transport whose ``_take`` returns at once when the queue is empty (``_TAKE_WAITS =
    False``: an actor taking one call at a time) is asked again after 1 ms, doubling up
    to 50 ms, until the caller's ``timeout``.
    """

    _TAKE_WAITS: bool = True

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"

    # ----- the transport -------------------------------------------------------------------------

    @abstractmethod
    def _push(self, items: list[T]) -> None: ...

    @abstractmethod
    def _peek(self) -> tuple[bool, T | None]: ...

    @abstractmethod
    def _take(self, max_items: int, lease_timeout: float, wait: float | None) -> list[Lease[T]]: ...

    @abstractmethod
    def _done(self, lease_ids: list[str]) -> list[str]: ...

    @abstractmethod
    def _counts(self) -> QueueCounts: ...

    # ----- the Queue protocol ----------------------------------------------------------------------

    def push(self, item: T) -> None:
        """Append ``item`` (it must be picklable on every backend but the local one)."""
        check_terminated()
        self._push([item])

    def push_many(self, items: Iterable[T]) -> None:
        """Append every item of ``items``, in order, in one call (see :meth:`Queue.push_many`)."""
        check_terminated()
        batch = check_items(items)
        if batch:
            self._push(batch)

    def peek(self) -> T | None:
        """The item the next ``pop`` would lease, without leasing it; None when there is none."""
        check_terminated()
        found, item = self._peek()
        return item if found else None

    def pop(self, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0) -> Lease[T] | None:
        """Lease the next item for ``lease_timeout`` seconds (see :meth:`Queue.pop`)."""
        check_terminated()
        lease_timeout, timeout = check_pop_arguments(lease_timeout, timeout)
        leases = self._lease(1, lease_timeout, timeout)
        return leases[0] if leases else None

    def pop_many(
        self, max_items: int, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0
    ) -> list[Lease[T]]:
        """Lease up to ``max_items`` items in one call (see :meth:`Queue.pop_many`)."""
        check_terminated()
        max_items = check_max_items(max_items)
        lease_timeout, timeout = check_pop_arguments(lease_timeout, timeout)
        return self._lease(max_items, lease_timeout, timeout)

    def _lease(self, max_items: int, lease_timeout: float, timeout: float | None) -> list[Lease[T]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            leases = self._take(max_items, lease_timeout, remaining)
            if leases or (deadline is not None and time.monotonic() >= deadline):
                return leases
            if not self._TAKE_WAITS:
                time.sleep(pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 0.05)

    def done(self, lease: Lease[T]) -> None:
        """Remove the leased item for good (see :meth:`Queue.done`)."""
        check_terminated()
        check_lease(lease, self._name)
        status = self._done([lease.lease_id])[0]
        if status != "ok":
            raise lease_error(status, lease.lease_id, self._name)

    def done_many(self, leases: Iterable[Lease[T]]) -> None:
        """Remove the items of several leases in one call (see :meth:`Queue.done_many`)."""
        check_terminated()
        batch = check_leases(leases, self._name)
        if not batch:
            return
        error = done_many_error(batch, self._done([lease.lease_id for lease in batch]), self._name)
        if error is not None:
            raise error

    def pending(self) -> int:
        """How many items wait to be popped."""
        return self.counts().pending

    def in_flight(self) -> int:
        """How many items are leased and not yet done."""
        return self.counts().in_flight

    def counts(self) -> QueueCounts:
        """Waiting and leased items at one instant (one call)."""
        check_terminated()
        return self._counts()


# ----- the state machine -------------------------------------------------------------------------

# Ended leases remembered so that a late done() says why it failed (expired or done) rather than "unknown".
_ENDED_MEMORY = 100_000


class QueueCore:
    """Items, leases and their deadlines, in memory; not thread-safe (callers lock).

    ``now`` is a monotonic clock reading supplied by the caller, so one core can be
    driven by a thread, an event loop or a test.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: deque[tuple[Any, int]] = deque()  # (item, deliveries so far)
        self._leases: dict[str, tuple[Any, int, float]] = {}  # lease id -> (item, deliveries, deadline)
        self._deadlines: list[tuple[float, str]] = []
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._ids = itertools.count(1)
        self._tag = uuid.uuid4().hex[:8]

    def push(self, item: Any) -> None:
        self._items.append((item, 0))

    def push_many(self, items: list[Any]) -> None:
        self._items.extend((item, 0) for item in items)

    def expire(self, now: float) -> int:
        """Put back the items whose lease ran out by ``now``; how many."""
        count = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            _, lease_id = heappop(self._deadlines)
            held = self._leases.pop(lease_id, None)
            if held is None:
                continue  # done in time
            item, deliveries, _ = held
            self._items.appendleft((item, deliveries))
            self._remember(lease_id, "expired")
            count += 1
        return count

    def next_deadline(self) -> float | None:
        """When the next lease runs out (monotonic), if any."""
        while self._deadlines and self._deadlines[0][1] not in self._leases:
            heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def peek(self, now: float) -> tuple[bool, Any]:
        """``(True, item)`` for the next item, ``(False, None)`` when there is none."""
        self.expire(now)
        return (True, self._items[0][0]) if self._items else (False, None)

    def pop(self, lease_timeout: float, now: float) -> Lease[Any] | None:
        self.expire(now)
        return self._lease(lease_timeout, now) if self._items else None

    def pop_many(self, max_items: int, lease_timeout: float, now: float) -> list[Lease[Any]]:
        self.expire(now)
        return [self._lease(lease_timeout, now) for _ in range(min(max_items, len(self._items)))]

    def _lease(self, lease_timeout: float, now: float) -> Lease[Any]:
        item, deliveries = self._items.popleft()
        lease_id = f"{self._tag}-{next(self._ids)}"
        deadline = now + lease_timeout
        self._leases[lease_id] = (item, deliveries + 1, deadline)
        heappush(self._deadlines, (deadline, lease_id))
        return Lease(item, lease_id, self.name, deliveries + 1, lease_timeout)

    def done(self, lease_id: str, now: float) -> str:
        """``"ok"``, or why the lease is not held: ``"expired"``, ``"done"``, ``"unknown"``."""
        self.expire(now)
        if self._leases.pop(lease_id, None) is not None:
            self._remember(lease_id, "done")
            return "ok"
        return self._ended.get(lease_id, "unknown")

    def done_many(self, lease_ids: list[str], now: float) -> list[str]:
        """Each lease's ``done`` status, in order (the leases held are done)."""
        return [self.done(lease_id, now) for lease_id in lease_ids]

    def counts(self, now: float) -> QueueCounts:
        self.expire(now)
        return QueueCounts(len(self._items), len(self._leases))

    def _remember(self, lease_id: str, how: str) -> None:
        self._ended[lease_id] = how
        if len(self._ended) > _ENDED_MEMORY:
            self._ended.popitem(last=False)


# ----- the local queue ---------------------------------------------------------------------------

_LOCAL: weakref.WeakValueDictionary[str, LocalQueue[Any]] = weakref.WeakValueDictionary()


class LocalQueue(QueueClient[T]):
    """A queue in this process (the local backend's): items are kept as they are, not copied.

    Its handle pickles within this process only (the local backend's jobs and actors
    are threads here); a blocking ``pop`` waits on a condition, waking when an item
    arrives or a lease runs out.
    """

    def __init__(self, name: str) -> None:
        super().__init__(check_queue_name(name))
        self._core = QueueCore(name)
        self._cond = threading.Condition()
        self._key = f"{name}-{uuid.uuid4().hex}"
        _LOCAL[self._key] = self

    def __reduce__(self) -> tuple[object, ...]:
        return (_find_local, (self._key, self._name))

    def _push(self, items: list[T]) -> None:
        with self._cond:
            self._core.push_many(items)
            self._cond.notify_all()

    def _peek(self) -> tuple[bool, T | None]:
        with self._cond:
            return self._core.peek(time.monotonic())

    def _take(self, max_items: int, lease_timeout: float, wait: float | None) -> list[Lease[T]]:
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while True:
                now = time.monotonic()
                leases = self._core.pop_many(max_items, lease_timeout, now)
                if leases or (deadline is not None and now >= deadline):
                    return leases
                # Wake for a push, or when the earliest lease runs out (its item comes back).
                wake = [t for t in (deadline, self._core.next_deadline()) if t is not None]
                self._cond.wait(max(0.0, min(wake) - now) if wake else None)

    def _done(self, lease_ids: list[str]) -> list[str]:
        with self._cond:
            return self._core.done_many(lease_ids, time.monotonic())

    def _counts(self) -> QueueCounts:
        with self._cond:
            return self._core.counts(time.monotonic())


def _find_local(key: str, name: str) -> LocalQueue[Any]:
    queue = _LOCAL.get(key)
    if queue is None:
        raise ConfigError(
            f"local queue {name!r} lives in the process of the LocalClient that created it (its jobs and actors are "
            "threads there); use a Fray cluster or Ray queue to share a queue between processes"
        )
    return queue


# ----- a queue on any backend's actors -----------------------------------------------------------


class QueueService:
    """The actor behind :class:`ActorQueue`: a :class:`QueueCore`, one call at a time."""

    def __init__(self, name: str) -> None:
        self._core = QueueCore(name)

    def push_many(self, items: list[Any]) -> None:
        self._core.push_many(items)

    def peek(self) -> tuple[bool, Any]:
        return self._core.peek(time.monotonic())

    def pop_many(self, max_items: int, lease_timeout: float) -> list[Lease[Any]]:
        return self._core.pop_many(max_items, lease_timeout, time.monotonic())

    def done_many(self, lease_ids: list[str]) -> list[str]:
        return self._core.done_many(lease_ids, time.monotonic())

    def counts(self) -> tuple[int, int]:
        counts = self._core.counts(time.monotonic())
        return counts.pending, counts.in_flight


class ActorQueue(QueueClient[T]):
    """A queue kept by a Fray actor (:class:`QueueService`) of any backend: the fallback for engines without one.

    An actor takes one call at a time, so a blocking ``pop`` cannot wait inside it: it
    asks again after 1 ms, doubling up to 50 ms while the queue stays empty.
    """

    _TAKE_WAITS = False

    def __init__(self, name: str, actor: Any) -> None:
        super().__init__(name)
        self._actor = actor

    def _push(self, items: list[T]) -> None:
        self._actor.push_many(items)

    def _peek(self) -> tuple[bool, T | None]:
        found, item = self._actor.peek()
        return bool(found), item

    def _take(self, max_items: int, lease_timeout: float, wait: float | None) -> list[Lease[T]]:
        leases: list[Lease[T]] = self._actor.pop_many(max_items, lease_timeout)
        return leases

    def _done(self, lease_ids: list[str]) -> list[str]:
        statuses: list[str] = self._actor.done_many(lease_ids)
        return statuses

    def _counts(self) -> QueueCounts:
        return counts_from(self._actor.counts())


def counts_from(answer: Any) -> QueueCounts:
    """The :class:`QueueCounts` of a queue server's ``[pending, in_flight]`` answer."""
    pending, in_flight = answer
    return QueueCounts(int(pending), int(in_flight))


def actor_queue(client: Any, name: str, *, exist_ok: bool = False) -> ActorQueue[Any]:
    """``create_queue`` for a backend without its own queue: a :class:`QueueService` actor named ``queue-NAME``.

    A backend's client adopts it in one line:
    ``def create_queue(self, name, *, exist_ok=False): return actor_queue(self, name, exist_ok=exist_ok)``.
    """
    check_queue_name(name)
    if exist_ok:
        raise ConfigError(
            f"create_queue({name!r}, exist_ok=True): this backend keeps queues in actors and cannot look one up by "
            "name; pass the queue handle along instead (it is picklable)"
        )
    try:
        actor = client.create_actor(QueueService, name, name=f"queue-{name}")
    except JobAlreadyExists:
        raise queue_exists(name, f"on {type(client).__name__}") from None
    return ActorQueue(name, actor)
