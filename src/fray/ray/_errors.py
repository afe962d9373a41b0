"""Turn Ray's exceptions into Fray's: the one error form every backend raises.

Users of :class:`~fray.ray.RayClient` never need to catch a Ray exception type:

* an exception raised by an actor method (Ray raises ``RayTaskError(UserType)``) becomes
  :func:`fray.core._remote.remote_error`: a :class:`~fray.errors.RemoteError` that is also of
  the user's class, its traceback trimmed of Ray's (and Fray's) frames;
* a return value Ray cannot pickle is a :class:`~fray.errors.SerializationError` naming
  the method, worded as on every backend;
* a dead actor is :class:`~fray.errors.ActorDiedError` (its ``__cause__`` the
  constructor's own error when the constructor raised), an unreachable one
  :class:`~fray.errors.ActorUnavailableError`;
* a lost worker or node (what a preemption looks like from the outside) is
  classified by :func:`is_preemption` so the job retry budgets can tell it apart
  from a failure of the job's own code.

Jobs do not go through here for their own exceptions: the worker captures those
itself (see ``_worker.run_job_replica``).
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import Any

from fray.core._remote import RemoteFailure, actor_died, remote_error
from fray.core._serialization import result_refused
from fray.errors import ActorDiedError, ActorUnavailableError, FrayError, RemoteError, SerializationError

__all__ = ["constructor_failure", "is_preemption", "task_failure", "translate", "trim_traceback"]


def _ray_exceptions() -> Any:
    import ray.exceptions

    return ray.exceptions


def is_preemption(exc: BaseException) -> bool:
    """True when ``exc`` means the process or node running the work went away, not that the work failed.

    These are the failures a preemptible VM produces (node died, worker crashed,
    object or owner lost); they count against ``max_retries_preemption``.
    """
    rex = _ray_exceptions()
    lost = (
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.LocalRayletDiedError,
        rex.ObjectLostError,
        rex.OwnerDiedError,
        rex.ActorDiedError,
        rex.ActorUnavailableError,
    )
    if isinstance(exc, rex.OutOfMemoryError):
        # Ray killed the worker because the node ran out of memory: the job's own doing.
        return False
    return isinstance(exc, lost)


# ----- remote tracebacks as text ---------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+')
# Ray writes "ray::Class.method() (pid=..., ip=...)" where Python writes "Traceback (most recent call last):".
_RAY_HEADER = re.compile(r"^(Traceback \(most recent call last\):|ray::\S+ \(pid=)")
_RAY_MARKERS = ("ray/_private/", "ray/worker.py", "ray/_raylet.pyx", "ray/util/tracing/", "ray/cloudpickle/")
_FRAY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# How Fray calls into the user's method (its own frames, and the stdlib's future and event loop).
_CALL_MACHINERY = ("/concurrent/futures/", "/asyncio/", "/threading.py")


def _is_ray_frame(path: str) -> bool:
    ray_module = sys.modules.get("ray")
    ray_dir = os.path.dirname(getattr(ray_module, "__file__", None) or "/nonexistent/") + os.sep
    return path.startswith(ray_dir) or any(marker in path for marker in _RAY_MARKERS)


def _is_caret_line(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and all(c in "^~" for c in stripped)


def trim_traceback(text: str) -> str:
    """A remote traceback as Ray formats it, as the user's own: the frames of the user's code.

    Ray's frames go wherever they are; Fray's and the standard library's (how Fray
    called the method) only above the first frame of the user's code, as
    :func:`fray.core._remote.user_traceback` does for tracebacks captured live.
    """
    out: list[str] = []
    keep = in_frame = seen_user = False
    for line in _ANSI.sub("", text).strip("\n").split("\n"):
        frame = _FRAME.match(line)
        if frame is not None:
            path = frame["path"]
            machinery = path.startswith(_FRAY_DIR) or any(m in path for m in _CALL_MACHINERY)
            keep = not _is_ray_frame(path) and (seen_user or not machinery)
            seen_user = seen_user or keep
            in_frame = True
            if keep:
                out.append(line)
        elif in_frame and line.startswith("    "):
            if keep:
                out.append(line)
        elif _RAY_HEADER.match(line):
            in_frame = seen_user = False
            out.append("Traceback (most recent call last):")
        elif not _is_caret_line(line):  # carets left over from frames Ray already hid
            in_frame = False
            out.append(line)
    return "\n".join(out) + "\n" if out else ""


def _failure_from_text(text: str, type_name: str = "") -> RemoteFailure:
    """A failure known only as traceback text: its last line reads ``Type: message``."""
    trimmed = trim_traceback(text)
    last = next((line for line in reversed(trimmed.splitlines()) if line and not line.startswith(" ")), "")
    name, _, message = last.partition(": ")
    return RemoteFailure(type_name or name.strip(), message, trimmed)


_UNSERIALIZABLE = re.compile(r"^Exception (?P<type>\S+) isn't serializable: .*?\nOriginal exception details:\n", re.S)


def task_failure(exc: Any) -> tuple[RemoteFailure, BaseException | None]:
    """The user's exception inside a ``RayTaskError``, as a RemoteFailure, and itself when Ray could ship it."""
    rex = _ray_exceptions()
    # The dual "RayTaskError(UserType)" that ray.get raises keeps the raw traceback only in its text.
    text = vars(exc).get("traceback_str") or str(exc)
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, rex.RayError):
        return RemoteFailure.capture(cause, traceback_text=trim_traceback(text)), cause
    # Ray could not pickle the user's exception and sent a description of it instead.
    described = str(cause) if cause is not None else text
    match = _UNSERIALIZABLE.match(described)
    if match is None:
        return _failure_from_text(text), None
    return _failure_from_text(described[match.end() :], match["type"]), None


