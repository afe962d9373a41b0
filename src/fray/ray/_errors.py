"""Turn Ray's exceptions into Fray's, keeping the original exception and the remote traceback.

Users of :class:`~fray.ray.RayClient` never need to catch a Ray exception type:

* an exception raised by user code comes back as its own type, with the remote
  traceback chained as ``__cause__`` (a :class:`RemoteTraceback`, the way
  ``concurrent.futures.ProcessPoolExecutor`` does it), or as
  :class:`~fray.errors.RemoteError` when its type cannot be rebuilt here;
* a dead actor is :class:`~fray.errors.ActorDiedError`, an unreachable one
  :class:`~fray.errors.ActorUnavailableError`;
* a lost worker or node (what a preemption looks like from the outside) is
  classified by :func:`is_preemption` so the job retry budgets can tell it apart
  from a failure of the job's own code.
"""

from __future__ import annotations

from typing import Any

from fray.errors import ActorDiedError, ActorUnavailableError, FrayError, RemoteError, SerializationError

__all__ = ["RemoteTraceback", "attach_traceback", "is_preemption", "translate"]


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised in another process (shown as its ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def attach_traceback(exc: BaseException, traceback_text: str) -> BaseException:
    """Chain ``traceback_text`` to ``exc`` as its cause, so printing ``exc`` shows where it happened."""
    if traceback_text:
        exc.__cause__ = RemoteTraceback(f'\n"""\n{traceback_text.rstrip()}\n"""')
    return exc


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


def _task_error_cause(exc: Any) -> BaseException:
    """The user's own exception inside a ``RayTaskError``, with the remote traceback chained."""
    # The exception ray.get raises is a "RayTaskError(UserType)" whose traceback is only in its text.
    traceback_text = getattr(exc, "traceback_str", None) or str(exc)
    cause = getattr(exc, "cause", None)
    rex = _ray_exceptions()
    if isinstance(cause, rex.RayTaskError):  # nested: the task called another task that raised
        return _task_error_cause(cause)
    if cause is None or (isinstance(cause, rex.RayError) and not isinstance(cause, rex.RayTaskError)):
        type_name = getattr(exc, "function_name", "unknown")
        message = str(cause) if cause is not None else str(exc)
        return RemoteError(type(cause).__qualname__ if cause is not None else type_name, message, traceback_text)
    if type(cause).__name__ == "UnserializableException" or isinstance(cause, rex.UnserializableException):
        return RemoteError("UnserializableException", str(cause), traceback_text)
    return attach_traceback(cause, traceback_text)


def translate(exc: BaseException, *, actor: str | None = None) -> BaseException:
    """The exception a Fray user sees for ``exc`` raised by Ray (``exc`` itself if it is not Ray's).

    ``actor`` names the actor for messages about dead or unreachable actors.
    """
    if isinstance(exc, FrayError) or not type(exc).__module__.startswith("ray"):
        return exc
    rex = _ray_exceptions()
    what = f"actor {actor!r}" if actor else "the actor"
    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, rex.RayActorError | rex.ActorDiedError):
            return translate(cause, actor=actor)
        return _task_error_cause(exc)
    if isinstance(exc, rex.ActorUnavailableError):
        err: FrayError = ActorUnavailableError(f"{what} is unreachable: {exc}")
    elif isinstance(exc, rex.ActorDiedError | rex.RayActorError | rex.ActorUnschedulableError):
        err = ActorDiedError(f"{what} died: {_first_line(exc)}")
    elif isinstance(exc, rex.GetTimeoutError):
        return TimeoutError(str(exc))
    elif isinstance(exc, rex.TaskCancelledError):
        import concurrent.futures

        return concurrent.futures.CancelledError(str(exc))
    elif isinstance(exc, rex.RaySystemError) and "serializ" in str(exc).lower():
        err = SerializationError(str(exc))
    else:
        err = RemoteError(type(exc).__qualname__, _first_line(exc), str(exc))
    err.__cause__ = exc
    return err


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
