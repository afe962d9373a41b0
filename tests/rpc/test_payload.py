"""Buffers out of band: every buffer type keeps its type and stays writable, and nothing is shared by mistake."""

from __future__ import annotations

import array
import socket
import threading

import numpy as np
import pytest

from fray.cluster.rpc import ActorClient, FixedResolver, wire
from fray.errors import ProtocolError

BIG = 1 << 20  # above the out-of-band threshold


def client_for(server, name: str) -> ActorClient:
    return ActorClient(FixedResolver({name: server.url(name)}), name)


def describe(value):
    """What the server received: its type, and whether it can be written to."""
    if isinstance(value, np.ndarray):
        return ("ndarray", bool(value.flags.writeable))
    if isinstance(value, memoryview):
        return ("memoryview", not value.readonly, value.format, value.shape)
    return (type(value).__name__, True)


@pytest.mark.parametrize("size", [512, BIG])
def test_every_buffer_type_round_trips_with_its_type_and_is_writable(shared_server, size: int) -> None:
    counter = client_for(shared_server, "counter")
    data = bytearray(range(256)) * (size // 256)
    back = counter.echo(data)
    assert type(back) is bytearray and back == data
    back[0] ^= 1  # writable
    doubles = np.arange(size // 8, dtype=np.float64).reshape(-1, 4)
    view = memoryview(doubles)
    echoed = counter.echo(view)
    assert isinstance(echoed, memoryview) and echoed.format == "d" and echoed.shape == view.shape
    assert echoed.tolist() == view.tolist() and not echoed.readonly
    assert counter.echo(view.toreadonly()).readonly
    numbers = array.array("i", range(size // 4))
    assert counter.echo(numbers) == numbers
    arr = counter.echo(np.full(size // 8, 3.0))
    assert arr.flags.writeable and float(arr.sum()) == 3.0 * (size // 8)
    arr += 1  # received arrays are ordinary arrays, small or large


def test_the_server_receives_the_same_types_writable(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    for value, expected in [
        (bytearray(BIG), ("bytearray", True)),
        (np.zeros(BIG // 8), ("ndarray", True)),
        (np.zeros(10), ("ndarray", True)),
        (memoryview(bytearray(BIG)), ("memoryview", True, "B", (BIG,))),
    ]:
        assert counter.apply(describe, value) == expected


def test_a_strided_memoryview_travels_as_a_copy(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    matrix = np.arange(BIG // 8, dtype=np.int64).reshape(-1, 8)
    strided = memoryview(matrix)[::2]
    assert counter.echo(strided).tolist() == strided.tolist()


def test_a_received_array_keeps_its_memory_when_more_frames_arrive(shared_server) -> None:
    # The reader reuses a large receive buffer only once nothing refers to it.
    counter = client_for(shared_server, "counter")
    first = counter.echo(np.ones(8 << 20, dtype=np.uint8))
    second = counter.echo(np.full(8 << 20, 2, dtype=np.uint8))
    third = counter.echo(bytes(8 << 20))  # copied out: its buffer may be reused
    fourth = counter.echo(np.full(8 << 20, 4, dtype=np.uint8))
    assert int(first.min()) == int(first.max()) == 1
    assert int(second.min()) == int(second.max()) == 2
    assert third == bytes(8 << 20)
    assert int(fourth.min()) == int(fourth.max()) == 4


@pytest.mark.parametrize("kind", [bytearray, bytes])
@pytest.mark.parametrize("size", [BIG, 8 * BIG], ids=["1MiB", "8MiB"])  # 8 MiB: built through the C API
def test_bytes_and_bytearray_segments_are_received_into_the_value_itself(kind: type, size: int) -> None:
    data = kind(np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8).tobytes())
    segments = wire.encode(data)
    sender, receiver = socket.socketpair()
    writer = threading.Thread(target=wire.send_frame, args=(sender, wire.FrameKind.RESULT, 7, segments))
    writer.start()
    frame = wire.FrameReader(receiver).read_frame()
    writer.join()
    sender.close()
    receiver.close()
    assert frame is not None and type(frame.segments[1]) is kind
    back = wire.decode(frame.segments)
    assert back is frame.segments[1], "the received object is the value: no copy"
    assert back == data and len(back) == size
    if kind is bytes:  # an ordinary bytes object: hashes like its contents, works as a key
        assert hash(back) == hash(bytes(data)) and {back: 1}[bytes(data)] == 1


def test_unknown_segment_flags_are_a_protocol_error() -> None:
    sender, receiver = socket.socketpair()
    sender.sendall(wire.frame_header(wire.FrameKind.RESULT, 1, [3 | (1 << 60)]) + b"abc")
    with pytest.raises(ProtocolError, match="segment table"):
        wire.FrameReader(receiver).read_frame()
    sender.close()
    receiver.close()
