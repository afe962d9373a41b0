"""``RayJobContext``: the job level on Ray (``ray.remote`` tasks, ``ray.put/get/wait``).

A task is a Ray task: plain functions become one ``ray.remote`` function each, made
once per function (Ray exports it once, as for ``@ray.remote``); other callables
travel pickled with each call. Refs among the arguments -- top level and one level
inside a list, tuple or dict -- are handed to Ray as top-level arguments, so Ray
resolves them all before the task runs (Ray alone resolves only the top level).
Inside the task, ``get_job_context()`` is this context (so nested tasks work, and Ray
lends a blocked task's CPU to them). A task's exception is captured where it was
raised and re-raised at ``get`` in the one error form; a task whose worker died
raises :class:`~fray.errors.TaskLostError`. Ray retries nothing (``max_retries=0``):
Fray never runs a task twice behind your back.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import cloudpickle
import ray.exceptions

import ray
from fray.client import client_from_spec
from fray.context import (
    JobContextBase,
    TaskCall,
    bind_context,
    clear_job_context,
    create_actor_via,
    not_ready_error,
    resolve_arguments,
    task_name,
)
from fray.core._codepickle import dumps
from fray.core._remote import RemoteFailure, remote_error
from fray.core._serialization import call_parts, check_picklable, refused
from fray.core.inside._stacks import running_task, serve
from fray.errors import ObjectLostError, TaskLostError
from fray.ray._errors import translate
from fray.ray._stacks import task_key, task_prefix
from fray.ray._values import shield
from fray.ray.inside import _worker
from fray.ray.resources import head_node_resource, ray_options

__all__ = ["RayJobContext", "RayObjectRef", "context_for"]


class RayObjectRef:
    """A ref of a :class:`RayJobContext`: a ``ray.ObjectRef`` (``.ray_ref``) and the task it came from."""

    __slots__ = ("name", "ray_ref")

    def __init__(self, ray_ref: Any, name: str = "") -> None:
        self.ray_ref = ray_ref
        self.name = name  # the task's function, for messages; empty for put objects

    @property
    def ref_id(self) -> str:
        """Ray's object id."""
        return str(self.ray_ref.hex())

    def __repr__(self) -> str:
        return f"RayObjectRef({self.ref_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RayObjectRef) and other.ray_ref == self.ray_ref

    def __hash__(self) -> int:
        return hash(self.ray_ref)

    def __reduce__(self) -> tuple[object, ...]:
        return (RayObjectRef, (self.ray_ref, self.name))


class _Slot:
    """Stands for the ``index``-th resolved ref in a task's arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[object, ...]:
        return (_Slot, (self.index,))


class _TaskError(Exception):
    """What a task raises to Ray when the user's code raised: the failure encoded where it happened."""

    def __init__(self, encoded: bytes) -> None:
        super().__init__("task failed")
        self.encoded = encoded

    def __reduce__(self) -> tuple[object, ...]:
        return (_TaskError, (self.encoded,))


def _is_slot(value: Any) -> bool:
    return isinstance(value, _Slot)


def _run(
    fn: Callable[..., Any], namespace: str, job_id: str, packed: tuple[Any, dict[str, Any]], values: tuple[Any, ...]
) -> Any:
    """The body of every task, in a Ray worker: bind the context, put the values in, call, capture.

    Inside a job (``job_id``) the task says where it runs once it has run for a moment, under
    its job's key (``fray.ray._stacks``), so that the job's ``stacks()`` finds it; its worker's
    stack server then names the task (by its ref id) in what it answers.
    """
    args, kwargs = packed
    if values:
        args, kwargs = resolve_arguments(args, kwargs, _is_slot, lambda slot: values[slot.index])
    token = bind_context(context_for(namespace))
    outer = _JOB.set(job_id)
    key = _where_task_runs(job_id)
    try:
        if key is None:
            return shield(fn(*args, **kwargs))
        with running_task(key[len(task_prefix(job_id)) :].decode()):
            return shield(fn(*args, **kwargs))
    except BaseException as exc:
        raise _TaskError(RemoteFailure.capture(exc).encode()) from None
    finally:
        _JOB.reset(outer)
        clear_job_context(token)
        if key is not None and _worker.REPORTER.cancel(key):
            # Only tasks that ran STARTED_AFTER seconds were written: quick ones cost nothing more.
            with contextlib.suppress(Exception):
                from ray.experimental import internal_kv

                internal_kv._internal_kv_del(key, namespace=_worker.KV_NAMESPACE)


