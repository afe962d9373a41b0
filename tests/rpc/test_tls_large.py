"""Frames of any size over TLS (issue 23): ``ssl.SSLSocket`` has no ``sendmsg``, nor descriptor passing.

A real TLS server on 127.0.0.1 (the cluster CA and certificate made as a controller makes them)
authenticates its peer with the Fray handshake inside the TLS channel, then echoes every value it
receives; the client checks each comes back equal and of the same type. Sizes straddle the
16 KiB small-frame limit, the 64 KiB out-of-band limit and the 1 MiB memfd limit.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fray.cluster.rpc import wire
from fray.cluster.rpc.tls import TlsFiles, client_context, ensure_cluster_tls, server_context
from fray.cluster.rpc.transport import _memfd
from fray.errors import ProtocolError
from support import typed

KEY = b"tls-large-test-key"
SIZES = [1, 16 * 1024 - 1, 16 * 1024, 30_000, 1 << 20, 64 << 20]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return ensure_cluster_tls(tmp_path_factory.mktemp("tls"), ["127.0.0.1"])


def _echo(sock: ssl.SSLSocket, failures: list[BaseException]) -> None:
    """Serve one connection: authenticate the peer, then send back every value it sends."""
    try:
        with sock:
            if wire.server_handshake(sock, KEY) is None:
                return  # refused: nothing of this peer's is unpickled
            sock.settimeout(60)
            reader = wire.FrameReader(sock)
            while (frame := reader.read_frame()) is not None:
                value = wire.decode(frame.segments)
                wire.send_frame(sock, wire.FrameKind.RESULT, frame.request_id, wire.encode(value))
            reader.close()
    except BaseException as exc:  # reported by the test, which would otherwise only see a hang
        failures.append(exc)


class _Peer:
    """The client end of a TLS connection to an echo server, after the Fray handshake."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self.reader = wire.FrameReader(sock)
        self.ids = 0

    def round_trip(self, value: Any) -> Any:
        self.ids += 1
        wire.send_frame(self.sock, wire.FrameKind.CALL, self.ids, wire.encode(value))
        frame = self.reader.read_frame()
        assert frame is not None and frame.kind is wire.FrameKind.RESULT and frame.request_id == self.ids
        return wire.decode(frame.segments)


@pytest.fixture
def tcp_peer(tls_files: TlsFiles) -> Iterator[_Peer]:
    """A TLS echo server on 127.0.0.1 over TCP, and a client connected to it."""
    failures: list[BaseException] = []
    server_tls = server_context(tls_files)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(60)

        def accept() -> None:
            try:
                plain, _ = listener.accept()
                wire.tune_socket(plain)
                _echo(server_tls.wrap_socket(plain, server_side=True), failures)
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        plain = socket.create_connection(listener.getsockname()[:2], timeout=60)
        wire.tune_socket(plain)
        sock = client_context(tls_files.ca_cert).wrap_socket(plain)
        try:
            wire.client_handshake(sock, KEY, "tls-echo")
            yield _Peer(sock)
        finally:
            with contextlib.suppress(OSError):
                sock.unwrap()
            sock.close()
            thread.join(60)
    assert not thread.is_alive(), "the echo server did not end with its connection"
    assert not failures, failures


@pytest.fixture
def unix_peer(tls_files: TlsFiles) -> Iterator[_Peer]:
    """TLS over a Unix socket pair: a transport that could pass memfds, which TLS must never try."""
    failures: list[BaseException] = []
    client_end, server_end = socket.socketpair()
    server_tls = server_context(tls_files)

    def serve() -> None:
        try:
            server_end.settimeout(60)
            _echo(server_tls.wrap_socket(server_end, server_side=True), failures)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_end.settimeout(60)
    sock = client_context(tls_files.ca_cert).wrap_socket(client_end)
    try:
        wire.client_handshake(sock, KEY, "tls-echo-unix")
        yield _Peer(sock)
    finally:
        sock.close()
        thread.join(60)
    assert not thread.is_alive(), "the echo server did not end with its connection"
    assert not failures, failures


