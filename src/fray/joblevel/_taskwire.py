"""What the owner of a :class:`~fray.ProcessJobContext` and its worker processes share: refs and messages.

A message is a small header (a tuple of plain data, pickled with the standard pickle)
followed by zero or more blobs, each sent as its own frame so that a large object is
never copied into a bigger one. Connections are ``multiprocessing.connection`` ones
over a Unix socket, authenticated with a per-context key before anything is unpickled.

Messages (``wid`` a worker id, ``rid`` a request id, ids are ref ids):

owner -> worker
    ``("run", task_id, fn_key, arg_ids, cached_ids)`` + blobs ``[fn?, args, *objects]``:
    run a task (``fn`` is sent the first time a worker sees ``fn_key``);
    ``("reply", rid, kind, payload)`` + blobs: the answer to a get or wait;
    ``("free", ids)``: forget cached objects; ``("exit",)``.
worker -> owner
    ``("hello", wid, pid)``; ``("done", task_id, ok)`` + ``[result or failure]``;
    ``("submit", ref_id, name, fn_key, dep_ids)`` + ``[fn?, args]``: a nested task;
    ``("put", ref_id)`` + ``[blob]``; ``("get", rid, ids)``; ``("wait", rid, ids, num_returns)``;
    ``("cancel", rid)``: the caller stopped waiting (timeout): answer at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import pickle
import socket
import threading
import types
import uuid
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from fray.core import _codepickle
from fray.core._serialization import plain_data

__all__ = ["Dep", "ProcessObjectRef", "dumps", "function_blob", "no_delay", "receive", "send"]


class ProcessObjectRef:
    """A ref of a :class:`~fray.ProcessJobContext`, valid in its owner and in its worker processes."""

    __slots__ = ("__weakref__", "_pin", "context_id", "ref_id")

    def __init__(self, context_id: str, ref_id: str, pin: Any = None) -> None:
        self.context_id = context_id
        self.ref_id = ref_id
        # Owner side: a callable that keeps the object for the context's life once the ref escapes.
        self._pin = pin

    def __repr__(self) -> str:
        return f"ProcessObjectRef({self.ref_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessObjectRef) and other.ref_id == self.ref_id

    def __hash__(self) -> int:
        return hash(self.ref_id)

    def __reduce__(self) -> tuple[object, ...]:
        # A ref pickled into data (not resolved as an argument) may be used anywhere, any time:
        # the owner keeps its object until the context shuts down.
        if self._pin is not None:
            self._pin(self.ref_id)
        return (ProcessObjectRef, (self.context_id, self.ref_id))


class Dep:
    """Stands for a resolved ref in a task's pickled arguments: the worker puts the value there."""

    __slots__ = ("ref_id",)

    def __init__(self, ref_id: str) -> None:
        self.ref_id = ref_id

    def __reduce__(self) -> tuple[object, ...]:
        return (Dep, (self.ref_id,))


def no_delay(conn: Connection) -> None:
    """Turn off Nagle's algorithm on a TCP connection: a message is several writes, which must not wait for ACKs."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as sock:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# Frames above this size bypass the connection's framing (which reads in small chunks into growing buffers):
# they are written as they are and read straight into one buffer of the right size.
_RAW = 1 << 20


def send(conn: Connection, lock: threading.Lock, header: tuple[Any, ...], blobs: Sequence[Any] = ()) -> None:
    """Send one message (header, then each blob) atomically with respect to other senders."""
    views = [memoryview(blob).cast("B") for blob in blobs]
    data = pickle.dumps((header, [view.nbytes for view in views]), protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        conn.send_bytes(data)
        for view in views:
            if view.nbytes <= _RAW:
                conn.send_bytes(view)
                continue
            fd, sent = conn.fileno(), 0
            while sent < view.nbytes:
                sent += os.write(fd, view[sent:])


def receive(conn: Connection) -> tuple[tuple[Any, ...], list[Any]]:
    """Receive one message; ``EOFError``/``OSError`` when the peer is gone. Large blobs arrive as ``bytearray``."""
    header, sizes = pickle.loads(conn.recv_bytes())
    blobs: list[Any] = []
    for size in sizes:
        if size <= _RAW:
            blobs.append(conn.recv_bytes())
            continue
        buffer = bytearray(size)
        view, fd, got = memoryview(buffer), conn.fileno(), 0
        while got < size:
            count = os.readv(fd, [view[got:]])
            if count == 0:
                raise EOFError("the peer closed the connection mid-message")
            got += count
        blobs.append(buffer)
    return header, blobs


def dumps(value: Any) -> bytes:
    """Pickle ``value``: with the standard pickle when it is plain data (much cheaper), else cloudpickle."""
    if plain_data(value):
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _codepickle.dumps(value)


def function_blob(fn: Any, cache: weakref.WeakKeyDictionary[Any, tuple[str, bytes]]) -> tuple[str, bytes]:
    """``(key, pickled fn)``; plain functions are pickled once and keyed by content, so both sides cache them.

    Other callables (bound methods, partials, callable objects) may carry state that
    changes: they are pickled at every submission under a key used once.
    """
    if isinstance(fn, types.FunctionType):
        found = cache.get(fn)
        if found is None:
            blob = _codepickle.dumps(fn)
            found = cache[fn] = ("f-" + hashlib.blake2b(blob, digest_size=16).hexdigest(), blob)
        return found
    return (f"{ONCE}{next(_once)}-{_TAG}", _codepickle.dumps(fn))


#: Prefix of the keys of callables that are not cached (see :func:`function_blob`).
ONCE = "once-"
_once = itertools.count(1)
_TAG = uuid.uuid4().hex[:8]