_CREATION_PREFIX = "The actor died because of an error raised in its creation task, "


def constructor_failure(exc: BaseException, actor_class: type | None = None) -> RemoteFailure | None:
    """What the constructor of a dead actor raised, when ``exc`` says that is why it died; else None.

    Ray keeps only the text of that exception, so the failure is read from it: the
    type is qualified with the actor class's module when that module defines it.
    """
    rex = _ray_exceptions()
    if not (isinstance(exc, rex.ActorDiedError) and getattr(exc, "_actor_init_failed", False)):
        return None
    text = str(getattr(exc, "error_msg", "") or exc)
    failure = _failure_from_text(text.removeprefix(_CREATION_PREFIX))
    name = failure.type_name
    if actor_class is not None and name and "." not in name and not hasattr(builtins, name):
        candidate = getattr(sys.modules.get(actor_class.__module__), name, None)
        if isinstance(candidate, type) and issubclass(candidate, BaseException):
            failure = RemoteFailure(f"{actor_class.__module__}.{name}", failure.message, failure.traceback_text)
    return failure


def _is_result_pickling(exc: Any, cause: BaseException) -> bool:
    """True when a method's return value, not the method, failed: Ray could not pickle what it returned."""
    import pickle

    if not isinstance(cause, TypeError | pickle.PicklingError):
        return False
    text = _ANSI.sub("", vars(exc).get("traceback_str") or str(exc))
    frames = [m["path"] for m in map(_FRAME.match, text.split("\n")) if m is not None]
    return bool(frames) and all(_is_ray_frame(p) for p in frames) and ("cloudpickle" in frames[-1])


# ----- translation -----------------------------------------------------------------------------


def translate(
    exc: BaseException, *, actor: str | None = None, method: str | None = None, actor_class: type | None = None
) -> BaseException:
    """The exception a Fray user sees for ``exc`` raised by Ray (``exc`` itself if it is not Ray's).

    ``actor`` names the actor (and ``method`` the method called) for the messages;
    ``actor_class`` helps to name a failed constructor's exception type.
    """
    if isinstance(exc, FrayError) or not type(exc).__module__.startswith("ray"):
        return exc
    rex = _ray_exceptions()
    what = f"actor {actor!r}" if actor else "the actor"
    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ActorDiedError):  # Fray's actor wrapper refused the call: the actor is ending
            return cause
        if isinstance(cause, rex.RayActorError | rex.RayTaskError):
            return translate(cause, actor=actor, method=method, actor_class=actor_class)
        if actor is not None and method is not None and cause is not None and _is_result_pickling(exc, cause):
            refusal = result_refused(actor, method, cause)
            refusal.__cause__ = cause
            return refusal
        failure, original = task_failure(exc)
        return remote_error(failure, original=original)
    started = constructor_failure(exc, actor_class)
    if started is not None:
        died = actor_died(f"{what} died: its constructor raised {started.summary}", remote_error(started))
        return died
    if isinstance(exc, rex.ActorUnavailableError) and "restarted" in str(exc):
        # The instance the call went to died, and Ray restarted the actor (ActorConfig.max_restarts).
        err: FrayError = ActorDiedError(
            f"{what} died while the call was in flight and was restarted: {first_line(exc)}"
        )
    elif isinstance(exc, rex.ActorUnavailableError):
        err = ActorUnavailableError(f"{what} is unreachable: {exc}")
    elif isinstance(exc, rex.ActorDiedError | rex.RayActorError | rex.ActorUnschedulableError):
        err = ActorDiedError(f"{what} died: {first_line(exc)}")
    elif isinstance(exc, rex.GetTimeoutError):
        return TimeoutError(str(exc))
    elif isinstance(exc, rex.TaskCancelledError):
        import concurrent.futures

        return concurrent.futures.CancelledError(str(exc))
    elif isinstance(exc, rex.RaySystemError) and "serializ" in str(exc).lower():
        err = SerializationError(str(exc))
    else:
        err = RemoteError(type(exc).__qualname__, first_line(exc), str(exc))
    err.__cause__ = exc
    return err


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name if it has none)."""
    text = _ANSI.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__
