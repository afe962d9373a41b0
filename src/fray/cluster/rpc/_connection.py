"""One authenticated connection from an actor client to an actor server.

:class:`Connection` keeps the requests in flight by request id, decides which
thread reads responses (the *read role*), batches pipelined requests in an
*outbox*, and decides what a broken connection means for each request: one that
provably never left fails with :class:`NotSent` (safe to retry), one that was
written fails with :class:`~fray.errors.ActorUnavailableError` ("may or may not
have run"). Its TCP socket is opened by :mod:`fray.cluster.rpc.transport._dial`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from fray.cluster.rpc import wire
from fray.cluster.rpc.transport import _local
from fray.cluster.rpc.transport._dial import dial_tcp
from fray.errors import ActorUnavailableError, ProtocolError, RpcTimeoutError

__all__ = ["Callback", "Connection", "NotSent", "Pending", "remaining"]

_PEEK = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: flag arithmetic on the enum costs a microsecond
# Queued requests are written at once beyond this many bytes or frames.
_OUTBOX_LIMIT = 256 * 1024
_OUTBOX_FRAMES = 16
# How long the pump thread leaves a free read role to threads waiting on their futures.
_PUMP_GRACE = 0.0005


class NotSent(Exception):
    """The request provably never reached the actor, so it may be retried (internal to the RPC client).

    ``stale``: the connection was idle and turned out dead when used (its server went away
    meanwhile); the caller may reconnect at once, as if it had noticed before sending.
    """

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


Callback = Callable[["wire.Frame | BaseException"], None]


class Pending:
    """One request in flight: either a thread waits for ``response``, or ``callback`` gets it."""

    __slots__ = ("callback", "response", "rid", "sent")

    def __init__(self, callback: Callback | None) -> None:
        self.callback = callback
        self.rid = 0
        self.response: wire.Frame | BaseException | None = None
        self.sent = False


class Connection:
    """One authenticated connection to a server, shared by every request of one channel.

    Who reads the socket: whichever thread holds the *read role*. A thread blocked on a
    synchronous call (or on a future's ``result()``) takes the role itself and reads
    until its own response arrives -- no thread switch on the common path; responses
    for other requests it meets on the way are handed to their owners. Requests made
    with ``.remote()`` may have no waiting thread, so while any is outstanding a
    *pump* thread takes the role when it has been free for ``_PUMP_GRACE``, and gives
    it back as soon as a waiting thread wants it.

    Who writes: small ``.remote()`` requests made while others are in flight are
    queued in the *outbox* and written together: by the role holder just before it
    blocks for a response, by the next thread that writes anyway, or once 16 are
    queued. The role holder writes without blocking (reading while the socket is
    full), so reading never stops behind writing and the two sides cannot deadlock.

    Locks: ``_cond`` guards the state; ``_send_lock`` serialises writers and may be
    held while taking ``_cond``, never the other way round except by try-acquire.
    """

    def __init__(self, host: str, port: int, token: bytes | None, timeout: float | None) -> None:
        connect_timeout = wire.HANDSHAKE_TIMEOUT if timeout is None else min(timeout, wire.HANDSHAKE_TIMEOUT)
        self._setup(dial_tcp(host, port, connect_timeout), f"{host}:{port}", token)

    @classmethod
    def local(cls, name: str, address: str, token: bytes | None, timeout: float | None) -> Connection:
        """A connection over the server's local listener ``name`` (see :mod:`fray.cluster.rpc.transport._local`).

        OSError when it is not reachable from here (another host).
        """
        connect_timeout = wire.HANDSHAKE_TIMEOUT if timeout is None else min(timeout, wire.HANDSHAKE_TIMEOUT)
        conn = cls.__new__(cls)
        conn._setup(_local.connect(name, connect_timeout), address, token)
        return conn

    def _setup(self, sock: socket.socket, address: str, token: bytes | None) -> None:
        self.address = address
        self.is_local = sock.family == socket.AF_UNIX  # over the server's local listener
        try:
            wire.client_handshake(sock, token, address)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._frames = wire.FrameReader(sock)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # waiters for responses and for the read role
        self._pump_cond = threading.Condition(lock)  # wakes the pump alone, so calls don't
        self._pump_sleeping = False
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self._reading = False  # some thread holds the read role
        self._waiters = 0  # threads blocked in wait() without the role
        self._unattended = 0  # outstanding .remote() requests: the pump's work
        self._pump: threading.Thread | None = None
        self._role_free_since = 0.0
        self._outbox: list[tuple[Pending, bytes]] = []  # queued small requests, in order
        self._outbox_bytes = 0
        self._reader_blocked = False  # the role holder is (about to be) blocked in a read
        self._retiring = False  # close once nothing is pending (see retire)
        self.error: BaseException | None = None

    @property
    def broken(self) -> bool:
        """True once the connection failed or was closed; it is never reused after that."""
        return self.error is not None

    def request(self, kind: wire.FrameKind, segments: list[Any], callback: Callback | None = None) -> Pending:
        """Send (or queue) one request and return its pending entry.

        With ``callback`` the response is delivered to it (from whichever thread reads);
        without, the caller must :meth:`wait` for it. Raises :class:`NotSent` when the
        frame could not be written (the server only acts on complete frames).

        Small ``.remote()`` requests made while a pipeline is running are queued in the
        *outbox* rather than written one by one: the thread that reads flushes it, in
        one system call, before it blocks for more responses (see :meth:`_flush_as_reader`).
        """
        entry = Pending(callback)
        queued = False
        with self._cond:
            if self.error is not None:
                raise NotSent(f"connection to {self.address} is closed: {self.error}")
            idle = not self._pending
            rid = entry.rid = next(self._ids)
            self._pending[rid] = entry
            if callback is not None:
                self._unattended += 1
                if (
                    len(segments) == 1
                    and not self._reader_blocked
                    and self._outbox_bytes < _OUTBOX_LIMIT
                    and (self._reading or self._outbox or len(self._pending) > len(self._outbox) + 1)
                ):
                    frame = wire.small_frame(kind, rid, segments[0])
                    if frame is not None:
                        self._outbox.append((entry, frame))
                        self._outbox_bytes += len(frame)
                        if len(self._outbox) < _OUTBOX_FRAMES:
                            if not self._reading:
                                self._start_pump_locked()
                            return entry
                        # A full batch goes out now, so the server works while we queue the next.
                        queued = True
        self._send_lock.acquire()
        try:
            with self._cond:
                batch = self._take_outbox_locked()
            if batch:
                self._send_batch(batch)
            if queued:  # ours was in the batch (or another thread already wrote it)
                self._flush_and_unlock()
                return entry
            wire.send_frame(self._sock, kind, rid, segments)
        except OSError as exc:
            self._send_lock.release()
            if queued:
                # Written with its batch (so maybe run): the failure reaches it like any sent call.
                self._fail(exc)
                return entry
            with self._cond:
                if self._pending.pop(rid, None) is not None and callback is not None:
                    self._unattended -= 1
            self._fail(exc)
            raise NotSent(f"could not send to {self.address}: {exc}", stale=idle) from exc
        self._flush_and_unlock()
        with self._cond:
            entry.sent = True
            orphaned = self.error is not None and self._pending.pop(rid, None) is not None
            if callback is not None and not orphaned and not self._reading:
                self._start_pump_locked()
        if orphaned:
            # The connection broke while we were sending; the reader skipped this unsent entry.
            self._deliver(entry, self._lost_error())
        return entry

    def call(self, kind: wire.FrameKind, segments: list[Any], deadline: float | None) -> wire.Frame | BaseException:
        """Send one request and wait for its response (:meth:`request` then :meth:`wait`), cheaply.

        When nobody else uses the connection at that moment (the common synchronous call),
        this thread takes the read role and the send lock together, writes its frame itself
        and reads its own response: three short critical sections instead of a dozen.
        Otherwise it takes the general path. Raises :class:`NotSent` like :meth:`request`.
        """
        cond = self._cond
        with cond:
            idle = not self._reading and not self._pending and not self._outbox
            if self.error is None and idle:
                self._check_idle_locked()  # a server that died while we were idle: not sent
            if self.error is not None:
                raise NotSent(f"connection to {self.address} is closed: {self.error}", stale=idle)
            fast = (
                not self._reading and not self._pending and not self._outbox and self._send_lock.acquire(blocking=False)
            )
            if fast:
                entry = Pending(None)
                rid = entry.rid = next(self._ids)
                self._pending[rid] = entry
                self._reading = True
                # Requests other threads make meanwhile are written by them, not queued for us.
                self._reader_blocked = True
        if not fast:
            return self.wait(self.request(kind, segments), deadline)
        try:
            wire.send_frame(self._sock, kind, rid, segments)
        except OSError as exc:
            self._send_lock.release()
            with cond:
                self._pending.pop(rid, None)
            self._release_role()
            self._fail(exc)
            # Nothing else was in flight: an idle connection whose server went away (EPIPE).
            raise NotSent(f"could not send to {self.address}: {exc}", stale=True) from exc
        entry.sent = True
        self._send_lock.release()
        try:
            while entry.response is None and self.error is None:
                if not self._deliver_next(deadline):
                    with cond:
                        self._expire_locked(entry)
        finally:
            self._release_role()
        return entry.response if entry.response is not None else self._lost_error()

    # -- the outbox -------------------------------------------------------------------------------

    def _take_outbox_locked(self) -> list[tuple[Pending, bytes]]:
        batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
        return batch

    def _send_batch(self, batch: list[tuple[Pending, bytes]]) -> None:
        """Write queued frames (holding the send lock, blocking). On failure they count as sent."""
        try:
            self._sock.sendall(b"".join(frame for _, frame in batch))
        finally:
            self._mark_sent(batch)

    def _mark_sent(self, batch: list[tuple[Pending, bytes]]) -> None:
        # Once any byte may have left, a queued call's fate is unknown: treat it as sent.
        with self._cond:
            for entry, _ in batch:
                entry.sent = True
            orphans = [e for e, _ in batch if self.error is not None and self._pending.pop(e.rid, None) is not None]
            self._unattended -= sum(1 for e in orphans if e.callback is not None)
        for orphan in orphans:
            self._deliver(orphan, self._lost_error())

    def _flush_and_unlock(self) -> None:
        """Flush what was queued while we held the send lock, then release it.

        The lock is released under the condition's lock, so a reader that found the
        send lock busy (and left its outbox to us) is never missed.
        """
        while True:
            with self._cond:
                batch = self._take_outbox_locked()
                if not batch:
                    self._send_lock.release()
                    return
            try:
                self._send_batch(batch)
            except OSError as exc:
                self._send_lock.release()
                self._fail(exc)
                return

    def _flush_as_reader(self) -> None:
        """Flush the outbox from the thread holding the read role, before it blocks on a read.

        The reader must keep reading while it writes, or a server blocked writing to
        us could never drain our requests: so it writes without blocking and, when the
        socket is full, reads a frame while it waits for room.
        """
        with self._cond:
            if not self._outbox or not self._send_lock.acquire(blocking=False):
                # A busy send lock means a writer is active: it flushes the outbox after itself.
                self._reader_blocked = True
                return
            batch = self._take_outbox_locked()
        while True:
            try:
                self._write_while_reading(b"".join(frame for _, frame in batch))
            except OSError as exc:
                self._mark_sent(batch)
                self._send_lock.release()
                self._fail(exc)
                return
            self._mark_sent(batch)
            with self._cond:
                batch = self._take_outbox_locked()
                if not batch:
                    self._reader_blocked = True
                    self._send_lock.release()
                    return

    def _write_while_reading(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self._sock.send(view, socket.MSG_DONTWAIT) :]
                continue
            except BlockingIOError:
                pass
            if wire.wait_for(self._sock, select.POLLIN | select.POLLOUT, None) & select.POLLIN:
                self._deliver_next(None)
                if self.error is not None:
                    raise ConnectionError(str(self.error))

    def wait(self, entry: Pending, deadline: float | None) -> wire.Frame | BaseException:
        """Block until ``entry``'s response arrives, reading the socket if no one else is.

        Returns the response frame, or the exception that ended the request (the
        connection broke, or :class:`RpcTimeoutError` at ``deadline``).
        """
        with self._cond:
            while entry.response is None and self._reading:
                self._waiters += 1
                try:
                    if not self._cond.wait(remaining(deadline)):
                        self._expire_locked(entry)
                finally:
                    self._waiters -= 1
            if entry.response is not None:
                return entry.response
            self._reading = True
        try:
            while entry.response is None and self.error is None:
                if not self._read_one(deadline):
                    with self._cond:
                        self._expire_locked(entry)
        finally:
            self._release_role()
        # A failed connection has answered every sent request; this is only a safety net.
        return entry.response if entry.response is not None else self._lost_error()

    def help_until(self, future: concurrent.futures.Future[Any], deadline: float | None) -> None:
        """Read responses in this thread until ``future`` is done, if no other thread is reading.

        Returns when the future is done, the connection failed, or ``deadline`` passed.
        """
        with self._cond:
            while self._reading and not future.done() and self.error is None:
                # The pump hands the role over between frames when it sees a waiter.
                self._waiters += 1
                try:
                    if not self._cond.wait(remaining(deadline)):
                        return
                finally:
                    self._waiters -= 1
            if future.done() or self.error is not None:
                return
            self._reading = True
        try:
            while not future.done() and self.error is None:
                if not self._read_one(deadline):
                    return
        finally:
            self._release_role()

    def _expire_locked(self, entry: Pending) -> None:
        if self._pending.pop(entry.rid, None) is not None:
            entry.response = RpcTimeoutError(f"no response from {self.address} in time")

    def expire(self, entry: Pending, error: BaseException) -> None:
        """Give up on ``entry``: its callback gets ``error``; a late response is dropped."""
        with self._cond:
            if self._pending.pop(entry.rid, None) is None:
                return
            if entry.callback is not None:
                self._unattended -= 1
            finished = self._retiring and not self._pending
        self._deliver(entry, error)
        if finished:
            self.close()

    def retire(self) -> None:
        """Close the connection once the requests in flight have their answers."""
        with self._cond:
            self._retiring = True
            idle = not self._pending
        if idle:
            self.close()

    def close(self) -> None:
        """Close the connection; requests in flight fail as if it broke."""
        self._fail(ConnectionError("closed by the client"))
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    # -- reading --------------------------------------------------------------------------------

    def _read_one(self, deadline: float | None) -> bool:
        """Read and deliver one frame (holding the read role). False if ``deadline`` passed first."""
        if self._frames.buffered():
            return self._deliver_next(deadline)
        # About to block: send what was queued first, since our responses may depend on it.
        self._flush_as_reader()
        try:
            return self._deliver_next(deadline)
        finally:
            with self._cond:
                self._reader_blocked = False

    def _deliver_next(self, deadline: float | None) -> bool:
        try:
            frame = self._frames.read_frame(deadline)
        except TimeoutError:
            return False
        except (OSError, ProtocolError, ValueError) as exc:
            self._fail(exc)
            return True
        if frame is None:
            self._fail(ConnectionError("server closed the connection"))
            return True
        if frame.kind is wire.FrameKind.PROTOCOL_ERROR:
            self._fail(ProtocolError(f"server rejected our frame: {bytes(frame.segments[0]).decode()!r}"))
            return True
        with self._cond:
            entry = self._pending.pop(frame.request_id, None)
            if entry is not None:
                if entry.callback is None:
                    # A thread waits for it: hand it over here, in the same critical section.
                    entry.response = frame
                    if self._waiters:
                        self._cond.notify_all()
                    entry = None
                else:
                    self._unattended -= 1
            finished = self._retiring and not self._pending
        if entry is not None:
            self._deliver(entry, frame)
        if finished:
            self.close()
        return True

    def _deliver(self, entry: Pending, response: wire.Frame | BaseException) -> None:
        if entry.callback is not None:
            entry.response = response
            entry.callback(response)
            if self._waiters:
                with self._cond:
                    self._cond.notify_all()
            return
        with self._cond:
            entry.response = response
            if self._waiters:
                self._cond.notify_all()

    def _release_role(self) -> None:
        with self._cond:
            self._reading = False
            self._reader_blocked = False
            self._role_free_since = time.monotonic()
            if self._waiters:
                self._cond.notify_all()
            if self._unattended and self.error is None:
                self._start_pump_locked()

    def _start_pump_locked(self) -> None:
        if self._pump is None:
            self._pump = threading.Thread(target=self._pump_loop, name=f"fray-rpc-pump-{self.address}", daemon=True)
            self._pump.start()
        elif self._pump_sleeping:
            self._pump_cond.notify()

    def _pump_loop(self) -> None:
        while True:
            with self._cond:
                while self.error is None:
                    if self._reading or not self._unattended:
                        self._pump_sleeping = True
                        self._pump_cond.wait()
                        self._pump_sleeping = False
                        continue
                    # A thread about to wait on a future reads for itself, without a thread
                    # switch (see help_until); step in only when none has for a moment.
                    idle = time.monotonic() - self._role_free_since
                    if idle >= _PUMP_GRACE:
                        break
                    self._pump_cond.wait(_PUMP_GRACE - idle)
                if self.error is not None:
                    return
                self._reading = True
            try:
                while self.error is None:
                    with self._cond:
                        # Hand the role over when nothing is left for the pump, or a thread
                        # waiting for its own response can read for itself.
                        if not self._unattended or self._waiters:
                            break
                    self._read_one(None)
            finally:
                self._release_role()

    def usable(self) -> bool:
        """False once the connection failed, including a server that died while nobody was reading.

        An idle connection has no reader, so a server that died meanwhile left its EOF
        unread in the socket; peeking notices it before a call is sent into it (which
        would leave that call's fate unknown).
        """
        if self.error is not None:
            return False
        if self.is_local or self._reading or self._pending:
            # Busy: whoever reads will see the EOF. Local: a send to a dead peer fails at once
            # (EPIPE), so the call is provably not sent without looking first.
            return True
        with self._cond:
            if self.error is None and not self._reading and not self._pending:
                self._check_idle_locked()
            return self.error is None

    def _check_idle_locked(self) -> None:
        if self.is_local:
            return
        try:
            data = self._sock.recv(1, _PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.error = exc
            return
        # A server never speaks unasked: EOF, or bytes nobody waits for, both end the connection.
        self.error = ConnectionError("server closed the connection" if not data else "unexpected data from server")

    def _lost_error(self) -> ActorUnavailableError:
        return ActorUnavailableError(
            f"connection to the actor server at {self.address} was lost while the call was in flight "
            f"({self.error}); the call may or may not have run"
        )

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            # Unsent entries belong to their sender, which will see its own send fail;
            # queued ones were never written, so they provably did not run.
            queued = [entry for entry, _ in self._take_outbox_locked()]
            for entry in queued:
                self._pending.pop(entry.rid, None)
            lost = [rid for rid, entry in self._pending.items() if entry.sent]
            entries = [self._pending.pop(rid) for rid in lost]
            self._unattended -= sum(1 for entry in entries + queued if entry.callback is not None)
            self._cond.notify_all()
            self._pump_cond.notify_all()
        for entry in entries:
            self._deliver(entry, self._lost_error())
        for entry in queued:
            self._deliver(
                entry,
                ActorUnavailableError(
                    f"connection to the actor server at {self.address} was lost ({self.error}) before "
                    "the call was sent; it did not run"
                ),
            )
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._frames.close()


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (at least 1 ms), or None without one."""
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)
