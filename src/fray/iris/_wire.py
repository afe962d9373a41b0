"""What a Fray actor call carries over Iris's actor RPC, both ways: pickled values and a raised exception.

Iris's ``ActorClient`` calls an actor's methods by name (``client.ping(...)``) and pickles the
arguments, the value and a raised exception itself. Fray keeps its own rules on top:

* the caller pickles the arguments first (:class:`Pickled`), so an unpicklable one is refused
  there with a :class:`~fray.errors.SerializationError` naming it, before anything is sent;
* the host pickles the value (:class:`Pickled`), so a value that cannot be pickled is a
  ``SerializationError`` naming the method rather than Iris's transport error;
* a method that raised is answered with :class:`CallFailed`, carrying the shared
  :class:`~fray.core._remote.RemoteFailure` encoding (type, message, trimmed traceback), so the
  caller raises Fray's one form of it: the dual ``RemoteError``, also of the user's class.

Values that are not :class:`Pickled` pass through as they are: the same handle talks to an
actor that another Iris program serves, and to a test's stand-in for ``ActorClient``.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from fray.core._remote import RemoteFailure, remote_error
from fray.errors import ActorDiedError, SerializationError

__all__ = ["CallFailed", "Pickled", "call_arguments", "raised", "unpickled"]


class Pickled:
    """A value pickled by Fray, travelling inside Iris's own pickling (a copy of bytes: cheap)."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Any, ...]:
        return (Pickled, (self.blob,))


class CallFailed(Exception):
    """A Fray actor's method raised: the :meth:`RemoteFailure.encode` bytes of what it raised."""

    def __init__(self, failure: bytes) -> None:
        super().__init__(failure)
        self.failure = failure


def call_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The host's view of a call's arguments: Fray's pickled pair opened, anything else as Iris gave it."""
    if len(args) == 1 and not kwargs and isinstance(args[0], Pickled):
        opened: tuple[tuple[Any, ...], dict[str, Any]] = cloudpickle.loads(args[0].blob)
        return opened
    return args, kwargs


def unpickled(value: Any, label: str) -> Any:
    """The caller's view of a call's value: Fray's pickled value opened, anything else as it came."""
    if not isinstance(value, Pickled):
        return value
    try:
        return cloudpickle.loads(value.blob)
    except Exception as exc:
        raise SerializationError(f"{label}: the return value cannot be unpickled here ({exc})") from exc


def raised(error: CallFailed) -> BaseException:
    """The exception a caller raises for a method that raised: Fray's dual ``RemoteError``.

    An :class:`~fray.errors.ActorDiedError` is returned as it was raised: the actor had ended
    itself (``current_actor().exit()`` / ``fail()``) before the call ran.
    """
    failure = RemoteFailure.decode(error.failure)
    original = failure.original()
    if isinstance(original, ActorDiedError):
        return original
    return remote_error(failure, original=original)