def _payloads(size: int) -> list[Any]:
    """Values of about ``size`` bytes: bytes, bytearray, and plain Python objects holding them."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    values: list[Any] = [data, bytearray(data)]
    if size <= 1 << 20:  # the 64 MiB case is about the buffers; objects of it add only time
        values += [
            {"data": data, "mutable": bytearray(data[::-1]), "n": size},
            [("x" * size, size), [bytearray(data)], {"nested": (data,)}],
        ]
    return values


@pytest.mark.parametrize("size", SIZES, ids=lambda n: f"{n}B")
def test_values_of_every_size_cross_tls_both_ways(tcp_peer: _Peer, size: int) -> None:
    for value in _payloads(size):
        back = tcp_peer.round_trip(value)
        assert type(back) is type(value)
        assert typed(back) == typed(value)


def test_many_frames_in_a_row_keep_the_stream_in_sync(tcp_peer: _Peer) -> None:
    # Alternating small (one TLS record) and large frames: a segment left half read in a
    # TLS record, or a frame sent in pieces out of order, would show as a mismatch here.
    for round_ in range(3):
        for size in (1, 40_000, 16 * 1024, 3 << 20, 100):
            value = (round_, bytearray(bytes([size % 251]) * size))
            assert typed(tcp_peer.round_trip(value)) == typed(value)


@pytest.mark.skipif(not _memfd.available(), reason="no memfds here")
@pytest.mark.parametrize("size", [_memfd.MIN_BYTES, 8 << 20], ids=lambda n: f"{n}B")
def test_tls_over_a_unix_socket_sends_large_segments_in_band(unix_peer: _Peer, size: int) -> None:
    for value in _payloads(size):
        back = unix_peer.round_trip(value)
        assert type(back) is type(value)
        assert typed(back) == typed(value)


@pytest.fixture
def tls_pair(tls_files: TlsFiles) -> Iterator[tuple[ssl.SSLSocket, ssl.SSLSocket]]:
    """Both ends of a TLS connection over a Unix socket pair: (client, server)."""
    client_end, server_end = socket.socketpair()
    client_end.settimeout(60)
    server_end.settimeout(60)
    server_side: list[ssl.SSLSocket] = []
    thread = threading.Thread(
        target=lambda: server_side.append(server_context(tls_files).wrap_socket(server_end, server_side=True))
    )
    thread.start()
    client = client_context(tls_files.ca_cert).wrap_socket(client_end)
    thread.join(60)
    with client, server_side[0] as server:
        yield client, server


def test_a_segment_claiming_a_passed_descriptor_is_refused_over_tls(
    tls_pair: tuple[ssl.SSLSocket, ssl.SSLSocket],
) -> None:
    client, server = tls_pair
    client.sendall(wire.frame_header(wire.FrameKind.CALL, 1, [5 | wire.SEGMENT_MEMFD]))
    with pytest.raises(ProtocolError, match="memfd"):
        wire.FrameReader(server).read_frame()


def test_a_frame_already_decrypted_is_read_before_a_deadline(tls_pair: tuple[ssl.SSLSocket, ssl.SSLSocket]) -> None:
    # One write, so one TLS record holds the end of the large frame and all of the small one:
    # reading the large segment exactly leaves the small frame inside the TLS layer, where
    # poll() does not see it.
    client, server = tls_pair
    large = wire.frame_header(wire.FrameKind.RESULT, 1, [200_000]) + bytes(200_000)
    small = wire.frame_header(wire.FrameKind.RESULT, 2, [3]) + b"abc"
    server.sendall(large + small)
    reader = wire.FrameReader(client)
    first = reader.read_frame()
    assert first is not None and first.request_id == 1 and len(first.segments[0]) == 200_000
    second = reader.read_frame(deadline=time.monotonic() + 5)
    assert second is not None and second.request_id == 2 and bytes(second.segments[0]) == b"abc"
