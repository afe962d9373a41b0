"""``ClusterQueue``: a durable queue with leases kept by the Fray cluster's controller (client side).

Items are pickled here and travel as opaque bytes; the controller keeps them in its
database (:mod:`fray.cluster.server.controller._queues`), so a queue survives a controller killed with
``kill -9`` and restarted. Calls ride out a controller restart (they are retried,
and made harmless to repeat: a push carries its item's id, a ``done`` its call id).
A blocking ``pop`` long-polls the controller in calls of a few seconds each. The batch
forms are one call and one transaction each, whatever their size (a ``push_many`` must
fit in one request: the controller's largest job argument, plus 16 MB).
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any, TypeVar

import cloudpickle

from fray.cluster.protocol.controller_client import CredentialLike, connect_controller, resolve_credential
from fray.core._serialization import plain_data
from fray.queue import Lease, QueueClient, QueueCounts, counts_from

__all__ = ["ClusterQueue"]

T = TypeVar("T")

# The longest one blocking pop call waits on the controller (it waits at most 5 s itself); the client calls again.
_POLL_SECONDS = 5.0


def _dumps(item: Any) -> bytes:
    if plain_data(item):
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    return bytes(cloudpickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))


class ClusterQueue(QueueClient[T]):
    """A queue of the Fray cluster at ``address``, named ``name`` in namespace ``key``'s first part.

    Picklable: a job or actor that receives it calls the controller with its own credential.
    """

    def __init__(self, address: str, key: str, name: str, token: CredentialLike = None) -> None:
        super().__init__(name)
        self._address = address
        self._key = key
        self._token = resolve_credential(token)
        self._controller = connect_controller(address, self._token)

    def __reduce__(self) -> tuple[object, ...]:
        return (ClusterQueue, (self._address, self._key, self._name))

    def __repr__(self) -> str:
        return f"ClusterQueue({self._key!r} at {self._address})"

    def _call(self, method: str, *args: Any) -> Any:
        return self._controller.queue(method, self._key, *args)

    def _push(self, items: list[T]) -> None:
        # Each item carries its id: a push sent again after a controller restart is not pushed twice.
        self._call("push_many", [[uuid.uuid4().hex, _dumps(item)] for item in items])

    def _peek(self) -> tuple[bool, T | None]:
        found, payload = self._call("peek")
        return (True, pickle.loads(payload)) if found else (False, None)

    def _take(self, max_items: int, lease_timeout: float, wait: float | None) -> list[Lease[T]]:
        # One long-poll of at most _POLL_SECONDS: the caller's loop asks again until its timeout.
        seconds = _POLL_SECONDS if wait is None else min(wait, _POLL_SECONDS)
        answer = self._call("pop_many", lease_timeout, seconds, max_items)
        return [
            Lease(pickle.loads(payload), str(lease_id), self._name, int(deliveries), lease_timeout)
            for lease_id, payload, deliveries in answer
        ]

    def _done(self, lease_ids: list[str]) -> list[str]:
        # The call id makes a done sent again after a controller restart harmless.
        return [str(status) for status in self._call("done_many", lease_ids, uuid.uuid4().hex)]

    def _counts(self) -> QueueCounts:
        return counts_from(self._call("counts"))
