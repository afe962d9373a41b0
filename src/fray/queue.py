"""Queues with leases: ``client.create_queue(name)`` on every backend.

A consumer ``pop``\\ s an item with a *lease*: the item is hidden from other consumers
until the consumer calls ``done(lease)`` or the lease times out, when the item goes
back to the front of the queue to be delivered again (at-least-once delivery; a
redelivered lease has ``deliveries > 1``). ``done`` after the lease timed out raises
:class:`~fray.errors.LeaseExpired` (someone else may process the item again), ``done``
twice :class:`~fray.errors.LeaseError`. Queue handles are picklable: pass them to jobs
and actors.

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
from collections import OrderedDict, deque
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from fray._runtime import check_terminated
from fray.errors import ConfigError, JobAlreadyExists, LeaseError, LeaseExpired, QueueAlreadyExists
from fray.job import validate_name

__all__ = [
    "DEFAULT_LEASE_TIMEOUT",
    "ActorQueue",
    "Lease",
    "LocalQueue",
    "Queue",
    "QueueCore",
    "QueueCounts",
    "QueueService",
    "actor_queue",
    "check_pop_arguments",
    "counts_from",
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

    def pending(self) -> int:
        """How many items wait to be popped (items whose lease expired included; leased ones not)."""
        ...

    def in_flight(self) -> int:
        """How many items are leased and not yet done."""
        ...

    def counts(self) -> QueueCounts:
        """Waiting and leased items, both read at the same instant (see :class:`QueueCounts`)."""
        ...


# ----- checks and words shared by every backend --------------------------------------------------


def check_queue_name(name: object) -> str:
    """A queue name: the rules of job names."""
    return validate_name(name, "queue name")


def check_pop_arguments(lease_timeout: object, timeout: object) -> tuple[float, float | None]:
    """Check ``pop``'s arguments; seconds as floats."""
    if isinstance(lease_timeout, bool) or not isinstance(lease_timeout, int | float) or not lease_timeout > 0:
        raise ConfigError(f"pop(lease_timeout={lease_timeout!r}) must be a number of seconds > 0")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0):
        raise ConfigError(
            f"pop(timeout={timeout!r}) must be 0 (do not wait), a number of seconds to wait, or None (wait for an item)"
        )
    return float(lease_timeout), None if timeout is None else float(timeout)


def check_lease(lease: object, queue: str) -> Lease[Any]:
    """``lease`` checked to be a :class:`Lease` of ``queue``."""
    if not isinstance(lease, Lease):
        raise LeaseError(f"done() takes the Lease that pop() returned, got {type(lease).__name__}: {lease!r}")
    if lease.queue != queue:
        raise LeaseError(
            f"lease {lease.lease_id!r} is of queue {lease.queue!r}, not {queue!r}: call done() on that queue"
        )
    return lease


def lease_error(status: str, lease_id: str, queue: str) -> LeaseError:
    """The error for ``done`` of a lease the queue no longer holds (``status``: expired, done or unknown)."""
    if status == "expired":
        return LeaseExpired(
            f"lease {lease_id!r} on queue {queue!r} expired before done(): its item went back to the queue and may be "
            "processed again; make the work idempotent or pop with a longer lease_timeout"
        )
    if status == "done":
        return LeaseError(f"lease {lease_id!r} on queue {queue!r} is already done; call done() once per lease")
    return LeaseError(
        f"lease {lease_id!r} is not held on queue {queue!r} (it ended long ago, or the queue was created again)"
    )


def queue_exists(name: str, where: str) -> QueueAlreadyExists:
    """The error for ``create_queue`` of a name that is taken."""
    return QueueAlreadyExists(
        f"a queue named {name!r} already exists {where}; pass its handle along (queue handles are picklable), "
        "use create_queue(name, exist_ok=True) to attach to it, or pick another name"
    )


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
        if not self._items:
            return None
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

    def counts(self, now: float) -> QueueCounts:
        self.expire(now)
        return QueueCounts(len(self._items), len(self._leases))

    def _remember(self, lease_id: str, how: str) -> None:
        self._ended[lease_id] = how
        if len(self._ended) > _ENDED_MEMORY:
            self._ended.popitem(last=False)


# ----- the local queue ---------------------------------------------------------------------------

_LOCAL: weakref.WeakValueDictionary[str, LocalQueue[Any]] = weakref.WeakValueDictionary()


