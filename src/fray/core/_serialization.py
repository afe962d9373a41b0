"""Checking at the API boundary that what a job or actor needs can travel to another process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cloudpickle

from fray.errors import SerializationError


def call_parts(fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], what: str = "the callable") -> dict[str, Any]:
    """Name each piece of a call, for error messages: ``{"the callable": fn, "argument 0": ..., ...}``."""
    parts: dict[str, Any] = {what: fn}
    parts.update({f"argument {i}": a for i, a in enumerate(args)})
    parts.update({f"keyword argument {k!r}": v for k, v in kwargs.items()})
    return parts


# Exact types every instance of which pickles. Subclasses are left out on purpose: an
# instance of ``class Tagged(int)`` may carry an unpicklable attribute.
_ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_CONTAINERS = frozenset({tuple, list, dict, set, frozenset})
# How many items the fast path looks at before it hands a value to cloudpickle instead.
_SCAN_LIMIT = 64


def _surely_picklable(value: Any) -> bool:
    """True if ``value`` is built only of builtin scalars and containers, so it pickles; cheap.

    False means "not known", never "not picklable": the caller then pickles for real. The
    scan is bounded, so a large or self-referencing container costs no more than pickling.
    """
    budget = _SCAN_LIMIT
    stack = [value]
    try:
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind in _ATOMS:
                continue
            if kind not in _CONTAINERS:
                return False
            budget -= len(item)
            if budget < 0:
                return False
            stack.extend(item.items() if kind is dict else item)
    except RuntimeError:  # another thread changed a dict or set under the scan: pickle it instead
        return False
    return True


def plain_data(value: Any) -> bool:
    """True when ``value`` is plain data (builtin scalars in builtin containers, small), so the standard pickle takes it."""
    return _surely_picklable(value)


def check_picklable(what: str, parts: Mapping[str, Any]) -> None:
    """Raise SerializationError naming the first of ``parts`` that cloudpickle cannot pickle.

    Every backend but the local one ships these values to another process; the local
    backend checks too, so that code that passes on a laptop does not fail on a cluster.
    Plain data (builtin scalars in builtin containers) is known to pickle and is not pickled.
    """
    for label, value in parts.items():
        if _surely_picklable(value):
            continue
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise refused(what, label, exc) from exc


def refused(what: str, label: str, exc: BaseException) -> SerializationError:
    """The error for ``label`` of ``what``, which could not be pickled (``exc`` says why): worded once."""
    return SerializationError(
        f"{what}: {label} cannot be pickled ({type(exc).__name__}: {exc}); Fray ships it to another "
        "process. Pass picklable data (create locks, files, sockets and clients inside the job or actor)"
    )


def actor_call_label(actor_name: str, method: str) -> str:
    """How errors name one method of one actor: ``actor 'counter', method 'add'``."""
    return f"actor {actor_name!r}, method {method!r}"


def check_call_picklable(actor_name: str, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse an actor call whose arguments cannot be pickled, naming the argument; the same on every backend.

    Backends that pickle the call anyway check the pickling error instead (and only then
    call this to word it), so the check costs nothing on the fast path.
    """
    if _surely_picklable(args) and _surely_picklable(kwargs):
        return  # the common case, without building the labels
    parts = {f"argument {i}": a for i, a in enumerate(args)}
    parts.update({f"keyword argument {k!r}": v for k, v in kwargs.items()})
    check_picklable(actor_call_label(actor_name, method), parts)


_RESULT = "the return value"


def check_result_picklable(actor_name: str, method: str, value: Any) -> None:
    """Refuse an actor method's return value that cannot be pickled; the same on every backend."""
    if _surely_picklable(value):
        return
    check_picklable(actor_call_label(actor_name, method), {_RESULT: value})


def result_refused(actor_name: str, method: str, exc: BaseException) -> SerializationError:
    """What :func:`check_result_picklable` raises, for backends that learn only afterwards that pickling failed."""
    return refused(actor_call_label(actor_name, method), _RESULT, exc)
