"""The local transport: same-host clients move to a Unix socket, large segments travel as memfds, safely."""

from __future__ import annotations

import array
import fcntl
import os
import socket
import threading

import numpy as np
import pytest

from fray.cluster.rpc import ActorClient, FixedResolver, wire
from fray.cluster.rpc.transport import _memfd
from fray.errors import ProtocolError

pytestmark = pytest.mark.skipif(not _memfd.available(), reason="memfds are Linux-only")

BIG = 4 << 20


def client_for(server, name: str) -> ActorClient:
    return ActorClient(FixedResolver({name: server.url(name)}), name)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_client_on_the_same_host_moves_to_the_local_transport(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    assert counter.echo(1) == 1
    assert counter._channel._conn is not None and counter._channel._conn.is_local


def test_the_local_transport_can_be_turned_off(shared_server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAY_RPC_LOCAL", "0")
    counter = client_for(shared_server, "counter")
    assert counter.echo(np.ones(BIG // 8)).sum() == BIG // 8
    assert counter._channel._conn is not None and not counter._channel._conn.is_local


@pytest.mark.parametrize("local", [True, False], ids=["local", "tcp"])
def test_large_values_of_every_kind_round_trip_on_both_transports(
    shared_server, monkeypatch: pytest.MonkeyPatch, local: bool
) -> None:
    if not local:
        monkeypatch.setenv("FRAY_RPC_LOCAL", "0")
    counter = client_for(shared_server, "counter")
    array_in = np.arange(BIG // 8, dtype=np.float64)
    data = os.urandom(BIG) * 5  # above the size received into huge-page-backed new objects
    for _ in range(3):  # the second and later rounds reuse spare memfds
        back = counter.echo({"a": array_in, "b": data, "c": bytearray(data), "d": memoryview(data)})
        assert np.array_equal(back["a"], array_in) and back["a"].flags.writeable
        assert type(back["b"]) is bytes and back["b"] == data
        assert type(back["c"]) is bytearray and back["c"] == data
        assert isinstance(back["d"], memoryview) and back["d"] == data
        back["a"][0] = -1.0  # copy-on-write: changes nothing anywhere else
        assert array_in[0] == 0.0


def test_large_calls_leave_no_descriptors_behind(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    payload = np.ones(BIG, dtype=np.uint8)
    for _ in range(3):
        counter.echo(payload)
    before = open_fds()
    for _ in range(20):
        assert counter.echo(payload).sum() == BIG
    # Spares are bounded: the count may move by the few the process keeps, never grow per call.
    assert open_fds() <= before + _memfd.MAX_SPARES


def test_a_value_kept_by_the_receiver_is_never_overwritten_by_later_calls(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    kept = [counter.echo(np.full(BIG, i, dtype=np.uint8)) for i in range(6)]
    for i, value in enumerate(kept):
        assert int(value.min()) == int(value.max()) == i


# -- what a receiver accepts --------------------------------------------------------------------


def _send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])


def _memfd_of(data: bytes, seal: bool = True) -> int:
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def _frame_naming_a_memfd(length: int) -> bytes:
    pickled = wire.encode(b"")[0]
    return wire.frame_header(wire.FrameKind.RESULT, 1, [len(pickled), length | wire.SEGMENT_MEMFD]) + pickled


def test_a_sealed_memfd_is_accepted() -> None:
    sender, receiver = socket.socketpair()
    fd = _memfd_of(b"x" * 4096)
    _send_with_fds(sender, _frame_naming_a_memfd(4096), [fd])
    os.close(fd)
    frame = wire.FrameReader(receiver).read_frame()
    assert frame is not None and bytes(frame.segments[1]) == b"x" * 4096
    sender.close()
    receiver.close()


@pytest.mark.parametrize("problem", ["unsealed", "too small", "not a memfd", "missing"])
def test_a_bad_descriptor_is_a_protocol_error_and_is_closed(problem: str, tmp_path) -> None:
    sender, receiver = socket.socketpair()
    if problem == "unsealed":
        fds = [_memfd_of(b"x" * 4096, seal=False)]
    elif problem == "too small":
        fds = [_memfd_of(b"x" * 100)]
    elif problem == "not a memfd":
        path = tmp_path / "file"
        path.write_bytes(b"x" * 4096)
        fds = [os.open(path, os.O_RDONLY)]
    else:
        fds = []
    frame = _frame_naming_a_memfd(4096)
    if fds:
        _send_with_fds(sender, frame, fds)
        for fd in fds:
            os.close(fd)
    else:
        sender.sendall(frame)
    before = open_fds()
    reader = wire.FrameReader(receiver)
    with pytest.raises(ProtocolError):
        reader.read_frame()
    reader.close()
    assert open_fds() <= before, "the received descriptor was closed"
    sender.close()
    receiver.close()


def test_descriptors_nobody_claims_are_closed_with_the_reader() -> None:
    sender, receiver = socket.socketpair()
    fd = _memfd_of(b"x" * 4096)
    pickled = wire.encode(7)[0]
    _send_with_fds(sender, wire.frame_header(wire.FrameKind.RESULT, 1, [len(pickled)]) + pickled, [fd])
    os.close(fd)
    reader = wire.FrameReader(receiver)
    before = open_fds()
    frame = reader.read_frame()
    assert frame is not None and wire.decode(frame.segments) == 7
    reader.close()
    assert open_fds() == before, "the descriptor received with the frame was closed"
    sender.close()
    receiver.close()


def test_spares_are_bounded_and_reused() -> None:
    spares = _memfd.Spares(max_bytes=3 << 20, max_count=2)
    fds = [spares.fill(b"a" * (1 << 20)) for _ in range(3)]
    for fd in fds:
        spares.keep(fd, 1 << 20)
    assert len(spares._spares) == 2
    again = spares.fill(b"b" * (1 << 20))
    assert again in fds and len(spares._spares) == 1
    assert os.pread(again, 4, 0) == b"bbbb"
    os.close(again)
    spares.clear()


def test_a_mapping_returns_its_memfd_once_freed() -> None:
    spares = _memfd.Spares()
    fd = _memfd_of(b"z" * 8192)
    mapped = spares.map(fd, 8192)
    view = np.frombuffer(mapped, dtype=np.uint8)
    assert not spares._spares
    del view, mapped
    assert [size for size, _ in spares._spares] == [8192]
    spares.clear()


def test_concurrent_large_calls_on_one_client(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(5):
                assert int(counter.echo(np.full(BIG, i, dtype=np.uint8)).max()) == i
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
