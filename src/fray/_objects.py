"""How job-level objects (task results, ``put`` values) travel and rest: one self-contained bytes blob.

:func:`encode` pickles with protocol 5 and keeps large buffers (numpy arrays,
``bytearray``, anything exposing ``PickleBuffer``) out of band, appended after the
pickle, each aligned to 64 bytes. :func:`decode` rebuilds the object with those
buffers as views into the blob, so a numpy array is not copied again: like Ray's
object store, it comes back read-only (the blob is immutable ``bytes``).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import cloudpickle

__all__ = ["decode", "encode"]

_IN_BAND = b"\x00"
_OUT_OF_BAND = b"\x01"
_COUNT = struct.Struct("!I")
_LENGTH = struct.Struct("!Q")
_ALIGN = 64


def encode(obj: Any) -> bytes:
    """``obj`` as one blob (raises whatever pickling raises)."""
    buffers: list[pickle.PickleBuffer] = []
    main = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return _IN_BAND + main
    raws = [buffer.raw() for buffer in buffers]
    header = _COUNT.pack(len(raws)) + b"".join(_LENGTH.pack(len(raw)) for raw in raws) + _LENGTH.pack(len(main))
    parts: list[bytes | memoryview] = [_OUT_OF_BAND, header, main]
    offset = 1 + len(header) + len(main)
    for raw in raws:
        pad = -offset % _ALIGN
        parts.append(b"\x00" * pad)
        parts.append(raw)
        offset += pad + len(raw)
    return b"".join(parts)


def decode(blob: bytes | memoryview) -> Any:
    """The object :func:`encode` made ``blob`` from."""
    view = memoryview(blob)
    if view[:1] == _IN_BAND:
        return pickle.loads(view[1:])
    (count,) = _COUNT.unpack_from(view, 1)
    position = 1 + _COUNT.size
    lengths = []
    for _ in range(count):
        lengths.append(_LENGTH.unpack_from(view, position)[0])
        position += _LENGTH.size
    (main_length,) = _LENGTH.unpack_from(view, position)
    position += _LENGTH.size
    main = view[position : position + main_length]
    position += main_length
    buffers = []
    for length in lengths:
        position += -position % _ALIGN
        buffers.append(view[position : position + length])
        position += length
    return pickle.loads(main, buffers=buffers)
