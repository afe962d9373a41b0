"""The pieces of one call's life on the client: its future, its timeout, and how its answer reads.

* :class:`CallFuture` -- the future of a ``.remote()`` call; its waiter reads the
  connection itself when no other thread does.
* :data:`timer` -- one thread expiring the requests of ``.remote()`` calls that have a timeout.
* :func:`rebuild_error` -- an ERROR frame back into the exception the caller sees:
  the dual ``RemoteError`` + user class (:func:`fray.core._remote.remote_error`) for an
  exception the method raised, the server's own error for a refused call.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from fray.actor import ActorFuture
from fray.cluster.rpc import wire
from fray.cluster.rpc._connection import Connection
from fray.cluster.rpc.protocol import ErrorCode, decode_error
from fray.core._deadlines import Deadlines
from fray.core._remote import remote_error
from fray.errors import SerializationError

__all__ = ["CallFuture", "rebuild_error", "settle", "timer"]


class CallFuture(ActorFuture):
    """An ActorFuture whose waiter reads the connection itself when no other thread is reading.

    That saves a thread switch per result when a caller keeps many calls in flight
    and collects them with ``result()``.
    """

    _connection: Connection | None = None
    _deadline: float | None = None

    def result(self, timeout: float | None = None) -> Any:
        self._help(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._help(timeout)
        return super().exception(timeout)

    def _help(self, timeout: float | None) -> None:
        conn = self._connection
        if conn is None or self.done():
            return
        deadline = self._deadline
        if timeout is not None:
            own = time.monotonic() + timeout
            deadline = own if deadline is None else min(deadline, own)
        conn.help_until(self, deadline)


def settle(
    future: concurrent.futures.Future[Any], *, result: Any = None, exception: BaseException | None = None
) -> None:
    """Complete ``future`` unless it is already done (cancelled by the user, or expired)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def rebuild_error(frame: wire.Frame, what: str) -> tuple[ErrorCode, BaseException]:
    """Decode an ERROR frame into ``(code, exception)``.

    RAISED (the actor's code raised): a :class:`~fray.errors.RemoteError` that is also
    of the user's exception class where that class exists here. Every other code is the
    server's own refusal: its error as raised there (a SerializationError for a result
    that cannot be pickled).
    """
    try:
        code, failure = decode_error(frame.segments[0])
    except Exception as exc:
        return ErrorCode.RAISED, SerializationError(f"undecodable error report for {what}: {exc!r}")
    if code is ErrorCode.RAISED:
        return code, remote_error(failure)
    original = failure.original()
    if code is ErrorCode.UNPICKLABLE_RESULT and not isinstance(original, SerializationError):
        original = SerializationError(failure.message)
    return code, original if original is not None else remote_error(failure)


#: Expires the requests of ``.remote()`` calls that have a timeout.
timer = Deadlines("fray-rpc-timer")
