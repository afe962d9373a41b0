"""The owner side of the job level on worker processes, shared by the process and cluster contexts.

A :class:`TaskOwner` -- the process that calls ``create_task`` -- keeps every object
and schedules every task; worker processes connect to it over an authenticated
``multiprocessing.connection`` socket (see :mod:`fray.joblevel._taskwire`) and run one task at
a time (:mod:`fray.joblevel._task_worker`). Where workers come from is a :class:`Launcher`'s
business: forked on this machine (:class:`~fray.ProcessJobContext`) or started as
jobs on a Fray cluster (``fray.cluster.client.context.ClusterJobContext``).

A task is sent to an idle worker once the refs among its arguments are ready,
together with those objects' bytes unless that worker already holds them (a ``put``
object used by a thousand tasks crosses to each worker once). Results come back as
bytes and are decoded on ``get``. At most ``num_workers`` tasks run at once; a task
waiting in ``get``/``wait`` does not count (more workers are started meanwhile, as
Ray lends a blocked task's CPU), so nested tasks never deadlock. A worker that dies
fails its task with :class:`~fray.errors.TaskLostError` (and the tasks that took its
result) and is replaced on demand; nothing is run twice.

Object lifetime: an object made here is freed (here and in the workers holding it)
once its ref is garbage-collected and no pending task needs it, unless the ref was
pickled into data (it may then be used anywhere, so it is kept until ``shutdown``,
after which finished results stay readable here until their refs are dropped);
objects made inside tasks (nested tasks and ``put``) are kept until shutdown too.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import traceback
import weakref
from collections import deque
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from fray.context import (
    JobContextBase,
    TaskCall,
    first_ready,
    new_context_id,
    not_ready_error,
    resolve_arguments,
    task_name,
)
from fray.core._serialization import call_parts, check_picklable
from fray.errors import ConfigError, ObjectLostError
from fray.job_info import _current_job
from fray.joblevel import _objects
from fray.joblevel._owner_messages import reply_message, run_message
from fray.joblevel._task_records import (
    NO_VALUE,
    PENDING,
    START_FAILURES,
    VALUE_KINDS,
    Launcher,
    ObjectRecord,
    Request,
    TaskRecord,
    WorkerRecord,
)
from fray.joblevel._task_worker import value_of
from fray.joblevel._taskwire import ONCE, Dep, ProcessObjectRef, dumps, function_blob, no_delay, receive, send
from fray.resources import ResourceConfig

__all__ = ["TaskOwner", "live_owners"]


class TaskOwner(JobContextBase[ProcessObjectRef]):
    """A job context whose tasks run on worker processes that connect to this process: see the module docstring.

    Subclasses say where workers come from (:meth:`_launcher`) and on which address
    family the owner listens (``family``: ``"AF_UNIX"`` on this machine, ``"AF_INET"``
    for workers elsewhere, on ``host``).
    """

    def __init__(
        self, kind: str, num_workers: int, *, client: Any = None, family: str = "AF_UNIX", host: str = "127.0.0.1"
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"{type(self).__name__}(num_workers={num_workers!r}) must be a whole number >= 1")
        self.num_workers = num_workers
        self.context_id = new_context_id(kind)
        self._client = client
        self._family = family
        self._host = host
        self._lock = threading.Lock()
        self._objects: dict[str, ObjectRecord] = {}
        self._ready: deque[TaskRecord] = deque()
        self._workers: dict[int, WorkerRecord] = {}
        self._idle: list[WorkerRecord] = []
        self._busy = 0
        self._blocked = 0
        self._starting: set[int] = set()
        self._start_failures = 0
        self._functions: dict[str, bytes] = {}
        self._pickled: weakref.WeakKeyDictionary[Any, tuple[str, bytes]] = weakref.WeakKeyDictionary()
        self._released: deque[str] = deque()
        self._ids = itertools.count(1)
        self._wids = itertools.count(1)
        self._closed = False
        self._launcher: Launcher | None = None
        self._listener: Listener | None = None
        self._wake_r, self._wake_w = -1, -1
        self._tmpdir = ""
        job = _current_job.get()
        self.job_id = job.job_id if job is not None else None  # the job whose stacks() show its tasks
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_workers={self.num_workers})"

    def __enter__(self) -> TaskOwner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __reduce__(self) -> tuple[object, ...]:
        raise ConfigError(
            f"a {type(self).__name__} cannot be pickled; inside its tasks, get_job_context() returns a context "
            "that reaches it"
        )

    # ----- start-up ------------------------------------------------------------------------------

    def _launcher_for(self, address: Any, authkey: bytes) -> Launcher:
        """Where workers come from; they connect to ``address`` with ``authkey``."""
        raise NotImplementedError

    def _check_task_resources(self, resources: ResourceConfig | None) -> None:
        """Refuse a task that asks for more than a worker has (here: anything goes)."""

    def _worker_request(self, wid: int) -> dict[str, Any]:
        """What a new worker is told (a launcher may add to it)."""
        assert self._listener is not None
        return {"wid": wid, "context": self.context_id, "address": self._listener.address, "family": self._family}

    def _start(self) -> None:
        """Listen, make the launcher, start the threads that talk to the workers (first task only)."""
        authkey = os.urandom(32)
        if self._family == "AF_UNIX":
            self._tmpdir = tempfile.mkdtemp(prefix="fray-tasks-")
            address: Any = os.path.join(self._tmpdir, "owner.sock")
        else:
            address = (self._host, 0)
        self._listener = Listener(address, family=self._family, authkey=authkey)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._launcher = self._launcher_for(self._listener.address, authkey)
        for target, name in ((self._accept, "accept"), (self._serve, "io")):
            threading.Thread(target=target, name=f"fray-{name}-{self.context_id}", daemon=True).start()

    def _start_worker(self) -> None:
        # With the lock held.
        assert self._launcher is not None
        wid = next(self._wids)
        self._starting.add(wid)
        try:
            self._launcher.start(self._worker_request(wid))
        except OSError as exc:
            self._starting.discard(wid)
            self._fail_queue("lost", f"no worker could be started ({exc})")

    def start_failed(self, wid: int, note: str) -> None:
        """A launcher's report: worker ``wid`` ended before it connected."""
        with self._lock:
            if wid not in self._starting:
                return
            self._starting.discard(wid)
            self._start_failures += 1
            if self._start_failures >= START_FAILURES:
                self._fail_queue("lost", f"workers end as they start ({note})")
            else:
                self._dispatch()

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closed:
            try:
                conn = listener.accept()
                no_delay(conn)
                (kind, wid, pid), _ = receive(conn)
            except Exception:  # a peer without the key, or the listener closing
                continue
            with self._lock:
                if self._closed or kind != "hello" or wid not in self._starting:
                    conn.close()
                    continue
                self._starting.discard(wid)
                self._start_failures = 0
                worker = WorkerRecord(wid, conn, pid)
                self._workers[wid] = worker
                self._idle.append(worker)
                self._dispatch()
            os.write(self._wake_w, b"w")

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

    def _handle(self, worker: WorkerRecord, header: tuple[Any, ...], blobs: list[bytes]) -> None:
        kind = header[0]
        if kind == "done":
            task = worker.task
            worker.task = None
            self._busy -= 1
            if task is not None:
                self._finish(task, header[2], blobs)
            if worker.wid in self._workers:
                self._idle.append(worker)
        elif kind == "submit":
            _, ref_id, name, key, with_fn, deps = header
            if with_fn and not key.startswith(ONCE):
                self._functions.setdefault(key, blobs[0])
            fn_blob = blobs[0] if key.startswith(ONCE) else None
            self._add_task(ref_id, name, key, fn_blob, blobs[-1], deps, pinned=True)
        elif kind == "put":
            obj = self._objects[header[1]] = ObjectRecord(pinned=True)
            obj.holders.add(worker.wid)
            worker.cached.add(header[1])
            self._complete(obj, header[2], blobs)
        elif kind in ("get", "wait"):
            ids = header[2]
            request = Request(worker, header[1], ids, header[3] if kind == "wait" else None)
            worker.requests[request.rid] = request
            if worker.blocked == 0:
                self._blocked += 1
            worker.blocked += 1
            for ref_id in ids:
                record = self._objects.get(ref_id)
                if record is not None and record.kind is PENDING:
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

    def _answer(self, request: Request, *, timed_out: bool = False) -> None:
        """Reply to a worker's get or wait (with the lock held)."""
        worker = request.worker
        request.done = True
        worker.requests.pop(request.rid, None)
        worker.blocked -= 1
        if worker.blocked == 0:
            self._blocked -= 1
        header, blobs = reply_message(request, self._objects, timed_out=timed_out)
        with contextlib.suppress(OSError):
            send(worker.conn, worker.lock, header, blobs)

    def _lost(self, worker: WorkerRecord) -> None:
        """A worker's connection closed: it died (or exited); forget it now, fail its task once we know how it ended.

        Learning how it ended may take a moment (the fork server's word, a cluster job's
        state): that happens on a thread of its own, so the other workers are not held up.
        """
        with self._lock:
            if self._workers.pop(worker.wid, None) is None:
                return
            with contextlib.suppress(OSError):
                worker.conn.close()
            if worker in self._idle:
                self._idle.remove(worker)
            for request in list(worker.requests.values()):
                request.done = True
            if worker.blocked:
                self._blocked -= 1
            for ref_id in worker.cached:
                obj = self._objects.get(ref_id)
                if obj is not None:
                    obj.holders.discard(worker.wid)
            task, worker.task = worker.task, None
            if task is not None:
                self._busy -= 1
            self._dispatch()
        if task is not None:
            threading.Thread(target=self._fail_lost, args=(worker, task), name="fray-lost-task", daemon=True).start()

    def _fail_lost(self, worker: WorkerRecord, task: TaskRecord) -> None:
        how = self._launcher.death_note(worker.wid, worker.pid) if self._launcher is not None else ""
        message = (
            f"task {task.name!r} was lost: its worker process (pid {worker.pid}) died"
            f"{f' ({how})' if how else ''} while running it; Fray does not run it again"
        )
        with self._lock:
            self._finish(task, "lost", [message.encode()])
            self._dispatch()

    # ----- scheduling (all with the lock held) ---------------------------------------------------

    def _add_task(
        self, ref_id: str, name: str, key: str, fn_blob: bytes | None, args_blob: bytes, deps: list[str], pinned: bool
    ) -> ObjectRecord:
        obj = self._objects[ref_id] = ObjectRecord(pinned)
        obj.refs = 0 if pinned else 1  # made here: its one ref is about to be handed out
        task = TaskRecord(ref_id, name, key, fn_blob, args_blob)
        failed: ObjectRecord | None = None
        for dep_id in dict.fromkeys(deps):
            dep = self._objects.get(dep_id)
            if dep is None:
                self._finish(task, "gone", [f"task {name!r} takes object {dep_id!r}, which is gone".encode()])
                return obj
            task.deps.append(dep_id)
            dep.users += 1
            if dep.kind is PENDING:
                task.waiting += 1
                dep.dependents.append(task)
            elif dep.kind not in VALUE_KINDS:
                failed = dep
        if failed is not None:
            self._finish(task, failed.kind or "lost", failed.frames)
        elif task.waiting == 0:
            self._ready.append(task)
        return obj

    def _finish(self, task: TaskRecord, kind: str, frames: list[Any]) -> None:
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
            self._complete(obj, kind, frames)
            self._maybe_free(task.task_id, obj)

    def _complete(self, obj: ObjectRecord, kind: str, frames: list[Any]) -> None:
        obj.kind, obj.frames = kind, frames
        dependents, obj.dependents = obj.dependents, []
        for task in dependents:
            if task.finished:
                continue
            if kind not in VALUE_KINDS:
                self._finish(task, kind, frames)  # a task whose argument failed fails the same way, unrun
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

    def _run_on(self, worker: WorkerRecord, task: TaskRecord) -> None:
        worker.task = task
        self._busy += 1
        header, blobs = run_message(worker, task, self._objects, self._functions)
        with contextlib.suppress(OSError):  # a dead worker is found by the I/O thread, which fails the task
            send(worker.conn, worker.lock, header, blobs)

    def _fail_queue(self, kind: str, message: str) -> None:
        while self._ready:
            task = self._ready.popleft()
            self._finish(task, kind, [f"task {task.name!r} never ran: {message}".encode()])

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

    def _maybe_free(self, ref_id: str, obj: ObjectRecord) -> None:
        if obj.refs > 0 or obj.users > 0 or obj.pinned or obj.kind is PENDING:
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

    _REF = ProcessObjectRef

    def _owns(self, ref: ProcessObjectRef) -> bool:
        return ref.context_id == self.context_id

    def _submit(self, call: TaskCall[ProcessObjectRef]) -> ProcessObjectRef:
        """Run ``fn(*args, **kwargs)`` in a worker process once the refs among its arguments are ready."""
        fn, args, kwargs, deps = call.fn, call.args, call.kwargs, call.deps
        self._check_task_resources(call.resources)
        name = task_name(fn)
        try:
            key, fn_blob = function_blob(fn, self._pickled)
            args_blob = dumps(resolve_arguments(args, kwargs, _is_ref, _as_dep))
        except Exception:
            check_picklable(f"task {name!r}", call_parts(fn, args, kwargs, "the function"))
            raise
        with self._lock:
            self._check_open()
            if self._listener is None:
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

    def running_tasks(self) -> list[tuple[int, str]]:
        """``(worker pid, task id)`` of every task running now (what ``stacks()`` asks)."""
        with self._lock:
            return [(worker.pid, worker.task.task_id) for worker in self._workers.values() if worker.task is not None]

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"this {type(self).__name__} is shut down; create a new one")

    def _put(self, obj: Any) -> ProcessObjectRef:
        """Store a snapshot of ``obj`` (pickled now); tasks receive copies, ``get`` here returns ``obj``."""
        kind, frames = _objects.encode(obj)
        with self._lock:
            self._check_open()
            ref_id = f"{self.context_id}/{next(self._ids)}"
            record = self._objects[ref_id] = ObjectRecord(pinned=False)
            record.refs = 1
            record.value = obj
            self._complete(record, kind, frames)
            return self._new_ref(ref_id)

    def _records(self, refs: list[ProcessObjectRef]) -> list[ObjectRecord]:
        with self._lock:
            records = [self._objects.get(ref.ref_id) for ref in refs]
        for ref, record in zip(refs, records, strict=True):
            if record is None:
                raise ObjectLostError(f"object {ref.ref_id!r} is gone: freed, or its context was shut down")
        return records  # type: ignore[return-value]

    def _values(self, refs: list[ProcessObjectRef], timeout: float | None) -> list[Any]:
        records = self._records(refs)
        futures = [record.future for record in records if record.kind is PENDING]
        if futures:
            _, not_done = concurrent.futures.wait(futures, timeout)
            if not_done:
                raise not_ready_error("get", len(not_done), len(refs), timeout)
        out = []
        for record in records:
            if record.value is NO_VALUE:
                value = value_of(record.kind or "lost", record.frames)  # raises for a failed task
                record.value = value
            out.append(record.value)
        return out

    def _first_ready(
        self, refs: list[ProcessObjectRef], want: int, timeout: float | None
    ) -> tuple[list[ProcessObjectRef], list[ProcessObjectRef]]:
        records = self._records(refs)
        return first_ready(refs, [record.future for record in records], want, timeout)

    # ----- shutdown ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers: running and queued tasks fail with TaskLostError; finished results stay readable here."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fail_queue("lost", f"its {type(self).__name__} was shut down")
            for worker in self._workers.values():
                if worker.task is not None:
                    self._finish(
                        worker.task, "lost", [f"its {type(self).__name__} was shut down while it ran".encode()]
                    )
                with contextlib.suppress(OSError):
                    worker.conn.close()
            pending = [obj for obj in self._objects.values() if obj.kind is PENDING]
            for obj in pending:
                self._complete(obj, "lost", [f"its {type(self).__name__} was shut down before it ran".encode()])
            self._workers.clear()
            self._idle.clear()
        if self._launcher is not None:
            self._launcher.close()
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


_LIVE: weakref.WeakSet[TaskOwner] = weakref.WeakSet()


def live_owners(job_id: str | None) -> list[TaskOwner]:
    """The task owners of this process that job ``job_id`` created (for its ``stacks()``)."""
    return [owner for owner in list(_LIVE) if owner.job_id == job_id]


@atexit.register
def _shutdown_at_exit() -> None:
    for context in list(_LIVE):
        with contextlib.suppress(Exception):
            context.shutdown()
