"""New ``bytes`` and ``bytearray`` objects for received segments, filled in place.

A large ``bytes`` or ``bytearray`` argument or result is rebuilt as that very type on the
receiving side, so its memory must be a new object's. Python only makes such objects
zero-filled (``bytearray(n)``) or as a copy of other memory (``bytes(view)``), and
either way the fresh pages are first faulted in 4 KiB at a time -- for 64 MiB that is
two thirds of the cost of receiving it. Here the object is made uninitialised through
the C API (``PyBytes_FromStringAndSize(NULL, n)``, as C extensions do), its memory is
advised to use transparent huge pages, and the receiver writes the segment straight into
it (``recv_into``/``preadv``): one copy, on 2 MiB pages.

Writing into a new ``bytes`` is sound only before anyone else sees it: :func:`new` hands
out the object together with a writable view, and the caller fills it before it
returns the object (its hash is computed lazily, later). Where the C API is not
reachable (not CPython) or the layout check below fails, the plain constructors are used.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

__all__ = ["new"]

# Below this, a plain bytearray (and one copy for bytes) costs nothing worth avoiding; it also
# keeps the C path away from the interpreter's shared empty bytes object.
_MIN_BYTES = 4096
# Smaller objects come from Python's allocator pools or small mallocs: nothing to gain.
_HUGE_PAGE_MIN_BYTES = 4 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


_PyBUF_WRITE = 0x200


def _c_api() -> tuple[Any, Any, Any, int, Any] | None:
    """The C constructors, a writable view of raw memory, the offset of a bytes object's data, and ``madvise``."""
    try:
        api = ctypes.pythonapi
        new_bytes = api.PyBytes_FromStringAndSize
        new_bytearray = api.PyByteArray_FromStringAndSize
        view_of = api.PyMemoryView_FromMemory
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (AttributeError, OSError):
        return None
    for function in (new_bytes, new_bytearray):
        function.restype = ctypes.py_object
        function.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    # A view of memory, without making a ctypes array type per size (~10 us each).
    view_of.restype = ctypes.py_object
    view_of.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # Where a bytes object keeps its data (``ob_sval``: the last member, so basicsize - 1);
    # checked on a probe instead of trusted, since it is an interpreter detail.
    offset = bytes.__basicsize__ - 1
    probe = b"fray-probe-%d" % id(offset)
    if ctypes.string_at(id(probe) + offset, len(probe)) != probe:
        return None
    return new_bytes, new_bytearray, view_of, offset, madvise


_API = _c_api()


def new(kind: type, n: int) -> tuple[Any, memoryview]:
    """A new, unshared ``kind`` (``bytes`` or ``bytearray``) of ``n`` bytes and a writable view of its memory.

    The contents are undefined until the caller has written all ``n`` bytes through the view.
    """
    if _API is None or n < _MIN_BYTES:
        out = bytearray(n)  # for ``bytes``, the caller's ``bytes(out)`` then copies it once
        return out, memoryview(out)
    new_bytes, new_bytearray, view_of, offset, madvise = _API
    if kind is bytes:
        obj = new_bytes(None, n)
        address = id(obj) + offset
        view = view_of(address, n, _PyBUF_WRITE)  # valid while ``obj`` lives: the caller holds it
    else:
        obj = new_bytearray(None, n)
        view = memoryview(obj)
        address = ctypes.addressof(ctypes.c_char.from_buffer(obj))
    if n >= _HUGE_PAGE_MIN_BYTES:
        _advise_huge_pages(madvise, address, n)
    return obj, view


def _advise_huge_pages(madvise: Any, address: int, n: int) -> None:
    """Ask for transparent huge pages over the 2 MiB-aligned part of ``[address, address + n)``."""
    if _MADV_HUGEPAGE is None:
        return
    start = -(-address // _HUGE_PAGE) * _HUGE_PAGE
    end = (address + n) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        madvise(start, end - start, _MADV_HUGEPAGE)  # advice: where huge pages are off, it fails harmlessly
