"""The processes of a :class:`~fray.ProcessJobContext`: its fork server and the workers it forks.

:func:`main` (``main(["", FD])``) runs the fork server: a single-threaded interpreter
that imported what every worker needs, then forks one worker per request (~1 ms,
against ~70 ms to start and import a fresh interpreter; see ``docs/job-level.md``).
Requests are JSON lines on its stdin; it answers on file descriptor ``FD`` with
``{"started": wid, "pid": N}`` and ``{"exited": N, "code": C}`` (negative: the
signal). It exits when its stdin closes (the owner ended).

A worker connects back to the owner over the context's authenticated Unix socket
and runs tasks one at a time on its main thread; a reader thread takes every
message as it arrives (so the owner's sends never wait on a busy worker) and ends
the process the moment the owner's connection closes. Inside a task,
``get_job_context()`` is a :class:`WorkerContext` that sends nested calls to the owner.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import queue
import select
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Connection
from typing import Any

import cloudpickle

from fray.context import (
    bind_context,
    check_num_returns,
    check_task,
    check_timeout,
    create_actor_via,
    find_refs,
    not_ready_error,
    one_ref,
    ref_list,
    resolve_arguments,
    task_name,
)
from fray.core._remote import RemoteFailure, remote_error
from fray.core._serialization import call_parts, check_picklable, refused
from fray.core.inside._stacks import running_task, serve
from fray.errors import ObjectLostError, TaskLostError
from fray.joblevel import _objects
from fray.joblevel._taskwire import ONCE, Dep, ProcessObjectRef, dumps, function_blob, no_delay, receive, send
from fray.resources import ResourceConfig

__all__ = ["AUTHKEY_VARIABLE", "WorkerContext", "serve_owner", "value_of"]

#: The environment variable that carries the context's connection key to the fork server.
AUTHKEY_VARIABLE = "FRAY_TASKS_AUTHKEY"


def value_of(kind: str, frames: Sequence[Any]) -> Any:
    """An object's value from its stored form (see :mod:`fray.joblevel._objects`), or the error its ``get`` raises.

    Kinds: ``ok`` and ``bytes`` (a value), ``error`` (an encoded RemoteFailure), ``lost``
    (the task's worker died: a message), ``gone`` (the owner freed the object: a message).
    """
    if kind in ("ok", "bytes"):  # fray.joblevel._task_records.VALUE_KINDS
        return _objects.decode(kind, frames)
    if kind == "error":
        raise remote_error(RemoteFailure.decode(bytes(frames[0])))
    if kind == "lost":
        raise TaskLostError(bytes(frames[0]).decode())
    raise ObjectLostError(bytes(frames[0]).decode())


class _Reply:
    __slots__ = ("blobs", "event", "header")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.header: tuple[Any, ...] = ()
        self.blobs: list[bytes] = []


class _Worker:
    """One worker process: its connection, object cache, function cache and pending requests."""

    def __init__(self, conn: Connection, context_id: str, wid: int) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()
        self.context_id = context_id
        self.wid = wid
        self.tasks: queue.SimpleQueue[tuple[tuple[Any, ...], list[bytes]] | None] = queue.SimpleQueue()
        # ref id -> (kind, frames): objects the owner sent here (it knows which), and this worker's puts.
        self.cache: dict[str, tuple[str, list[Any]]] = {}
        self.functions: dict[str, Any] = {}
        self.replies: dict[int, _Reply] = {}
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.sent_keys: set[str] = set()
        self.pickled: weakref.WeakKeyDictionary[Any, tuple[str, bytes]] = weakref.WeakKeyDictionary()
        self.context = WorkerContext(self)

    def send(self, header: tuple[Any, ...], blobs: Sequence[Any] = ()) -> None:
        send(self.conn, self.send_lock, header, blobs)

    def read(self) -> None:
        """The reader thread: file every message; end the process when the owner is gone."""
        try:
            while True:
                header, blobs = receive(self.conn)
                kind = header[0]
                if kind == "run":
                    self.tasks.put((header, blobs))
                elif kind == "reply":
                    with self.lock:
                        slot = self.replies.get(header[1])
                    if slot is not None and not slot.event.is_set():
                        slot.header, slot.blobs = header, blobs
                        slot.event.set()
                elif kind == "free":
                    for ref_id in header[1]:
                        self.cache.pop(ref_id, None)
                elif kind == "exit":
                    self.tasks.put(None)
                    return
        except (EOFError, OSError):
            pass
        # The owner closed the connection or died: nothing here can be delivered any more.
        os._exit(0)

    def serve(self) -> None:
        """The main thread: run tasks one at a time, in the order they came."""
        bind_context(self.context)
        while True:
            message = self.tasks.get()
            if message is None:
                return
            self.run(*message)

    def run(self, header: tuple[Any, ...], blobs: list[bytes]) -> None:
        _, task_id, name, fn_key, with_fn, objects = header
        position = 0
        try:
            if with_fn:
                fn = cloudpickle.loads(blobs[0])
                position = 1
                if not fn_key.startswith(ONCE):
                    self.functions[fn_key] = fn
            else:
                fn = self.functions[fn_key]
            args_blob = blobs[position]
            self.file(objects, blobs[position + 1 :])
            args, kwargs = cloudpickle.loads(args_blob)
            args, kwargs = resolve_arguments(args, kwargs, _is_dep, self._dep_value)
            with running_task(task_id):  # stacks() of this process name the task it runs
                result = fn(*args, **kwargs)
            try:
                kind, frames = _objects.encode(result)
            except Exception as exc:
                raise refused(f"task {name!r}", "the return value", exc) from exc
        except BaseException as exc:
            kind, frames = "error", [RemoteFailure.capture(exc).encode()]
        self.send(("done", task_id, kind), frames)

    def file(self, objects: list[tuple[str, str, int]], frames: list[Any]) -> None:
        """Keep objects the owner sent: ``(ref_id, kind, frame count)`` each, their frames in order."""
        position = 0
        for ref_id, kind, count in objects:
            held = frames[position : position + count]
            if kind == "bytes" and type(held[0]) is not bytes:
                held = [bytes(held[0])]  # once here, so that every task shares one immutable copy
            self.cache[ref_id] = (kind, held)
            position += count

    def _dep_value(self, dep: Dep) -> Any:
        return value_of(*self.cache[dep.ref_id])

    def request(self, header: tuple[Any, ...], timeout: float | None) -> tuple[tuple[Any, ...], list[bytes]]:
        """Send a get or wait to the owner and block for its answer; on timeout, ask for the answer now."""
        rid = header[1]
        slot = _Reply()
        with self.lock:
            self.replies[rid] = slot
        try:
            self.send(header)
            if not slot.event.wait(timeout):
                self.send(("cancel", rid))
                slot.event.wait()
            return slot.header, slot.blobs
        finally:
            with self.lock:
                self.replies.pop(rid, None)


def _is_dep(value: Any) -> bool:
    return isinstance(value, Dep)


def _is_ref(value: Any) -> bool:
    return isinstance(value, ProcessObjectRef)


class WorkerContext:
    """``get_job_context()`` inside a task of a :class:`~fray.ProcessJobContext`: the owner does the work.

    Nested tasks and ``put`` objects belong to the owner (and are kept until the
    context shuts down); ``get`` and ``wait`` ask the owner, and a task waiting gives
    up its worker's place meanwhile, so nested tasks never deadlock the pool.
    """

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self.context_id = worker.context_id

    def __repr__(self) -> str:
        return f"WorkerContext({self.context_id!r}, worker={self._worker.wid})"

    def _owns(self, ref: ProcessObjectRef) -> bool:
        return ref.context_id == self.context_id

    def _new_id(self) -> str:
        return f"{self.context_id}/w{self._worker.wid}.{next(self._worker.ids)}"

    def create_task(
        self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any
    ) -> ProcessObjectRef:
        """Submit a nested task to the owner; returns its ref at once."""
        check_task(fn, resources)
        deps = [
            one_ref(d, ProcessObjectRef, "create_task: argument", self._owns) for d in find_refs(args, kwargs, _is_ref)
        ]
        name = task_name(fn)
        try:
            key, fn_blob = function_blob(fn, self._worker.pickled)
            args_blob = dumps(resolve_arguments(args, kwargs, _is_ref, lambda ref: Dep(ref.ref_id)))
        except Exception:
            check_picklable(f"task {name!r}", call_parts(fn, args, kwargs, "the function"))
            raise
        ref_id = self._new_id()
        worker = self._worker
        blobs = [args_blob] if key in worker.sent_keys else [fn_blob, args_blob]
        worker.send(("submit", ref_id, name, key, len(blobs) == 2, [d.ref_id for d in deps]), blobs)
        if not key.startswith(ONCE):
            worker.sent_keys.add(key)
        return ProcessObjectRef(self.context_id, ref_id)

    def put(self, obj: Any) -> ProcessObjectRef:
        """Store ``obj`` with the owner (a copy, pickled now); the worker keeps it cached too."""
        kind, frames = _objects.encode(obj)
        ref_id = self._new_id()
        self._worker.cache[ref_id] = (kind, frames)
        self._worker.send(("put", ref_id, kind), frames)
        return ProcessObjectRef(self.context_id, ref_id)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """Values from the owner (objects this worker already holds are not sent again)."""
        timeout = check_timeout(timeout, "get")
        if isinstance(refs, ProcessObjectRef) or not isinstance(refs, list | tuple):
            return self._values([one_ref(refs, ProcessObjectRef, "get()", self._owns)], timeout)[0]
        return self._values(ref_list(refs, ProcessObjectRef, "get()", self._owns), timeout)

    def _values(self, refs: list[ProcessObjectRef], timeout: float | None) -> list[Any]:
        worker = self._worker
        ids = [ref.ref_id for ref in refs]
        missing = [ref_id for ref_id in ids if ref_id not in worker.cache]
        if missing:
            header, blobs = worker.request(("get", next(worker.ids), missing), timeout)
            if header[2] == "timeout":
                raise not_ready_error("get", header[3], len(ids), timeout)
            worker.file(header[3], blobs)  # the owner records that this worker holds them
        return [value_of(*worker.cache[ref_id]) for ref_id in ids]

    def wait(
        self, refs: Sequence[ProcessObjectRef], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[ProcessObjectRef], list[ProcessObjectRef]]:
        """Ask the owner which of ``refs`` are ready; it answers once ``num_returns`` are (or at the timeout)."""
        items = ref_list(refs, ProcessObjectRef, "wait()", self._owns)
        want = check_num_returns(num_returns, len(items))
        timeout = check_timeout(timeout, "wait")
        worker = self._worker
        header, _ = worker.request(("wait", next(worker.ids), [r.ref_id for r in items], want), timeout)
        done = set(header[3])
        ready: list[ProcessObjectRef] = []
        not_ready: list[ProcessObjectRef] = []
        for ref in items:
            (ready if ref.ref_id in done and len(ready) < want else not_ready).append(ref)
        return ready, not_ready

    def create_actor(self, actor_class: type, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        """An actor of this process's current client (``FRAY_CLIENT_SPEC``, else the local backend)."""
        from fray.client import current_client

        return create_actor_via(current_client(), actor_class, args, name, kwargs)


# ----- the worker process ------------------------------------------------------------------------


def serve_owner(request: dict[str, Any], authkey: bytes) -> None:
    """Be worker ``request["wid"]``: connect to the owner and run its tasks until told to exit or the owner goes.

    ``request`` holds ``wid``, ``context``, ``address`` and ``family`` (how to reach the
    owner), and optionally ``path`` (``sys.path``) and ``cwd`` to take from the owner.
    """
    serve()  # the worker answers stacks() (fray.core.inside._stacks), naming the task it runs
    if "path" in request:
        sys.path[:] = request["path"]
    if "cwd" in request:
        with contextlib.suppress(OSError):
            os.chdir(request["cwd"])
    address = request["address"]
    family = request.get("family", "AF_UNIX")
    conn = Client(tuple(address) if family == "AF_INET" else address, family=family, authkey=authkey)
    no_delay(conn)
    worker = _Worker(conn, request["context"], request["wid"])
    worker.send(("hello", worker.wid, os.getpid()))
    threading.Thread(target=worker.read, name="fray-task-reader", daemon=True).start()
    worker.serve()


def _worker_main(request: dict[str, Any], authkey: bytes) -> None:
    """In a forked child: its own process group (stopping it reaches what its tasks started), then serve."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    serve_owner(request, authkey)


def _fork_worker(request: dict[str, Any], authkey: bytes, closing: list[int]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        for fd in closing:
            with contextlib.suppress(OSError):
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _worker_main(request, authkey)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve_forks(answers: int) -> None:
    """The fork server's loop: fork a worker per request line; report starts and exits on ``answers``."""
    authkey = bytes.fromhex(os.environ.pop(AUTHKEY_VARIABLE))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake select()
    stdin = sys.stdin.fileno()
    buffer = b""

    def answer(message: dict[str, Any]) -> None:
        os.write(answers, json.dumps(message).encode() + b"\n")

    while True:
        readable, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                answer({"exited": pid, "code": code})
        if stdin in readable:
            data = os.read(stdin, 1 << 16)
            if not data:
                return  # the owner is gone; its workers see their connections close and exit
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                pid = _fork_worker(request, authkey, [stdin, answers, wake_r, wake_w])
                answer({"started": request["wid"], "pid": pid})


def main(argv: list[str]) -> None:
    """Entry point of the fork server; ``argv[1]`` is the file descriptor to answer on."""
    # Warm what user tasks commonly import (the public fray package), so that forked workers start with it.
    # Not a dependency of this module: nothing here uses it.
    importlib.import_module("fray")
    serve_forks(int(argv[1]))
