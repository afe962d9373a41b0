"""``LocalJobContext``: the job level on threads of this process (the default context).

Tasks run on a pool of at most ``max_workers`` threads at a time; the submitter's
context variables are copied into each task (so ``current_client()``, ``current_job()``
and ``get_job_context()`` there are the submitter's, and nested tasks work). A task
waiting in ``get``/``wait`` gives up its place while it waits, as a Ray task gives
back its CPU, so nested tasks never deadlock a full pool. A task starts only once
the refs among its arguments are ready; if one of them failed, the task fails with
that error without running. Objects are shared by reference (no copy): do not mutate
what ``get`` returns. Nothing is pickled, so functions and values need not be picklable.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import itertools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from fray.context import (
    JobContextBase,
    TaskCall,
    after_all,
    bind_context,
    first_ready,
    new_context_id,
    not_ready_error,
    resolve_arguments,
    task_name,
)
from fray.core._remote import RemoteFailure, remote_error
from fray.core.inside._stacks import thread_task
from fray.errors import ConfigError, TaskLostError
from fray.job_info import _current_job

__all__ = ["LocalJobContext", "LocalObjectRef"]

# Every live ref of this process by id, so that a ref pickled and unpickled here (e.g. when an
# actor call checks its arguments) is the same ref.
_REFS: weakref.WeakValueDictionary[str, LocalObjectRef] = weakref.WeakValueDictionary()


class _TaskError(Exception):
    """How a failed task sits in its future: the failure as captured, and the original exception."""

    def __init__(self, failure: RemoteFailure, original: BaseException | None) -> None:
        super().__init__(failure.summary)
        self.failure = failure
        self.original = original


class LocalObjectRef:
    """A ref of a :class:`LocalJobContext`: a future in this process."""

    __slots__ = ("__weakref__", "_context_id", "_future", "ref_id")

    def __init__(self, context_id: str, ref_id: str, future: concurrent.futures.Future[Any]) -> None:
        self._context_id = context_id
        self.ref_id = ref_id
        self._future = future

    def __repr__(self) -> str:
        state = "ready" if self._future.done() else "pending"
        return f"LocalObjectRef({self.ref_id!r}, {state})"

    def __reduce__(self) -> tuple[object, ...]:
        _REFS[self.ref_id] = self
        return (_find_ref, (self.ref_id,))


def _find_ref(ref_id: str) -> LocalObjectRef:
    ref = _REFS.get(ref_id)
    if ref is None:
        raise ConfigError(
            f"ObjectRef {ref_id!r} of a LocalJobContext was unpickled in another process; thread contexts' refs "
            "live in the process that made them (use ProcessJobContext or a cluster context to share objects)"
        )
    return ref


class _Threads:
    """A pool of threads running at most ``limit`` tasks at once; a task blocked in a wait does not count.

    Threads are started when work can run and no idle thread is coming for it, and
    end after :data:`IDLE_EXIT` seconds without work.
    """

    IDLE_EXIT = 10.0

    def __init__(self, limit: int, name: str) -> None:
        self._limit = limit
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[tuple[Callable[[], None], Callable[[], None]]] = deque()  # (work, drop)
        self._active = 0  # threads running a task and not blocked in a wait
        self._idle = 0  # threads waiting for work
        self._wakeups = 0  # idle threads notified but not yet awake
        self._starting = 0  # threads started but not yet looking for work
        self._closed = False
        self._local = threading.local()
        self._serial = itertools.count(1)

    def submit(self, work: Callable[[], None], drop: Callable[[], None]) -> None:
        """Run ``work`` on a thread; ``drop`` is called instead if the pool closes before it starts."""
        with self._cond:
            if self._closed:
                raise ConfigError("this LocalJobContext is shut down; create a new one")
            self._queue.append((work, drop))
            self._wake()

    def _wake(self) -> None:
        # With the lock held: make sure a thread is coming for every queued task that may run now.
        need = min(len(self._queue), self._limit - self._active) - self._wakeups - self._starting
        for _ in range(need):
            if self._idle > self._wakeups:
                self._wakeups += 1
                self._cond.notify()
            else:
                self._starting += 1
                thread = threading.Thread(target=self._run, name=f"{self._name}-{next(self._serial)}", daemon=True)
                thread.start()

    def _run(self) -> None:
        self._local.pool = self
        with self._cond:
            self._starting -= 1
            while not self._closed:
                if self._queue and self._active < self._limit:
                    work, _ = self._queue.popleft()
                    self._active += 1
                    self._cond.release()
                    try:
                        work()
                    finally:
                        self._cond.acquire()
                        self._active -= 1
                        self._wake()
                    continue
                self._idle += 1
                notified = self._cond.wait(self.IDLE_EXIT)
                self._idle -= 1
                if notified:
                    self._wakeups = max(0, self._wakeups - 1)
                elif not self._queue:
                    return

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a blocking wait: a task of this pool gives up its place meanwhile."""
        if getattr(self._local, "pool", None) is not self:
            yield
            return
        with self._cond:
            self._active -= 1
            self._wake()
        try:
            yield
        finally:
            with self._cond:
                self._active += 1

    def close(self) -> None:
        """Start nothing more: queued work is dropped; running work finishes."""
        with self._cond:
            self._closed = True
            dropped = [drop for _, drop in self._queue]
            self._queue.clear()
            self._cond.notify_all()
        for drop in dropped:
            drop()


