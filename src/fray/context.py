"""The job level: :class:`JobContext` (tasks, objects, wait) and how code finds its context.

Inside a job, work fans out as *tasks* (``create_task(fn, *args)``: a function passed
directly, no decorators) whose results are :class:`ObjectRef`\\ s; ``get`` turns refs into
values, ``wait`` returns the first ``num_returns`` that are ready, ``put`` stores an
object once so that many tasks can take it by reference. ``create_actor`` delegates to
the client's actors.

:func:`get_job_context` returns the context set with :func:`set_job_context`, else the
context of the backend the code runs on (inside a ``fray://`` job the cluster's, inside
a Ray job Ray's, inside a task the context that runs the task), else a local threaded
one. Implementations (see ``docs/job-level.md``):

* :class:`~fray.joblevel._local_context.LocalJobContext` -- threads of this process;
* :class:`~fray.joblevel._process_context.ProcessJobContext` -- worker processes on this machine;
* ``fray.ray.RayJobContext`` -- Ray tasks and Ray's object store;
* ``fray.cluster.client.context.ClusterJobContext`` -- tasks on a Fray cluster's workers.

What every implementation provides, and this module's helpers implement once:

* ObjectRefs passed as task arguments are resolved before the task runs: at the top
  level of ``args``/``kwargs`` and one level inside a list, tuple or dict argument
  (``f([ref1, ref2])`` receives values; ``f([[ref]])`` receives the inner ref itself);
* a task that raised re-raises at ``get`` in the one error form
  (:func:`fray.core._remote.remote_error`: a :class:`~fray.errors.RemoteError` that is also
  of the user's class); a task whose worker died raises :class:`~fray.errors.TaskLostError`;
* bad input raises a typed error saying how to fix it.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from fray.client import current_client
from fray.core._lending import blocked
from fray.core.inside._runtime import check_terminated
from fray.errors import ConfigError
from fray.resources import ResourceConfig

__all__ = [
    "JobContext",
    "ObjectRef",
    "bind_context",
    "check_num_returns",
    "check_resources",
    "clear_job_context",
    "get_job_context",
    "ref_list",
    "resolve_arguments",
    "set_job_context",
    "task_name",
]

T = TypeVar("T")


@runtime_checkable
class ObjectRef(Protocol):
    """A reference to an object of one :class:`JobContext`: a task's result or a ``put`` value.

    Refs are picklable: pass them to tasks (resolved before the task runs, see the
    module docstring) or inside data. ``ref_id`` is unique within the context.
    """

    @property
    def ref_id(self) -> str:
        """The object's id, unique within its context."""
        ...


