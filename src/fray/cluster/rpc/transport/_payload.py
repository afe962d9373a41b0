"""How values become the segments of a frame, and back: pickle protocol 5 with out-of-band buffers.

Segment 0 is the pickle; every large buffer in the value travels as a segment of its own,
sent from the caller's memory without a copy and rebuilt on the receiving side on the memory
it was received into:

* numpy arrays (and any type that reduces to a :class:`pickle.PickleBuffer` for protocol 5)
  do this by themselves;
* ``memoryview`` and ``array.array`` of :data:`OOB_MIN_BYTES` or more are reduced here to a
  PickleBuffer too (the pickler refuses a memoryview and copies an array into the stream):
  a memoryview is rebuilt on a view of its received buffer, an array.array with one copy;
* the pickler never asks about ``bytes`` and ``bytearray`` (it copies them into the stream
  itself), so large ones near the top of the value (an argument, a result, an item of one)
  are wrapped in :class:`_LargeBuffer` first. Both are rebuilt on their received buffer: the
  frame reader receives such segments into a new object of their type (see
  :mod:`fray.cluster.rpc.transport._fresh`), which ``bytes(...)`` and :func:`_rebuild_bytearray` return as is.

Values made only of builtin scalars and small containers skip cloudpickle (several times
slower than the C pickler) -- the common small call.
"""

from __future__ import annotations

import array
import contextlib
import io
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from fray.errors import SerializationError

__all__ = ["OOB_MIN_BYTES", "decode", "encode"]

#: Buffers at least this long travel as out-of-band segments instead of in the pickle stream.
OOB_MIN_BYTES = 64 * 1024


class _LargeBuffer:
    """Stands in for a large ``bytes`` or ``bytearray`` so that it travels out of band.

    The pickler never consults ``reducer_override`` for exact ``bytes`` and ``bytearray``,
    and would copy them into the stream; this wrapper reduces to ``bytes(<buffer>)`` or
    ``_rebuild_bytearray(<buffer>)`` over an out-of-band buffer instead.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        rebuild = bytes if type(self.data) is bytes else _rebuild_bytearray
        return rebuild, (pickle.PickleBuffer(self.data),)


def _wrap_large_bytes(obj: Any, depth: int = 0) -> Any:
    """``obj`` with large bytes and bytearrays near its top (arguments, results) wrapped in :class:`_LargeBuffer`."""
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        return _LargeBuffer(obj) if len(obj) >= OOB_MIN_BYTES else obj
    if depth >= 3:
        return obj
    if kind is tuple or kind is list:
        items = [_wrap_large_bytes(item, depth + 1) for item in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        return tuple(items) if kind is tuple else items
    if kind is dict:
        values = {key: _wrap_large_bytes(value, depth + 1) for key, value in obj.items()}
        if all(values[key] is value for key, value in obj.items()):
            return obj
        return values
    return obj


# -- buffers out of band ---------------------------------------------------------------------


def _rebuild_bytearray(buffer: Any) -> bytearray:
    """A received bytearray segment is the bytearray itself: no copy."""
    return buffer if type(buffer) is bytearray else bytearray(buffer)


def _rebuild_memoryview(buffer: Any, fmt: str, shape: tuple[int, ...], readonly: bool) -> memoryview:
    view = memoryview(buffer).cast("B")
    if fmt != "B" or len(shape) != 1:
        # A format memoryview.cast cannot make (a struct string): the bytes, flat.
        with contextlib.suppress(TypeError, ValueError):
            view = view.cast(fmt, shape)  # type: ignore[call-overload]
    return view.toreadonly() if readonly else view


def _rebuild_array(typecode: str, buffer: Any) -> array.array[Any]:
    out = array.array(typecode)
    out.frombytes(buffer)
    return out


def _reduce_buffer(obj: Any) -> tuple[Any, ...] | None:
    """How ``obj`` (a memoryview or array.array) travels, or None for the pickler's default."""
    kind = type(obj)
    if kind is memoryview:
        if obj.nbytes >= OOB_MIN_BYTES and obj.c_contiguous:
            return _rebuild_memoryview, (pickle.PickleBuffer(obj), obj.format, obj.shape, obj.readonly)
        # Small or strided: copied into the stream (a memoryview cannot be pickled otherwise).
        return _rebuild_memoryview, (bytearray(obj.tobytes()), obj.format, obj.shape, obj.readonly)
    if len(obj) * obj.itemsize < OOB_MIN_BYTES:
        return None
    return _rebuild_array, (obj.typecode, pickle.PickleBuffer(obj))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with byte buffers out of band (see :func:`_reduce_buffer`)."""

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is memoryview or kind is array.array:
            reduced = _reduce_buffer(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


# -- encode / decode ---------------------------------------------------------------------------


_PLAIN_TYPES = frozenset({int, float, str, bool, type(None)})


def _is_plain(obj: Any, depth: int = 0) -> bool:
    """True for small values built only from builtins, which the C pickler handles alone.

    Runs on every call, so scalars are checked inline rather than by recursion.
    """
    kind = type(obj)
    if kind in _PLAIN_TYPES:
        return True
    if kind is bytes or kind is bytearray:
        return len(obj) < OOB_MIN_BYTES
    if depth >= 3:
        return False
    if kind is tuple or kind is list:
        if len(obj) > 16:
            return False
        for item in obj:  # noqa: SIM110 - a plain loop is faster than all() on this hot path
            if type(item) not in _PLAIN_TYPES and not _is_plain(item, depth + 1):
                return False
        return True
    if kind is dict:
        if len(obj) > 16:
            return False
        for key, value in obj.items():
            if type(key) is not str or (type(value) not in _PLAIN_TYPES and not _is_plain(value, depth + 1)):
                return False
        return True
    return False


def encode(obj: Any) -> list[Any]:
    """Pickle ``obj`` with protocol 5; return ``[pickle, *out_of_band_buffers]`` as bytes-like segments.

    Raises :class:`SerializationError` when ``obj`` cannot be pickled.
    """
    if _is_plain(obj):
        # The common small call: the C pickler is several times faster than cloudpickle's.
        return [pickle.dumps(obj, protocol=5)]
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(_wrap_large_bytes(obj))
    except Exception as exc:
        raise SerializationError(f"cannot pickle {_describe(obj)}: {exc}") from exc
    if not buffers:
        return [stream.getvalue()]
    return [stream.getbuffer(), *(_raw(b) for b in buffers)]


def _raw(buffer: pickle.PickleBuffer) -> Any:
    try:
        return buffer.raw()
    except BufferError:
        # Non-contiguous buffers cannot be sent in place; copy this one.
        return bytes(buffer)


def decode(segments: Sequence[Any], loads: Callable[..., Any] = pickle.loads) -> Any:
    """Unpickle a frame's segments (the inverse of :func:`encode`)."""
    return loads(segments[0], buffers=segments[1:])


def _describe(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 200 else text[:200] + "..."
