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


def check_picklable(what: str, parts: Mapping[str, Any]) -> None:
    """Raise SerializationError naming the first of ``parts`` that cloudpickle cannot pickle.

    Every backend but the local one ships these values to another process; the local
    backend checks too, so that code that passes on a laptop does not fail on a cluster.
    """
    for label, value in parts.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise SerializationError(
                f"{what}: {label} cannot be pickled ({type(exc).__name__}: {exc}); Fray ships it to another "
                "process. Pass picklable data (create locks, files, sockets and clients inside the job or actor)"
            ) from exc
