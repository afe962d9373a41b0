"""What runs inside a Ray actor's process: the class Fray gives Ray in place of the user's.

:func:`actor_class_for` makes a subclass of the user's class whose constructor first
gives the process its Fray identity (``current_job()``, ``current_client()``,
``current_actor()``) and whose public methods pass through a thin wrapper that:

* runs ``async def`` methods to completion on the actor's own
  :class:`~fray.core.inside._eventloop.ActorLoop`, as on every backend (Ray would run them
  concurrently and out of order; Fray runs up to ``max_concurrency`` of them);
* counts the calls running, so that a terminating actor can wait for them;
* acts on ``current_actor().exit()`` / ``fail()`` once the call that asked returns:
  the outcome is written to Ray's key-value store (where the actor's job handle reads
  it) and the actor asks itself to exit, through a method of its own concurrency group.

Three control methods live in that group (:data:`CONTROL_GROUP`), so they run while a user
method is busy: ``__fray_shutdown__`` (sets ``shutdown_requested`` and waits, bounded,
for running calls to end), ``__fray_exit__`` and ``__fray_stacks__`` (the live stacks of the
actor's threads, for ``ActorHandle.stacks()``: see ``fray.ray._stacks``).
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from fray.actor_context import ActorCalls, ActorContext, ActorEnd, set_process_actor
from fray.core.inside._eventloop import ActorLoop
from fray.core.inside._stacks import capture, serve
from fray.ray._values import shield
from fray.ray.actors import RayActorHandle
from fray.ray.inside._actor_end import record_end

__all__ = ["CONTROL_GROUP", "GROUP_ENV", "INDEX_ENV", "actor_class_for"]

CONTROL_GROUP = "fray_control"
GROUP_ENV = "FRAY_ACTOR_GROUP"
INDEX_ENV = "FRAY_ACTOR_INDEX"


class _Host(ActorCalls):
    """The actor process's Fray state: its context, the calls running, and how it ends."""

    def __init__(self, env: dict[str, str], cls: type) -> None:
        job_id = self.job_id = env.get("FRAY_JOB_ID", "")
        name = env.get("FRAY_JOB_NAME", cls.__name__)
        namespace = env.get("FRAY_NAMESPACE", "")
        group = env.get(GROUP_ENV) or None
        index = int(env.get(INDEX_ENV, "0"))
        context = ActorContext.of_actor(name, group, index, lambda: _handle(name, namespace, cls, job_id))
        super().__init__(context, on_end=self._end)

    def _end(self, end: ActorEnd) -> None:
        """The actor asked to end: record how, then exit once the calls running (its own included) return."""
        record_end(self.job_id, end)
        threading.Thread(target=_exit_self, name="fray-actor-exit", daemon=True).start()


def _exit_self() -> None:
    import ray

    # A call of the control group: it runs beside the user's calls, and Ray lets the calls
    # running finish (the one that asked included) before the process exits.
    ray.get_runtime_context().current_actor.__fray_exit__.remote()


def _handle(name: str, namespace: str, cls: type, job_id: str) -> Any:
    return RayActorHandle(name, namespace, cls, job_id=job_id)


def _wrap(fn: Callable[..., Any], is_coroutine: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        host: _Host = self._fray_host
        host.enter()
        try:
            if is_coroutine:
                # Not fray.core.inside._eventloop.invoke: it looks the method up by name, which would find this stand-in.
                return shield(self._fray_actor_loop.run(fn(self, *args, **kwargs)))
            return shield(fn(self, *args, **kwargs))
        finally:
            host.leave()
            host.check_end()

    return method


def _shutdown(self: Any, grace: float) -> bool:
    """Set ``shutdown_requested``; True once no call runs, False if some still ran after ``grace`` seconds."""
    host: _Host = self._fray_host
    host.context.shutdown_requested.set()
    return host.wait_idle(grace)


def _exit(self: Any) -> None:
    import ray

    ray.actor.exit_actor()


def _stacks(self: Any, locals: bool) -> dict[str, Any]:
    """This process's pid, host and every thread's stack but the control thread's own, as JSON."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "threads": [thread.to_json() for thread in capture(locals=locals, skip_current=True)],
    }


def actor_class_for(cls: type) -> type:
    """A subclass of ``cls`` that gives the process its Fray identity and wraps its public methods.

    The subclass keeps the user's class name, so Ray's dashboard and error messages
    show it.
    """
    import ray

    # Plain methods only: static and class methods are left as they are (they have no actor state).
    public = [
        (name, value)
        for name, value in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and inspect.isfunction(inspect.getattr_static(cls, name))
    ]
    has_coroutines = any(inspect.iscoroutinefunction(value) for _, value in public)

    def __init__(self: Any, fray_env: dict[str, str], /, *args: Any, **kwargs: Any) -> None:
        os.environ.update(fray_env)
        serve()  # the actor's process answers stacks() on its host too (fray.core.inside._stacks), as every Fray process
        host = self._fray_host = _Host(fray_env, cls)
        set_process_actor(host.context)
        if has_coroutines:
            self._fray_actor_loop = ActorLoop(fray_env.get("FRAY_JOB_NAME", cls.__name__))
        cls.__init__(self, *args, **kwargs)  # type: ignore[misc]
        host.check_end()

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__fray_shutdown__": ray.method(concurrency_group=CONTROL_GROUP)(_shutdown),
        "__fray_exit__": ray.method(concurrency_group=CONTROL_GROUP)(_exit),
        "__fray_stacks__": ray.method(concurrency_group=CONTROL_GROUP)(_stacks),
    }
    for name, value in public:
        namespace[name] = _wrap(value, inspect.iscoroutinefunction(value))
    return type(cls.__name__, (cls,), namespace)