# The Fray job a task belongs to, inside that task: its own tasks belong to the same job.
_JOB: contextvars.ContextVar[str] = contextvars.ContextVar("fray_ray_task_job", default="")


def _current_job_id() -> str:
    """The Fray job that code submitting a task runs in ("" outside any job: nobody asks for those tasks' stacks)."""
    return _JOB.get() or os.environ.get("FRAY_JOB_ID", "")


def _where_task_runs(job_id: str) -> bytes | None:
    """Inside a job: start this process's stack server and schedule the task's key; None outside a job."""
    if not job_id:
        return None
    serve()
    # A task's ref id is Ray's id of its first return object: the task's id, then return index 1 (4 bytes, LE).
    ref_id = f"{ray.get_runtime_context().get_task_id()}01000000"
    key = task_key(job_id, ref_id)
    _worker.REPORTER.schedule(key)
    return key


def _task_for(fn: Callable[..., Any]) -> Callable[..., Any]:
    def task(namespace: str, job_id: str, packed: tuple[Any, dict[str, Any]], *values: Any) -> Any:
        return _run(fn, namespace, job_id, packed, values)

    task.__name__ = task.__qualname__ = task_name(fn)
    return task


def _pickled_task(
    pickled_fn: bytes, namespace: str, job_id: str, packed: tuple[Any, dict[str, Any]], *values: Any
) -> Any:
    return _run(cloudpickle.loads(pickled_fn), namespace, job_id, packed, values)


