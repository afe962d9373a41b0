"""``ClusterQueue``: a durable queue with leases kept by the Fray cluster's controller (client side).

Items are pickled here and travel as opaque bytes; the controller keeps them in its
database (:mod:`fray.cluster.controller._queues`), so a queue survives a controller killed with
``kill -9`` and restarted. Calls ride out a controller restart (they are retried,
and made harmless to repeat: a push carries its item's id, a ``done`` its call id).
A blocking ``pop`` long-polls the controller in calls of a few seconds each. The batch
forms are one call and one transaction each, whatever their size (a ``push_many`` must
fit in one request: the controller's largest job argument, plus 16 MB).
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

import cloudpickle

from fray.cluster.controller_client import CredentialLike, connect_controller, resolve_credential
from fray.core._runtime import check_terminated
from fray.core._serialization import plain_data
from fray.queue import (
    DEFAULT_LEASE_TIMEOUT,
    Lease,
    QueueCounts,
    check_items,
    check_lease,
    check_leases,
    check_max_items,
    check_pop_arguments,
    counts_from,
    done_many_error,
    lease_error,
)

__all__ = ["ClusterQueue"]

T = TypeVar("T")

# The longest one blocking pop call waits on the controller (it waits at most 5 s itself); the client calls again.
_POLL_SECONDS = 5.0


def _dumps(item: Any) -> bytes:
    if plain_data(item):
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    return bytes(cloudpickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))


class ClusterQueue(Generic[T]):
    """A queue of the Fray cluster at ``address``, named ``name`` in namespace ``key``'s first part.

    Picklable: a job or actor that receives it calls the controller with its own credential.
    """

    def __init__(self, address: str, key: str, name: str, token: CredentialLike = None) -> None:
        self._address = address
        self._key = key
        self._name = name
        self._token = resolve_credential(token)
        self._controller = connect_controller(address, self._token)

    def __reduce__(self) -> tuple[object, ...]:
        return (ClusterQueue, (self._address, self._key, self._name))

    def __repr__(self) -> str:
        return f"ClusterQueue({self._key!r} at {self._address})"

    @property
    def name(self) -> str:
        """The queue's name (without its namespace)."""
        return self._name

    def _call(self, method: str, *args: Any) -> Any:
        check_terminated()
        return self._controller.queue(method, self._key, *args)

    def push(self, item: T) -> None:
        """Append ``item`` (pickled here; the controller keeps the bytes)."""
        self._call("push", uuid.uuid4().hex, _dumps(item))

    def peek(self) -> T | None:
        """The next item without leasing it, or None."""
        found, payload = self._call("peek")
        return pickle.loads(payload) if found else None

    def pop(self, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0) -> Lease[T] | None:
        """Lease the next item (see :meth:`fray.queue.Queue.pop`); a blocking pop long-polls the controller."""
        lease_timeout, timeout = check_pop_arguments(lease_timeout, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            answer = self._call("pop", lease_timeout, min(remaining, _POLL_SECONDS))
            if answer is not None:
                return self._lease(answer, lease_timeout)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def pop_many(
        self, max_items: int, lease_timeout: float = DEFAULT_LEASE_TIMEOUT, *, timeout: float | None = 0.0
    ) -> list[Lease[T]]:
        """Lease up to ``max_items`` items in one call and one transaction (see :meth:`fray.queue.Queue.pop_many`)."""
        max_items = check_max_items(max_items)
        lease_timeout, timeout = check_pop_arguments(lease_timeout, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            answer = self._call("pop_many", lease_timeout, min(remaining, _POLL_SECONDS), max_items)
            if answer or (deadline is not None and time.monotonic() >= deadline):
                return [self._lease(one, lease_timeout) for one in answer]

    def _lease(self, answer: Any, lease_timeout: float) -> Lease[T]:
        lease_id, payload, deliveries = answer
        return Lease(pickle.loads(payload), str(lease_id), self._name, int(deliveries), lease_timeout)

    def done(self, lease: Lease[T]) -> None:
        """Remove the leased item for good (see :meth:`fray.queue.Queue.done`)."""
        check_lease(lease, self._name)
        status = self._call("done", lease.lease_id, uuid.uuid4().hex)
        if status != "ok":
            raise lease_error(str(status), lease.lease_id, self._name)

    def push_many(self, items: Iterable[T]) -> None:
        """Append every item, in order, in one call and one transaction (see :meth:`fray.queue.Queue.push_many`)."""
        batch = [[uuid.uuid4().hex, _dumps(item)] for item in check_items(items)]
        if batch:
            self._call("push_many", batch)

    def done_many(self, leases: Iterable[Lease[T]]) -> None:
        """Remove the items of several leases in one call and one transaction (see :meth:`fray.queue.Queue.done_many`)."""
        batch = check_leases(leases, self._name)
        if not batch:
            return
        statuses = self._call("done_many", [lease.lease_id for lease in batch], uuid.uuid4().hex)
        error = done_many_error(batch, [str(status) for status in statuses], self._name)
        if error is not None:
            raise error

    def pending(self) -> int:
        """Items waiting to be popped."""
        return self.counts().pending

    def in_flight(self) -> int:
        """Items leased and not done."""
        return self.counts().in_flight

    def counts(self) -> QueueCounts:
        """Waiting and leased items at one instant (one call)."""
        return counts_from(self._call("counts"))
