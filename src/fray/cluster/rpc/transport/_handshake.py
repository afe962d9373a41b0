"""The Fray actor handshake: an HMAC-SHA256 challenge-response over two nonces, in both directions.

A connection starts with it (:func:`server_handshake`, :func:`client_handshake`), before any
frame (:mod:`fray.cluster.rpc.wire`): only fixed-size binary records and a bounded principal name
are read, and nothing is unpickled until it has succeeded. Both ends then derive the
connection's session key (:func:`session_key`). :mod:`fray.cluster.rpc.wire` re-exports every public
name here. See ``docs/protocol.md`` for the byte layout and the versioning rule.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import NamedTuple

from fray.errors import AuthenticationError, ProtocolError

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "MAX_PRINCIPAL_BYTES",
    "PROTOCOL_VERSION",
    "Authenticated",
    "KeySource",
    "client_handshake",
    "server_handshake",
    "session_key",
]

#: Version of the frame layout and handshake. Bumped on any incompatible change;
#: both ends refuse a peer with another version during the handshake.
PROTOCOL_VERSION = 4

_HANDSHAKE_MAGIC = b"FRAY"
_NONCE_BYTES = 32
_MAC_BYTES = 32

# HELLO (server -> client): magic, version, flags, server nonce.
_HELLO = struct.Struct("!4sBB32s")
# AUTH (client -> server): magic, version, flags, client nonce, client MAC.
_AUTH = struct.Struct("!4sBB32s32s")
# AUTH_REPLY (server -> client): magic, status, flags, server MAC.
_AUTH_REPLY = struct.Struct("!4sBB32s")
_FLAG_TOKEN = 1  # in HELLO: the server requires a token; in AUTH: the client has one.
_FLAG_PRINCIPAL = 2  # in AUTH: a u16 length and a principal name follow the record.
_PRINCIPAL_LENGTH = struct.Struct("!H")
#: Longest principal name a handshake may carry.
MAX_PRINCIPAL_BYTES = 512
_STATUS_OK = 0
_STATUS_REFUSED = 1
_STATUS_VERSION = 2

# The whole handshake of a peer must end within this many seconds (a peer that connects and
# then says nothing, or trickles its bytes, must not hold a thread for long).
HANDSHAKE_TIMEOUT = 5.0


def _mac(token: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    # The role label keeps a client's proof from being replayed as a server's and vice versa.
    message = b"fray-auth-v%d-%s" % (PROTOCOL_VERSION, role) + server_nonce + client_nonce
    return hmac.new(token, message, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            # The deadline covers the whole handshake: a peer trickling one byte at a time
            # cannot hold the connection longer by resetting a per-read timeout.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the handshake took too long")
            sock.settimeout(remaining)
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed during the handshake")
        got += k
    return bytes(buf)


KeySource = bytes | None | Callable[[str], "bytes | None"]
"""What a server checks proofs against: one token, none, or a function from principal to key (None: unknown)."""


def _key_for(keys: KeySource, principal: str) -> bytes | None:
    if callable(keys):
        return keys(principal)
    return keys if principal == "" else None


class Authenticated(NamedTuple):
    """A successful server handshake: who the peer proved to be, and the connection's session key.

    The session key (empty without authentication) is fresh per connection and known only
    to the two ends; protocols that authenticate every frame use it (see :func:`session_key`).
    """

    principal: str
    session: bytes


def session_key(key: bytes, server_nonce: bytes, client_nonce: bytes, principal: bytes) -> bytes:
    """The key both ends derive after a handshake: nobody who merely relayed the handshake knows it."""
    return hmac.new(key, b"fray-session-v1" + server_nonce + client_nonce + principal, hashlib.sha256).digest()


def server_handshake(sock: socket.socket, keys: KeySource, deadline: float | None = None) -> Authenticated | None:
    """Run the server side of the handshake on a freshly accepted socket.

    Returns the authenticated *principal* ("" for a peer proving the plain token) and the
    session key when the peer may send frames, None (after telling the peer why, where the format
    allows) when it must be disconnected. ``keys`` is the token, None (no
    authentication: loopback only), or a function giving the key of a principal
    (``"worker"``, ``"user:alice"``, ``"job:<id>"``...; None refuses it). Only fixed-size
    binary records and a bounded principal name are read here: nothing from an
    unauthenticated peer is unpickled. ``deadline`` (a ``time.monotonic()`` value,
    default :data:`HANDSHAKE_TIMEOUT` from now) bounds the whole handshake; past it,
    ``TimeoutError``.
    """
    if deadline is None:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
    server_nonce = os.urandom(_NONCE_BYTES)
    flags = _FLAG_TOKEN if keys is not None else 0
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    sock.sendall(_HELLO.pack(_HANDSHAKE_MAGIC, PROTOCOL_VERSION, flags, server_nonce))
    magic, version, client_flags, client_nonce, client_mac = _AUTH.unpack(_recv_exact(sock, _AUTH.size, deadline))
    if magic != _HANDSHAKE_MAGIC:
        return None
    if version != PROTOCOL_VERSION:
        sock.sendall(_AUTH_REPLY.pack(_HANDSHAKE_MAGIC, _STATUS_VERSION, PROTOCOL_VERSION, bytes(_MAC_BYTES)))
        return None
    principal = ""
    if client_flags & _FLAG_PRINCIPAL:
        (length,) = _PRINCIPAL_LENGTH.unpack(_recv_exact(sock, _PRINCIPAL_LENGTH.size, deadline))
        if length > MAX_PRINCIPAL_BYTES:
            return None
        try:
            principal = _recv_exact(sock, length, deadline).decode()
        except UnicodeDecodeError:
            return None
    if keys is None:
        # Unauthenticated servers only ever listen on loopback (see ActorServer).
        sock.sendall(_AUTH_REPLY.pack(_HANDSHAKE_MAGIC, _STATUS_OK, 0, bytes(_MAC_BYTES)))
        return Authenticated("", b"")
    key = _key_for(keys, principal)
    expected = _mac(key, b"client", server_nonce, client_nonce + principal.encode()) if key is not None else None
    if expected is None or not (client_flags & _FLAG_TOKEN) or not hmac.compare_digest(expected, client_mac):
        sock.sendall(_AUTH_REPLY.pack(_HANDSHAKE_MAGIC, _STATUS_REFUSED, 0, bytes(_MAC_BYTES)))
        return None
    assert key is not None
    proof = _mac(key, b"server", server_nonce, client_nonce + principal.encode())
    sock.sendall(_AUTH_REPLY.pack(_HANDSHAKE_MAGIC, _STATUS_OK, _FLAG_TOKEN, proof))
    return Authenticated(principal, session_key(key, server_nonce, client_nonce, principal.encode()))


def client_handshake(sock: socket.socket, token: bytes | None, address: str, principal: str = "") -> bytes:
    """Run the client side of the handshake; raise unless both sides proved the same key; return the session key.

    ``principal`` names whose key ``token`` is ("" for the plain token, else e.g.
    ``"user:alice"``). A client that holds a token also requires the *server* to prove
    it, so results are never unpickled from an impostor. A client without a token only
    talks to a server without one, and only over loopback.
    """
    magic, version, flags, server_nonce = _HELLO.unpack(_recv_exact(sock, _HELLO.size))
    if magic != _HANDSHAKE_MAGIC:
        raise ProtocolError(f"{address} is not a Fray actor server (bad handshake magic {magic!r})")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"{address} speaks Fray protocol version {version}, this client speaks {PROTOCOL_VERSION}")
    server_wants_token = bool(flags & _FLAG_TOKEN)
    if token is not None and not server_wants_token:
        raise AuthenticationError(
            f"actor server at {address} runs without authentication but this client has a token; "
            "refusing to exchange pickles with a server that cannot prove it holds the token"
        )
    if token is None and server_wants_token:
        # Still complete the exchange so the server can log a clean refusal.
        client_nonce = os.urandom(_NONCE_BYTES)
        sock.sendall(_AUTH.pack(_HANDSHAKE_MAGIC, PROTOCOL_VERSION, 0, client_nonce, bytes(_MAC_BYTES)))
        raise AuthenticationError(
            f"actor server at {address} requires a token; set FRAY_TOKEN (or pass token=) to the cluster token"
        )
    if token is None and not _is_loopback_peer(sock):
        raise AuthenticationError(
            f"refusing an unauthenticated connection to {address}: without a token only loopback is allowed"
        )
    client_nonce = os.urandom(_NONCE_BYTES)
    name = principal.encode()
    if len(name) > MAX_PRINCIPAL_BYTES:
        raise AuthenticationError(f"principal name {principal!r} is too long")
    client_mac = _mac(token, b"client", server_nonce, client_nonce + name) if token is not None else bytes(_MAC_BYTES)
    flags_out = (_FLAG_TOKEN if token is not None else 0) | (_FLAG_PRINCIPAL if principal else 0)
    record = _AUTH.pack(_HANDSHAKE_MAGIC, PROTOCOL_VERSION, flags_out, client_nonce, client_mac)
    if principal:
        record += _PRINCIPAL_LENGTH.pack(len(name)) + name
    sock.sendall(record)
    magic, status, _flags, server_mac = _AUTH_REPLY.unpack(_recv_exact(sock, _AUTH_REPLY.size))
    if magic != _HANDSHAKE_MAGIC:
        raise ProtocolError(f"{address} sent a bad handshake reply")
    if status == _STATUS_VERSION:
        raise ProtocolError(f"{address} does not support Fray protocol version {PROTOCOL_VERSION}")
    who = f"the credential of {principal!r}" if principal else "our token (is FRAY_TOKEN the cluster's?)"
    if status != _STATUS_OK:
        raise AuthenticationError(f"server at {address} refused {who}")
    if token is not None and not hmac.compare_digest(
        server_mac, _mac(token, b"server", server_nonce, client_nonce + name)
    ):
        raise AuthenticationError(f"server at {address} could not prove it holds the key of {who}")
    return session_key(token, server_nonce, client_nonce, name) if token is not None else b""


def _is_loopback_peer(sock: socket.socket) -> bool:
    if sock.family == socket.AF_UNIX:
        return True  # a Unix socket never leaves the machine
    host = sock.getpeername()[0]
    return bool(host.startswith("127.") or host in ("::1", "localhost"))
