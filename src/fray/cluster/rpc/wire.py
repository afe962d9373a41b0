"""The Fray actor wire protocol: handshake, framing and payload encoding.

Everything that touches raw bytes lives here, so the rules that keep a server safe
are in one place:

* A connection starts with a fixed-size binary handshake (:func:`server_handshake`,
  :func:`client_handshake`, kept in :mod:`fray.cluster.rpc.transport._handshake` and re-exported here): an
  HMAC-SHA256 challenge-response over two nonces, in both directions. Nothing is unpickled
  until it has succeeded.
* After it, every message is a *frame*: a fixed 16-byte header decoded with
  :mod:`struct`, a table of segment lengths, then the segments. Sizes are checked
  against the limits before a single payload byte is read.
* Segment 0 of a frame is a pickle (protocol 5); the other segments are its
  out-of-band buffers (see :mod:`fray.cluster.rpc.transport._payload`), sent straight from the caller's
  memory with ``sendmsg`` (``sendall`` per buffer over TLS, whose sockets have no
  ``sendmsg``) and received with ``recv_into`` into one buffer each, which
  becomes the memory of the rebuilt value: a new bytearray or bytes for those types
  (:mod:`fray.cluster.rpc.transport._fresh`), else a huge-page-backed map for large ones, reused from
  frame to frame once nothing refers to it any more.

See ``docs/protocol.md`` for the byte layout and the versioning rule.
"""

from __future__ import annotations

import array
import collections
import enum
import mmap
import os
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from fray.cluster.rpc.transport import _fresh, _memfd
from fray.cluster.rpc.transport._handshake import (
    HANDSHAKE_TIMEOUT,
    MAX_PRINCIPAL_BYTES,
    PROTOCOL_VERSION,
    Authenticated,
    KeySource,
    client_handshake,
    server_handshake,
    session_key,
)
from fray.cluster.rpc.transport._payload import decode, encode
from fray.errors import ProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_SEGMENTS",
    "HANDSHAKE_TIMEOUT",
    "MAX_PRINCIPAL_BYTES",
    "PROTOCOL_VERSION",
    "SEGMENT_BYTEARRAY",
    "SEGMENT_BYTES",
    "SEGMENT_MEMFD",
    "Authenticated",
    "Frame",
    "FrameKind",
    "FrameReader",
    "KeySource",
    "client_handshake",
    "decode",
    "encode",
    "frame_header",
    "send_frame",
    "server_handshake",
    "session_key",
    "small_frame",
    "tune_socket",
    "wait_for",
]

#: Largest frame (sum of its segments) accepted by default: 1 GiB.
DEFAULT_MAX_FRAME_BYTES = 1 << 30
#: Most segments (1 pickle + out-of-band buffers) one frame may carry.
DEFAULT_MAX_SEGMENTS = 4096

_FRAME_MAGIC = b"FR"
# Frame header: magic, version, kind, request id, number of segments.
_HEADER = struct.Struct("!2sBBQI")

_LENGTH = struct.Struct("!Q")
# Frames below this size are written with one contiguous send (and may be batched).
_SMALL_FRAME_BYTES = 16384
# Cached packers of the segment-length table, per segment count.
_TABLES: dict[int, struct.Struct] = {}

# The top bits of an entry of the segment-length table are flags; the rest is the length.
#: The segment is not in the stream: it is the next memfd passed with the frame (local connections).
SEGMENT_MEMFD = 1 << 63
#: The segment is rebuilt as a ``bytearray``: receive it into one (then it needs no copy).
SEGMENT_BYTEARRAY = 1 << 62
#: The segment is rebuilt as ``bytes``: receive it into a new one (then it needs no copy).
SEGMENT_BYTES = 1 << 61
_SEGMENT_FLAGS = SEGMENT_MEMFD | SEGMENT_BYTEARRAY | SEGMENT_BYTES
_SEGMENT_TYPES = {SEGMENT_BYTEARRAY: bytearray, SEGMENT_BYTES: bytes}
_LENGTH_MASK = (1 << 48) - 1
# Linux passes at most this many descriptors per sendmsg (SCM_MAX_FD).
_MAX_FDS = 253
_FD_BUFFER_BYTES = socket.CMSG_SPACE(_MAX_FDS * 4) if hasattr(socket, "CMSG_SPACE") else 0
_CTRUNC = int(getattr(socket, "MSG_CTRUNC", 0))  # an int: flag arithmetic on the enum is slow
_CMSG_CLOEXEC = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))

# Segments at least this large are received into huge-page-backed maps (see _allocate).
_HUGE_PAGE_MIN_BYTES = 4 << 20
# A reader keeps its last large receive buffer for reuse (already faulted in) up to this size.
_SPARE_MAX_BYTES = 256 << 20
_SOCKET_BUFFER_BYTES = 4 << 20

