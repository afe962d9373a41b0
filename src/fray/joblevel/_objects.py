"""How job-level objects (task results, ``put`` values) travel and rest: a kind and a list of frames.

:func:`encode` returns ``("bytes", [obj])`` for a ``bytes`` object (immutable: kept and
sent as it is, never copied), else ``("ok", [pickle, *buffers])``: pickled with
protocol 5, large buffers (numpy arrays, ``bytearray``, anything exposing
``PickleBuffer``) kept out of band as frames of their own, so that nothing is copied
into one big blob. :func:`decode` rebuilds the object with those frames as its
buffers: a numpy array comes back as a read-only view of the received bytes, as from
Ray's object store.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import cloudpickle

from fray.core._serialization import plain_data

__all__ = ["decode", "encode", "frames_size"]

Frame = bytes | bytearray | memoryview


def encode(obj: Any) -> tuple[str, list[Frame]]:
    """``obj`` as ``(kind, frames)`` (raises whatever pickling raises)."""
    if type(obj) is bytes:
        return "bytes", [obj]
    if plain_data(obj):
        return "ok", [pickle.dumps(obj, protocol=5)]
    buffers: list[pickle.PickleBuffer] = []
    main = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    # Each buffer is copied once, so that the stored object is a snapshot of ``obj`` now.
    return "ok", [main, *(bytes(buffer.raw()) for buffer in buffers)]


def decode(kind: str, frames: Sequence[Frame]) -> Any:
    """The object :func:`encode` made ``(kind, frames)`` from."""
    if kind == "bytes":
        frame = frames[0]
        return frame if type(frame) is bytes else bytes(frame)
    buffers = [memoryview(frame).toreadonly() for frame in frames[1:]]
    return pickle.loads(frames[0], buffers=buffers)


def frames_size(frames: Sequence[Frame]) -> int:
    """How many bytes ``frames`` hold."""
    return sum(memoryview(frame).nbytes for frame in frames)
