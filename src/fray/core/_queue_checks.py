"""The checks of queue arguments and the words of queue errors that every backend shares.

Each backend's queue (:mod:`fray.queue`'s local and actor-backed ones, the Ray and the
cluster queue) checks its arguments and words its errors with these, so a mistake reads
the same everywhere. The checks of leases are in :mod:`fray.queue`, with :class:`~fray.queue.Lease`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fray.errors import ConfigError, LeaseError, LeaseExpired, QueueAlreadyExists
from fray.job import validate_name

__all__ = [
    "check_items",
    "check_max_items",
    "check_pop_arguments",
    "check_queue_name",
    "lease_error",
    "queue_exists",
    "sequence",
]


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


def check_max_items(max_items: object) -> int:
    """``pop_many``'s ``max_items``: a whole number >= 1."""
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise ConfigError(f"pop_many(max_items={max_items!r}) must be a whole number >= 1 (how many leases at most)")
    return max_items


def sequence(values: object, method: str, what: str) -> list[Any]:
    """``values`` as a list, if it is a batch of ``what`` (the argument of ``method``); else ConfigError."""
    # A string, bytes or a mapping is iterable but almost never meant as a batch: refused, not split up.
    if isinstance(values, str | bytes | bytearray | Mapping) or not isinstance(values, Iterable):
        raise ConfigError(
            f"{method}() takes a list (or another iterable) of {what}, got {type(values).__name__}: "
            f"{values!r:.80}; wrap a single value in a list"
        )
    return list(values)


def check_items(items: object) -> list[Any]:
    """``push_many``'s items as a list."""
    return sequence(items, "push_many", "items")


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