# Sockets accept at most IOV_MAX buffers per sendmsg; Linux's is 1024.
_IOV_MAX = 512
# Over TLS, buffers smaller than this are joined before sending: each sendall is at least
# one TLS record (with its own header and MAC), so many small ones would cost more than a copy.
_TLS_JOIN_BYTES = 64 * 1024


class FrameKind(enum.IntEnum):
    """What a frame carries; the values are part of the wire format."""

    CALL = 1  #: client -> server: invoke a method (see protocol.call_request).
    CONTROL = 2  #: client -> server: ping, lookup, list actors, list methods.
    RESULT = 3  #: server -> client: the pickled return value.
    ERROR = 4  #: server -> client: an error code and an encoded failure (see protocol.encode_error).
    PROTOCOL_ERROR = 5  #: server -> client: UTF-8 text, then the server closes the connection.


class Frame(NamedTuple):
    """One decoded frame: its kind, request id and segments (segment 0 is the pickle)."""

    kind: FrameKind
    request_id: int
    segments: list[Any]


# Enum construction is slow on the per-frame path; a dict lookup is not.
_KINDS = {int(kind): kind for kind in FrameKind}


# ---------------------------------------------------------------------------------------------
# Frames


def _table(count: int) -> struct.Struct:
    table = _TABLES.get(count)
    if table is None:
        table = _TABLES[count] = struct.Struct(f"!{count}Q")
    return table


def frame_header(kind: FrameKind, request_id: int, entries: Sequence[int]) -> bytes:
    """The bytes before a frame's segments: the header and the segment table (lengths with their flags).

    The one place a frame's envelope is built; :meth:`FrameReader.read_frame` is the one
    place it is parsed.
    """
    return _HEADER.pack(_FRAME_MAGIC, PROTOCOL_VERSION, kind, request_id, len(entries)) + _table(len(entries)).pack(
        *entries
    )


def small_frame(kind: FrameKind, request_id: int, payload: bytes) -> bytes | None:
    """The whole encoding of a one-segment frame if it is small enough to batch, else None."""
    if len(payload) >= _SMALL_FRAME_BYTES:
        return None
    return frame_header(kind, request_id, (len(payload),)) + payload


def _entry(view: Any) -> int:
    """A segment's entry in the length table: its length, flagged when it is a bytearray's or bytes' memory.

    Segment 0 (the pickle) is ``bytes`` itself, never a view of it: it is not flagged.
    """
    if type(view) is memoryview:
        kind = type(view.obj)
        if kind is bytearray:
            return view.nbytes | SEGMENT_BYTEARRAY
        if kind is bytes:
            return view.nbytes | SEGMENT_BYTES
    return len(view)


def send_frame(sock: socket.socket, kind: FrameKind, request_id: int, segments: Sequence[Any]) -> None:
    """Send one frame: header, length table and segments in as few ``sendmsg`` calls as possible.

    ``segments`` are bytes-like objects; they are sent from their own memory (no
    concatenation), which is what keeps large numpy arrays from being copied. On a
    local (Unix socket) connection, segments of :data:`fray.cluster.rpc.transport._memfd.MIN_BYTES` or
    more travel as memfds instead (see :mod:`fray.cluster.rpc.transport._memfd`). Over TLS every segment
    travels in band, written with ``sendall``.
    Callers serialise concurrent senders on one socket with a lock.
    """
    if len(segments) == 1 and type(segments[0]) is bytes and len(segments[0]) < _SMALL_FRAME_BYTES:
        # The common small message: one contiguous write is cheaper than an iovec.
        sock.sendall(frame_header(kind, request_id, (len(segments[0]),)) + segments[0])
        return
    views = [s if type(s) is bytes else memoryview(s).cast("B") for s in segments]
    entries = [_entry(v) for v in views]
    if isinstance(sock, ssl.SSLSocket):
        # An SSLSocket refuses sendmsg (it would bypass the encryption), and descriptors cannot
        # cross TLS even over a Unix socket: never a memfd here, whatever the family.
        _send_tls(sock, frame_header(kind, request_id, entries), views)
        return
    fds: list[int] = []
    try:
        if getattr(sock, "family", None) == socket.AF_UNIX and _memfd.available():
            for index, view in enumerate(views):
                if len(view) >= _memfd.MIN_BYTES and len(fds) < _MAX_FDS:
                    fds.append(_memfd.SPARES.fill(view))
                    entries[index] |= SEGMENT_MEMFD
                    views[index] = b""
        header = frame_header(kind, request_id, entries)
        _sendmsg_all(sock, [header, *views], fds)
    finally:
        # Sent (the receiver has its own descriptors) or not: either way these are not ours any more.
        for fd in fds:
            os.close(fd)


