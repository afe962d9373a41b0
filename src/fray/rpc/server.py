"""The actor server: serves any Python objects to remote :class:`~fray.rpc.client.ActorClient` s.

Threads, and why:

* one *accept* thread hands each new connection to its own *connection* thread;
* a connection thread runs the handshake, then reads frames, decodes them, answers
  control requests itself and hands calls to the target actor's runner;
* an actor with ``max_concurrency=1`` (the default) runs calls one at a time in
  arrival order. When it is idle, the connection thread that received a call runs
  it itself -- no thread switch on the latency-critical path -- and a *drain*
  thread takes over the calls that queue up behind a running one, so a long call
  only ever occupies its own actor (and its own connection);
* an actor with ``max_concurrency > 1`` has up to that many *worker* threads
  (started on demand) taking calls from one FIFO queue;
* an actor with ``async def`` methods also gets one event-loop thread; the thread
  running the call waits for the coroutine there, so ``max_concurrency`` bounds
  sync and async calls alike.

Responses of calls run by the connection thread while more requests are waiting
in its buffer are batched into one write (see :class:`_Connection`); every other
response is written at once by the thread that produced it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import inspect
import ipaddress
import logging
import pickle
import queue
import selectors
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from fray.actor import check_actor_method, public_methods
from fray.errors import ConfigError, SerializationError
from fray.rpc import wire
from fray.rpc.namespace import default_token, resolve_namespace

__all__ = ["ActorInfo", "ActorServer", "MethodInfo", "NameMapping"]

logger = logging.getLogger(__name__)

# The connection thread writes batched responses at least every this many bytes, and
# responses queued before a call it runs itself leave at most this late (seconds).
_OUTBOX_FLUSH_BYTES = 64 * 1024
_BATCH_DELAY = 0.0005


class NameMapping(Protocol):
    """Where an :class:`ActorServer` publishes its actors so resolvers can find them.

    :class:`~fray.rpc.registry.EndpointRegistry` and its remote client implement it.
    """

    def register(self, namespace: str, name: str, url: str) -> None:
        """Publish ``url`` as the endpoint of actor ``name`` in ``namespace``."""
        ...

    def unregister(self, namespace: str, name: str, url: str) -> None:
        """Withdraw ``url`` for ``name`` (a no-op if another URL replaced it meanwhile)."""
        ...


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


class ErrorCode(enum.IntEnum):
    """Why a call failed; tells the client whether the method ran. Part of the wire format."""

    RAISED = 0  #: the method ran (or started) and raised; the payload is its exception.
    NOT_FOUND = 1  #: no actor of that name in that namespace; nothing ran.
    REPLACED = 2  #: the name now belongs to another actor id; nothing ran.
    REJECTED = 3  #: the request was invalid (no such method, undecodable arguments); nothing ran.


# A call request, as pickled in segment 0 of a CALL frame.
#   (namespace, name, actor_id or None, method, args, kwargs)
# A control request, as pickled in a CONTROL frame: (operation, arguments tuple).
CONTROL_PING = "ping"
CONTROL_LOOKUP = "lookup"
CONTROL_LIST_ACTORS = "list_actors"
CONTROL_LIST_METHODS = "list_methods"


def encode_error(code: ErrorCode, exc: BaseException) -> list[Any]:
    """The segments of an ERROR frame: the exception pickled on its own, plus its text.

    The exception is pickled separately so the report always decodes even where the
    exception type itself does not (the client then raises a RemoteError).
    """
    try:
        exc_bytes: bytes | None = cloudpickle.dumps(exc, protocol=5)
    except Exception:
        exc_bytes = None
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    text = "".join(traceback.format_exception(exc))
    return [pickle.dumps((int(code), exc_bytes, type_name, str(exc), text), protocol=5)]


class _Connection:
    """The server's side of one client connection: a socket and the lock its senders share.

    Responses to calls that the connection thread ran itself while more requests were
    already buffered are collected in an *outbox* and written together, with one
    system call, once the buffer runs dry (see :meth:`flush`): under pipelining that
    saves most of the per-response writes. Before the thread runs a call that might
    take long, it asks the :class:`_Flusher` to write the outbox if it is not back
    quickly, so a fast call's answer never waits for a slow call after it.
    """

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.reader_thread = 0
        self._send_lock = threading.Lock()  # also guards the outbox
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._generation = 0  # counts flushes, so a late flusher can tell it is not needed

    def send(self, kind: wire.FrameKind, request_id: int, segments: list[Any]) -> None:
        """Send a response; a client that went away simply misses it."""
        if len(segments) == 1 and threading.get_ident() == self.reader_thread:
            frame = wire.small_frame(kind, request_id, segments[0])
            if frame is not None:
                with self._send_lock:
                    self._outbox.append(frame)
                    self._outbox_bytes += len(frame)
                    full = self._outbox_bytes >= _OUTBOX_FLUSH_BYTES
                if full:
                    self.flush()
                return
        try:
            with self._send_lock:
                wire.send_frame(self.sock, kind, request_id, segments)
        except OSError:
            pass

    def flush(self, generation: int | None = None) -> None:
        """Write the outbox (if ``generation`` is given: only if no flush happened since)."""
        with self._send_lock:
            if not self._outbox or (generation is not None and generation != self._generation):
                return
            data = b"".join(self._outbox)
            self._outbox.clear()
            self._outbox_bytes = 0
            self._generation += 1
            with contextlib.suppress(OSError):
                self.sock.sendall(data)

    def before_inline_call(self) -> None:
        """The connection thread is about to run a call: make sure queued answers still leave soon."""
        if self._outbox:
            _flusher.watch(self, self._generation)

    def send_error(self, request_id: int, code: ErrorCode, exc: BaseException) -> None:
        self.send(wire.FrameKind.ERROR, request_id, encode_error(code, exc))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class _Flusher:
    """One daemon thread writing outboxes whose connection thread is busy running a call.

    Deadlines are all ``_BATCH_DELAY`` after registration, so they arrive in order
    and the thread only needs waking when the queue was empty.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[float, _Connection, int]] = collections.deque()
        self._thread: threading.Thread | None = None

    def watch(self, conn: _Connection, generation: int) -> None:
        with self._cond:
            self._queue.append((time.monotonic() + _BATCH_DELAY, conn, generation))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fray-actor-flusher", daemon=True)
                self._thread.start()
            elif len(self._queue) == 1:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                deadline, conn, generation = self._queue[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._queue.popleft()
            conn.flush(generation)


_flusher = _Flusher()


class _Call:
    """One accepted call: what to run, and where its answer goes."""

    __slots__ = ("actor", "args", "conn", "kwargs", "method", "rid")

    def __init__(
        self, conn: _Connection, rid: int, actor: _Actor, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.conn, self.rid, self.actor = conn, rid, actor
        self.method, self.args, self.kwargs = method, args, kwargs

    def run(self) -> None:
        """Run the method and send its result or exception."""
        conn = self.conn
        try:
            result = getattr(self.actor.obj, self.method)(*self.args, **self.kwargs)
            if inspect.isawaitable(result):
                result = self.actor.runner.run_coroutine(result)
        except BaseException as exc:  # the caller gets every exception, SystemExit included
            conn.send_error(self.rid, ErrorCode.RAISED, exc)
            return
        try:
            segments = wire.encode(result)
        except SerializationError as exc:
            conn.send_error(self.rid, ErrorCode.RAISED, exc)
            return
        conn.send(wire.FrameKind.RESULT, self.rid, segments)

    def reject(self, code: ErrorCode, reason: str) -> None:
        """Answer without running: the actor went away while this call waited."""
        self.conn.send_error(self.rid, code, LookupError(f"{reason} before this call ran"))


class _ActorRunner:
    """Runs one actor's calls, at most ``max_concurrency`` at a time, starting them in arrival order.

    With ``max_concurrency == 1`` (the default) calls wait in a backlog and exactly one
    thread at a time drains it. When the actor is idle the connection thread that
    received a call runs it itself (see :meth:`run_or_queue`), which saves a thread
    switch on the latency-critical path; a worker thread takes over the backlog
    whenever calls queue up behind a running one, so a connection never drains
    calls that arrived on other connections.

    With ``max_concurrency > 1`` calls go through a FIFO queue drained by up to
    ``max_concurrency`` worker threads, started on demand.
    """

    def __init__(self, label: str, max_concurrency: int) -> None:
        self.label = label
        self.max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        # max_concurrency == 1: the backlog, and whether some thread currently owns the actor.
        self._backlog: collections.deque[_Call] = collections.deque()
        self._busy = False
        # Wakes the drain worker (max_concurrency == 1) or carries jobs to the pool (> 1).
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = 0
        self._queued = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_reason: tuple[ErrorCode, str] = (ErrorCode.NOT_FOUND, "")

    def run_or_queue(self, call: _Call) -> None:
        """Run ``call`` now in this thread if the actor is idle, else queue it behind the others."""
        if self.max_concurrency > 1:
            self._submit_pool(call)
            return
        with self._lock:
            stopped = self._stopped
            if not stopped and (self._busy or self._backlog):
                self._backlog.append(call)
                return
            self._busy = not stopped
        if stopped:
            call.reject(*self._stop_reason)
            return
        try:
            call.conn.before_inline_call()
            call.run()
        finally:
            self._release()

    def _release(self) -> None:
        """Called by the thread owning the actor when its call is done: hand the backlog on, or go idle."""
        with self._lock:
            if not self._backlog or self._stopped:
                self._busy = False
                return
            if not self._threads:
                self._spawn(self._drain)
        # Ownership (busy stays True) passes to the drain worker.
        self._queue.put(None)

    def _drain(self) -> None:
        while True:
            self._queue.get()
            while True:
                with self._lock:
                    if self._stopped:
                        self._busy = False
                        return
                    if not self._backlog:
                        self._busy = False
                        break
                    call = self._backlog.popleft()
                call.run()

    def _submit_pool(self, call: _Call) -> None:
        with self._lock:
            if self._stopped:
                stopped = True
            else:
                stopped = False
                self._queued += 1
                if self._queued > self._idle and len(self._threads) < self.max_concurrency:
                    self._spawn(self._work)
        if stopped:
            call.reject(*self._stop_reason)
            return
        self._queue.put(call)

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"fray-actor-{self.label}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if call is None:
                return
            call.run()

    def run_coroutine(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on this actor's event loop and wait for its result."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name=f"fray-actor-loop-{self.label}", daemon=True
                ).start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def stop(self, code: ErrorCode, reason: str) -> None:
        """Refuse queued and later calls (they did not run), let running ones finish, stop the threads."""
        with self._lock:
            self._stopped = True
            self._stop_reason = (code, reason)
            refused = list(self._backlog)
            self._backlog.clear()
            threads = len(self._threads)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
        with contextlib.suppress(queue.Empty):
            while True:
                queued = self._queue.get_nowait()
                if queued is not None:
                    refused.append(queued)
        for call in refused:
            call.reject(code, reason)
        for _ in range(threads):
            self._queue.put(None)


@dataclass
class _Actor:
    namespace: str
    name: str
    actor_id: str
    obj: Any
    runner: _ActorRunner

    def info(self) -> ActorInfo:
        return ActorInfo(
            self.namespace, self.name, self.actor_id, type(self.obj).__qualname__, self.runner.max_concurrency
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ActorServer:
    """Serves registered Python objects to remote callers over the Fray actor protocol.

    ``ActorServer(host="127.0.0.1", port=0)`` binds at once (so :attr:`address` is
    known before :meth:`start`); :meth:`register` adds actors at any time;
    :meth:`start` serves in background threads and :meth:`serve` in the calling one;
    :meth:`stop` disconnects every client.

    Authentication: every connection must prove it holds ``token`` (default
    ``FRAY_TOKEN``) before any payload is read. A server with no token at all (or
    ``token=""``, which opts out even when ``FRAY_TOKEN`` is set) only binds a
    loopback address and logs a warning, since any local process can then run code
    in it; binding another address without a token is a :class:`ConfigError`.

    ``namespace`` (default: :func:`~fray.rpc.namespace.default_namespace`) is where
    :meth:`register` puts actors unless told otherwise; callers from another
    namespace cannot see them. ``registry``, when given, is told about every actor so
    resolvers can find it by name.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | bytes | None = None,
        *,
        namespace: str | None = None,
        registry: NameMapping | None = None,
        advertise_host: str | None = None,
        max_frame_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._token = default_token(token)
        if self._token is None and not _is_loopback(host):
            raise ConfigError(
                f"ActorServer(host={host!r}) has no token: set FRAY_TOKEN or pass token=; "
                "without one a server may only listen on a loopback address such as 127.0.0.1"
            )
        if self._token is None:
            logger.warning(
                "ActorServer on %s runs WITHOUT authentication: any local process can call its actors. "
                "Set FRAY_TOKEN to require a token.",
                host,
            )
        self.namespace = resolve_namespace(namespace)
        self._registry = registry
        self._max_frame_bytes = max_frame_bytes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(512)
        self._port: int = self._listener.getsockname()[1]
        if advertise_host is None:
            advertise_host = socket.gethostbyname(socket.gethostname()) if host in ("0.0.0.0", "", "::") else host
        self._advertise_host = advertise_host
        self._lock = threading.Lock()
        self._actors: dict[tuple[str, str], _Actor] = {}
        self._connections: set[_Connection] = set()
        self._started = False
        self._stopped = threading.Event()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._accept_thread: threading.Thread | None = None

    # -- public API -----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` where clients reach this server."""
        host = f"[{self._advertise_host}]" if ":" in self._advertise_host else self._advertise_host
        return f"{host}:{self._port}"

    def url(self, name: str) -> str:
        """The ``actor://host:port/name`` URL of actor ``name`` on this server."""
        return f"actor://{self.address}/{name}"

    def register(self, name: str, obj: Any, *, max_concurrency: int = 1, namespace: str | None = None) -> str:
        """Serve ``obj`` as actor ``name``; return its fresh actor id.

        Registering a name again replaces the previous object: clients bound to the old
        id get :class:`~fray.errors.ActorUnavailableError` instead of silently reaching
        the new one. ``max_concurrency`` is how many calls may run at once (1: one at
        a time, in arrival order).
        """
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"actor name must be a non-empty string without '/', got {name!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        ns = resolve_namespace(namespace) if namespace is not None else self.namespace
        actor_id = uuid.uuid4().hex
        actor = _Actor(ns, name, actor_id, obj, _ActorRunner(f"{name}-{actor_id[:8]}", max_concurrency))
        with self._lock:
            previous = self._actors.get((ns, name))
            self._actors[(ns, name)] = actor
        if previous is not None:
            previous.runner.stop(
                ErrorCode.REPLACED, f"actor {name!r} was replaced (id {previous.actor_id} -> {actor_id})"
            )
        if self._registry is not None:
            self._registry.register(ns, name, self.url(name))
        return actor_id

    def unregister(self, name: str, *, namespace: str | None = None) -> None:
        """Stop serving actor ``name``; later calls to it fail with ActorUnavailableError."""
        ns = resolve_namespace(namespace) if namespace is not None else self.namespace
        with self._lock:
            actor = self._actors.pop((ns, name), None)
        if actor is None:
            return
        actor.runner.stop(ErrorCode.NOT_FOUND, f"actor {name!r} was unregistered")
        if self._registry is not None:
            try:
                self._registry.unregister(ns, name, self.url(name))
            except Exception:
                logger.warning("could not unregister actor %r from the registry", name, exc_info=True)

    def actors(self) -> list[ActorInfo]:
        """Every actor this server serves, in all namespaces."""
        with self._lock:
            return [actor.info() for actor in self._actors.values()]

    def start(self) -> ActorServer:
        """Start serving in background threads; return self."""
        with self._lock:
            if self._started:
                return self
            if self._stopped.is_set():
                raise RuntimeError("this ActorServer was stopped; create a new one")
            self._started = True
        self._accept_thread = threading.Thread(target=self._accept_loop, name="fray-actor-accept", daemon=True)
        self._accept_thread.start()
        return self

    def serve(self) -> None:
        """Serve until :meth:`stop` is called (from another thread or a signal handler)."""
        self.start()
        self._stopped.wait()

    def stop(self) -> None:
        """Stop accepting, drop every connection (their in-flight calls fail on the client) and stop the actors."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._wakeup_w.send(b"x")
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        self._listener.close()
        self._wakeup_r.close()
        self._wakeup_w.close()
        with self._lock:
            connections = list(self._connections)
            actors = list(self._actors.values())
            self._actors.clear()
        for conn in connections:
            conn.close()
        for actor in actors:
            actor.runner.stop(ErrorCode.NOT_FOUND, f"actor server {self.address} stopped")
            if self._registry is not None:
                try:
                    self._registry.unregister(actor.namespace, actor.name, self.url(actor.name))
                except Exception:
                    logger.warning("could not unregister actor %r from the registry", actor.name, exc_info=True)

    def __enter__(self) -> ActorServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ActorServer({self.address!r}, namespace={self.namespace!r}, actors={len(self._actors)})"

    # -- connection handling ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wakeup_r, selectors.EVENT_READ)
            while not self._stopped.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self._wakeup_r:
                        return
                    try:
                        sock, peer = self._listener.accept()
                    except OSError:
                        continue
                    threading.Thread(
                        target=self._serve_connection,
                        args=(sock, f"{peer[0]}:{peer[1]}"),
                        name="fray-actor-conn",
                        daemon=True,
                    ).start()

    def _serve_connection(self, sock: socket.socket, peer: str) -> None:
        conn = _Connection(sock, peer)
        with self._lock:
            if self._stopped.is_set():
                conn.close()
                return
            self._connections.add(conn)
        try:
            wire.tune_socket(sock)
            sock.settimeout(wire.HANDSHAKE_TIMEOUT)
            if not wire.server_handshake(sock, self._token):
                logger.warning("refused connection from %s: authentication failed", peer)
                return
            sock.settimeout(None)
            reader = wire.FrameReader(sock, max_frame_bytes=self._max_frame_bytes)
            conn.reader_thread = threading.get_ident()
            while True:
                if not reader.buffered():
                    conn.flush()
                try:
                    frame = reader.read_frame()
                except wire.ProtocolError as exc:
                    logger.warning("dropping connection from %s: %s", peer, exc)
                    conn.send(wire.FrameKind.PROTOCOL_ERROR, 0, [str(exc).encode()])
                    return
                if frame is None:
                    return
                if frame.kind is wire.FrameKind.CALL:
                    self._handle_call(conn, frame)
                elif frame.kind is wire.FrameKind.CONTROL:
                    self._handle_control(conn, frame)
                else:
                    message = f"clients may not send {frame.kind.name} frames"
                    logger.warning("dropping connection from %s: %s", peer, message)
                    conn.send(wire.FrameKind.PROTOCOL_ERROR, frame.request_id, [message.encode()])
                    return
        except (OSError, ValueError):
            # A reset, a timeout during the handshake, or a socket closed by stop().
            return
        except Exception:
            # A bug of ours must cost one connection, never the server.
            logger.exception("dropping connection from %s after an internal error", peer)
            return
        finally:
            conn.flush()  # e.g. a PROTOCOL_ERROR explaining why we hang up
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _lookup(self, namespace: str, name: str) -> _Actor | None:
        with self._lock:
            return self._actors.get((namespace, name))

    def _handle_call(self, conn: _Connection, frame: wire.Frame) -> None:
        rid = frame.request_id
        try:
            namespace, name, actor_id, method, args, kwargs = wire.decode(frame.segments)
            if not (
                isinstance(namespace, str)
                and isinstance(name, str)
                and isinstance(actor_id, str | None)
                and isinstance(method, str)
                and isinstance(args, tuple)
                and isinstance(kwargs, dict)
            ):
                raise TypeError("malformed call request")
        except Exception as exc:
            error = SerializationError(f"the server could not decode the call's arguments: {exc!r}")
            conn.send_error(rid, ErrorCode.REJECTED, error)
            return
        actor = self._lookup(namespace, name)
        if actor is None:
            conn.send_error(rid, ErrorCode.NOT_FOUND, LookupError(self._not_found(namespace, name)))
            return
        if actor_id is not None and actor_id != actor.actor_id:
            message = f"actor {name!r} was replaced: {actor_id} -> {actor.actor_id}"
            conn.send_error(rid, ErrorCode.REPLACED, LookupError(message))
            return
        try:
            check_actor_method(type(actor.obj), method)
        except AttributeError as exc:
            conn.send_error(rid, ErrorCode.REJECTED, exc)
            return
        actor.runner.run_or_queue(_Call(conn, rid, actor, method, args, kwargs))

    def _not_found(self, namespace: str, name: str) -> str:
        return f"no actor named {name!r} in namespace {namespace!r} at {self.address}"

    def _handle_control(self, conn: _Connection, frame: wire.Frame) -> None:
        rid = frame.request_id
        try:
            operation, arguments = pickle.loads(frame.segments[0])
            result: Any
            if operation == CONTROL_PING:
                result = "pong"
            elif operation == CONTROL_LOOKUP:
                namespace, name = arguments
                actor = self._lookup(namespace, name)
                if actor is None:
                    conn.send_error(rid, ErrorCode.NOT_FOUND, LookupError(self._not_found(namespace, name)))
                    return
                result = actor.actor_id
            elif operation == CONTROL_LIST_ACTORS:
                (namespace,) = arguments
                result = [info for info in self.actors() if info.namespace == namespace]
            elif operation == CONTROL_LIST_METHODS:
                namespace, name = arguments
                actor = self._lookup(namespace, name)
                if actor is None:
                    conn.send_error(rid, ErrorCode.NOT_FOUND, LookupError(self._not_found(namespace, name)))
                    return
                result = describe_methods(type(actor.obj))
            else:
                raise ValueError(f"unknown control operation {operation!r}")
        except Exception as exc:
            conn.send_error(rid, ErrorCode.REJECTED, exc)
            return
        conn.send(wire.FrameKind.RESULT, rid, [pickle.dumps(result, protocol=5)])


def describe_methods(cls: type) -> list[MethodInfo]:
    """The remotely callable methods of ``cls`` with their signatures and docstrings."""
    infos = []
    for name in public_methods(cls):
        member = getattr(cls, name)
        signature = _signature_text(member)
        infos.append(MethodInfo(name, signature, inspect.getdoc(member) or "", inspect.iscoroutinefunction(member)))
    return infos


def _signature_text(member: Any) -> str:
    """``member``'s signature as the caller sees it: annotations evaluated, ``self`` left out."""
    try:
        try:
            signature = inspect.signature(member, eval_str=True)
        except Exception:  # an annotation that does not evaluate here
            signature = inspect.signature(member)
    except (TypeError, ValueError):
        return "(...)"
    parameters = list(signature.parameters.values())
    if inspect.isfunction(member) and parameters and parameters[0].name == "self":
        signature = signature.replace(parameters=parameters[1:])
    return str(signature)
