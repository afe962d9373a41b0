"""A data-only RPC on the Fray framing: nothing is unpickled on either side.

The cluster controller speaks this instead of the actor protocol, so that no peer --
not even an authenticated one -- can make it run code by sending a crafted pickle.
Connections are authenticated exactly like actor connections (the handshake of
:mod:`fray.cluster.rpc.wire`), and frames use the same header; what differs is the payload:

* CALL: one segment, msgpack ``[method, args (list), kwargs (map)]``;
* RESULT: one segment, the msgpack return value;
* ERROR: one segment, msgpack ``{"type": name, "message": text}`` -- the name of a
  :mod:`fray.errors` class, which the client raises again (anything else becomes a
  plain :class:`~fray.errors.FrayError`).

msgpack carries only nil, booleans, numbers, strings, byte strings, arrays and maps;
user payloads travel as opaque byte strings that only a task or a client opens.

Every frame after the handshake is authenticated: its segment starts with a 32-byte
HMAC-SHA256 tag, under the connection's session key (:func:`fray.cluster.rpc.wire.session_key`),
over the direction, the frame's sequence number on that direction, its request id,
kind and payload. A man-in-the-middle who relays a token holder's handshake gains
nothing: without the session key it can neither inject, alter, replay nor reorder a
frame -- the receiver drops the connection at the first bad tag.

:class:`DataServer` serves one handler function (a connection thread per client
connection, each running its calls in order); :class:`DataClient` keeps a small pool
of connections so that a long-poll in one thread does not hold up calls from others.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from fray import errors
from fray.cluster.rpc import wire
from fray.cluster.rpc._accept import Acceptor, Limits
from fray.cluster.rpc.server import bind_listener
from fray.cluster.rpc.tls import (
    UntrustedServerError,
    client_context,
    default_ca,
    fetch_pinned_ca,
    is_loopback_address,
    missing_ca,
)
from fray.errors import (
    ActorUnavailableError,
    CallNotSentError,
    FrayError,
    ProtocolError,
    RpcTimeoutError,
    SerializationError,
)

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "DataClient", "DataServer", "pack", "unpack"]

logger = logging.getLogger(__name__)

#: Largest request a DataServer accepts by default: 256 MiB.
DEFAULT_MAX_REQUEST_BYTES = 256 << 20

_TAG_BYTES = 32
_SEQ = struct.Struct("!QQB")

# Errors whose constructor takes more than a message are never rebuilt by name.
_NOT_REBUILT = frozenset({"JobFailed", "RemoteError"})


def pack(value: Any) -> bytes:
    """``value`` as msgpack (tuples become arrays); SerializationError for anything that is not plain data."""
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"not plain data (nil, bool, number, str, bytes, list, map): {exc}") from exc


def unpack(data: bytes | bytearray) -> Any:
    """Decode msgpack; ProtocolError if it is not well-formed."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"malformed msgpack payload: {exc}") from exc


