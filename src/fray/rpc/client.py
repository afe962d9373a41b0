"""The actor client: a handle that resolves an actor by name and calls it over the wire.

Layers, bottom up:

* :class:`_Connection` -- one authenticated socket to one server: requests in flight
  by request id, who reads responses (the *read role*), the outbox that batches
  pipelined requests, and the rule that decides what a broken connection means for
  each request (sent or not).
* :class:`_Channel` -- what one :class:`ActorClient` is bound to: resolution through
  the resolver, the cached connection, the actor id it has seen, re-resolution.
* :class:`ActorClient` -- the user-facing handle: ``client.method(...)`` blocks,
  ``client.method.remote(...)`` returns an :class:`~fray.actor.ActorFuture`.

The at-most-once rule: a call is retried (up to ``RpcOptions.retries``) only when it
provably never reached the actor -- resolution failed, the connection could not be
opened, the actor was not registered, or the frame could not be written. Once a
request is on the wire, a broken connection fails it with
:class:`~fray.errors.ActorUnavailableError` saying it may or may not have run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import pickle
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast, get_args
from urllib.parse import urlsplit

from fray.actor import ActorFuture, check_actor_method
from fray.errors import ActorUnavailableError, ConfigError, RemoteError, SerializationError
from fray.rpc import wire
from fray.rpc.namespace import default_token, resolve_namespace
from fray.rpc.resolver import Resolver
from fray.rpc.server import (
    CONTROL_LIST_ACTORS,
    CONTROL_LIST_METHODS,
    CONTROL_LOOKUP,
    ActorInfo,
    ErrorCode,
    MethodInfo,
)

__all__ = ["ActorClient", "RpcOptions", "RpcTimeoutError", "list_actors", "list_methods", "parse_actor_url"]

T = TypeVar("T")

# Queued requests are written at once beyond this many bytes or frames.
_OUTBOX_LIMIT = 256 * 1024
_OUTBOX_FRAMES = 16
# How long the pump thread leaves a free read role to threads waiting on their futures.
_PUMP_GRACE = 0.0005
# How long _fray_ready() keeps polling an actor that is not up yet when no timeout is set.
_READY_TIMEOUT = 300.0
# Dead peers whose host vanished (no RST ever comes) are detected by TCP keepalive after
# about IDLE + INTERVAL * COUNT seconds.
_KEEPALIVE_IDLE = 10
_KEEPALIVE_INTERVAL = 5
_KEEPALIVE_COUNT = 3


@dataclass(frozen=True)
class RpcOptions:
    """How a client makes its calls.

    ``timeout``: seconds for a whole call, resolution included (None: no limit; a
    dead server is still detected by the connection breaking). ``retries``: how many
    more times a call that provably did not reach the actor is attempted.
    """

    timeout: float | None = None
    retries: int = 0

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"RpcOptions.timeout must be positive or None, got {self.timeout!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"RpcOptions.retries must be an int >= 0, got {self.retries!r}")


class RpcTimeoutError(ActorUnavailableError, TimeoutError):
    """A call did not complete within ``RpcOptions.timeout``; if it was sent, it may or may not have run."""


class CallNotSentError(ActorUnavailableError):
    """The call provably never reached the actor: it did not run, and sending it again is safe.

    Every other :class:`~fray.errors.ActorUnavailableError` about a call means it may or
    may not have run.
    """


class _NotSent(Exception):
    """Internal: the request provably never reached the actor, so it may be retried."""


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


# ---------------------------------------------------------------------------------------------
# Connection


Callback = Callable[["wire.Frame | BaseException"], None]


class _Pending:
    """One request in flight: either a thread waits for ``response``, or ``callback`` gets it."""

    __slots__ = ("callback", "response", "rid", "sent")

    def __init__(self, callback: Callback | None) -> None:
        self.callback = callback
        self.rid = 0
        self.response: wire.Frame | BaseException | None = None
        self.sent = False


class _Connection:
    """One authenticated connection to a server, shared by every request of one channel.

    Who reads the socket: whichever thread holds the *read role*. A thread blocked on a
    synchronous call (or on a future's ``result()``) takes the role itself and reads
    until its own response arrives -- no thread switch on the common path; responses
    for other requests it meets on the way are handed to their owners. Requests made
    with ``.remote()`` may have no waiting thread, so while any is outstanding a
    *pump* thread takes the role when it has been free for ``_PUMP_GRACE``, and gives
    it back as soon as a waiting thread wants it.

    Who writes: small ``.remote()`` requests made while others are in flight are
    queued in the *outbox* and written together: by the role holder just before it
    blocks for a response, by the next thread that writes anyway, or once 16 are
    queued. The role holder writes without blocking (reading while the socket is
    full), so reading never stops behind writing and the two sides cannot deadlock.

    Locks: ``_cond`` guards the state; ``_send_lock`` serialises writers and may be
    held while taking ``_cond``, never the other way round except by try-acquire.
    """

    def __init__(self, host: str, port: int, token: bytes | None, timeout: float | None) -> None:
        self.address = f"{host}:{port}"
        connect_timeout = wire.HANDSHAKE_TIMEOUT if timeout is None else min(timeout, wire.HANDSHAKE_TIMEOUT)
        sock = socket.create_connection((host, port), timeout=connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if hasattr(socket, "TCP_KEEPIDLE"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, _KEEPALIVE_IDLE)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, _KEEPALIVE_INTERVAL)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, _KEEPALIVE_COUNT)
            wire.tune_socket(sock)
            wire.client_handshake(sock, token, self.address)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._frames = wire.FrameReader(sock)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # waiters for responses and for the read role
        self._pump_cond = threading.Condition(lock)  # wakes the pump alone, so calls don't
        self._pump_sleeping = False
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._reading = False  # some thread holds the read role
        self._waiters = 0  # threads blocked in wait() without the role
        self._unattended = 0  # outstanding .remote() requests: the pump's work
        self._pump: threading.Thread | None = None
        self._role_free_since = 0.0
        self._outbox: list[tuple[_Pending, bytes]] = []  # queued small requests, in order
        self._outbox_bytes = 0
        self._reader_blocked = False  # the role holder is (about to be) blocked in a read
        self._retiring = False  # close once nothing is pending (see retire)
        self.error: BaseException | None = None

    @property
    def broken(self) -> bool:
        """True once the connection failed or was closed; it is never reused after that."""
        return self.error is not None

    def request(self, kind: wire.FrameKind, segments: list[Any], callback: Callback | None = None) -> _Pending:
        """Send (or queue) one request and return its pending entry.

        With ``callback`` the response is delivered to it (from whichever thread reads);
        without, the caller must :meth:`wait` for it. Raises :class:`_NotSent` when the
        frame could not be written (the server only acts on complete frames).

        Small ``.remote()`` requests made while a pipeline is running are queued in the
        *outbox* rather than written one by one: the thread that reads flushes it, in
        one system call, before it blocks for more responses (see :meth:`_flush_as_reader`).
        """
        entry = _Pending(callback)
        queued = False
        with self._cond:
            if self.error is not None:
                raise _NotSent(f"connection to {self.address} is closed: {self.error}")
            rid = entry.rid = next(self._ids)
            self._pending[rid] = entry
            if callback is not None:
                self._unattended += 1
                if (
                    len(segments) == 1
                    and not self._reader_blocked
                    and self._outbox_bytes < _OUTBOX_LIMIT
                    and (self._reading or self._outbox or len(self._pending) > len(self._outbox) + 1)
                ):
                    frame = wire.small_frame(kind, rid, segments[0])
                    if frame is not None:
                        self._outbox.append((entry, frame))
                        self._outbox_bytes += len(frame)
                        if len(self._outbox) < _OUTBOX_FRAMES:
                            if not self._reading:
                                self._start_pump_locked()
                            return entry
                        # A full batch goes out now, so the server works while we queue the next.
                        queued = True
        self._send_lock.acquire()
        try:
            with self._cond:
                batch = self._take_outbox_locked()
            if batch:
                self._send_batch(batch)
            if queued:  # ours was in the batch (or another thread already wrote it)
                self._flush_and_unlock()
                return entry
            wire.send_frame(self._sock, kind, rid, segments)
        except OSError as exc:
            self._send_lock.release()
            if queued:
                # Written with its batch (so maybe run): the failure reaches it like any sent call.
                self._fail(exc)
                return entry
            with self._cond:
                if self._pending.pop(rid, None) is not None and callback is not None:
                    self._unattended -= 1
            self._fail(exc)
            raise _NotSent(f"could not send to {self.address}: {exc}") from exc
        self._flush_and_unlock()
        with self._cond:
            entry.sent = True
            orphaned = self.error is not None and self._pending.pop(rid, None) is not None
            if callback is not None and not orphaned and not self._reading:
                self._start_pump_locked()
        if orphaned:
            # The connection broke while we were sending; the reader skipped this unsent entry.
            self._deliver(entry, self._lost_error())
        return entry

    # -- the outbox -------------------------------------------------------------------------------

    def _take_outbox_locked(self) -> list[tuple[_Pending, bytes]]:
        batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
        return batch

    def _send_batch(self, batch: list[tuple[_Pending, bytes]]) -> None:
        """Write queued frames (holding the send lock, blocking). On failure they count as sent."""
        try:
            self._sock.sendall(b"".join(frame for _, frame in batch))
        finally:
            self._mark_sent(batch)

    def _mark_sent(self, batch: list[tuple[_Pending, bytes]]) -> None:
        # Once any byte may have left, a queued call's fate is unknown: treat it as sent.
        with self._cond:
            for entry, _ in batch:
                entry.sent = True
            orphans = [e for e, _ in batch if self.error is not None and self._pending.pop(e.rid, None) is not None]
            self._unattended -= sum(1 for e in orphans if e.callback is not None)
        for orphan in orphans:
            self._deliver(orphan, self._lost_error())

    def _flush_and_unlock(self) -> None:
        """Flush what was queued while we held the send lock, then release it.

        The lock is released under the condition's lock, so a reader that found the
        send lock busy (and left its outbox to us) is never missed.
        """
        while True:
            with self._cond:
                batch = self._take_outbox_locked()
                if not batch:
                    self._send_lock.release()
                    return
            try:
                self._send_batch(batch)
            except OSError as exc:
                self._send_lock.release()
                self._fail(exc)
                return

    def _flush_as_reader(self) -> None:
        """Flush the outbox from the thread holding the read role, before it blocks on a read.

        The reader must keep reading while it writes, or a server blocked writing to
        us could never drain our requests: so it writes without blocking and, when the
        socket is full, reads a frame while it waits for room.
        """
        with self._cond:
            if not self._outbox or not self._send_lock.acquire(blocking=False):
                # A busy send lock means a writer is active: it flushes the outbox after itself.
                self._reader_blocked = True
                return
            batch = self._take_outbox_locked()
        while True:
            try:
                self._write_while_reading(b"".join(frame for _, frame in batch))
            except OSError as exc:
                self._mark_sent(batch)
                self._send_lock.release()
                self._fail(exc)
                return
            self._mark_sent(batch)
            with self._cond:
                batch = self._take_outbox_locked()
                if not batch:
                    self._reader_blocked = True
                    self._send_lock.release()
                    return

    def _write_while_reading(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self._sock.send(view, socket.MSG_DONTWAIT) :]
                continue
            except BlockingIOError:
                pass
            readable, _, _ = select.select([self._sock], [self._sock], [])
            if readable:
                self._deliver_next(None)
                if self.error is not None:
                    raise ConnectionError(str(self.error))

    def wait(self, entry: _Pending, deadline: float | None) -> wire.Frame | BaseException:
        """Block until ``entry``'s response arrives, reading the socket if no one else is.

        Returns the response frame, or the exception that ended the request (the
        connection broke, or :class:`RpcTimeoutError` at ``deadline``).
        """
        with self._cond:
            while entry.response is None and self._reading:
                self._waiters += 1
                try:
                    if not self._cond.wait(_remaining(deadline)):
                        self._expire_locked(entry)
                finally:
                    self._waiters -= 1
            if entry.response is not None:
                return entry.response
            self._reading = True
        try:
            while entry.response is None and self.error is None:
                if not self._read_one(deadline):
                    with self._cond:
                        self._expire_locked(entry)
        finally:
            self._release_role()
        # A failed connection has answered every sent request; this is only a safety net.
        return entry.response if entry.response is not None else self._lost_error()

    def help_until(self, future: concurrent.futures.Future[Any], deadline: float | None) -> None:
        """Read responses in this thread until ``future`` is done, if no other thread is reading.

        Returns when the future is done, the connection failed, or ``deadline`` passed.
        """
        with self._cond:
            while self._reading and not future.done() and self.error is None:
                # The pump hands the role over between frames when it sees a waiter.
                self._waiters += 1
                try:
                    if not self._cond.wait(_remaining(deadline)):
                        return
                finally:
                    self._waiters -= 1
            if future.done() or self.error is not None:
                return
            self._reading = True
        try:
            while not future.done() and self.error is None:
                if not self._read_one(deadline):
                    return
        finally:
            self._release_role()

    def _expire_locked(self, entry: _Pending) -> None:
        if self._pending.pop(entry.rid, None) is not None:
            entry.response = RpcTimeoutError(f"no response from {self.address} in time")

    def expire(self, entry: _Pending, error: BaseException) -> None:
        """Give up on ``entry``: its callback gets ``error``; a late response is dropped."""
        with self._cond:
            if self._pending.pop(entry.rid, None) is None:
                return
            if entry.callback is not None:
                self._unattended -= 1
            finished = self._retiring and not self._pending
        self._deliver(entry, error)
        if finished:
            self.close()

    def retire(self) -> None:
        """Close the connection once the requests in flight have their answers."""
        with self._cond:
            self._retiring = True
            idle = not self._pending
        if idle:
            self.close()

    def close(self) -> None:
        """Close the connection; requests in flight fail as if it broke."""
        self._fail(ConnectionError("closed by the client"))
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    # -- reading --------------------------------------------------------------------------------

    def _read_one(self, deadline: float | None) -> bool:
        """Read and deliver one frame (holding the read role). False if ``deadline`` passed first."""
        if self._frames.buffered():
            return self._deliver_next(deadline)
        # About to block: send what was queued first, since our responses may depend on it.
        self._flush_as_reader()
        try:
            return self._deliver_next(deadline)
        finally:
            with self._cond:
                self._reader_blocked = False

    def _deliver_next(self, deadline: float | None) -> bool:
        try:
            frame = self._frames.read_frame(deadline)
        except TimeoutError:
            return False
        except (OSError, wire.ProtocolError, ValueError) as exc:
            self._fail(exc)
            return True
        if frame is None:
            self._fail(ConnectionError("server closed the connection"))
            return True
        if frame.kind is wire.FrameKind.PROTOCOL_ERROR:
            self._fail(wire.ProtocolError(f"server rejected our frame: {bytes(frame.segments[0]).decode()!r}"))
            return True
        with self._cond:
            entry = self._pending.pop(frame.request_id, None)
            if entry is not None and entry.callback is not None:
                self._unattended -= 1
            finished = self._retiring and not self._pending
        if entry is not None:
            self._deliver(entry, frame)
        if finished:
            self.close()
        return True

    def _deliver(self, entry: _Pending, response: wire.Frame | BaseException) -> None:
        if entry.callback is not None:
            entry.response = response
            entry.callback(response)
            if self._waiters:
                with self._cond:
                    self._cond.notify_all()
            return
        with self._cond:
            entry.response = response
            if self._waiters:
                self._cond.notify_all()

    def _release_role(self) -> None:
        with self._cond:
            self._reading = False
            self._role_free_since = time.monotonic()
            if self._waiters:
                self._cond.notify_all()
            if self._unattended and self.error is None:
                self._start_pump_locked()

    def _start_pump_locked(self) -> None:
        if self._pump is None:
            self._pump = threading.Thread(target=self._pump_loop, name=f"fray-rpc-pump-{self.address}", daemon=True)
            self._pump.start()
        elif self._pump_sleeping:
            self._pump_cond.notify()

    def _pump_loop(self) -> None:
        while True:
            with self._cond:
                while self.error is None:
                    if self._reading or not self._unattended:
                        self._pump_sleeping = True
                        self._pump_cond.wait()
                        self._pump_sleeping = False
                        continue
                    # A thread about to wait on a future reads for itself, without a thread
                    # switch (see help_until); step in only when none has for a moment.
                    idle = time.monotonic() - self._role_free_since
                    if idle >= _PUMP_GRACE:
                        break
                    self._pump_cond.wait(_PUMP_GRACE - idle)
                if self.error is not None:
                    return
                self._reading = True
            try:
                while self.error is None:
                    with self._cond:
                        # Hand the role over when nothing is left for the pump, or a thread
                        # waiting for its own response can read for itself.
                        if not self._unattended or self._waiters:
                            break
                    self._read_one(None)
            finally:
                self._release_role()

    def usable(self) -> bool:
        """False once the connection failed, including a server that died while nobody was reading.

        An idle connection has no reader, so a server that died meanwhile left its EOF
        unread in the socket; peeking notices it before a call is sent into it (which
        would leave that call's fate unknown).
        """
        with self._cond:
            if self.error is None and not self._reading and not self._pending:
                self._check_idle_locked()
            return self.error is None

    def _check_idle_locked(self) -> None:
        try:
            data = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.error = exc
            return
        # A server never speaks unasked: EOF, or bytes nobody waits for, both end the connection.
        self.error = ConnectionError("server closed the connection" if not data else "unexpected data from server")

    def _lost_error(self) -> ActorUnavailableError:
        return ActorUnavailableError(
            f"connection to the actor server at {self.address} was lost while the call was in flight "
            f"({self.error}); the call may or may not have run"
        )

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            # Unsent entries belong to their sender, which will see its own send fail;
            # queued ones were never written, so they provably did not run.
            queued = [entry for entry, _ in self._take_outbox_locked()]
            for entry in queued:
                self._pending.pop(entry.rid, None)
            lost = [rid for rid, entry in self._pending.items() if entry.sent]
            entries = [self._pending.pop(rid) for rid in lost]
            self._unattended -= sum(1 for entry in entries + queued if entry.callback is not None)
            self._cond.notify_all()
            self._pump_cond.notify_all()
        for entry in entries:
            self._deliver(entry, self._lost_error())
        for entry in queued:
            self._deliver(
                entry,
                ActorUnavailableError(
                    f"connection to the actor server at {self.address} was lost ({self.error}) before "
                    "the call was sent; it did not run"
                ),
            )
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


# ---------------------------------------------------------------------------------------------
# Timeouts of asynchronous calls


class _Timer:
    """One daemon thread expiring the requests of ``.remote()`` calls that have a timeout."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, deadline: float, action: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), action))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fray-rpc-timer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, action = heapq.heappop(self._heap)
            action()


_timer = _Timer()


# ---------------------------------------------------------------------------------------------
# Channel: resolution, binding and the cached connection of one client


class _Channel:
    """The state one ActorClient (and its ``with_options`` copies) shares."""

    def __init__(self, resolver: Resolver, name: str, namespace: str, token: bytes | None) -> None:
        self.resolver = resolver
        self.name = name
        self.namespace = namespace
        self.token = token
        # Reentrant: a call's completion may drop the connection from inside bind()'s cleanup.
        self._lock = threading.RLock()
        self._conn: _Connection | None = None
        self._actor_id: str | None = None
        # The id this channel last talked to; a different one behind the name means "replaced".
        self._known_id: str | None = None

    def bind(self, deadline: float | None) -> tuple[_Connection, str]:
        """Return a live connection and the actor id to address, resolving and connecting if needed.

        Raises _NotSent (retryable), AuthenticationError / ProtocolError, or
        ActorUnavailableError when the actor behind the name was replaced.
        """
        conn, actor_id = self._conn, self._actor_id
        if conn is not None and actor_id is not None and conn.usable():
            return conn, actor_id
        with self._lock:
            if self._conn is not None and self._actor_id is not None and self._conn.usable():
                return self._conn, self._actor_id
            self._drop_locked()
            try:
                urls = list(self.resolver.resolve(self.name))
            except Exception as exc:
                raise _NotSent(f"resolving actor {self.name!r} failed: {exc!r}") from exc
            if not urls:
                raise _NotSent(f"no endpoint found for actor {self.name!r} in namespace {self.namespace!r}")
            problems = []
            for url in urls:
                host, port, server_name = parse_actor_url(url)
                try:
                    conn = _Connection(host, port, self.token, _remaining(deadline))
                except OSError as exc:  # refused, unreachable, or the peer died during the handshake
                    problems.append(f"{url}: {exc}")
                    continue
                try:
                    actor_id = _control(conn, CONTROL_LOOKUP, (self.namespace, server_name), deadline)
                except _NotSent as exc:
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
            raise _NotSent(f"actor {self.name!r} is unreachable: " + "; ".join(problems))

    def drop(self, conn: _Connection | None = None, *, forget_id: bool = False) -> None:
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


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)


def _control(conn: _Connection, operation: str, arguments: tuple[Any, ...], deadline: float | None) -> Any:
    """Make one control request and wait for its answer (errors as for a call that did not run)."""
    entry = conn.request(wire.FrameKind.CONTROL, [pickle.dumps((operation, arguments), protocol=5)])
    response = conn.wait(entry, deadline)
    if isinstance(response, BaseException):
        raise response
    if response.kind is wire.FrameKind.RESULT:
        return pickle.loads(response.segments[0])
    code, exc = _rebuild_error(response, f"control {operation}")
    if code is ErrorCode.NOT_FOUND:
        raise _NotSent(str(exc))
    raise exc


def _settle(
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


def _rebuild_error(frame: wire.Frame, what: str) -> tuple[ErrorCode, BaseException]:
    """Decode an ERROR frame into (code, exception): the original type where it unpickles."""
    try:
        raw_code, exc_bytes, type_name, message, traceback_text = pickle.loads(frame.segments[0])
        code = ErrorCode(raw_code)
    except Exception as exc:
        return ErrorCode.RAISED, SerializationError(f"undecodable error report for {what}: {exc!r}")
    exc_obj: BaseException | None = None
    if exc_bytes is not None:
        try:
            loaded = pickle.loads(exc_bytes)
            exc_obj = loaded if isinstance(loaded, BaseException) else None
        except Exception:
            exc_obj = None
    if exc_obj is None:
        exc_obj = RemoteError(type_name, message, traceback_text)
    with contextlib.suppress(AttributeError):  # exceptions with __slots__ only
        exc_obj.remote_traceback = traceback_text  # type: ignore[attr-defined]
    if traceback_text:
        exc_obj.add_note(f"\nRemote traceback ({what}):\n{traceback_text.rstrip()}")
    return code, exc_obj


# ---------------------------------------------------------------------------------------------
# The client


class ActorClient(Generic[T]):
    """A handle to the actor ``name``, found through ``resolver``.

    ``client.method(*args)`` calls and blocks; ``client.method.remote(*args)`` returns
    an :class:`~fray.actor.ActorFuture` at once (the first call resolves and connects
    in the calling thread, so calls leave in program order). Calls from one client
    share one connection and run on the actor in the order they were made.

    ``cls`` (or the subscripted form ``ActorClient[Counter](resolver, name)``) lets the
    client reject unknown methods locally; :meth:`typed` returns the client typed as
    ``cls`` so a type checker checks blocking calls against the real signatures.

    ``namespace`` defaults to the resolver's (when it has one), else the process
    default. ``token`` defaults to ``FRAY_TOKEN``; it is never pickled, so a handle
    sent to another process uses that process's token.
    """

    def __init__(
        self,
        resolver: Resolver,
        name: str,
        options: RpcOptions = RpcOptions(),
        *,
        cls: type[T] | None = None,
        namespace: str | None = None,
        token: str | bytes | None = None,
    ) -> None:
        if namespace is None:
            namespace = getattr(resolver, "namespace", None)
        self._options = options
        self._cls: type[Any] | None = cls
        self._methods: dict[str, _RpcMethod] = {}
        self._channel = _Channel(resolver, name, resolve_namespace(namespace), default_token(token))
        self._ready: concurrent.futures.Future[None] | None = None

    @classmethod
    def _from_channel(cls, channel: _Channel, options: RpcOptions, actor_cls: type[Any] | None) -> ActorClient[Any]:
        client: ActorClient[Any] = cls.__new__(cls)
        client._options = options
        client._cls = actor_cls
        client._methods = {}
        client._channel = channel
        client._ready = None
        return client

    @property
    def name(self) -> str:
        """The actor's name."""
        return self._channel.name

    @property
    def namespace(self) -> str:
        """The namespace the name is resolved in."""
        return self._channel.namespace

    @property
    def options(self) -> RpcOptions:
        """The options every call of this client uses."""
        return self._options

    def with_options(self, **changes: Any) -> ActorClient[T]:
        """A client for the same actor (sharing this one's connection) with some options changed."""
        return self._from_channel(self._channel, replace(self._options, **changes), self._cls)

    def typed(self) -> T:
        """This client, typed as the actor class: ``client.typed().incr(1)`` is a checked blocking call."""
        return cast(T, self)

    def close(self) -> None:
        """Close the cached connection (the next call reconnects)."""
        self._channel.drop()

    def __getattr__(self, method: str) -> _RpcMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        bound = self._methods.get(method)
        if bound is None:
            actor_cls = self._actor_class()
            if actor_cls is not None:
                check_actor_method(actor_cls, method)
            bound = self._methods[method] = _RpcMethod(self, method)
        return bound

    def _actor_class(self) -> type[Any] | None:
        if self._cls is None:
            args = get_args(self.__dict__.get("__orig_class__"))
            if args and isinstance(args[0], type):
                self._cls = args[0]
        return self._cls

    def __reduce__(self) -> tuple[Any, ...]:
        channel = self._channel
        return (
            _rebuild_client,
            (channel.resolver, channel.name, self._options, self._actor_class(), channel.namespace),
        )

    def __repr__(self) -> str:
        return f"ActorClient({self.name!r}, namespace={self.namespace!r})"

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        """A future done once the actor resolves and answers; ActorUnavailableError if it never does in time."""
        if self._ready is None:
            self._ready = concurrent.futures.Future()
            threading.Thread(target=self._wait_ready, args=(self._ready,), name="fray-rpc-ready", daemon=True).start()
        return self._ready

    def _wait_ready(self, future: concurrent.futures.Future[None]) -> None:
        timeout = self._options.timeout if self._options.timeout is not None else _READY_TIMEOUT
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                self._channel.bind(deadline)
            except _NotSent as exc:
                if time.monotonic() + _backoff(attempt) >= deadline:
                    _settle(
                        future,
                        exception=ActorUnavailableError(f"actor {self.name!r} not ready after {timeout}s: {exc}"),
                    )
                    return
                time.sleep(_backoff(attempt))
                attempt += 1
                continue
            except BaseException as exc:
                _settle(future, exception=exc)
                return
            _settle(future, result=None)
            return

    # -- calls ----------------------------------------------------------------------------------

    def _submit(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], deadline: float | None, callback: Any
    ) -> tuple[_Connection, _Pending]:
        """Send one call; retry while it provably was not sent. ``callback`` as for _Connection.request."""
        channel = self._channel
        attempt = 0
        while True:
            try:
                conn, actor_id = channel.bind(deadline)
                segments = wire.encode((channel.namespace, channel.name, actor_id, method, args, kwargs))
                if len(segments) > 1:
                    size = sum(memoryview(segment).nbytes for segment in segments)
                    if size > wire.DEFAULT_MAX_FRAME_BYTES:
                        raise SerializationError(
                            f"arguments of {self.name}.{method} take {size} bytes; a call carries at most "
                            f"{wire.DEFAULT_MAX_FRAME_BYTES} (put large data in shared storage and pass a reference)"
                        )
                return conn, conn.request(wire.FrameKind.CALL, segments, callback(conn) if callback else None)
            except _NotSent as exc:
                channel.drop()
                now = time.monotonic()
                if attempt >= self._options.retries or (deadline is not None and now >= deadline):
                    raise CallNotSentError(
                        f"call {self.name}.{method} was not sent (attempt {attempt + 1} of "
                        f"{self._options.retries + 1}): {exc}"
                    ) from None
                delay = _backoff(attempt)
                if deadline is not None:
                    delay = min(delay, max(deadline - now, 0.0))
                time.sleep(delay)
                attempt += 1

    def _outcome(self, response: wire.Frame | BaseException, conn: _Connection, method: str) -> tuple[bool, Any]:
        """Turn a response into ``(True, value)`` or ``(False, exception)``; drop a connection that failed."""
        channel = self._channel
        what = f"{channel.name}.{method}"
        if isinstance(response, BaseException):
            if isinstance(response, RpcTimeoutError):
                response = self._timeout_error(method, self._options.timeout)
            elif isinstance(response, ActorUnavailableError):
                channel.drop(conn)
            return False, response
        if response.kind is wire.FrameKind.RESULT:
            try:
                return True, wire.decode(response.segments)
            except Exception as exc:
                return False, SerializationError(f"cannot unpickle the result of {what}: {exc!r}")
        code, error = _rebuild_error(response, what)
        if code is ErrorCode.NOT_FOUND:
            channel.drop(conn)
            error = ActorUnavailableError(f"{error}; the call did not run")
        elif code is ErrorCode.REPLACED:
            channel.drop(conn, forget_id=True)
            error = ActorUnavailableError(f"{error}; the call did not run, later calls go to the new instance")
        return False, error

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        timeout = self._options.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        conn, entry = self._submit(method, args, kwargs, deadline, None)
        ok, value = self._outcome(conn.wait(entry, deadline), conn, method)
        if ok:
            return value
        raise value

    def _call_async(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        timeout = self._options.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        future = _CallFuture()

        def completer(conn: _Connection) -> Callback:
            def complete(response: wire.Frame | BaseException) -> None:
                ok, value = self._outcome(response, conn, method)
                if ok:
                    _settle(future, result=value)
                else:
                    _settle(future, exception=value)

            return complete

        try:
            conn, entry = self._submit(method, args, kwargs, deadline, completer)
        except BaseException as exc:
            future.set_exception(exc)
            return future
        future._connection, future._deadline = conn, deadline
        if deadline is not None:
            error = self._timeout_error(method, timeout)
            _timer.schedule(deadline, lambda: conn.expire(entry, error))
        return future

    def _timeout_error(self, method: str, timeout: float | None) -> RpcTimeoutError:
        return RpcTimeoutError(
            f"call {self.name}.{method} did not complete within {timeout}s; it may or may not have run"
        )


class _CallFuture(ActorFuture):
    """An ActorFuture whose waiter reads the connection itself when no other thread is reading.

    That saves a thread switch per result when a caller keeps many calls in flight
    and collects them with ``result()``.
    """

    _connection: _Connection | None = None
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


def _rebuild_client(
    resolver: Resolver, name: str, options: RpcOptions, cls: type[Any] | None, namespace: str
) -> ActorClient[Any]:
    return ActorClient(resolver, name, options, cls=cls, namespace=namespace)


def _backoff(attempt: int) -> float:
    return float(min(0.05 * 2**attempt, 1.0))


class _RpcMethod:
    """One method of an ActorClient: call it to block, or ``.remote(...)`` for a future."""

    __slots__ = ("_client", "_method")

    def __init__(self, client: ActorClient[Any], method: str) -> None:
        self._client = client
        self._method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client._call(self._method, args, kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the call and return its future at once."""
        return self._client._call_async(self._method, args, kwargs)

    def __repr__(self) -> str:
        return f"<actor method {self._client.name}.{self._method}>"


def list_methods(client: ActorClient[Any]) -> list[MethodInfo]:
    """The remotely callable methods of the actor behind ``client``, with signatures and docstrings."""
    deadline = None if client.options.timeout is None else time.monotonic() + client.options.timeout
    try:
        conn, _ = client._channel.bind(deadline)
        return list(_control(conn, CONTROL_LIST_METHODS, (client.namespace, client.name), deadline))
    except _NotSent as exc:
        raise CallNotSentError(str(exc)) from None


def list_actors(
    address: str, *, namespace: str | None = None, token: str | bytes | None = None, timeout: float = 10.0
) -> list[ActorInfo]:
    """The actors served at ``address`` (``host:port``) in ``namespace`` (default: the process's)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    conn = _Connection(host.strip("[]"), int(port), default_token(token), timeout)
    try:
        return list(_control(conn, CONTROL_LIST_ACTORS, (resolve_namespace(namespace),), deadline))
    except _NotSent as exc:
        raise CallNotSentError(str(exc)) from None
    finally:
        conn.close()
