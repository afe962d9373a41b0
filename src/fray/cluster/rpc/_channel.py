"""What one actor client is bound to: resolution, the cached connection, and the actor id it has seen.

:class:`Channel` resolves the actor's name through the resolver, opens (and
caches) a :class:`~fray.cluster.rpc._connection.Connection`, looks the actor id up with a
control request, and notices when the actor behind the name was replaced.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

from fray.cluster.rpc import wire
from fray.cluster.rpc._calls import rebuild_error
from fray.cluster.rpc._connection import Connection, NotSent, remaining
from fray.cluster.rpc.protocol import CONTROL_LOCAL, CONTROL_LOOKUP, ErrorCode, control_request, parse_actor_url
from fray.cluster.rpc.resolver import Resolver
from fray.cluster.rpc.transport import _local
from fray.errors import CallNotSentError

__all__ = ["Channel", "backoff", "control", "go_local"]


class Channel:
    """The state one ActorClient (and its ``with_options`` copies) shares."""

    def __init__(self, resolver: Resolver, name: str, namespace: str, token: bytes | None) -> None:
        self.resolver = resolver
        self.name = name
        self.namespace = namespace
        self.token = token
        # Reentrant: a call's completion may drop the connection from inside bind()'s cleanup.
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._actor_id: str | None = None
        # The id this channel last talked to; a different one behind the name means "replaced".
        self._known_id: str | None = None

    def bind(self, deadline: float | None, *, check_idle: bool = True) -> tuple[Connection, str]:
        """Return a live connection and the actor id to address, resolving and connecting if needed.

        Raises NotSent (retryable), AuthenticationError / ProtocolError, or
        ActorUnavailableError when the actor behind the name was replaced.
        ``check_idle=False`` skips looking for a server that died while the connection was
        idle, for callers that send with :meth:`Connection.call`, which looks itself.
        """
        conn, actor_id = self._conn, self._actor_id
        if conn is not None and actor_id is not None and (conn.error is None if not check_idle else conn.usable()):
            return conn, actor_id
        with self._lock:
            if self._conn is not None and self._actor_id is not None and self._conn.usable():
                return self._conn, self._actor_id
            self._drop_locked()
            try:
                urls = list(self.resolver.resolve(self.name))
            except Exception as exc:
                raise NotSent(f"resolving actor {self.name!r} failed: {exc!r}") from exc
            if not urls:
                raise NotSent(f"no endpoint found for actor {self.name!r} in namespace {self.namespace!r}")
            problems = []
            for url in urls:
                host, port, server_name = parse_actor_url(url)
                try:
                    conn = Connection(host, port, self.token, remaining(deadline))
                except OSError as exc:  # refused, unreachable, or the peer died during the handshake
                    problems.append(f"{url}: {exc}")
                    continue
                try:
                    conn = go_local(conn, self.token, deadline)
                    actor_id = control(conn, CONTROL_LOOKUP, (self.namespace, server_name), deadline)
                except NotSent as exc:
                    conn.close()
                    problems.append(f"{url}: {exc}")
                    continue
                except BaseException:
                    conn.close()
                    raise
                self._conn, self._actor_id = conn, actor_id
                previous, self._known_id = self._known_id, actor_id
                if previous is not None and previous != actor_id:
                    raise CallNotSentError(
                        f"actor {self.name!r} was replaced by a new instance (id {previous} -> {actor_id}); "
                        "this call was not sent, later calls go to the new instance"
                    )
                return conn, actor_id
            raise NotSent(f"actor {self.name!r} is unreachable: " + "; ".join(problems))

    def drop(self, conn: Connection | None = None, *, forget_id: bool = False) -> None:
        """Forget the cached connection (if it is still ``conn``) so the next call re-resolves."""
        with self._lock:
            if conn is None or self._conn is conn:
                self._drop_locked()
            if forget_id:
                self._known_id = None

    def _drop_locked(self) -> None:
        if self._conn is not None:
            # Calls still in flight on it keep their answers; then it closes.
            self._conn.retire()
        self._conn, self._actor_id = None, None


def control(conn: Connection, operation: str, arguments: tuple[Any, ...], deadline: float | None) -> Any:
    """Make one control request and wait for its answer (errors as for a call that did not run)."""
    entry = conn.request(wire.FrameKind.CONTROL, [control_request(operation, arguments)])
    response = conn.wait(entry, deadline)
    if isinstance(response, BaseException):
        raise response
    if response.kind is wire.FrameKind.RESULT:
        return pickle.loads(response.segments[0])
    code, exc = rebuild_error(response, f"control {operation}")
    if code is ErrorCode.NOT_FOUND:
        raise NotSent(str(exc))
    raise exc


def go_local(conn: Connection, token: bytes | None, deadline: float | None) -> Connection:
    """``conn``, or a connection to the same server over its local listener when this host can reach it.

    The TCP connection is authenticated first, so the listener's name only ever comes from
    the server the client meant; the local connection runs the same handshake again.
    """
    if not _local.enabled():
        return conn
    name = control(conn, CONTROL_LOCAL, (), deadline)
    if not isinstance(name, str):
        return conn
    try:
        local = Connection.local(name, conn.address, token, remaining(deadline))
    except OSError:
        return conn  # another host (or network namespace): stay on TCP
    conn.close()
    return local


def backoff(attempt: int) -> float:
    """How long to wait before retry ``attempt`` (from 0) of a call that was not sent."""
    return float(min(0.05 * 2**attempt, 1.0))
