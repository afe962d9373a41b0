"""The framing layer: frames survive any split into reads, payloads round-trip without copies."""

from __future__ import annotations

import pickle
import socket
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fray.cluster.rpc import wire
from fray.cluster.rpc.protocol import ErrorCode, decode_error, encode_error
from fray.errors import SerializationError


class _Capture:
    """Stands in for a socket: records what send_frame writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data: bytes) -> None:
        self.data += data

    def sendmsg(self, buffers: list[memoryview]) -> int:
        for buffer in buffers:
            self.data += buffer
        return sum(len(b) for b in buffers)


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from(list(wire.FrameKind)),
            st.integers(0, 2**64 - 1),
            st.lists(st.integers(0, 300_000), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=6,
    ),
    chunk=st.integers(1, 70_000),
)
def test_frames_survive_any_split_into_reads(frames: list[tuple[wire.FrameKind, int, list[int]]], chunk: int) -> None:
    expected = [(kind, rid, [bytes([i % 251]) * size for i, size in enumerate(sizes)]) for kind, rid, sizes in frames]
    capture = _Capture()
    for kind, rid, segments in expected:
        wire.send_frame(capture, kind, rid, segments)  # type: ignore[arg-type]
    stream = bytes(capture.data)
    sender_side, receiver_side = socket.socketpair()

    def dribble() -> None:
        for start in range(0, len(stream), chunk):
            sender_side.sendall(stream[start : start + chunk])
        sender_side.close()

    writer = threading.Thread(target=dribble)
    writer.start()
    reader = wire.FrameReader(receiver_side)
    got = []
    while (frame := reader.read_frame()) is not None:
        got.append((frame.kind, frame.request_id, [bytes(s) for s in frame.segments]))
    writer.join()
    receiver_side.close()
    assert got == expected


def test_encode_sends_large_buffers_out_of_band() -> None:
    array = np.arange(1_000_000, dtype=np.float64)
    blob = b"z" * 200_000
    segments = wire.encode({"array": array, "blob": blob, "small": b"abc"})
    assert len(segments) == 3  # the pickle plus two out-of-band buffers
    assert sum(memoryview(s).nbytes for s in segments[1:]) == array.nbytes + len(blob)
    back = wire.decode([bytes(segments[0]), bytearray(segments[1]), bytearray(segments[2])])
    assert np.array_equal(back["array"], array) and type(back["blob"]) is bytes and back["small"] == b"abc"
    assert back["array"].flags.writeable  # received arrays are ordinary, writable arrays


def test_encode_reports_what_cannot_be_pickled() -> None:
    with pytest.raises(SerializationError, match="cannot pickle"):
        wire.encode((threading.Lock(),))
    assert pickle.loads(wire.encode((lambda x: x + 1,))[0])[0](1) == 2  # cloudpickle by value


class _Unrebuildable(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}+{b}")


def test_error_reports_are_a_code_and_the_shared_failure_encoding() -> None:
    (segment,) = encode_error(ErrorCode.REPLACED, LookupError("gone"))
    code, failure = decode_error(segment)
    assert code is ErrorCode.REPLACED
    assert (failure.type_name, failure.message) == ("LookupError", "gone")
    assert isinstance(failure.original(), LookupError)
    # An exception that does not survive pickling still reports its type, message and traceback.
    try:
        raise _Unrebuildable("a", "b")
    except _Unrebuildable as exc:
        (segment,) = encode_error(ErrorCode.RAISED, exc)
    code, failure = decode_error(segment)
    assert code is ErrorCode.RAISED and failure.type_name.endswith("_Unrebuildable")
    assert failure.message == "a+b" and failure.original() is None and "_Unrebuildable" in failure.traceback_text


def test_a_malformed_error_report_is_refused() -> None:
    for bad in (b"", b"\x00not a failure", b"\x09" + encode_error(ErrorCode.RAISED, ValueError("x"))[0][1:]):
        with pytest.raises(ValueError):
            decode_error(bad)