def _send_tls(sock: ssl.SSLSocket, header: bytes, views: list[Any]) -> None:
    """Write a frame to a TLS socket: runs of small buffers joined, large ones straight from their memory."""
    run: list[Any] = [header]
    run_bytes = len(header)
    for view in views:
        if len(view) < _TLS_JOIN_BYTES:
            run.append(view)
            run_bytes += len(view)
            if run_bytes < _TLS_JOIN_BYTES:
                continue
        if run:
            sock.sendall(b"".join(run))
            run, run_bytes = [], 0
        if len(view) >= _TLS_JOIN_BYTES:
            sock.sendall(view)
    if run:
        sock.sendall(b"".join(run))


def _sendmsg_all(sock: socket.socket, buffers: list[Any], fds: Sequence[int] = ()) -> None:
    pending = [memoryview(b) for b in buffers if len(b)]
    # Descriptors ride with the first bytes (the header), so they arrive before the frame is parsed.
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    while pending:
        if ancillary:
            sent = sock.sendmsg(pending[:_IOV_MAX], ancillary)
            ancillary = []
        else:
            sent = sock.sendmsg(pending[:_IOV_MAX])
        # Drop what went out; a partial send leaves the tail of one buffer.
        while sent and pending:
            first = pending[0]
            if sent >= len(first):
                sent -= len(first)
                pending.pop(0)
            else:
                pending[0] = first[sent:]
                sent = 0


