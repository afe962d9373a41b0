"""How a Ray actor that ended itself (``current_actor().exit()`` / ``fail()``) says so.

The actor writes its outcome to Ray's key-value store (:func:`record_end`) before it
exits; its job handle (:func:`read_end`) and its callers (:func:`ended_death`) read it
there once Ray reports the actor dead.
"""

from __future__ import annotations

from fray.actor_context import ActorEnd
from fray.core._lifecycle import Failure
from fray.core._remote import remote_error
from fray.errors import ActorDiedError

__all__ = ["KV_NAMESPACE", "end_key", "ended_death", "read_end", "record_end"]

KV_NAMESPACE = "fray"
_EXITED = b"exit"


def end_key(job_id: str) -> bytes:
    """The key-value store key where an actor that ended itself leaves its outcome."""
    return f"actor-end/{job_id}".encode()


def read_end(job_id: str) -> tuple[bool, Failure | None]:
    """(True, None) if the actor exited, (True, failure) if it failed itself, (False, None) if neither."""
    from ray.experimental import internal_kv

    try:
        data = internal_kv._internal_kv_get(end_key(job_id), namespace=KV_NAMESPACE)
    except Exception:
        return False, None
    if not data:
        return False, None
    return True, None if data == _EXITED else Failure.decode(data)


def record_end(job_id: str, end: ActorEnd) -> None:
    """Leave how the actor ended (``exit()`` or ``fail()``) where its job handle reads it (:func:`read_end`)."""
    from ray.experimental import internal_kv

    if end.error is None:
        value = _EXITED
    else:
        failure = Failure.from_exception(end.error)
        value = failure.with_message(f"actor failed itself: {failure.message}").encode()
    internal_kv._internal_kv_put(end_key(job_id), value, namespace=KV_NAMESPACE)


def ended_death(name: str, job_id: str) -> ActorDiedError | None:
    """The ActorDiedError for an actor that ended itself (None if it did not): its cause is what it failed with."""
    ended, failure = read_end(job_id)
    if not ended:
        return None
    if failure is None:
        return ActorDiedError(f"actor {name!r} ended itself (current_actor().exit())")
    death = ActorDiedError(f"actor {name!r} {failure.message}")
    if failure.remote is not None:
        death.__cause__ = remote_error(failure.remote)
    return death
