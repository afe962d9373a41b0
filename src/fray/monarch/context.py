"""``MonarchJobContext``: tasks as calls on a pool of pre-spawned Monarch processes (``monarch?procs=N``).

The pool is one Fray actor group of ``procs`` stateless :class:`TaskRunner` actors
(one Monarch process mesh, :class:`~fray.monarch.host.FrayHost` on each rank),
spawned once, on first use. ``create_task(fn, ...)`` queues the task here; each
free rank gets one call ``run(fn, args, kwargs)`` at a time (a rank runs its calls
in order, so a second call sent to a busy rank would wait behind the first: the
queue stays here instead). Calls complete through Monarch's bridge
(:mod:`fray.monarch.futures`), which frees the rank and sends the next task: no
polling loop anywhere. A task's exception is the one error form; a rank that died
fails its task with :class:`~fray.errors.TaskLostError` and is replaced by a new
actor.

Monarch has no object store (see the seed design): ``put`` raises ``ConfigError``
naming the alternatives. Refs are futures of this process: refs among a task's
arguments (top level, one level in) are resolved here before the call is sent, so
the values travel with the call. Inside a task, ``get_job_context()`` is a context
on the same pool that sends to the *other* ranks (each process queues its own
tasks); a task waiting on nested tasks holds its rank meanwhile, so nesting as deep
as the pool has ranks waits forever: keep nesting shallow, or use
``ProcessJobContext`` for recursive fan-out.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from fray.context import (
    JobContextBase,
    TaskCall,
    after_all,
    bind_context,
    clear_job_context,
    first_ready,
    new_context_id,
    not_ready_error,
    resolve_arguments,
    task_name,
)
from fray.core._serialization import call_parts, check_picklable
from fray.core.inside._stacks import running_task
from fray.errors import ActorDiedError, ConfigError, TaskLostError

__all__ = ["MonarchJobContext", "MonarchObjectRef", "TaskRunner"]

_REFS: weakref.WeakValueDictionary[str, MonarchObjectRef] = weakref.WeakValueDictionary()


class TaskRunner:
    """The stateless actor on each rank of the pool: runs one task per call."""

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        context: Any,
        rank: int,
        task_id: str = "",
    ) -> Any:
        context._pool.exclude = rank  # nested tasks go to the other ranks: this one is busy with the caller
        token = bind_context(context)
        try:
            with running_task(task_id):  # this process's stacks name the task (one at a time per rank)
                return fn(*args, **kwargs)
        finally:
            clear_job_context(token)


class MonarchObjectRef:
    """A ref of a :class:`MonarchJobContext`: the future of one task's call, valid in the process that made it."""

    __slots__ = ("__weakref__", "_context_id", "_future", "_here", "name", "ref_id")

    def __init__(
        self, context_id: str, ref_id: str, future: concurrent.futures.Future[Any], name: str, here: bool = True
    ) -> None:
        self._context_id = context_id
        self.ref_id = ref_id
        self._future = future
        self._here = here  # False for a ref unpickled in another process: its value is not known there
        self.name = name

    def __repr__(self) -> str:
        return f"MonarchObjectRef({self.ref_id!r})"

    def __reduce__(self) -> tuple[object, ...]:
        _REFS[self.ref_id] = self
        return (_find_ref, (self._context_id, self.ref_id, self.name))


def _find_ref(context_id: str, ref_id: str, name: str) -> MonarchObjectRef:
    """The ref itself in the process that made it; elsewhere a ref whose value cannot be fetched."""
    ref = _REFS.get(ref_id)
    return ref if ref is not None else MonarchObjectRef(context_id, ref_id, concurrent.futures.Future(), name, False)


def _check_here(refs: list[MonarchObjectRef]) -> None:
    for ref in refs:
        if not ref._here:
            raise ConfigError(
                f"ObjectRef {ref.ref_id!r} was made in another process; Monarch has no object store, so a ref's value "
                "is only known where it was made: pass the value itself (refs in a task's arguments, at the top level "
                "and one level inside lists and dicts, are replaced by their values before the call is sent)"
            )


# (function, args, kwargs, its ref's future, the function's name, the ref's id)
_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], "concurrent.futures.Future[Any]", str, str]


class _Pool:
    """The runner actors and this process's queue of tasks for them."""

    def __init__(self, client: Any, name: str, runners: list[Any], deferred: concurrent.futures.Executor) -> None:
        self.client = client  # None inside a task: dead ranks are then not replaced from there
        self.name = name
        self.runners = runners
        self.busy = [False] * len(runners)
        self.exclude: int | None = None
        self.queue: deque[_Job] = deque()
        self.lock = threading.Lock()
        self.replacements = itertools.count(1)
        self.deferred = deferred

    def submit(self, job: _Job, context: Any) -> None:
        with self.lock:
            self.queue.append(job)
            started = self._pump(context)
        self._run_after(started)

    def _pump(self, context: Any) -> list[Callable[[], object]]:
        # With the lock held: one call per free rank. What may run callbacks (watching a
        # call, failing a ref's future) is returned and done by the caller after it releases
        # the lock: a call that already finished runs its callback at once, a failed ref
        # starts the tasks waiting on it, and both take the lock again.
        after: list[Callable[[], object]] = []
        for rank in range(len(self.runners)):
            if not self.queue:
                break
            if self.busy[rank] or rank == self.exclude or self.runners[rank] is None:
                continue
            fn, args, kwargs, future, name, task_id = self.queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            self.busy[rank] = True
            try:
                call = self.runners[rank].run.remote(fn, args, kwargs, context, rank, task_id)
            except BaseException as exc:
                self.busy[rank] = False
                after.append(functools.partial(future.set_exception, exc))
                continue
            after.append(
                functools.partial(call.add_done_callback, functools.partial(self._done, rank, future, name, context))
            )
        return after

    @staticmethod
    def _run_after(after: list[Callable[[], object]]) -> None:
        for action in after:
            action()

    def _done(self, rank: int, future: concurrent.futures.Future[Any], name: str, context: Any, call: Any) -> None:
        error = call.exception()
        dead = isinstance(error, ActorDiedError)
        if dead:
            lost = TaskLostError(
                f"task {name!r} was lost: its Monarch process died ({error}); Fray does not run it again"
            )
            lost.__cause__ = error
            future.set_exception(lost)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(call.result())
        with self.lock:
            if dead:
                self.runners[rank] = None
                if self.client is not None:  # a new actor takes the rank (made off Monarch's bridge thread)
                    self.deferred.submit(self._replace, rank, context)
            else:
                self.busy[rank] = False
            started = self._pump(context)
        self._run_after(started)

    def _replace(self, rank: int, context: Any) -> None:
        runner = self.client.create_actor(TaskRunner, name=f"{self.name}-r{next(self.replacements)}")
        with self.lock:
            self.runners[rank] = runner
            self.busy[rank] = False
            started = self._pump(context)
        self._run_after(started)