class _Integrity:
    """Tags and checks the frames of one connection (see the module docstring)."""

    def __init__(self, session: bytes, sends: bytes, receives: bytes) -> None:
        self._session = session
        self._sends, self._receives = sends, receives
        self._sent = 0
        self._received = 0

    def _tag(self, direction: bytes, seq: int, request_id: int, kind: int, payload: bytes | memoryview) -> bytes:
        mac = hmac.new(self._session, direction + _SEQ.pack(seq, request_id, kind), hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def seal(self, kind: wire.FrameKind, request_id: int, payload: bytes) -> bytes:
        tag = self._tag(self._sends, self._sent, request_id, int(kind), payload)
        self._sent += 1
        return tag + payload

    def open(self, frame: wire.Frame) -> bytes:
        """The payload of a received frame; ProtocolError if its tag is wrong."""
        segment = frame.segments[0]
        if len(segment) < _TAG_BYTES:
            raise ProtocolError("frame without an integrity tag")
        view = memoryview(segment)
        expected = self._tag(self._receives, self._received, frame.request_id, int(frame.kind), view[_TAG_BYTES:])
        if not hmac.compare_digest(expected, bytes(view[:_TAG_BYTES])):
            raise ProtocolError("frame failed its integrity check (altered, replayed or injected)")
        self._received += 1
        return bytes(view[_TAG_BYTES:])


def _error_payload(exc: BaseException) -> bytes:
    if not isinstance(exc, FrayError):
        return pack({"type": "FrayError", "message": f"internal error: {type(exc).__name__}: {exc}"})
    # An error's own plain fields travel too (JobAlreadyExists.job_name, ...), never objects.
    fields = {k: v for k, v in vars(exc).items() if not k.startswith("_") and isinstance(v, str | int | float | bool)}
    return pack({"type": type(exc).__name__, "message": str(exc), "fields": fields})


def _rebuild_error(payload: Any, what: str) -> FrayError:
    if not isinstance(payload, dict) or not isinstance(payload.get("message"), str):
        return ProtocolError(f"malformed error report for {what}")
    kind, message = payload.get("type"), payload["message"]
    cls = getattr(errors, kind, None) if isinstance(kind, str) and kind not in _NOT_REBUILT else None
    if not (isinstance(cls, type) and issubclass(cls, FrayError)):
        return FrayError(message)
    # Rebuilt without the class's own __init__ (whose parameters differ by class): the message
    # as it was worded there, then the plain fields it carried.
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    fields = payload.get("fields")
    if isinstance(fields, dict):
        for key, value in fields.items():
            if isinstance(key, str) and not key.startswith("_") and isinstance(value, str | int | float | bool):
                setattr(err, key, value)
    return err


class DataServer:
    """Serves ``handler(principal, method, args, kwargs) -> plain data`` on ``host:port`` to authenticated clients.

    ``keys`` is the token, or a function from principal to key (see
    :func:`~fray.cluster.rpc.wire.server_handshake`); the handler learns which principal
    authenticated the connection. With ``tls``, peers beyond this machine must use TLS
    (see :mod:`fray.cluster.rpc.tls`).

    ``handler`` raises a :class:`~fray.errors.FrayError` to answer with that error;
    anything else is logged and answered as an internal error. Requests larger than
    ``max_request_bytes`` are refused before they are read.
    """

    def __init__(
        self,
        handler: Callable[[str, str, list[Any], dict[str, Any]], Any],
        host: str = "127.0.0.1",
        port: int = 0,
        keys: wire.KeySource = None,
        *,
        advertise_host: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        limits: Limits | None = None,
        name: str = "fray",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if keys is None:
            raise FrayError("a DataServer always requires a token (or a key for each principal)")
        self._handler = handler
        self._max_request_bytes = max_request_bytes
        self._listener, self._port, self._advertise_host = bind_listener(host, port, advertise_host, name)
        self._acceptor = Acceptor(self._listener, keys, self._serve, limits=limits, name=name, tls=tls)
        self._stopped = False

    @property
    def address(self) -> str:
        """``host:port`` where clients reach this server."""
        host = f"[{self._advertise_host}]" if ":" in self._advertise_host else self._advertise_host
        return f"{host}:{self._port}"

    def start(self) -> DataServer:
        """Serve in background threads."""
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting and drop every connection."""
        if self._stopped:
            return
        self._stopped = True
        self._acceptor.stop()
        self._listener.close()

    def _serve(self, sock: socket.socket, peer: str, authenticated: wire.Authenticated) -> None:
        integrity = _Integrity(authenticated.session, b"S", b"C")
        reader = wire.FrameReader(sock, max_frame_bytes=self._max_request_bytes, max_segments=1)
        while True:
            try:
                frame = reader.read_frame()
                if frame is None:
                    return
                if frame.kind is not wire.FrameKind.CALL:
                    raise ProtocolError(f"clients may not send {frame.kind.name} frames")
                payload = integrity.open(frame)
            except ProtocolError as exc:
                logger.warning("dropping connection from %s: %s", peer, exc)
                with contextlib.suppress(OSError):
                    wire.send_frame(sock, wire.FrameKind.PROTOCOL_ERROR, 0, [str(exc).encode()])
                return
            kind, answer = self._answer(payload, peer, authenticated.principal)
            wire.send_frame(sock, kind, frame.request_id, [integrity.seal(kind, frame.request_id, answer)])

    def _answer(self, segment: bytes | bytearray, peer: str, principal: str) -> tuple[wire.FrameKind, bytes]:
        try:
            request = unpack(segment)
            if not (
                isinstance(request, list)
                and len(request) == 3
                and isinstance(request[0], str)
                and isinstance(request[1], list)
                and isinstance(request[2], dict)
            ):
                raise ProtocolError("a call is [method, args, kwargs]")
            method, args, kwargs = request
            return wire.FrameKind.RESULT, pack(self._handler(principal, method, args, kwargs))
        except FrayError as exc:
            return wire.FrameKind.ERROR, _error_payload(exc)
        except Exception as exc:
            logger.exception("internal error answering %s", peer)
            return wire.FrameKind.ERROR, _error_payload(exc)


class _Conn:
    def __init__(
        self, host: str, port: int, token: bytes | None, principal: str, timeout: float, ca: Path | None, pin: str = ""
    ) -> None:
        tls = None
        if not is_loopback_address(host):
            if ca is None and pin:
                # The credential pins the controller's CA: find it (a TLS handshake, nothing secret) and
                # trust only it, so an impostor is refused before the Fray handshake.
                ca_pem = fetch_pinned_ca(host, port, pin, min(timeout, wire.HANDSHAKE_TIMEOUT))
                tls = client_context(ca_pem=ca_pem)
            else:
                ca = ca or default_ca(host, port)
                if ca is None:
                    raise missing_ca(host, port)
                tls = client_context(ca)
        sock = socket.create_connection((host, port), timeout=min(timeout, wire.HANDSHAKE_TIMEOUT))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if tls is not None:
                try:
                    sock = tls.wrap_socket(sock)
                except ssl.SSLCertVerificationError as exc:
                    raise UntrustedServerError(
                        f"{host}:{port} did not present a certificate of this cluster's CA ({ca or pin}): {exc}"
                    ) from None
            session = wire.client_handshake(sock, token, f"{host}:{port}", principal)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = wire.FrameReader(sock, max_segments=1)
        self.integrity = _Integrity(session, b"C", b"S")
        self.ids = 0

    def idle_and_open(self) -> bool:
        """False if the server closed this idle connection (e.g. it restarted)."""
        # A server never speaks unasked: anything readable on an idle connection (EOF, a
        # reset, stray bytes) means it is finished. poll(), unlike select(), takes any fd.
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            return not poller.poll(0)
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class DataClient:
    """Calls a :class:`DataServer` at ``address`` (``host:port``); thread-safe, with a pool of connections.

    ``token`` is the key of ``principal`` ("" for the plain token). A server beyond this
    machine is reached over TLS, trusting the CA certificate ``ca`` (default: see
    :func:`~fray.cluster.rpc.tls.default_ca`), or the CA whose pin is ``pin`` when no ``ca`` is given
    (:func:`~fray.cluster.rpc.tls.fetch_pinned_ca`).

    A call that provably was not sent (no connection could be opened) raises
    :class:`~fray.errors.CallNotSentError`; one whose connection broke after it was sent
    raises :class:`~fray.errors.ActorUnavailableError` ("may or may not have run"); one
    without an answer within ``timeout`` seconds raises
    :class:`~fray.errors.RpcTimeoutError`. Server-side errors are raised as their
    :mod:`fray.errors` class.
    """

    def __init__(
        self,
        address: str,
        token: bytes | None,
        *,
        principal: str = "",
        timeout: float = 30.0,
        max_idle: int = 4,
        ca: Path | None = None,
        pin: str = "",
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self._host, self._port = host.strip("[]"), int(port)
        self._token = token
        self._principal = principal
        self._ca = ca
        self._pin = pin
        self.timeout = timeout
        self._lock = threading.Lock()
        self._idle: list[_Conn] = []
        self._max_idle = max_idle

    def call(self, method: str, args: list[Any], kwargs: dict[str, Any], timeout: float | None = None) -> Any:
        """Call ``method`` and return its (msgpack-decoded) result."""
        timeout = self.timeout if timeout is None else timeout
        request = pack([method, args, kwargs])
        what = f"controller call {method} at {self.address}"
        conn = self._take()
        if conn is None:
            try:
                conn = _Conn(self._host, self._port, self._token, self._principal, timeout, self._ca, self._pin)
            except (OSError, EOFError) as exc:
                raise CallNotSentError(f"{what} was not sent: cannot connect: {exc}") from None
        conn.ids += 1
        try:
            segment = conn.integrity.seal(wire.FrameKind.CALL, conn.ids, request)
            wire.send_frame(conn.sock, wire.FrameKind.CALL, conn.ids, [segment])
        except OSError as exc:
            conn.close()
            raise CallNotSentError(f"{what} was not sent: {exc}") from None
        try:
            frame = conn.reader.read_frame(time.monotonic() + timeout)
        except TimeoutError:
            conn.close()
            raise RpcTimeoutError(f"{what} did not complete within {timeout}s; it may or may not have run") from None
        except (OSError, ProtocolError, ValueError) as exc:
            conn.close()
            raise ActorUnavailableError(
                f"connection lost during {what} ({exc}); the call may or may not have run"
            ) from None
        if frame is None or frame.request_id != conn.ids:
            conn.close()
            raise ActorUnavailableError(f"the server closed the connection during {what}; it may or may not have run")
        if frame.kind is wire.FrameKind.PROTOCOL_ERROR:
            conn.close()
            raise ProtocolError(f"{self.address} refused {what}: {bytes(frame.segments[0]).decode(errors='replace')}")
        try:
            payload = conn.integrity.open(frame)
        except ProtocolError:
            conn.close()
            raise
        self._give_back(conn)
        if frame.kind is wire.FrameKind.RESULT:
            return unpack(payload)
        if frame.kind is wire.FrameKind.ERROR:
            raise _rebuild_error(unpack(payload), what)
        raise ProtocolError(f"{self.address} answered {what} with a {frame.kind.name} frame")

    def _take(self) -> _Conn | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if conn.idle_and_open():
                return conn
            conn.close()

    def _give_back(self, conn: _Conn) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (calls in flight finish on theirs)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