class FrameReader:
    """Reads frames from one socket, validating each header before reading its payload.

    Small frames are parsed out of a reusable receive buffer (one ``recv`` usually
    brings in many pipelined frames); large segments are received directly into
    their own buffer (see :meth:`_read_segment`).
    """

    _BUFFER_BYTES = 256 * 1024

    def __init__(
        self,
        sock: socket.socket,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_segments: int = DEFAULT_MAX_SEGMENTS,
    ) -> None:
        self._sock = sock
        self._buf = bytearray(self._BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._spare: Any = None  # the last large receive buffer (see _large_buffer)
        # A local connection may pass memfds: read with recvmsg, and queue them in arrival order.
        # Not over TLS (even on a Unix socket): an SSLSocket has no recvmsg and no descriptor
        # crosses it, so a segment flagged as a memfd is refused there as one never passed.
        self._local = sock.family == socket.AF_UNIX and _memfd.available() and not isinstance(sock, ssl.SSLSocket)
        self._fds: collections.deque[int] = collections.deque()
        self.max_frame_bytes = max_frame_bytes
        self.max_segments = max_segments

    def read_frame(self, deadline: float | None = None) -> Frame | None:
        """Return the next frame, or None at a clean end of stream between frames.

        Raises :class:`ProtocolError` for a malformed or oversized frame (the caller
        must then drop the connection) and ``ConnectionError`` for a stream cut mid-frame.
        With a ``deadline`` (``time.monotonic()`` value), raises ``TimeoutError`` if no
        frame has *started* arriving by then; a frame once started is read to its end,
        so the stream stays in sync.
        """
        if deadline is not None and self._end == self._start:
            self._wait_readable(deadline)
        if not self._fill(_HEADER.size, at_boundary=True):
            return None
        magic, version, kind, request_id, nsegments = _HEADER.unpack_from(self._buf, self._start)
        if magic != _FRAME_MAGIC:
            raise ProtocolError(f"bad frame magic {bytes(magic)!r}")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"unsupported frame version {version} (expected {PROTOCOL_VERSION})")
        frame_kind = _KINDS.get(kind)
        if frame_kind is None:
            raise ProtocolError(f"unknown frame kind {kind}")
        if not 1 <= nsegments <= self.max_segments:
            raise ProtocolError(f"frame has {nsegments} segments; 1..{self.max_segments} are allowed")
        self._start += _HEADER.size
        table = 8 * nsegments
        self._fill(table)
        entries = _table(nsegments).unpack_from(self._buf, self._start)
        self._start += table
        total = 0
        for entry in entries:
            if entry & ~(_LENGTH_MASK | _SEGMENT_FLAGS):
                raise ProtocolError(f"bad segment table entry {entry:#x}")
            total += entry & _LENGTH_MASK
        if total > self.max_frame_bytes:
            raise ProtocolError(f"frame of {total} bytes exceeds the limit of {self.max_frame_bytes} bytes")
        return Frame(frame_kind, request_id, [self._read_segment(entry) for entry in entries])

    def buffered(self) -> int:
        """How many received bytes wait in the buffer (0: the next read will block)."""
        return self._end - self._start

    def _wait_readable(self, deadline: float) -> None:
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            # Already decrypted, inside the TLS layer: poll() cannot see these bytes.
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not wait_for(self._sock, select.POLLIN, remaining):
            raise TimeoutError("no frame before the deadline")

    def _fill(self, n: int, *, at_boundary: bool = False) -> bool:
        """Ensure ``n`` bytes are buffered (``n`` <= buffer size)."""
        while self._end - self._start < n:
            if self._start and self._start == self._end:
                self._start = self._end = 0
            elif self._start and len(self._buf) - self._start < n:
                # Move the partial record to the front so it can complete in place.
                remaining = self._end - self._start
                self._buf[:remaining] = self._buf[self._start : self._end]
                self._start, self._end = 0, remaining
            got = self._receive(self._view[self._end :])
            if got == 0:
                if at_boundary and self._end == self._start:
                    return False
                raise ConnectionError("connection closed in the middle of a frame")
            self._end += got
        return True

    def _receive(self, view: memoryview) -> int:
        if not self._local:
            return self._sock.recv_into(view)
        got, ancillary, flags, _ = self._sock.recvmsg_into([view], _FD_BUFFER_BYTES, _CMSG_CLOEXEC)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        if flags & _CTRUNC:
            raise ProtocolError("the peer passed more descriptors than a frame may carry")
        return got

    def close(self) -> None:
        """Close descriptors received but never claimed by a frame (only a faulty peer leaves any)."""
        while self._fds:
            os.close(self._fds.popleft())

    def _read_segment(self, entry: int) -> Any:
        """One segment: a new bytes or bytearray for a segment flagged so, else a writable buffer
        (a bytearray, a huge-page map, a memfd's private map, or a view of a reused buffer)."""
        n = entry & _LENGTH_MASK
        kind = _SEGMENT_TYPES.get(entry & (SEGMENT_BYTEARRAY | SEGMENT_BYTES))
        if entry & SEGMENT_MEMFD:
            if not self._fds:
                raise ProtocolError("a segment names a memfd the peer did not pass")
            fd = self._fds.popleft()
            if kind is not None:
                out, out_view = _fresh.new(kind, n)
                _memfd.SPARES.read(fd, out_view)
                return out
            return _memfd.SPARES.map(fd, n)
        available = self._end - self._start
        if n <= available or n <= self._BUFFER_BYTES // 4:
            self._fill(n)
            data = bytearray(self._view[self._start : self._start + n])
            self._start += n
            return data
        # Large segment: take what is buffered, then receive the rest straight into place.
        if kind is not None:
            out, out_view = _fresh.new(kind, n)
        else:
            out = self._large_buffer(n)
            out_view = memoryview(out).cast("B")
        out_view[:available] = self._view[self._start : self._end]
        self._start = self._end = 0
        got = available
        while got < n:
            k = self._sock.recv_into(out_view[got:])
            if k == 0:
                raise ConnectionError("connection closed in the middle of a frame")
            got += k
        return out

    def _large_buffer(self, n: int) -> Any:
        """A buffer of ``n`` bytes: the last one again if nothing refers to it any more, else a new one.

        Reusing it saves faulting in fresh pages, the largest cost of receiving tens of
        megabytes. A value decoded on it (a numpy array) keeps it alive and referenced,
        so it is never handed out twice; a value copied out of it (``bytes``) lets it go.
        """
        spare = self._spare
        # References to the spare: this reader's attribute, the local name, getrefcount's argument.
        if spare is not None and n <= len(spare) <= 2 * n and sys.getrefcount(spare) == 3:
            return spare if len(spare) == n else memoryview(spare)[:n]
        buffer = _allocate(n)
        self._spare = buffer if n <= _SPARE_MAX_BYTES and type(buffer) is not bytearray else None
        return buffer


def _allocate(n: int) -> Any:
    """A writable buffer of ``n`` bytes to receive a large segment into.

    Large buffers are anonymous maps advised to use transparent huge pages: the
    kernel then copies socket data into 2 MiB pages instead of faulting in 4 KiB
    ones, which roughly halves the cost of receiving tens of megabytes.
    """
    if n < _HUGE_PAGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return bytearray(n)
    buffer = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


def wait_for(sock: socket.socket, events: int, timeout: float | None) -> int:
    """Wait until ``sock`` has ``events`` (``select.POLLIN``/``POLLOUT``); return those that happened (0: timeout).

    ``poll()``, unlike ``select()``, works for any descriptor number: a process with more
    than 1,024 open files can still use Fray.
    """
    poller = select.poll()
    poller.register(sock, events)
    ready = poller.poll(None if timeout is None else max(timeout, 0.0) * 1000)
    return ready[0][1] if ready else 0


def tune_socket(sock: socket.socket) -> None:
    """Socket options every Fray connection uses: no Nagle delay (TCP), large kernel buffers."""
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Bigger buffers mean fewer wake-ups per megabyte on large transfers; the kernel caps them.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER_BYTES)