class MonarchJobContext(JobContextBase[MonarchObjectRef]):
    """The job level on a pool of Monarch processes: see the module docstring.

    ``procs`` is the pool's size (``MonarchClient(procs=N)`` / ``monarch?procs=N``;
    default 2). ``resources`` of ``create_task`` are accepted and not enforced (the
    pool's processes are spawned once).
    """

    def __init__(self, client: Any, procs: int | None = None) -> None:
        size = 2 if procs is None else procs
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"MonarchJobContext(procs={procs!r}) must be a whole number >= 1")
        self._client = client
        self.procs = size
        self.context_id = new_context_id("monarch")
        self._pool: _Pool | None = None
        self._pool_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._deferred = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fray-monarch-deps")

    def __repr__(self) -> str:
        return f"MonarchJobContext(procs={self.procs})"

    def __reduce__(self) -> tuple[object, ...]:
        # Inside a task: a context on the same pool (its runners' handles travel), without a client.
        pool = self._ensure_pool()
        return (_remote_context, (self.context_id, self.procs, pool.name, pool.runners))

    def _ensure_pool(self) -> _Pool:
        with self._pool_lock:
            if self._pool is None:
                name = f"tasks-{uuid.uuid4().hex[:8]}"
                group = self._client.create_actor_group(TaskRunner, name=name, count=self.procs)
                self._pool = _Pool(self._client, name, list(group._handles), self._deferred)
            return self._pool

    _REF = MonarchObjectRef

    def _owns(self, ref: MonarchObjectRef) -> bool:
        return ref._context_id == self.context_id

    # ----- tasks ---------------------------------------------------------------------------------

    def _submit(self, call: TaskCall[MonarchObjectRef]) -> MonarchObjectRef:
        """Queue ``run(fn, args, kwargs)`` for the next free rank once the refs among the arguments are ready."""
        fn, args, kwargs, deps = call.fn, call.args, call.kwargs, call.deps
        _check_here(deps)
        name = task_name(fn)
        parts = call_parts(fn, args, kwargs, "the function")
        if deps:  # the refs are checked as the values they stand for, when they are known
            parts = {"the function": fn}
        check_picklable(f"task {name!r}", parts)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        ref = MonarchObjectRef(self.context_id, f"{self.context_id}/{next(self._ids)}", future, name)
        if not deps:
            self._ensure_pool().submit((fn, args, kwargs, future, name, ref.ref_id), self)
            return ref

        def start() -> None:
            try:
                values = resolve_arguments(args, kwargs, self._is_ref, _value)
            except BaseException as exc:  # an argument's task failed: this one fails the same way, unrun
                future.set_exception(exc)
                return
            self._ensure_pool().submit((fn, *values, future, name, ref.ref_id), self)

        after_all([dep._future for dep in deps], start)
        return ref

    def _put(self, obj: Any) -> MonarchObjectRef:
        """Refused: Monarch has no object store (the message names the alternatives)."""
        raise ConfigError(
            "MonarchJobContext.put: the Monarch backend has no object store; pass the value to create_task directly "
            "(it travels with the call), or keep shared state in an actor (ctx.create_actor)"
        )

    # ----- results -------------------------------------------------------------------------------

    def _values(self, refs: list[MonarchObjectRef], timeout: float | None) -> list[Any]:
        _check_here(refs)
        _, not_done = concurrent.futures.wait([ref._future for ref in refs], timeout)
        if not_done:
            raise not_ready_error("get", len(not_done), len(refs), timeout)
        return [_value(ref) for ref in refs]

    def _first_ready(
        self, refs: list[MonarchObjectRef], want: int, timeout: float | None
    ) -> tuple[list[MonarchObjectRef], list[MonarchObjectRef]]:
        _check_here(refs)
        return first_ready(refs, [ref._future for ref in refs], want, timeout)

    def shutdown(self) -> None:
        """Stop the pool's processes."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        self._deferred.shutdown(wait=False)
        if pool is not None and pool.client is not None:
            for runner in pool.runners:
                job = getattr(runner, "_record", None)
                if job is not None:
                    job.terminate()


def _value(ref: MonarchObjectRef) -> Any:
    """A done ref's value, or its task's error."""
    return ref._future.result()


def _remote_context(context_id: str, procs: int, name: str, runners: list[Any]) -> MonarchJobContext:
    """The context a task sees: the same pool, reached through its runners' handles, and its own queue."""
    context = MonarchJobContext(None, procs)
    context.context_id = context_id
    context._pool = _Pool(None, name, list(runners), context._deferred)
    return context
