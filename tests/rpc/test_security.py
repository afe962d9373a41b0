"""Authentication before any payload is decoded, and robustness against malformed input."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fray.cluster.rpc import ActorClient, ActorServer, AuthenticationError, FixedResolver, RpcOptions
from fray.cluster.rpc.wire import PROTOCOL_VERSION
from fray.errors import ConfigError
from rpc.actors import Counter
from rpc.support import TOKEN

HELLO = struct.Struct("!4sBB32s")
AUTH = struct.Struct("!4sBB32s32s")
REPLY = struct.Struct("!4sBB32s")
HEADER = struct.Struct("!2sBBQI")


class Bomb:
    """Unpickling this creates a directory: proof that a payload was decoded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.mkdir, (self.path,))


def frame(kind: int, payload: bytes, rid: int = 1) -> bytes:
    return HEADER.pack(b"FR", PROTOCOL_VERSION, kind, rid, 1) + struct.pack("!Q", len(payload)) + payload


def recv_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def handshake(sock: socket.socket, token: bytes | None) -> bytes:
    """Run the client side of the handshake by hand; return the server's reply status byte."""
    _, _, _, server_nonce = HELLO.unpack(sock.recv(HELLO.size, socket.MSG_WAITALL))
    client_nonce = os.urandom(32)
    mac = bytes(32)
    if token is not None:
        message = b"fray-auth-v%d-client" % PROTOCOL_VERSION + server_nonce + client_nonce
        mac = hmac.new(token, message, hashlib.sha256).digest()
    sock.sendall(AUTH.pack(b"FRAY", PROTOCOL_VERSION, 1, client_nonce, mac))
    return sock.recv(REPLY.size, socket.MSG_WAITALL)


@pytest.fixture(scope="module")
def server() -> Iterator[ActorServer]:
    with ActorServer(token=TOKEN) as server:
        server.register("counter", Counter())
        yield server


def connect(server: ActorServer) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def test_wrong_or_missing_token_is_refused(shared_server, monkeypatch: pytest.MonkeyPatch) -> None:
    url = {"counter": shared_server.url("counter")}
    with pytest.raises(AuthenticationError, match="refused our token"):
        ActorClient(FixedResolver(url), "counter", token="wrong").incr()
    monkeypatch.delenv("FRAY_TOKEN")
    with pytest.raises(AuthenticationError, match="requires a token"):
        ActorClient(FixedResolver(url), "counter", RpcOptions(retries=3)).incr()


def test_client_with_token_refuses_an_unauthenticated_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with ActorServer(token="") as open_server:
        monkeypatch.delenv("FRAY_TOKEN")
        open_server.register("counter", Counter())
        url = {"counter": open_server.url("counter")}
        assert ActorClient(FixedResolver(url), "counter").incr() == 1  # no token on either side: loopback only
        with pytest.raises(AuthenticationError, match="without authentication"):
            ActorClient(FixedResolver(url), "counter", token=TOKEN).incr()


def test_server_without_token_only_binds_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRAY_TOKEN")
    with pytest.raises(ConfigError, match="no token"):
        ActorServer(host="0.0.0.0")


def test_nothing_is_unpickled_before_authentication(server: ActorServer, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    with connect(server) as sock:
        reply = handshake(sock, b"not-the-token")
        assert reply[4] != 0  # refused
        with contextlib.suppress(OSError):  # the server may already have closed
            sock.sendall(frame(1, pickle.dumps(Bomb(str(marker)))))
        recv_all(sock)
    with connect(server) as sock:  # skipping the handshake entirely
        HELLO.unpack(sock.recv(HELLO.size, socket.MSG_WAITALL))
        with contextlib.suppress(OSError):
            sock.sendall(frame(1, pickle.dumps(Bomb(str(marker)))) * 3)
        recv_all(sock)
    assert not marker.exists()
    # Control: the same bytes from an authenticated peer are decoded (so the test can fail).
    with connect(server) as sock:
        assert handshake(sock, TOKEN.encode())[4] == 0
        sock.sendall(frame(1, pickle.dumps(Bomb(str(marker)))))
        sock.recv(1)
    assert marker.exists()


def test_oversized_frame_is_rejected_without_reading_it(server: ActorServer) -> None:
    with connect(server) as sock:
        assert handshake(sock, TOKEN.encode())[4] == 0
        sock.sendall(HEADER.pack(b"FR", PROTOCOL_VERSION, 1, 7, 1) + struct.pack("!Q", 1 << 40))
        answer = recv_all(sock)  # the server explains, then closes (it does not wait for 1 TiB)
    assert b"exceeds the limit" in answer
    assert ActorClient(FixedResolver({"counter": server.url("counter")}), "counter").echo(5) == 5


def test_bad_version_and_magic_are_rejected(server: ActorServer) -> None:
    for header in (
        HEADER.pack(b"FR", PROTOCOL_VERSION + 1, 1, 1, 1),
        HEADER.pack(b"XX", PROTOCOL_VERSION, 1, 1, 1),
        HEADER.pack(b"FR", PROTOCOL_VERSION, 99, 1, 1),
        HEADER.pack(b"FR", PROTOCOL_VERSION, 1, 1, 0),
        HEADER.pack(b"FR", PROTOCOL_VERSION, 1, 1, 1 << 31),
    ):
        with connect(server) as sock:
            assert handshake(sock, TOKEN.encode())[4] == 0
            sock.sendall(header + bytes(8))
            assert recv_all(sock)[:2] == b"FR"  # a PROTOCOL_ERROR frame, then the server hangs up


def _still_serves(server: ActorServer) -> None:
    client = ActorClient(FixedResolver({"counter": server.url("counter")}), "counter", RpcOptions(timeout=10))
    assert client.echo("alive") == "alive"
    client.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_fuzz_before_authentication(server: ActorServer, data: bytes) -> None:
    with connect(server) as sock:
        sock.recv(HELLO.size, socket.MSG_WAITALL)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            recv_all(sock)
        except OSError:
            pass
    _still_serves(server)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.integers(0, 255),
    rid=st.integers(0, 2**64 - 1),
    lengths=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 64), min_size=0, max_size=4),
    body=st.binary(max_size=200),
    version=st.sampled_from([PROTOCOL_VERSION, 0, 255]),
)
def test_fuzz_after_authentication(
    server: ActorServer, kind: int, rid: int, lengths: list[int], body: bytes, version: int
) -> None:
    raw = HEADER.pack(b"FR", version, kind, rid, len(lengths)) + b"".join(struct.pack("!Q", n) for n in lengths)
    with connect(server) as sock:
        assert handshake(sock, TOKEN.encode())[4] == 0
        try:
            sock.sendall(raw + body)
            sock.shutdown(socket.SHUT_WR)  # a truncated frame ends here: the server must not wait forever
            recv_all(sock)
        except OSError:
            pass
    _still_serves(server)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=200))
def test_fuzz_garbage_payloads_get_an_error_not_a_crash(server: ActorServer, payload: bytes) -> None:
    with connect(server) as sock:
        assert handshake(sock, TOKEN.encode())[4] == 0
        sock.sendall(frame(1, payload, rid=9) + frame(2, payload, rid=10))
        sock.shutdown(socket.SHUT_WR)
        answer = recv_all(sock)
    assert answer.count(b"FR") >= 1  # each frame got an answer (an ERROR frame)
    _still_serves(server)