class LocalQueue(Generic[T]):
    """A queue in this process (the local backend's): items are kept as they are, not copied.

    Its handle pickles within this process only (the local backend's jobs and actors
    are threads here); a blocking ``pop`` waits on a condition, waking when an item
    arrives or a lease runs out.
    """

    def __init__(self, name: str) -> None:
        self._name = check_queue_name(name)
        self._core = QueueCore(name)
        self._cond = threading.Condition()
        self._key = f"{name}-{uuid.uuid4().hex}"
        _LOCAL[self._key] = self

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    def __repr__(self) -> str:
        return f"LocalQueue({self._name!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_find_local, (self._key, self._name))

    def push(self, item: T) -> None:
        """Append ``item``."""
        check_terminated()
        with self._cond:
            self._core.push(item)
            self._cond.notify()

    def peek(self) -> T | None:
        """The next item without leasing it, or None."""
        check_terminated()
        with self._cond:
            found, item = self._core.peek(time.monotonic())
        return item if found else None

    def pop(self, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0) -> Lease[T] | None:
        """Lease the next item (see :meth:`Queue.pop`)."""
        check_terminated()
        lease_timeout, timeout = check_pop_arguments(lease_timeout, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                lease = self._core.pop(lease_timeout, now)
                if lease is not None:
                    return lease
                if deadline is not None and now >= deadline:
                    return None
                # Wake for a push, or when the earliest lease runs out (its item comes back).
                wake = [t for t in (deadline, self._core.next_deadline()) if t is not None]
                self._cond.wait(max(0.0, min(wake) - now) if wake else None)

    def done(self, lease: Lease[T]) -> None:
        """Remove the leased item for good (see :meth:`Queue.done`)."""
        check_terminated()
        check_lease(lease, self._name)
        with self._cond:
            status = self._core.done(lease.lease_id, time.monotonic())
        if status != "ok":
            raise lease_error(status, lease.lease_id, self._name)

    def pending(self) -> int:
        """Items waiting to be popped."""
        return self.counts().pending

    def in_flight(self) -> int:
        """Items leased and not done."""
        return self.counts().in_flight

    def counts(self) -> QueueCounts:
        """Waiting and leased items at one instant."""
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

    def push(self, item: Any) -> None:
        self._core.push(item)

    def peek(self) -> tuple[bool, Any]:
        return self._core.peek(time.monotonic())

    def pop(self, lease_timeout: float) -> Lease[Any] | None:
        return self._core.pop(lease_timeout, time.monotonic())

    def done(self, lease_id: str) -> str:
        return self._core.done(lease_id, time.monotonic())

    def counts(self) -> tuple[int, int]:
        counts = self._core.counts(time.monotonic())
        return counts.pending, counts.in_flight


class ActorQueue(Generic[T]):
    """A queue kept by a Fray actor (:class:`QueueService`) of any backend: the fallback for engines without one.

    An actor takes one call at a time, so a blocking ``pop`` cannot wait inside it: it
    asks again after 1 ms, doubling up to 50 ms while the queue stays empty.
    """

    def __init__(self, name: str, actor: Any) -> None:
        self._name = name
        self._actor = actor

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    def __repr__(self) -> str:
        return f"ActorQueue({self._name!r})"

    def push(self, item: T) -> None:
        """Append ``item``."""
        self._actor.push(item)

    def peek(self) -> T | None:
        """The next item without leasing it, or None."""
        found, item = self._actor.peek()
        return item if found else None

    def pop(self, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0) -> Lease[T] | None:
        """Lease the next item (see :meth:`Queue.pop`)."""
        lease_timeout, timeout = check_pop_arguments(lease_timeout, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while True:
            lease: Lease[T] | None = self._actor.pop(lease_timeout)
            if lease is not None or (deadline is not None and time.monotonic() >= deadline):
                return lease
            remaining = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(remaining)
            pause = min(pause * 2, 0.05)

    def done(self, lease: Lease[T]) -> None:
        """Remove the leased item for good (see :meth:`Queue.done`)."""
        check_lease(lease, self._name)
        status = self._actor.done(lease.lease_id)
        if status != "ok":
            raise lease_error(status, lease.lease_id, self._name)

    def pending(self) -> int:
        """Items waiting to be popped."""
        return self.counts().pending

    def in_flight(self) -> int:
        """Items leased and not done."""
        return self.counts().in_flight

    def counts(self) -> QueueCounts:
        """Waiting and leased items at one instant (one call to the actor)."""
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
