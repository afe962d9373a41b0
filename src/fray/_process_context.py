"""``ProcessJobContext``: the job level on worker processes of this machine (real parallelism).

This process -- the *owner* -- keeps every object and schedules every task; worker
processes (forked by a warm fork server, see :mod:`fray._task_worker`) run one task
at a time. A task is sent to an idle worker once the refs among its arguments are
ready, together with those objects' bytes unless that worker already holds them (a
``put`` object used by a thousand tasks crosses to each worker once). Results come
back as bytes and are decoded on ``get``.

At most ``num_workers`` tasks run at once; a task waiting in ``get``/``wait`` does
not count (more workers are started meanwhile, as Ray lends a blocked task's CPU),
so nested tasks never deadlock. A worker that dies fails its task with
:class:`~fray.errors.TaskLostError` (and the tasks that took its result) and is
replaced on demand; nothing is run twice.

Object lifetime: an object made here is freed (here and in the workers holding it)
once its ref is garbage-collected and no pending task needs it, unless the ref was
pickled into data (it may then be used anywhere, so it is kept until
:meth:`ProcessJobContext.shutdown`, after which finished results stay readable here
until their refs are dropped); objects made inside tasks (nested tasks and ``put``)
are kept until shutdown too.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from fray import _objects
from fray._runtime import check_terminated
from fray._serialization import call_parts, check_picklable
from fray._task_worker import AUTHKEY_VARIABLE, value_of
from fray._taskwire import ONCE, Dep, ProcessObjectRef, dumps, function_blob, receive, send
from fray.context import (
    check_callable,
    check_num_returns,
    check_resources,
    check_timeout,
    create_actor_via,
    find_refs,
    new_context_id,
    not_ready_error,
    one_ref,
    ref_list,
    resolve_arguments,
    task_name,
)
from fray.errors import ConfigError, ObjectLostError
from fray.resources import ResourceConfig

__all__ = ["ProcessJobContext"]

_PENDING = None
_NO_VALUE: Any = object()
#: Consecutive workers that die before connecting, after which queued tasks fail instead of retrying.
_START_FAILURES = 3


class _Object:
    __slots__ = ("blob", "dependents", "future", "holders", "kind", "pinned", "refs", "users", "value", "watchers")

    def __init__(self, pinned: bool) -> None:
        self.kind: str | None = _PENDING  # then "ok", "error" (blob: RemoteFailure), "lost" or "gone" (message)
        self.blob = b""
        self.value = _NO_VALUE
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.refs = 0  # live refs in this process (counted only for objects made here)
        self.users = 0  # unfinished tasks taking it as an argument
        self.pinned = pinned
        self.holders: set[int] = set()  # workers holding its bytes
        self.dependents: list[_Task] = []
        self.watchers: list[_Request] = []


class _Task:
    __slots__ = ("args_blob", "deps", "finished", "fn_blob", "fn_key", "name", "task_id", "waiting")

    def __init__(self, task_id: str, name: str, fn_key: str, fn_blob: bytes | None, args_blob: bytes) -> None:
        self.task_id = task_id
        self.name = name
        self.fn_key = fn_key
        self.fn_blob = fn_blob  # only for callables pickled per submission
        self.args_blob = args_blob
        self.deps: list[str] = []
        self.waiting = 0
        self.finished = False


class _Worker:
    __slots__ = ("blocked", "cached", "conn", "fn_keys", "lock", "pid", "requests", "task", "wid")

    def __init__(self, wid: int, conn: Connection, pid: int) -> None:
        self.wid = wid
        self.conn = conn
        self.lock = threading.Lock()
        self.pid = pid
        self.task: _Task | None = None
        self.blocked = 0  # its task's get/wait requests in progress
        self.cached: set[str] = set()
        self.fn_keys: set[str] = set()
        self.requests: dict[int, _Request] = {}


class _Request:
    __slots__ = ("count", "done", "ids", "num_returns", "rid", "worker")

    def __init__(self, worker: _Worker, rid: int, ids: list[str], num_returns: int | None) -> None:
        self.worker = worker
        self.rid = rid
        self.ids = ids
        self.num_returns = num_returns  # None for a get
        self.count = 0  # get: objects still pending; wait: objects ready
        self.done = False

    @property
    def satisfied(self) -> bool:
        """True once the worker can have its answer."""
        return self.count == 0 if self.num_returns is None else self.count >= self.num_returns


class ProcessJobContext:
    """The job level on worker processes of this machine: see the module docstring.

    ``num_workers`` (default: the CPU count) is how many tasks run at once. Functions,
    arguments and results must be picklable (they cross processes; a function defined
    in ``__main__`` travels by value). ``resources`` of ``create_task`` are accepted
    and not enforced. Worker output goes to this process's stdout/stderr. Workers
    import modules from this process's ``sys.path`` and current directory.
    ``client`` is where ``create_actor`` creates actors (default: the current client).
    """

    def __init__(self, num_workers: int | None = None, *, client: Any = None) -> None:
        if num_workers is None:
            num_workers = os.cpu_count() or 1
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"ProcessJobContext(num_workers={num_workers!r}) must be a whole number >= 1")
        self.num_workers = num_workers
        self.context_id = new_context_id("procs")
        self._client = client
        self._lock = threading.Lock()
        self._exited = threading.Condition(self._lock)
        self._objects: dict[str, _Object] = {}
        self._ready: deque[_Task] = deque()
        self._workers: dict[int, _Worker] = {}
        self._idle: list[_Worker] = []
        self._busy = 0
        self._blocked = 0
        self._starting: dict[int, int | None] = {}  # wid -> pid once forked
        self._start_failures = 0
        self._exits: dict[int, int] = {}
        self._functions: dict[str, bytes] = {}
        self._pickled: weakref.WeakKeyDictionary[Any, tuple[str, bytes]] = weakref.WeakKeyDictionary()
        self._released: deque[str] = deque()
        self._ids = itertools.count(1)
        self._wids = itertools.count(1)
        self._closed = False
        self._server: subprocess.Popen[bytes] | None = None
        self._listener: Listener | None = None
        self._wake_r, self._wake_w = -1, -1
        self._tmpdir = ""
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"ProcessJobContext(num_workers={self.num_workers})"

    def __enter__(self) -> ProcessJobContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __reduce__(self) -> tuple[object, ...]:
        raise ConfigError(
            "a ProcessJobContext cannot be pickled; inside its tasks, get_job_context() returns a context "
            "that reaches it"
        )

    # ----- start-up ------------------------------------------------------------------------------

    def _start(self) -> None:
        """Start the fork server and the threads that talk to the workers (first task only)."""
        authkey = os.urandom(32)
        self._tmpdir = tempfile.mkdtemp(prefix="fray-tasks-")
        self._listener = Listener(os.path.join(self._tmpdir, "owner.sock"), family="AF_UNIX", authkey=authkey)
        answers_r, answers_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        env = {**os.environ, AUTHKEY_VARIABLE: authkey.hex()}
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER_MAIN, str(answers_w)],
            stdin=subprocess.PIPE,
            env=env,
            pass_fds=[answers_w],
            start_new_session=True,
        )
        os.close(answers_w)
        for target, name in ((self._accept, "accept"), (self._serve, "io")):
            threading.Thread(target=target, name=f"fray-{name}-{self.context_id}", daemon=True).start()
        threading.Thread(
            target=self._read_answers, args=(answers_r,), name=f"fray-forks-{self.context_id}", daemon=True
        ).start()

    def _start_worker(self) -> None:
        # With the lock held.
        assert self._server is not None and self._server.stdin is not None and self._listener is not None
        wid = next(self._wids)
        self._starting[wid] = None
        request = {
            "wid": wid,
            "context": self.context_id,
            "address": self._listener.address,
            "path": list(sys.path),
            "cwd": os.getcwd(),
        }
        try:
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            self._server.stdin.flush()
        except OSError:
            del self._starting[wid]
            self._fail_queue("lost", "its ProcessJobContext's fork server is gone (was the process forked?)")

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closed:
            try:
                conn = listener.accept()
                (kind, wid, pid), _ = receive(conn)
            except Exception:  # a peer without the key, or the listener closing
                continue
            with self._lock:
                if self._closed or kind != "hello" or wid not in self._starting:
                    conn.close()
                    continue
                del self._starting[wid]
                self._start_failures = 0
                worker = _Worker(wid, conn, pid)
                self._workers[wid] = worker
                self._idle.append(worker)
                self._dispatch()
            os.write(self._wake_w, b"w")

    def _read_answers(self, fd: int) -> None:
        with open(fd, "rb") as answers:
            for line in answers:
                message = json.loads(line)
                with self._lock:
                    if "started" in message:
                        if message["started"] in self._starting:
                            self._starting[message["started"]] = message["pid"]
                        continue
                    pid, code = message["exited"], message["code"]
                    self._exits[pid] = code
                    self._exited.notify_all()
                    failed = [wid for wid, p in self._starting.items() if p == pid]
                    for wid in failed:  # died before it connected
                        del self._starting[wid]
                        self._start_failures += 1
                    if failed and self._start_failures >= _START_FAILURES:
                        self._fail_queue("lost", f"worker processes exit as they start (exit code {code}); see above")
                    elif failed:
                        self._dispatch()

    # ----- the I/O thread ------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closed:
            with self._lock:
                conns = {worker.conn: worker for worker in self._workers.values()}
            for ready in wait([*conns, self._wake_r]):
                if ready == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                assert isinstance(ready, Connection)
                worker = conns[ready]
                try:
                    header, blobs = receive(ready)
                except (EOFError, OSError):
                    self._lost(worker)
                    continue
                with self._lock:
                    try:
                        self._handle(worker, header, blobs)
                        self._drain()
                        self._dispatch()
                    except Exception:  # a bug here must not silence every later message
                        traceback.print_exc()

    def _handle(self, worker: _Worker, header: tuple[Any, ...], blobs: list[bytes]) -> None:
        kind = header[0]
        if kind == "done":
            task = worker.task
            worker.task = None
            self._busy -= 1
            if task is not None:
                self._finish(task, header[2], blobs[0])
            if worker.wid in self._workers:
                self._idle.append(worker)
        elif kind == "submit":
            _, ref_id, name, key, with_fn, deps = header
            if with_fn and not key.startswith(ONCE):
                self._functions.setdefault(key, blobs[0])
            fn_blob = blobs[0] if key.startswith(ONCE) else None
            self._add_task(ref_id, name, key, fn_blob, blobs[-1], deps, pinned=True)
        elif kind == "put":
            obj = self._objects[header[1]] = _Object(pinned=True)
            obj.holders.add(worker.wid)
            worker.cached.add(header[1])
            self._complete(obj, "ok", blobs[0])
        elif kind in ("get", "wait"):
            ids = header[2]
            request = _Request(worker, header[1], ids, header[3] if kind == "wait" else None)
            worker.requests[request.rid] = request
            if worker.blocked == 0:
                self._blocked += 1
            worker.blocked += 1
            for ref_id in ids:
                record = self._objects.get(ref_id)
                if record is not None and record.kind is _PENDING:
                    record.watchers.append(request)
                    request.count += kind == "get"
                elif kind == "wait":
                    request.count += 1
            if request.satisfied:
                self._answer(request)
        elif kind == "cancel":
            pending = worker.requests.get(header[1])
            if pending is not None and not pending.done:
                self._answer(pending, timed_out=True)

    def _answer(self, request: _Request, *, timed_out: bool = False) -> None:
        """Reply to a worker's get or wait (with the lock held)."""
        worker = request.worker
        request.done = True
        worker.requests.pop(request.rid, None)
        worker.blocked -= 1
        if worker.blocked == 0:
            self._blocked -= 1
        blobs: list[bytes] = []
        if request.num_returns is not None:
            ready = [i for i in request.ids if (o := self._objects.get(i)) is None or o.kind is not _PENDING]
            header: tuple[Any, ...] = ("reply", request.rid, "ready", ready)
        elif timed_out:
            header = ("reply", request.rid, "timeout", request.count)
        else:
            entries = []
            for ref_id in request.ids:
                obj = self._objects.get(ref_id)
                if obj is None:
                    entries.append((ref_id, "gone"))
                    blobs.append(f"object {ref_id!r} is gone: its owner freed it".encode())
                    continue
                entries.append((ref_id, obj.kind or "lost"))
                blobs.append(obj.blob)
                obj.holders.add(worker.wid)
                worker.cached.add(ref_id)
            header = ("reply", request.rid, "values", entries)
        with contextlib.suppress(OSError):
            send(worker.conn, worker.lock, header, blobs)

    def _lost(self, worker: _Worker) -> None:
        """A worker's connection closed: it died (or exited); fail its task, forget what it held."""
        with self._lock:
            if self._workers.pop(worker.wid, None) is None:
                return
            with contextlib.suppress(OSError):
                worker.conn.close()
            if worker in self._idle:
                self._idle.remove(worker)
            self._exited.wait_for(lambda: worker.pid in self._exits or self._closed, timeout=2.0)
            code = self._exits.get(worker.pid)
            for request in list(worker.requests.values()):
                request.done = True
            if worker.blocked:
                self._blocked -= 1
            for ref_id in worker.cached:
                obj = self._objects.get(ref_id)
                if obj is not None:
                    obj.holders.discard(worker.wid)
            task = worker.task
            if task is not None:
                self._busy -= 1
                how = f"exit code {code}" if code is not None and code >= 0 else f"signal {-code}" if code else ""
                self._finish(
                    task,
                    "lost",
                    f"task {task.name!r} was lost: its worker process (pid {worker.pid}) died"
                    f"{f' ({how})' if how else ''} while running it; Fray does not run it again".encode(),
                )
            self._dispatch()

    # ----- scheduling (all with the lock held) ---------------------------------------------------

    def _add_task(
        self, ref_id: str, name: str, key: str, fn_blob: bytes | None, args_blob: bytes, deps: list[str], pinned: bool
    ) -> _Object:
        obj = self._objects[ref_id] = _Object(pinned)
        obj.refs = 0 if pinned else 1  # made here: its one ref is about to be handed out
        task = _Task(ref_id, name, key, fn_blob, args_blob)
        failed: _Object | None = None
        for dep_id in dict.fromkeys(deps):
            dep = self._objects.get(dep_id)
            if dep is None:
                self._finish(task, "gone", f"task {name!r} takes object {dep_id!r}, which is gone".encode())
                return obj
            task.deps.append(dep_id)
            dep.users += 1
            if dep.kind is _PENDING:
                task.waiting += 1
                dep.dependents.append(task)
            elif dep.kind != "ok":
                failed = dep
        if failed is not None:
            self._finish(task, failed.kind or "lost", failed.blob)
        elif task.waiting == 0:
            self._ready.append(task)
        return obj

    def _finish(self, task: _Task, kind: str, blob: bytes) -> None:
        if task.finished:
            return
        task.finished = True
        for dep_id in task.deps:
            dep = self._objects.get(dep_id)
            if dep is not None:
                dep.users -= 1
                self._maybe_free(dep_id, dep)
        obj = self._objects.get(task.task_id)
        if obj is not None:
            self._complete(obj, kind, blob)
            self._maybe_free(task.task_id, obj)

    def _complete(self, obj: _Object, kind: str, blob: bytes) -> None:
        obj.kind, obj.blob = kind, blob
        dependents, obj.dependents = obj.dependents, []
        for task in dependents:
            if task.finished:
                continue
            if kind != "ok":
                self._finish(task, kind, blob)  # a task whose argument failed fails the same way, unrun
                continue
            task.waiting -= 1
            if task.waiting == 0:
                self._ready.append(task)
        watchers, obj.watchers = obj.watchers, []
        for request in watchers:
            if request.done:
                continue
            request.count += -1 if request.num_returns is None else 1
            if request.satisfied:
                self._answer(request)
        obj.future.set_result(None)

    def _dispatch(self) -> None:
        while self._ready and self._idle:
            task = self._ready.popleft()
            if not task.finished:
                self._run_on(self._idle.pop(), task)
        if self._closed:
            return
        if self._ready:
            running = self._busy - self._blocked + len(self._starting)
            for _ in range(min(len(self._ready), self.num_workers - running)):
                self._start_worker()
        elif self._idle and len(self._workers) - self._blocked > self.num_workers:
            worker = self._idle.pop()  # a worker started while others were blocked: no longer needed
            del self._workers[worker.wid]
            with contextlib.suppress(OSError):
                send(worker.conn, worker.lock, ("exit",))

    def _run_on(self, worker: _Worker, task: _Task) -> None:
        worker.task = task
        self._busy += 1
        blobs: list[bytes] = []
        with_fn = task.fn_key not in worker.fn_keys
        if with_fn:
            blobs.append(task.fn_blob if task.fn_blob is not None else self._functions[task.fn_key])
            if not task.fn_key.startswith(ONCE):
                worker.fn_keys.add(task.fn_key)
        blobs.append(task.args_blob)
        objects = []
        for dep_id in task.deps:
            if dep_id not in worker.cached:
                obj = self._objects[dep_id]
                objects.append((dep_id, obj.kind))
                blobs.append(obj.blob)
                worker.cached.add(dep_id)
                obj.holders.add(worker.wid)
        with contextlib.suppress(OSError):  # a dead worker is found by the I/O thread, which fails the task
            send(worker.conn, worker.lock, ("run", task.task_id, task.name, task.fn_key, with_fn, objects), blobs)

    def _fail_queue(self, kind: str, message: str) -> None:
        while self._ready:
            task = self._ready.popleft()
            self._finish(task, kind, f"task {task.name!r} never ran: {message}".encode())

    # ----- object lifetime -------------------------------------------------------------------------

    def _pin(self, ref_id: str) -> None:
        obj = self._objects.get(ref_id)
        if obj is not None:
            obj.pinned = True

    def _drain(self) -> None:
        """Free the objects whose refs were garbage-collected since the last call (lock held)."""
        while self._released:
            ref_id = self._released.popleft()
            obj = self._objects.get(ref_id)
            if obj is not None:
                obj.refs -= 1
                self._maybe_free(ref_id, obj)

    def _maybe_free(self, ref_id: str, obj: _Object) -> None:
        if obj.refs > 0 or obj.users > 0 or obj.pinned or obj.kind is _PENDING:
            return
        del self._objects[ref_id]
        for wid in obj.holders:
            worker = self._workers.get(wid)
            if worker is not None:
                worker.cached.discard(ref_id)
                with contextlib.suppress(OSError):
                    send(worker.conn, worker.lock, ("free", [ref_id]))

    def _new_ref(self, ref_id: str) -> ProcessObjectRef:
        """The one ref of an object made here (its record counts it already)."""
        ref = ProcessObjectRef(self.context_id, ref_id, self._pin)
        weakref.finalize(ref, self._released.append, ref_id)
        return ref

    # ----- the JobContext API ------------------------------------------------------------------

    def _owns(self, ref: ProcessObjectRef) -> bool:
        return ref.context_id == self.context_id

    def create_task(
        self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any
    ) -> ProcessObjectRef:
        """Run ``fn(*args, **kwargs)`` in a worker process once the refs among its arguments are ready."""
        check_terminated()
        check_callable(fn)
        check_resources(resources)
        deps = [
            one_ref(d, ProcessObjectRef, "create_task: argument", self._owns) for d in find_refs(args, kwargs, _is_ref)
        ]
        name = task_name(fn)
        try:
            key, fn_blob = function_blob(fn, self._pickled)
            args_blob = dumps(resolve_arguments(args, kwargs, _is_ref, _as_dep))
        except Exception:
            check_picklable(f"task {name!r}", call_parts(fn, args, kwargs, "the function"))
            raise
        with self._lock:
            self._check_open()
            if self._server is None:
                self._start()
            ref_id = f"{self.context_id}/{next(self._ids)}"
            if not key.startswith(ONCE):
                self._functions.setdefault(key, fn_blob)
            self._add_task(
                ref_id, name, key, fn_blob if key.startswith(ONCE) else None, args_blob, [d.ref_id for d in deps], False
            )
            ref = self._new_ref(ref_id)
            self._drain()
            self._dispatch()
        return ref

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this ProcessJobContext is shut down; create a new one")

    def put(self, obj: Any) -> ProcessObjectRef:
        """Store a snapshot of ``obj`` (pickled now); tasks receive copies, ``get`` here returns ``obj``."""
        check_terminated()
        blob = _objects.encode(obj)
        with self._lock:
            self._check_open()
            ref_id = f"{self.context_id}/{next(self._ids)}"
            record = self._objects[ref_id] = _Object(pinned=False)
            record.refs = 1
            record.value = obj
            self._complete(record, "ok", blob)
            return self._new_ref(ref_id)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """The value of one ref, or the values of a list of refs, in order (see :class:`~fray.JobContext`)."""
        check_terminated()
        timeout = check_timeout(timeout, "get")
        if isinstance(refs, ProcessObjectRef) or not isinstance(refs, list | tuple):
            return self._values([one_ref(refs, ProcessObjectRef, "get()", self._owns)], timeout)[0]
        return self._values(ref_list(refs, ProcessObjectRef, "get()", self._owns), timeout)

    def _records(self, refs: list[ProcessObjectRef]) -> list[_Object]:
        with self._lock:
            records = [self._objects.get(ref.ref_id) for ref in refs]
        for ref, record in zip(refs, records, strict=True):
            if record is None:
                raise ObjectLostError(f"object {ref.ref_id!r} is gone: freed, or its context was shut down")
        return records  # type: ignore[return-value]

    def _values(self, refs: list[ProcessObjectRef], timeout: float | None) -> list[Any]:
        records = self._records(refs)
        futures = [record.future for record in records if record.kind is _PENDING]
        if futures:
            _, not_done = concurrent.futures.wait(futures, timeout)
            if not_done:
                raise not_ready_error("get", len(not_done), len(refs), timeout)
        out = []
        for record in records:
            if record.value is _NO_VALUE:
                value = value_of(record.kind or "lost", record.blob)  # raises for a failed task
                record.value = value
            out.append(record.value)
        return out

    def wait(
        self, refs: Sequence[ProcessObjectRef], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[ProcessObjectRef], list[ProcessObjectRef]]:
        """The first ``num_returns`` refs to be ready, without polling (see :class:`~fray.JobContext`)."""
        check_terminated()
        items = ref_list(refs, ProcessObjectRef, "wait()", self._owns)
        want = check_num_returns(num_returns, len(items))
        timeout = check_timeout(timeout, "wait")
        records = self._records(items)
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = {record.future for record in records if not record.future.done()}
        while pending and len(items) - len(pending) < want:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            done, _ = concurrent.futures.wait(pending, remaining, concurrent.futures.FIRST_COMPLETED)
            pending -= done
        ready: list[ProcessObjectRef] = []
        not_ready: list[ProcessObjectRef] = []
        for ref, record in zip(items, records, strict=True):
            (ready if record.future.done() and len(ready) < want else not_ready).append(ref)
        return ready, not_ready

    def create_actor(self, actor_class: type, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        """An actor of this context's client (the current client when none was given)."""
        client = self._client
        if client is None:
            from fray.client import current_client

            client = current_client()
        return create_actor_via(client, actor_class, args, name, kwargs)

    # ----- shutdown ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers: running and queued tasks fail with TaskLostError; finished results stay readable here."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fail_queue("lost", "its ProcessJobContext was shut down")
            for worker in self._workers.values():
                if worker.task is not None:
                    self._finish(worker.task, "lost", b"its ProcessJobContext was shut down while it ran")
                with contextlib.suppress(OSError):
                    worker.conn.close()
            pending = [obj for obj in self._objects.values() if obj.kind is _PENDING]
            for obj in pending:
                self._complete(obj, "lost", b"its ProcessJobContext was shut down before it ran")
            self._workers.clear()
            self._idle.clear()
            self._exited.notify_all()
        if self._server is not None:
            with contextlib.suppress(OSError):
                assert self._server.stdin is not None
                self._server.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._server.wait(5)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def _is_ref(value: Any) -> bool:
    return isinstance(value, ProcessObjectRef)


def _as_dep(ref: ProcessObjectRef) -> Dep:
    return Dep(ref.ref_id)


_LIVE: weakref.WeakSet[ProcessJobContext] = weakref.WeakSet()
# Not ``-m fray._task_worker``: the user's functions defined in ``__main__`` must not meet Fray's module there.
_SERVER_MAIN = "import sys; from fray._task_worker import main; main(sys.argv)"


@atexit.register
def _shutdown_at_exit() -> None:
    for context in list(_LIVE):
        with contextlib.suppress(Exception):
            context.shutdown()
