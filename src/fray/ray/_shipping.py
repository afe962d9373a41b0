"""What a RayClient ships to Ray, made once per function and per actor class.

Ray exports a remote function once and reuses it; :class:`Shipping` does the same for
the callables of Fray jobs (pickled once, apart from their arguments, so workers can
reuse them unpickled) and for the Ray actor classes that host Fray actors.
"""

from __future__ import annotations

import pickle
import types
import weakref
from typing import Any

import cloudpickle

from fray.core._codepickle import dumps
from fray.core._serialization import call_parts, check_picklable
from fray.errors import ConfigError
from fray.job import CallableEntrypoint, JobRequest
from fray.ray.inside._actor_host import CONTROL_GROUP, actor_class_for

__all__ = ["Shipping"]

# Values that pickle the same with or without cloudpickle, which only adds what plain pickle
# cannot do (code, classes of __main__) and costs several microseconds per call to set up.
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _plain(value: object, depth: int = 0) -> bool:
    """True if ``value`` is made of scalars, tuples, lists and dicts only (then plain pickle suffices)."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth > 2:  # deep or large values are rare in arguments, and cloudpickle costs little next to them
        return False
    if kind is not tuple and kind is not list and kind is not dict:
        return False
    if len(value) > 16:  # type: ignore[arg-type]
        return False
    items: Any = value
    if kind is dict:
        if any(type(key) is not str for key in items):
            return False
        items = items.values()
    for item in items:  # noqa: SIM110 -- a loop, not all() over a generator: a third of its cost
        # Scalars are checked here, without a call each: most arguments are a few of them.
        if type(item) not in _SCALARS and not _plain(item, depth + 1):
            return False
    return True


class Shipping:
    """One client's caches of pickled job callables and Ray actor classes (weak: they go with their functions)."""

    def __init__(self) -> None:
        self._classes: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()
        self._functions: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()

    def entry(self, request: JobRequest) -> tuple[bytes, bytes]:
        """A callable job's (callable, arguments), each pickled; ConfigError for a binary TPU job."""
        entry = request.entrypoint
        if not isinstance(entry, CallableEntrypoint):
            raise ConfigError(f"job {request.name!r}: TPU jobs on Ray need a callable entrypoint")
        try:
            # Pickled once here, both to check it and to ship it: Ray then moves plain bytes.
            # The callable travels apart from its arguments so workers can reuse it unpickled.
            call = (entry.args, dict(entry.kwargs))
            arguments = pickle.dumps(call, pickle.HIGHEST_PROTOCOL) if _plain(call) else cloudpickle.dumps(call)
            return self.callable(entry.callable), arguments
        except Exception:
            check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
            raise

    def callable(self, fn: Any) -> bytes:
        """``fn`` pickled, once per function: what Ray does when it exports a remote function.

        As with ``ray.remote``, a function defined in ``__main__`` is captured with the
        values of its globals at its first submission. Other callables (bound methods,
        partials, callable objects) are pickled at every submission.
        """
        if not isinstance(fn, types.FunctionType):
            return dumps(fn)
        pickled = self._functions.get(fn)
        if pickled is None:
            pickled = self._functions[fn] = dumps(fn)
        return pickled

    def actor_class(self, cls: type) -> Any:
        """The Ray actor class that hosts ``cls`` (made once per class)."""
        ray_cls = self._classes.get(cls)
        if ray_cls is None:
            import ray

            # Two control threads: stacks() is answered even while a shutdown waits for running calls.
            ray_cls = ray.remote(concurrency_groups={CONTROL_GROUP: 2})(actor_class_for(cls))  # type: ignore[call-overload]
            self._classes[cls] = ray_cls
        return ray_cls
