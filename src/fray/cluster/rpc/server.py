"""The actor server: serves any Python objects to remote :class:`~fray.cluster.rpc.client.ActorClient` s.

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
in its buffer are batched into one write (see
:class:`~fray.cluster.rpc._dispatch.ServerConnection`); every other response is written at
once by the thread that produced it. How calls run and are answered lives in
:mod:`fray.cluster.rpc._dispatch`; what the frames mean, in :mod:`fray.cluster.rpc.protocol`.
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import pickle
import socket
import threading
import uuid
from typing import Any, Protocol

from fray.actor import public_methods
from fray.cluster.rpc import wire
from fray.cluster.rpc._accept import Acceptor, Limits
from fray.cluster.rpc._dispatch import Actor, ActorRunner, Call, CallHooks, ServerConnection
from fray.cluster.rpc.namespace import default_token, resolve_namespace
from fray.cluster.rpc.protocol import (
    CONTROL_LIST_ACTORS,
    CONTROL_LIST_METHODS,
    CONTROL_LOCAL,
    CONTROL_LOOKUP,
    CONTROL_PING,
    ActorInfo,
    ErrorCode,
    MethodInfo,
)
from fray.cluster.rpc.transport import _local
from fray.errors import ConfigError, ProtocolError, SerializationError

__all__ = ["ActorInfo", "ActorServer", "MethodInfo", "NameMapping"]

logger = logging.getLogger(__name__)


class NameMapping(Protocol):
    """Where an :class:`ActorServer` publishes its actors so resolvers can find them.

    :class:`~fray.cluster.rpc.registry.EndpointRegistry` and its remote client implement it.
    """

    def register(self, namespace: str, name: str, url: str) -> None:
        """Publish ``url`` as the endpoint of actor ``name`` in ``namespace``."""
        ...

    def unregister(self, namespace: str, name: str, url: str) -> None:
        """Withdraw ``url`` for ``name`` (a no-op if another URL replaced it meanwhile)."""
        ...


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _reachable_address() -> str:
    """The address other machines reach this one by: the host name's, unless that is loopback
    (as on many Linux set-ups), then the source address of the default route."""
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = "127.0.0.1"
    if not _is_loopback(named):
        return named
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # sends nothing: only asks the kernel for a route
            return str(probe.getsockname()[0])
        except OSError:
            return named


def bind_listener(
    host: str, port: int, advertise_host: str | None, name: str = "fray"
) -> tuple[socket.socket, int, str]:
    """Bind and listen on ``host:port``; return the socket, the port and the host clients should use.

    Binding anything but a loopback address is logged as a warning naming the address
    that other machines can reach, since the server is then exposed beyond this host.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(512)
    bound: int = listener.getsockname()[1]
    if advertise_host is None:
        advertise_host = _reachable_address() if host in ("0.0.0.0", "", "::") else host
    if not _is_loopback(host):
        everywhere = " (every interface)" if host in ("0.0.0.0", "", "::") else ""
        logger.warning(
            "%s server listens on %s:%d%s and is reachable from other machines as %s:%d; "
            "only peers holding the token can use it",
            name,
            host or "0.0.0.0",
            bound,
            everywhere,
            advertise_host,
            bound,
        )
    return listener, bound, advertise_host


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

    ``namespace`` (default: :func:`~fray.cluster.rpc.namespace.default_namespace`) is where
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
        limits: Limits | None = None,
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
        self._listener, self._port, self._advertise_host = bind_listener(host, port, advertise_host, "actor")
        self._lock = threading.Lock()
        self._actors: dict[tuple[str, str], Actor] = {}
        self._connections: set[ServerConnection] = set()
        self._started = False
        self._stopped = threading.Event()
        self._acceptor = Acceptor(self._listener, self._token, self._serve_connection, limits=limits, name="actor")
        # Clients on this host move to the local listener (see fray.cluster.rpc.transport._local); same handshake and limits.
        local = _local.listen()
        self._local_name: str | None = None
        self._local_acceptor: Acceptor | None = None
        if local is not None:
            self._local_listener, self._local_name = local
            self._local_acceptor = Acceptor(
                self._local_listener, self._token, self._serve_connection, limits=limits, name="actor-local"
            )

    # -- public API -----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` where clients reach this server."""
        host = f"[{self._advertise_host}]" if ":" in self._advertise_host else self._advertise_host
        return f"{host}:{self._port}"

    def url(self, name: str) -> str:
        """The ``actor://host:port/name`` URL of actor ``name`` on this server."""
        return f"actor://{self.address}/{name}"

    def register(
        self,
        name: str,
        obj: Any,
        *,
        max_concurrency: int = 1,
        namespace: str | None = None,
        hooks: CallHooks | None = None,
    ) -> str:
        """Serve ``obj`` as actor ``name``; return its fresh actor id.

        Registering a name again replaces the previous object: clients bound to the old
        id get :class:`~fray.errors.ActorUnavailableError` instead of silently reaching
        the new one. ``max_concurrency`` is how many calls may run at once (1: one at
        a time, in arrival order). ``hooks`` (a :class:`~fray.cluster.rpc._dispatch.CallHooks`)
        are told when each call starts (and may refuse it) and when it has ended.
        """
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"actor name must be a non-empty string without '/', got {name!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        ns = resolve_namespace(namespace) if namespace is not None else self.namespace
        actor_id = uuid.uuid4().hex
        actor = Actor(ns, name, actor_id, obj, ActorRunner(f"{name}-{actor_id[:8]}", max_concurrency), hooks)
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
        self._acceptor.start()
        if self._local_acceptor is not None:
            self._local_acceptor.start()
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
        self._acceptor.stop()
        self._listener.close()
        if self._local_acceptor is not None:
            self._local_acceptor.stop()
            self._local_listener.close()
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

    def _serve_connection(self, sock: socket.socket, peer: str, authenticated: wire.Authenticated) -> None:
        """Serve one authenticated connection (the acceptor ran the handshake and closes the socket after)."""
        conn = ServerConnection(sock, peer)
        with self._lock:
            if self._stopped.is_set():
                return
            self._connections.add(conn)
        reader = wire.FrameReader(sock, max_frame_bytes=self._max_frame_bytes)
        conn.reader = reader
        try:
            conn.reader_thread = threading.get_ident()
            while True:
                if not reader.buffered():
                    conn.flush()
                try:
                    frame = reader.read_frame()
                except ProtocolError as exc:
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
        finally:
            conn.flush()  # e.g. a PROTOCOL_ERROR explaining why we hang up
            reader.close()
            with self._lock:
                self._connections.discard(conn)

    def _lookup(self, namespace: str, name: str) -> Actor | None:
        # One dict read, atomic on its own: no lock on the per-call path.
        return self._actors.get((namespace, name))

    def _handle_call(self, conn: ServerConnection, frame: wire.Frame) -> None:
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
            actor.check_method(method)
        except AttributeError as exc:
            conn.send_error(rid, ErrorCode.REJECTED, exc)
            return
        actor.runner.run_or_queue(Call(conn, rid, actor, method, args, kwargs))

    def _not_found(self, namespace: str, name: str) -> str:
        return f"no actor named {name!r} in namespace {namespace!r} at {self.address}"

    def _handle_control(self, conn: ServerConnection, frame: wire.Frame) -> None:
        rid = frame.request_id
        try:
            operation, arguments = pickle.loads(frame.segments[0])
            result: Any
            if operation == CONTROL_PING:
                result = "pong"
            elif operation == CONTROL_LOCAL:
                result = self._local_name
            elif operation == CONTROL_LIST_ACTORS:
                (namespace,) = arguments
                result = [info for info in self.actors() if info.namespace == namespace]
            elif operation in (CONTROL_LOOKUP, CONTROL_LIST_METHODS):
                namespace, name = arguments
                actor = self._lookup(namespace, name)
                if actor is None:
                    conn.send_error(rid, ErrorCode.NOT_FOUND, LookupError(self._not_found(namespace, name)))
                    return
                result = actor.actor_id if operation == CONTROL_LOOKUP else describe_methods(type(actor.obj))
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
