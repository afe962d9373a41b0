"""How the actor server runs calls and answers them.

* :class:`ServerConnection` -- the server's side of one client connection: the
  socket, the lock its senders share, and the *outbox* that batches the answers
  to pipelined calls (with :class:`_Flusher` making sure none waits long).
* :class:`ActorRunner` -- runs one actor's calls, at most ``max_concurrency`` at
  a time, in arrival order; ``async def`` methods run on the actor's one
  :class:`~fray.core.inside._eventloop.ActorLoop` (through :func:`~fray.core.inside._eventloop.invoke`,
  as on every backend).
* :class:`Call` -- one accepted call: what to run and where its answer goes.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fray.actor import check_actor_method
from fray.cluster.rpc import wire
from fray.cluster.rpc.protocol import ActorInfo, ErrorCode, encode_error
from fray.core._serialization import check_result_picklable
from fray.core.inside._eventloop import ActorLoop, invoke
from fray.errors import SerializationError

__all__ = ["Actor", "ActorRunner", "Call", "CallHooks", "ServerConnection"]

# The connection thread writes batched responses at least every this many bytes, and
# responses queued before a call it runs itself leave at most this late (seconds).
_OUTBOX_FLUSH_BYTES = 64 * 1024
_BATCH_DELAY = 0.0005


class ServerConnection:
    """The server's side of one client connection: a socket and the lock its senders share.

    Responses to calls that the connection thread ran itself while more requests were
    already buffered are collected in an *outbox* and written together, with one
    system call, once the buffer runs dry (see :meth:`flush`): under pipelining that
    saves most of the per-response writes. Before the thread runs a call that might
    take long, it asks the :class:`_Flusher` to write the outbox if it is not back
    quickly, so a fast call's answer never waits for a slow call after it.
    """

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.reader_thread = 0
        self.reader: wire.FrameReader | None = None  # the connection thread's reader (see send)
        self._send_lock = threading.Lock()  # also guards the outbox
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._generation = 0  # counts flushes, so a late flusher can tell it is not needed

    def send(self, kind: wire.FrameKind, request_id: int, segments: list[Any]) -> None:
        """Send a response; a client that went away simply misses it."""
        if len(segments) == 1 and threading.get_ident() == self.reader_thread:
            frame = wire.small_frame(kind, request_id, segments[0])
            if frame is not None:
                reader = self.reader
                with self._send_lock:
                    if not self._outbox and reader is not None and not reader.buffered():
                        # Nothing queued and no request waiting behind this one: write now,
                        # rather than queue the answer and flush the queue a moment later.
                        with contextlib.suppress(OSError):
                            self.sock.sendall(frame)
                        return
                    self._outbox.append(frame)
                    self._outbox_bytes += len(frame)
                    full = self._outbox_bytes >= _OUTBOX_FLUSH_BYTES
                if full:
                    self.flush()
                return
        try:
            with self._send_lock:
                wire.send_frame(self.sock, kind, request_id, segments)
        except OSError:
            pass

    def flush(self, generation: int | None = None) -> None:
        """Write the outbox (if ``generation`` is given: only if no flush happened since)."""
        with self._send_lock:
            if not self._outbox or (generation is not None and generation != self._generation):
                return
            data = b"".join(self._outbox)
            self._outbox.clear()
            self._outbox_bytes = 0
            self._generation += 1
            with contextlib.suppress(OSError):
                self.sock.sendall(data)

    def before_inline_call(self) -> None:
        """The connection thread is about to run a call: make sure queued answers still leave soon."""
        if self._outbox:
            _flusher.watch(self, self._generation)

    def send_error(self, request_id: int, code: ErrorCode, exc: BaseException) -> None:
        self.send(wire.FrameKind.ERROR, request_id, encode_error(code, exc))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class _Flusher:
    """One daemon thread writing outboxes whose connection thread is busy running a call.

    Deadlines are all ``_BATCH_DELAY`` after registration, so they arrive in order
    and the thread only needs waking when the queue was empty.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[float, ServerConnection, int]] = collections.deque()
        self._thread: threading.Thread | None = None

    def watch(self, conn: ServerConnection, generation: int) -> None:
        with self._cond:
            self._queue.append((time.monotonic() + _BATCH_DELAY, conn, generation))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fray-actor-flusher", daemon=True)
                self._thread.start()
            elif len(self._queue) == 1:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                deadline, conn, generation = self._queue[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._queue.popleft()
            conn.flush(generation)


_flusher = _Flusher()


class Call:
    """One accepted call: what to run, and where its answer goes."""

    __slots__ = ("actor", "args", "conn", "kwargs", "method", "rid")

    def __init__(
        self, conn: ServerConnection, rid: int, actor: Actor, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.conn, self.rid, self.actor = conn, rid, actor
        self.method, self.args, self.kwargs = method, args, kwargs

    def run(self) -> None:
        """Run the method and send its result or exception (between the actor's hooks, if it has any)."""
        hooks = self.actor.hooks
        if hooks is None:
            self._run(None)
            return
        try:
            hooks.started()
        except BaseException as exc:  # the hook refuses the call: it did not run
            self.conn.send_error(self.rid, ErrorCode.RAISED, exc)
            return
        try:
            self._run(hooks)
        finally:
            hooks.ended()

    def _run(self, hooks: CallHooks | None) -> None:
        conn, actor = self.conn, self.actor
        try:
            result = invoke(actor.obj, self.method, self.args, self.kwargs, actor.runner.loop)
        except BaseException as exc:  # the caller gets every exception, SystemExit included
            withheld = hooks.withheld() if hooks is not None else None
            conn.send_error(self.rid, ErrorCode.RAISED, withheld or exc)
            return
        if hooks is not None and (withheld := hooks.withheld()) is not None:
            conn.send_error(self.rid, ErrorCode.RAISED, withheld)
            return
        try:
            segments = wire.encode(result)
        except SerializationError as exc:
            conn.send_error(self.rid, ErrorCode.UNPICKLABLE_RESULT, _result_error(actor.name, self.method, result, exc))
            return
        conn.send(wire.FrameKind.RESULT, self.rid, segments)

    def reject(self, code: ErrorCode, reason: str) -> None:
        """Answer without running: the actor went away while this call waited."""
        self.conn.send_error(self.rid, code, LookupError(f"{reason} before this call ran"))


def _result_error(actor_name: str, method: str, result: Any, error: SerializationError) -> SerializationError:
    """The error the caller gets for a return value that cannot be pickled, worded as on every backend."""
    try:
        check_result_picklable(actor_name, method, result)
    except SerializationError as worded:
        return worded
    return error  # pickled with cloudpickle's checks but not with ours: keep the wire's own words


class ActorRunner:
    """Runs one actor's calls, at most ``max_concurrency`` at a time, starting them in arrival order.

    With ``max_concurrency == 1`` (the default) calls wait in a backlog and exactly one
    thread at a time drains it. When the actor is idle the connection thread that
    received a call runs it itself (see :meth:`run_or_queue`), which saves a thread
    switch on the latency-critical path; a worker thread takes over the backlog
    whenever calls queue up behind a running one, so a connection never drains
    calls that arrived on other connections.

    With ``max_concurrency > 1`` calls go through a FIFO queue drained by up to
    ``max_concurrency`` worker threads, started on demand.
    """

    def __init__(self, label: str, max_concurrency: int) -> None:
        self.label = label
        self.max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        # max_concurrency == 1: the backlog, and whether some thread currently owns the actor.
        self._backlog: collections.deque[Call] = collections.deque()
        self._busy = False
        # Wakes the drain worker (max_concurrency == 1) or carries jobs to the pool (> 1).
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._idle = 0
        self._queued = 0
        self.loop = ActorLoop(label)  # where the actor's ``async def`` methods run
        self._stop_reason: tuple[ErrorCode, str] = (ErrorCode.NOT_FOUND, "")

    def run_or_queue(self, call: Call) -> None:
        """Run ``call`` now in this thread if the actor is idle, else queue it behind the others."""
        if self.max_concurrency > 1:
            self._submit_pool(call)
            return
        with self._lock:
            stopped = self._stopped
            if not stopped and (self._busy or self._backlog):
                self._backlog.append(call)
                return
            self._busy = not stopped
        if stopped:
            call.reject(*self._stop_reason)
            return
        try:
            call.conn.before_inline_call()
            call.run()
        finally:
            self._release()

    def _release(self) -> None:
        """Called by the thread owning the actor when its call is done: hand the backlog on, or go idle."""
        with self._lock:
            if not self._backlog or self._stopped:
                self._busy = False
                return
            if not self._threads:
                self._spawn(self._drain)
        # Ownership (busy stays True) passes to the drain worker.
        self._queue.put(None)

    def _drain(self) -> None:
        while True:
            self._queue.get()
            while True:
                with self._lock:
                    if self._stopped:
                        self._busy = False
                        return
                    if not self._backlog:
                        self._busy = False
                        break
                    call = self._backlog.popleft()
                call.run()

    def _submit_pool(self, call: Call) -> None:
        with self._lock:
            if self._stopped:
                stopped = True
            else:
                stopped = False
                self._queued += 1
                if self._queued > self._idle and len(self._threads) < self.max_concurrency:
                    self._spawn(self._work)
        if stopped:
            call.reject(*self._stop_reason)
            return
        self._queue.put(call)

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"fray-actor-{self.label}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if call is None:
                return
            call.run()

    def stop(self, code: ErrorCode, reason: str) -> None:
        """Refuse queued and later calls (they did not run), let running ones finish, stop the threads."""
        with self._lock:
            self._stopped = True
            self._stop_reason = (code, reason)
            refused = list(self._backlog)
            self._backlog.clear()
            threads = len(self._threads)
        self.loop.close()
        with contextlib.suppress(queue.Empty):
            while True:
                queued = self._queue.get_nowait()
                if queued is not None:
                    refused.append(queued)
        for call in refused:
            call.reject(code, reason)
        for _ in range(threads):
            self._queue.put(None)


class CallHooks(Protocol):
    """What an actor's host is told around each call (see ``ActorServer.register(hooks=...)``)."""

    def started(self) -> None:
        """A call is about to run; raising refuses it (the caller gets the exception, nothing runs)."""
        ...

    def withheld(self) -> BaseException | None:
        """The call has run: an exception returned here is the caller's answer instead of the call's own.

        A host being terminated says its actor died: the answer of a call that was still
        running then must not depend on whether it beat the server's stop to the socket.
        """
        ...

    def ended(self) -> None:
        """The call has run and its answer was sent."""
        ...


@dataclass
class Actor:
    namespace: str
    name: str
    actor_id: str
    obj: Any
    runner: ActorRunner
    hooks: CallHooks | None = None
    # Methods already checked callable (see check_method): the check runs once per method, not per call.
    checked: set[str] = field(default_factory=set)

    def check_method(self, method: str) -> None:
        """Raise AttributeError unless ``method`` may be called remotely (cached once it may)."""
        if method not in self.checked:
            check_actor_method(type(self.obj), method)
            self.checked.add(method)

    def info(self) -> ActorInfo:
        return ActorInfo(
            self.namespace, self.name, self.actor_id, type(self.obj).__qualname__, self.runner.max_concurrency
        )
