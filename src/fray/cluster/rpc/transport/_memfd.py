"""Large segments between processes on one host: anonymous shared memory passed as a file descriptor.

Over a local (Unix socket) connection, a segment of :data:`MIN_BYTES` or more does not travel
through the socket: the sender copies it into a *memfd* (an anonymous in-memory file) and
passes the descriptor with the frame (``SCM_RIGHTS``); the receiver maps it copy-on-write and
rebuilds the value on that memory -- one copy per crossing instead of two, and no socket
buffers to drain. Why memfds rather than ``multiprocessing.shared_memory``: a memfd has no name,
so nothing outside the two processes can open it and nothing is left behind when either dies
(the memory is freed with the last descriptor or mapping); a named segment must be unlinked on
every path, survives a killed process, and goes through a resource-tracker process.

Ownership, which is what makes reuse safe: a memfd belongs to one process at a time. The sender
writes it, sends it and closes its own descriptor, never touching it again; the receiver's
mapping is private (copy-on-write). Once the receiver's mapping is gone (the value built on it
was freed), the memfd is the receiver's alone, and it keeps it in its :class:`Spares` to carry
its next large segment -- pages already allocated, so the next copy does not fault them in.
Spares are bounded (:data:`MAX_SPARE_BYTES`, :data:`MAX_SPARES`); beyond, memfds are closed.

Safety: descriptors are only accepted on an authenticated connection (the frame reader only
runs after the handshake; descriptors sent earlier are discarded by the kernel), each must be a
memfd sealed against shrinking (so the sender cannot make the receiver's mapping fault with
SIGBUS), at least as large as its segment, and segments count against the frame size limit.
"""

from __future__ import annotations

import bisect
import fcntl
import mmap
import os
import stat
import threading
import weakref
from typing import Any

from fray.errors import ProtocolError

__all__ = ["MIN_BYTES", "SPARES", "Spares", "available"]

#: Segments at least this large go through a memfd on local connections.
MIN_BYTES = 1 << 20
#: At most this many bytes of spare memfds are kept per process (one larger is never kept).
MAX_SPARE_BYTES = 512 << 20
#: At most this many spare memfds are kept per process.
MAX_SPARES = 8
# Received memfds whose descriptor is kept open (to be reused once the mapping dies); beyond
# this many, the descriptor is closed at once and the memfd is freed with its mapping.
_MAX_LENT = 256
_PAGE = mmap.PAGESIZE
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def available() -> bool:
    """True where memfds and descriptor passing exist (Linux)."""
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


class Spares:
    """This process's spare memfds, and the receiving end's mapping of memfds it was sent."""

    def __init__(self, max_bytes: int = MAX_SPARE_BYTES, max_count: int = MAX_SPARES) -> None:
        self.max_bytes = max_bytes
        self.max_count = max_count
        # Reentrant: a mapping freed by the garbage collector while this lock is held (any
        # allocation may run a collection) returns its memfd through keep(), which takes it again.
        self._lock = threading.RLock()
        self._spares: list[tuple[int, int]] = []  # (size, fd), sorted
        self._bytes = 0
        self._lent = 0  # descriptors kept open for mappings still alive

    # -- sending ------------------------------------------------------------------------------

    def fill(self, data: Any) -> int:
        """A memfd holding ``data`` (from offset 0) that the caller sends and then closes.

        A spare of a fitting size is reused; otherwise a new memfd is made, sealed
        against shrinking.
        """
        view = memoryview(data).cast("B")
        n = view.nbytes
        fd = self._take(n)
        if fd is None:
            fd = os.memfd_create("fray-rpc", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, -(-n // _PAGE) * _PAGE)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            except BaseException:
                os.close(fd)
                raise
        try:
            # One mapping with every page table entry made at once, then one memcpy: about half
            # the cost of pwrite() (which copies page by page) or of faulting the pages in.
            target = mmap.mmap(fd, n, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                target[:n] = view
            finally:
                target.close()
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _take(self, n: int) -> int | None:
        """A spare of at least ``n`` bytes and not more than twice that, or None."""
        with self._lock:
            index = bisect.bisect_left(self._spares, (n, -1))
            if index < len(self._spares) and self._spares[index][0] <= 2 * n:
                size, fd = self._spares.pop(index)
                self._bytes -= size
                return fd
        return None

    def keep(self, fd: int, size: int) -> None:
        """Take ``fd`` (a memfd of ``size`` bytes nobody else holds) as a spare, or close it if there is no room."""
        with self._lock:
            if size <= self.max_bytes:
                while self._spares and (len(self._spares) >= self.max_count or self._bytes + size > self.max_bytes):
                    # Make room by dropping the smallest: large ones are the expensive ones to make.
                    old_size, old_fd = self._spares.pop(0)
                    self._bytes -= old_size
                    os.close(old_fd)
                if len(self._spares) < self.max_count and self._bytes + size <= self.max_bytes:
                    bisect.insort(self._spares, (size, fd))
                    self._bytes += size
                    return
        os.close(fd)

    def clear(self) -> None:
        """Close every spare."""
        with self._lock:
            spares, self._spares, self._bytes = self._spares, [], 0
        for _, fd in spares:
            os.close(fd)

    # -- receiving ----------------------------------------------------------------------------

    def map(self, fd: int, length: int) -> Any:
        """The received memfd ``fd`` as a private, writable buffer of ``length`` bytes; takes ``fd`` over.

        Raises :class:`ProtocolError` (closing ``fd``) for anything but a shrink-sealed
        memfd of at least ``length`` bytes.
        """
        size = self._check(fd, length)
        try:
            buffer = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            lend = self._lent < _MAX_LENT
            if lend:
                self._lent += 1
        if not lend:
            os.close(fd)  # the mapping keeps the memory; this memfd is not reused
            return buffer
        finalizer = weakref.finalize(buffer, self._returned, fd, size)
        finalizer.atexit = False
        return buffer

    def read(self, fd: int, into: memoryview) -> None:
        """Copy the received memfd ``fd``'s first ``len(into)`` bytes into ``into`` (a byte view); ``fd`` is then a spare."""
        length = into.nbytes
        size = self._check(fd, length)
        try:
            done = 0
            while done < length:
                got = os.preadv(fd, [into[done:]], done)
                if got == 0:
                    raise ProtocolError("memfd ended before its segment did")
                done += got
        except BaseException:
            os.close(fd)
            raise
        self.keep(fd, size)

    def _returned(self, fd: int, size: int) -> None:
        with self._lock:
            self._lent -= 1
        self.keep(fd, size)

    @staticmethod
    def _check(fd: int, length: int) -> int:
        try:
            info = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # fails for anything but a memfd (or shmem file)
        except OSError as exc:
            os.close(fd)
            raise ProtocolError(f"a passed descriptor is not a memfd: {exc}") from None
        if not stat.S_ISREG(info.st_mode) or not seals & fcntl.F_SEAL_SHRINK or info.st_size < length:
            os.close(fd)
            raise ProtocolError("a passed descriptor is not a shrink-sealed memfd as large as its segment")
        return int(info.st_size)


SPARES = Spares()
"""The process's spare memfds, shared by every local connection."""