class LocalJobContext(JobContextBase[LocalObjectRef]):
    """The job level on threads of this process: see the module docstring.

    ``max_workers`` bounds how many tasks run at once (default: the machine's CPU
    count plus 4, at most 32, as :class:`concurrent.futures.ThreadPoolExecutor`).
    ``client`` is where ``create_actor`` creates actors (default: the current client
    at the time of the call). Threads are Python threads: CPU-bound Python code does
    not run in parallel; use :class:`~fray.ProcessJobContext` for that.
    """

    def __init__(self, max_workers: int | None = None, *, client: Any = None) -> None:
        if max_workers is None:
            max_workers = min(32, (os.cpu_count() or 1) + 4)
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"LocalJobContext(max_workers={max_workers!r}) must be a whole number >= 1")
        self.context_id = new_context_id("threads")
        self.max_workers = max_workers
        self._client = client
        self._threads = _Threads(max_workers, f"fray-task-{self.context_id}")
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"LocalJobContext(max_workers={self.max_workers})"

    def __enter__(self) -> LocalJobContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Drop tasks not started yet and let the pool's threads end; running tasks finish."""
        self._threads.close()

    def _new_ref(self, future: concurrent.futures.Future[Any]) -> LocalObjectRef:
        return LocalObjectRef(self.context_id, f"{self.context_id}/{next(self._ids)}", future)

    _REF = LocalObjectRef

    def _owns(self, ref: LocalObjectRef) -> bool:
        return ref._context_id == self.context_id

    # ----- tasks --------------------------------------------------------------------------------

    def _submit(self, call: TaskCall[LocalObjectRef]) -> LocalObjectRef:
        """Run ``fn(*args, **kwargs)`` on a thread once the refs among its arguments are ready."""
        fn, args, kwargs, deps = call.fn, call.args, call.kwargs, call.deps
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        context = contextvars.copy_context()
        # The task's own context: the submitter's variables, with this job context bound.
        context.run(bind_context, self)
        ref = self._new_ref(future)
        task_id = ref.ref_id
        job = _current_job.get()  # whose task it is, for that job's stacks()
        job_id = job.job_id if job is not None else None

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                call_args, call_kwargs = resolve_arguments(args, kwargs, self._is_ref, _value)
                with thread_task(task_id, job_id):
                    result = context.run(fn, *call_args, **call_kwargs)
            except BaseException as exc:
                future.set_exception(_TaskError(RemoteFailure.capture(exc), exc))
                return
            future.set_result(result)

        def drop() -> None:
            if future.set_running_or_notify_cancel():
                future.set_exception(
                    TaskLostError(f"task {task_name(fn)!r} never ran: its LocalJobContext was shut down")
                )

        if not deps:
            self._threads.submit(run, drop)
        else:
            self._after(deps, future, run, drop)
        return ref

    def _after(
        self,
        deps: list[LocalObjectRef],
        future: concurrent.futures.Future[Any],
        run: Callable[[], None],
        drop: Callable[[], None],
    ) -> None:
        """Submit ``run`` once every dep is done; fail ``future`` with the first dep that failed."""

        def start() -> None:
            for dep in deps:
                exc = dep._future.exception()
                if exc is not None:
                    future.set_exception(exc)
                    return
            try:
                self._threads.submit(run, drop)
            except ConfigError:
                drop()

        after_all([dep._future for dep in deps], start)

    def _put(self, obj: Any) -> LocalObjectRef:
        """A ref to ``obj`` itself (shared, not copied)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(obj)
        return self._new_ref(future)

    # ----- results ------------------------------------------------------------------------------

    def _values(self, refs: list[LocalObjectRef], timeout: float | None) -> list[Any]:
        futures = [ref._future for ref in refs]
        if not all(f.done() for f in futures):
            with self._threads.waiting():
                _, not_done = concurrent.futures.wait(futures, timeout)
            if not_done:
                raise not_ready_error("get", len(not_done), len(futures), timeout)
        return [_value(ref) for ref in refs]

    def _first_ready(
        self, refs: list[LocalObjectRef], want: int, timeout: float | None
    ) -> tuple[list[LocalObjectRef], list[LocalObjectRef]]:
        # Blocks on the futures themselves, without polling; a task waiting here lends its thread.
        with self._threads.waiting():
            return first_ready(refs, [ref._future for ref in refs], want, timeout)


def _value(ref: LocalObjectRef) -> Any:
    """A done ref's value, or its task's error in the shared form."""
    try:
        return ref._future.result()
    except _TaskError as err:
        raise remote_error(err.failure, original=err.original) from None