class RayJobContext(JobContextBase[RayObjectRef]):
    """The job level on the Ray cluster of a :class:`~fray.ray.RayClient`: see the module docstring.

    ``create_task(resources=...)`` maps to Ray's task options as for jobs
    (``num_cpus``, ``memory``, GPUs, non-preemptible placement); without it a task
    takes Ray's default of one CPU. Actors are the client's.
    """

    _REF = RayObjectRef

    def __init__(self, client: Any = None, *, namespace: str | None = None) -> None:
        self._client = client
        self.namespace: str = client.namespace if client is not None else str(namespace)
        self._lock = threading.Lock()
        self._remotes: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._generic: Any = None
        self._pin: str | None = None

    @property
    def client(self) -> Any:
        """The RayClient behind ``create_actor`` (inside a task: one made for this namespace, once)."""
        with self._lock:
            if self._client is None:
                self._client = client_from_spec(f"ray?namespace={quote(self.namespace)}")
            return self._client

    def _pin_resource(self) -> str:
        if self._pin is None:
            self._pin = head_node_resource(ray.cluster_resources())
        return self._pin

    def __repr__(self) -> str:
        return f"RayJobContext(namespace={self.namespace!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (context_for, (self.namespace,))

    def _remote_for(self, fn: Callable[..., Any]) -> tuple[Any, tuple[Any, ...]]:
        """The Ray remote function for ``fn``, and the leading arguments it takes."""
        if isinstance(fn, types.FunctionType):
            with self._lock:
                remote = self._remotes.get(fn)
                if remote is None:
                    remote = self._remotes[fn] = ray.remote(max_retries=0)(_task_for(fn))
            return remote, ()
        with self._lock:
            if self._generic is None:
                self._generic = ray.remote(max_retries=0)(_pickled_task)
        return self._generic, (dumps(fn),)

    # ----- the JobContext API ------------------------------------------------------------------

    def _submit(self, call: TaskCall[RayObjectRef]) -> RayObjectRef:
        """Submit ``fn(*args, **kwargs)`` as a Ray task; its ref at once (Ray resolves the argument refs)."""
        fn, args, kwargs, deps = call.fn, call.args, call.kwargs, call.deps
        refs: list[Any] = []
        slots: dict[Any, _Slot] = {}

        def slot(ref: RayObjectRef) -> _Slot:
            if ref.ray_ref not in slots:
                slots[ref.ray_ref] = _Slot(len(refs))
                refs.append(ref.ray_ref)
            return slots[ref.ray_ref]

        packed = resolve_arguments(args, kwargs, _is_ref, slot) if deps else (args, kwargs)
        name = task_name(fn)
        try:
            remote, leading = self._remote_for(fn)
            if call.resources is not None:
                remote = remote.options(**ray_options(call.resources, pin_resource=self._pin_resource()))
            ray_ref = remote.remote(*leading, self.namespace, _current_job_id(), packed, *refs)
        except Exception as exc:
            if "pickle" not in str(exc).lower() and "serializ" not in str(exc).lower():
                raise
            check_picklable(f"task {name!r}", call_parts(fn, args, kwargs, "the function"))
            raise
        return RayObjectRef(ray_ref, name)

    def _put(self, obj: Any) -> RayObjectRef:
        """``ray.put(obj)``: a copy in Ray's object store."""
        return RayObjectRef(ray.put(shield(obj)))

    def _values(self, refs: list[RayObjectRef], timeout: float | None) -> list[Any]:
        try:
            return list(ray.get([ref.ray_ref for ref in refs], timeout=timeout))
        except ray.exceptions.GetTimeoutError:
            ready, _ = ray.wait([r.ray_ref for r in _unique(refs)], num_returns=len(_unique(refs)), timeout=0)
            raise not_ready_error("get", len(_unique(refs)) - len(ready), len(refs), timeout) from None
        except ray.exceptions.RayError as exc:
            raise _translate(exc, refs) from None

    def _first_ready(
        self, refs: list[RayObjectRef], want: int, timeout: float | None
    ) -> tuple[list[RayObjectRef], list[RayObjectRef]]:
        """``ray.wait`` (Ray blocks; nothing polls)."""
        unique = [r.ray_ref for r in _unique(refs)]
        if want == 0 or not unique:
            return [], list(refs)
        done, _ = ray.wait(unique, num_returns=min(want, len(unique)), timeout=timeout)
        done_set = set(done)
        ready: list[RayObjectRef] = []
        not_ready: list[RayObjectRef] = []
        for ref in refs:
            (ready if ref.ray_ref in done_set and len(ready) < want else not_ready).append(ref)
        return ready, not_ready

    def create_actor(self, actor_class: type, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        """An actor of this context's RayClient (inside a task: one made for the namespace, once)."""
        return create_actor_via(self.client, actor_class, args, name, kwargs)


# The context of each Ray namespace in this process: a client's, or (in a Ray worker) one made on first use.
_CONTEXTS: dict[str, RayJobContext] = {}
_CONTEXTS_LOCK = threading.Lock()


def context_for(namespace: str, client: Any = None) -> RayJobContext:
    """This process's context for ``namespace``: ``client``'s own when given (made once), else any."""
    with _CONTEXTS_LOCK:
        context = _CONTEXTS.get(namespace)
        if context is None or (client is not None and context._client not in (None, client)):
            context = _CONTEXTS[namespace] = RayJobContext(client, namespace=namespace)
        elif client is not None and context._client is None:
            context._client = client
        return context


def _is_ref(value: Any) -> bool:
    return isinstance(value, RayObjectRef)


def _unique(refs: list[RayObjectRef]) -> list[RayObjectRef]:
    return list({ref.ray_ref: ref for ref in refs}.values())


def _translate(exc: BaseException, refs: list[RayObjectRef]) -> BaseException:
    """The Fray error for a Ray error raised by ``ray.get`` of task results."""
    cause: BaseException | None = exc
    while cause is not None:  # a dependent's error wraps its argument's
        if isinstance(cause, _TaskError):
            return remote_error(RemoteFailure.decode(cause.encoded))
        if isinstance(cause, ray.exceptions.WorkerCrashedError | ray.exceptions.NodeDiedError):
            return TaskLostError(f"a task was lost: the Ray worker running it died ({_first_line(cause)})")
        nested = getattr(cause, "cause", None)
        cause = nested if isinstance(nested, BaseException) and nested is not cause else None
    if isinstance(exc, ray.exceptions.ObjectLostError | ray.exceptions.OwnerDiedError):
        return ObjectLostError(f"Ray lost an object: {_first_line(exc)}")
    if isinstance(exc, ray.exceptions.RayTaskError):
        inner = getattr(exc, "cause", None)
        if isinstance(inner, TypeError | AttributeError) and "pickl" in str(inner).lower():
            name = next((r.name for r in refs if r.name), "")
            return refused(f"task {name!r}", "the return value", inner)
    return translate(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