@runtime_checkable
class JobContext(Protocol):
    """Tasks, objects and waits inside a job, on one backend."""

    def create_task(
        self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any
    ) -> ObjectRef:
        """Run ``fn(*args, **kwargs)`` as a task; returns the ref of its result at once.

        ObjectRefs among the arguments are replaced by their values first. ``resources``
        (a :class:`~fray.resources.ResourceConfig`) is where the backend places tasks;
        the keyword is Fray's, so ``fn`` cannot take an argument called ``resources``.
        """
        ...

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """The value of a ref, or the list of values of a list of refs; blocks until ready.

        Raises the task's exception (the shared dual form), :class:`~fray.errors.TaskLostError`
        when the task's worker died, ``TimeoutError`` after ``timeout`` seconds.
        """
        ...

    def wait(
        self, refs: Sequence[Any], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Any], list[Any]]:
        """Block until ``num_returns`` of ``refs`` are ready (or ``timeout``); return ``(ready, not_ready)``.

        A failed task counts as ready (its ``get`` raises). Both lists keep the input order.
        """
        ...

    def put(self, obj: Any) -> ObjectRef:
        """Store ``obj`` in the job's objects; tasks given the ref receive the value."""
        ...

    def create_actor(self, actor_class: type, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        """Create an actor through the context's client (a unique name when ``name`` is None)."""
        ...


R = TypeVar("R")


@dataclass(frozen=True)
class TaskCall(Generic[R]):
    """One checked ``create_task`` call, as a backend's ``_submit`` receives it."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    resources: ResourceConfig | None
    deps: list[R]
    """The refs among the arguments (top level and one level in), each checked to be this context's."""


class JobContextBase(ABC, Generic[R]):
    """The declared base of every backend's job context: the :class:`JobContext` methods, written once.

    The public methods check their arguments (a terminated job, the callable, the
    resources, each ref's type and owner, ``num_returns``, ``timeout``) and find the refs
    among a task's arguments here; a backend supplies what it does with them:

    ================================================  ==================================================
    ``_REF``                                          the backend's ref class
    ``_submit(call)``                                 start the task (a :class:`TaskCall`)
    ``_put(obj)``                                     store a value; its ref
    ``_values(refs, timeout)``                        the refs' values in order; ``TimeoutError`` past it
    ``_first_ready(refs, want, timeout)``             ``wait``'s ``(ready, not_ready)``, both in order
    ``_owns(ref)``                                    whether a ref of ``_REF`` is this context's (default:
                                                      all are, one connection serves them)
    ``_client``                                       where ``create_actor`` creates actors (None: the
                                                      current client)
    ================================================  ==================================================
    """

    _REF: ClassVar[type]
    _client: Any = None

    @abstractmethod
    def _submit(self, call: TaskCall[R]) -> R: ...

    @abstractmethod
    def _put(self, obj: Any) -> R: ...

    @abstractmethod
    def _values(self, refs: list[R], timeout: float | None) -> list[Any]: ...

    @abstractmethod
    def _first_ready(self, refs: list[R], want: int, timeout: float | None) -> tuple[list[R], list[R]]: ...

    def _owns(self, ref: R) -> bool:
        return True

    def _is_ref(self, value: Any) -> bool:
        return isinstance(value, self._REF)

    def create_task(
        self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any
    ) -> R:
        """Run ``fn(*args, **kwargs)`` as a task; the ref of its result, at once (see :class:`JobContext`)."""
        checked = check_task(fn, resources)
        deps = [
            one_ref(ref, self._REF, "create_task: argument", self._owns)
            for ref in find_refs(args, kwargs, self._is_ref)
        ]
        return self._submit(TaskCall(fn, args, dict(kwargs), checked, deps))

    def put(self, obj: Any) -> R:
        """Store ``obj``; tasks given the ref receive the value (see :class:`JobContext`)."""
        check_terminated()
        return self._put(obj)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """The value of one ref, or the values of a list of refs, in order (see :class:`JobContext`)."""
        check_terminated()
        timeout = check_timeout(timeout, "get")
        if isinstance(refs, self._REF) or not isinstance(refs, list | tuple):
            one = [one_ref(refs, self._REF, "get()", self._owns)]
            with blocked():
                return self._values(one, timeout)[0]
        many = ref_list(refs, self._REF, "get()", self._owns)
        with blocked():
            return self._values(many, timeout)

    def wait(self, refs: Sequence[R], num_returns: int = 1, timeout: float | None = None) -> tuple[list[R], list[R]]:
        """The first ``num_returns`` refs to be ready, and the rest, both in input order (see :class:`JobContext`)."""
        check_terminated()
        items = ref_list(refs, self._REF, "wait()", self._owns)
        want = check_num_returns(num_returns, len(items))
        timeout = check_timeout(timeout, "wait")
        with blocked():
            return self._first_ready(items, want, timeout)

    def create_actor(self, actor_class: type, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        """An actor of this context's client (the current client when it has none), uniquely named if unnamed."""
        return create_actor_via(self._client, actor_class, args, name, kwargs)

    def shutdown(self) -> None:
        """Let go of what the context holds (its client calls this at its own shutdown); by default nothing."""


# ----- finding the context -------------------------------------------------------------------

_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("fray_job_context", default=None)


def get_job_context() -> JobContext:
    """The job context of the calling code.

    In order: the one set with :func:`set_job_context` (or bound by the task that is
    running); else the context of the current client's backend (:func:`fray.current_client`:
    inside a job, the backend running it), which the client creates once; with no client
    configured that is the embedded local backend, whose context runs tasks on threads.
    """
    check_terminated()
    context = _current.get()
    if context is not None:
        return context
    from fray.client import current_client
    from fray.core._client_core import ClientCore

    client = current_client()
    if not isinstance(client, ClientCore):  # a client object of the user's own (marin's tests install some)
        raise ConfigError(
            f"{type(client).__name__} has no job context; set one with "
            "fray.set_job_context(fray.LocalJobContext()) (tasks on threads of this process)"
        )
    found: JobContext = client._fray_job_context()
    return found


def set_job_context(context: JobContext) -> contextvars.Token[JobContext | None]:
    """Make ``context`` the job context of this thread (and of tasks and threads started from it).

    Returns a token; :func:`clear_job_context` removes the setting again.
    """
    if not isinstance(context, JobContext):
        raise ConfigError(
            f"set_job_context needs a JobContext (create_task, get, wait, put, create_actor), "
            f"got {type(context).__name__}"
        )
    return _current.set(context)


def clear_job_context(token: contextvars.Token[JobContext | None] | None = None) -> None:
    """Undo :func:`set_job_context`: back to the value before ``token``, or to none at all."""
    if token is not None:
        _current.reset(token)
    else:
        _current.set(None)


def bind_context(context: JobContext) -> contextvars.Token[JobContext | None]:
    """Backends call this where a task runs, so that ``get_job_context()`` there is the task's context."""
    return _current.set(context)


# ----- helpers every implementation shares ---------------------------------------------------

_ids = itertools.count(1)
_PROCESS_TAG = uuid.uuid4().hex[:8]


def new_context_id(kind: str) -> str:
    """A unique id for a new context of ``kind`` (unique across processes too)."""
    return f"{kind}-{os.getpid()}-{_PROCESS_TAG}-{next(_ids)}"


def task_name(fn: Any) -> str:
    """How messages name a task's function: its qualified name, or its type's for callable objects."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name else type(fn).__name__


def check_task(fn: Any, resources: object) -> ResourceConfig | None:
    """The checks of every ``create_task``: not after this job was terminated, a callable, valid resources."""
    check_terminated()
    check_callable(fn)
    return check_resources(resources)


def check_callable(fn: Any) -> None:
    """Refuse a task that is not callable, saying what was given."""
    if not callable(fn):
        raise ConfigError(
            f"create_task needs a function (or any callable) as its first argument, got "
            f"{type(fn).__name__}: {fn!r}; pass the function itself, not its result"
        )


def check_resources(resources: object) -> ResourceConfig | None:
    """Check ``create_task(resources=...)``: None or a :class:`~fray.resources.ResourceConfig`."""
    if resources is not None and not isinstance(resources, ResourceConfig):
        raise ConfigError(
            f"create_task(resources={resources!r}) must be a fray.ResourceConfig (e.g. ResourceConfig(cpu=2)) or None"
        )
    return resources


def ref_list(refs: object, ref_type: type[T], what: str, owner: Callable[[T], bool]) -> list[T]:
    """``refs`` as a list of this context's refs; a typed error naming the first that is not one.

    ``owner(ref)`` says whether a ref of the right type belongs to this context.
    """
    items: Iterable[object]
    if isinstance(refs, list | tuple):
        items = refs
    else:
        raise ConfigError(
            f"{what} takes a list of ObjectRefs (from create_task or put), got {type(refs).__name__}: {refs!r}"
        )
    out: list[T] = []
    for index, item in enumerate(items):
        out.append(one_ref(item, ref_type, f"{what}: item {index}", owner))
    return out


def one_ref(item: object, ref_type: type[T], what: str, owner: Callable[[T], bool]) -> T:
    """``item`` checked to be a ref of this context (see :func:`ref_list`)."""
    if isinstance(item, ref_type):
        if not owner(item):
            raise ConfigError(
                f"{what}: {item!r} belongs to another job context; get its value there (or pass the value, "
                "not the ref) -- refs are valid only in the context that made them"
            )
        return item
    if isinstance(item, ObjectRef):
        raise ConfigError(
            f"{what}: {item!r} is an ObjectRef of another kind of job context ({type(item).__name__}); "
            "refs are valid only in the context that made them"
        )
    raise ConfigError(
        f"{what} must be an ObjectRef returned by create_task or put, got {type(item).__name__}: {item!r}"
        + ("; wrap plain values with put() or use them directly" if not isinstance(item, list | tuple) else "")
    )


def check_num_returns(num_returns: object, count: int) -> int:
    """Check ``wait(num_returns=...)`` against the number of refs given."""
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns < 0:
        raise ConfigError(f"wait(num_returns={num_returns!r}) must be a whole number >= 0")
    if num_returns > count:
        raise ConfigError(
            f"wait(num_returns={num_returns}) asks for more refs than the {count} given; "
            f"pass num_returns <= {count} (num_returns=len(refs) waits for all)"
        )
    return num_returns


def check_timeout(timeout: object, what: str) -> float | None:
    """Check a ``timeout`` argument: None (forever) or seconds >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise ConfigError(f"{what}(timeout={timeout!r}) must be None (wait forever) or a number of seconds >= 0")
    return float(timeout)


def not_ready_error(what: str, missing: int, total: int, timeout: float | None) -> TimeoutError:
    """The ``TimeoutError`` of a ``get`` whose objects were not all ready in time."""
    return TimeoutError(f"{what}: {missing} of {total} objects not ready after {timeout}s")


# One level of nesting: refs in a list, tuple or dict argument are resolved; deeper ones are not.
_NESTABLE = (list, tuple, dict)


def find_refs(args: tuple[Any, ...], kwargs: Mapping[str, Any], is_ref: Callable[[Any], bool]) -> list[Any]:
    """The refs among ``args``/``kwargs`` (top level, and one level inside lists, tuples and dicts), in order."""
    found: list[Any] = []
    for value in itertools.chain(args, kwargs.values()):
        if is_ref(value):
            found.append(value)
        elif type(value) in _NESTABLE:
            inner = value.values() if type(value) is dict else value
            found.extend(item for item in inner if is_ref(item))
    return found


def resolve_arguments(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    is_ref: Callable[[Any], bool],
    value_of: Callable[[Any], Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` with each ref (as :func:`find_refs` finds them) replaced by ``value_of(ref)``."""

    def one(value: Any) -> Any:
        if is_ref(value):
            return value_of(value)
        kind = type(value)
        if kind is list:
            return [value_of(v) if is_ref(v) else v for v in value]
        if kind is tuple:
            return tuple(value_of(v) if is_ref(v) else v for v in value)
        if kind is dict:
            return {k: value_of(v) if is_ref(v) else v for k, v in value.items()}
        return value

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def first_ready(
    items: Sequence[T], futures: Sequence[concurrent.futures.Future[Any]], want: int, timeout: float | None
) -> tuple[list[T], list[T]]:
    """What ``wait`` returns: the first ``want`` of ``items`` whose future (same position) is done, and the rest.

    Blocks on the futures themselves (no polling loop) until ``want`` are done or ``timeout``
    seconds have passed.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = {future for future in futures if not future.done()}
    while pending and len(futures) - len(pending) < want:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            break
        done, _ = concurrent.futures.wait(pending, remaining, concurrent.futures.FIRST_COMPLETED)
        pending -= done
    ready: list[T] = []
    not_ready: list[T] = []
    for item, future in zip(items, futures, strict=True):
        (ready if future.done() and len(ready) < want else not_ready).append(item)
    return ready, not_ready


def after_all(futures: Sequence[concurrent.futures.Future[Any]], then: Callable[[], None]) -> None:
    """Call ``then()`` once, in the thread that completes the last of ``futures`` (at once if all are done)."""
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: concurrent.futures.Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        then()

    for future in futures:
        future.add_done_callback(one_done)


def create_actor_via(
    client: Any | None, actor_class: type, args: tuple[Any, ...], name: str | None, kwargs: Any
) -> Any:
    """``create_actor`` of a context: the client's (the current client's when ``client`` is None),
    with a unique name when none is given."""
    check_terminated()
    if client is None:
        client = current_client()
    if name is None:
        base = getattr(actor_class, "__name__", "actor")
        name = f"{base}-{uuid.uuid4().hex[:8]}"
    return client.create_actor(actor_class, *args, name=name, **kwargs)
