"""What the frames of the actor protocol mean: requests, control operations, error reports.

:mod:`fray.cluster.rpc.wire` moves bytes (handshake, framing, pickling); this module says
what a CALL, CONTROL and ERROR frame carries, so that the client and the server
share these definitions without either importing the other. See ``docs/protocol.md``.
"""

from __future__ import annotations

import enum
import pickle
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fray.core._remote import RemoteFailure
from fray.errors import ConfigError

__all__ = [
    "CONTROL_LIST_ACTORS",
    "CONTROL_LIST_METHODS",
    "CONTROL_LOCAL",
    "CONTROL_LOOKUP",
    "CONTROL_PING",
    "ActorInfo",
    "ErrorCode",
    "MethodInfo",
    "call_request",
    "control_request",
    "decode_error",
    "encode_error",
    "parse_actor_url",
]


class ErrorCode(enum.IntEnum):
    """Why a call failed; tells the client whether the method ran. Part of the wire format."""

    RAISED = 0  #: the method ran (or started) and raised; the report is its exception.
    NOT_FOUND = 1  #: no actor of that name in that namespace; nothing ran.
    REPLACED = 2  #: the name now belongs to another actor id; nothing ran.
    REJECTED = 3  #: the request was invalid (no such method, undecodable arguments); nothing ran.
    UNPICKLABLE_RESULT = 4  #: the method ran, but its return value cannot be pickled.


# A call request, as pickled in segment 0 of a CALL frame:
#   (namespace, name, actor_id or None, method, args, kwargs)
# A control request, as pickled in a CONTROL frame: (operation, arguments tuple).
CONTROL_PING = "ping"
CONTROL_LOOKUP = "lookup"
CONTROL_LIST_ACTORS = "list_actors"
CONTROL_LIST_METHODS = "list_methods"
#: The name of the server's local (Unix socket) listener, or None (see fray.cluster.rpc.transport._local).
CONTROL_LOCAL = "local"


def call_request(
    namespace: str, name: str, actor_id: str | None, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """The object a CALL frame pickles (see the layout above)."""
    return (namespace, name, actor_id, method, args, kwargs)


def control_request(operation: str, arguments: tuple[Any, ...]) -> bytes:
    """Segment 0 of a CONTROL frame."""
    return pickle.dumps((operation, arguments), protocol=5)


def encode_error(code: ErrorCode, exc: BaseException) -> list[bytes]:
    """The segments of an ERROR frame: one byte of code, then ``RemoteFailure.capture(exc).encode()``.

    The failure's header is data (JSON) and always decodes; the exception itself rides
    along pickled, and the client falls back to a RemoteError where it does not rebuild.
    """
    return [bytes((int(code),)) + RemoteFailure.capture(exc).encode()]


def decode_error(segment: bytes | bytearray) -> tuple[ErrorCode, RemoteFailure]:
    """The code and failure of an ERROR frame's segment 0; ``ValueError`` if it is not one."""
    if not segment:
        raise ValueError("empty error report")
    return ErrorCode(segment[0]), RemoteFailure.decode(bytes(segment[1:]))


@dataclass(frozen=True)
class MethodInfo:
    """One remotely callable method of an actor, as listed by the server."""

    name: str
    signature: str
    doc: str
    is_async: bool


@dataclass(frozen=True)
class ActorInfo:
    """One actor registered on a server."""

    namespace: str
    name: str
    actor_id: str
    class_name: str
    max_concurrency: int


def parse_actor_url(url: str) -> tuple[str, int, str]:
    """Split ``actor://host:port/name`` into ``(host, port, name)``; ConfigError if malformed."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "actor" or not parts.hostname or port is None or not name or "/" in name:
        raise ConfigError(f"not an actor URL: {url!r} (expected actor://host:port/name)")
    return parts.hostname, port, name
