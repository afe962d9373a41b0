"""The work a client started and still has to settle, without keeping what already finished.

A client remembers its jobs and actors so that ``shutdown()`` and the driver-exit rule can
wait for them or stop them. A driver that submits a million short jobs must not keep a
million of them (each with its request, arguments and captured output) for the life of
the client: :class:`OwnedWork` drops the entries known to be finished whenever it has
doubled since its last sweep, so an ``add`` costs amortised O(1) and the memory held is
about twice the work still running. A handle the caller kept works as before; only the
client's own reference goes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["OwnedWork"]

T = TypeVar("T")


class OwnedWork(Generic[T]):
    """Entries by key, in the order added; finished ones are dropped as the collection grows.

    ``finished`` must answer from what an entry already knows, without asking its engine
    (it runs under the client's lock). Not thread-safe on its own: the client's lock
    guards it.
    """

    #: The fewest entries worth a sweep: below this nothing is dropped.
    SWEEP_AT = 256

    def __init__(self, finished: Callable[[T], bool]) -> None:
        self._finished = finished
        self._items: dict[Hashable, T] = {}
        self._kept = 0  # entries left by the last sweep

    def add(self, key: Hashable, item: T) -> None:
        """Remember ``item`` under ``key`` (replacing an entry of that key)."""
        self._items[key] = item
        if len(self._items) >= max(self.SWEEP_AT, 2 * self._kept):
            self._sweep()

    def pop(self, key: Hashable) -> T | None:
        """Forget ``key``; its entry, or None if there was none."""
        return self._items.pop(key, None)

    def values(self) -> list[T]:
        """Every entry still held, oldest first."""
        return list(self._items.values())

    def _sweep(self) -> None:
        self._items = {key: item for key, item in self._items.items() if not self._finished(item)}
        self._kept = len(self._items)
