"""The Monarch actor that hosts one Fray actor inside a Monarch process.

Every Fray actor is a :class:`FrayHost` spawned on a process mesh: its constructor
builds the user's object from a cloudpickled ``(class, args, kwargs)``, and its one
endpoint, :meth:`FrayHost.invoke`, dispatches ``(method, args, kwargs)`` to that
object with :func:`fray._eventloop.invoke` -- so user classes need no Monarch
decorators, and ``async def`` methods run on the actor's own event loop as on every
backend. A group's members are the ranks of one host mesh; each rank picks its own
:class:`MemberSpec` by its rank.

Replies are tagged tuples (see :data:`OK` ...), never exceptions, so that what the
caller sees is worded by Fray, not by Monarch:

* ``(OK, value)`` -- the value, shipped by Monarch as it is (plain data);
* ``(PICKLED, bytes)`` -- the value cloudpickled here, where a failure to pickle it
  can still be reported in Fray's words (``(UNPICKLABLE, message)``);
* ``(ERROR, RemoteFailure bytes)`` -- the method raised;
* ``(DEAD, RemoteFailure bytes)`` -- the constructor raised; the actor never served.

The same endpoint will run tasks on pre-spawned processes: a task is a call of a
stateless runner object's method (see ``docs/monarch.md``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
from monarch.actor import Actor, current_rank, endpoint

from fray._eventloop import ActorLoop, invoke
from fray._remote import RemoteFailure
from fray._serialization import check_result_picklable
from fray.errors import SerializationError
from fray.job import JobInfo, replica_env
from fray.monarch import supervision

__all__ = ["DEAD", "ERROR", "OK", "PICKLED", "UNPICKLABLE", "FrayHost", "MemberSpec", "travels_as_is"]

OK, PICKLED, ERROR, UNPICKLABLE, DEAD = "ok", "pickled", "error", "unpicklable", "dead"

# Values of these exact types always pickle, so they go back as they are: no second
# pickling here, no copy of a large bytes payload.
_AS_IS: frozenset[type] = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})


def travels_as_is(value: Any) -> bool:
    """True for values that surely pickle and need no pre-pickling: scalars, strings, bytes, numeric arrays."""
    kind = type(value)
    if kind in _AS_IS:
        return True
    # numpy arrays without Python objects inside, recognised without importing numpy
    return kind.__name__ == "ndarray" and kind.__module__ == "numpy" and not value.dtype.hasobject


@dataclass(frozen=True)
class MemberSpec:
    """What one rank of a host mesh needs to know about the Fray actor it hosts."""

    info: JobInfo
    client_spec: str
    log_path: str


class FrayHost(Actor):
    """Hosts one Fray actor per rank: builds it, serves its method calls one at a time, in order."""

    def __init__(self, members: Sequence[MemberSpec], payload: bytes) -> None:
        member = members[current_rank().rank]
        self._label = member.info.name
        _redirect_output(member.log_path)
        # The process hosts this actor only, so the job identity and the backend can live in
        # its environment: current_job() and current_client() read them there.
        os.environ.update(replica_env(member.info, member.client_spec))
        self._loop = ActorLoop(self._label)
        self._instance: object | None = None
        self._failure: bytes | None = None
        try:
            cls, args, kwargs = cloudpickle.loads(payload)
            self._instance = cls(*args, **kwargs)
        except BaseException as exc:
            failure = RemoteFailure.capture(exc)
            sys.stderr.write(failure.traceback_text)
            self._failure = failure.encode()

    @endpoint
    def ready(self) -> tuple[int, bytes | None]:
        """This process's id, and the constructor's encoded failure (None if the actor is serving)."""
        return os.getpid(), self._failure

    @endpoint
    def invoke(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        """Call ``method`` on the hosted object; a tagged reply (see the module docstring)."""
        instance = self._instance
        if instance is None:
            return DEAD, self._failure
        try:
            result = invoke(instance, method, args, kwargs, self._loop)
        except BaseException as exc:
            return ERROR, RemoteFailure.capture(exc).encode()
        if travels_as_is(result):
            return OK, result
        try:
            return PICKLED, cloudpickle.dumps(result)
        except Exception as exc:
            return UNPICKLABLE, _unpicklable_message(self._label, method, result, exc)

    def __supervise__(self, failure: Any) -> bool:
        # Meshes that this actor's own code created through Fray report here (this actor owns
        # them); Fray turns their failures into ActorDiedError for its callers.
        return supervision.handle(failure)


def _unpicklable_message(label: str, method: str, value: object, exc: Exception) -> str:
    try:
        check_result_picklable(label, method, value)
    except SerializationError as err:
        return str(err)
    return f"actor {label!r}, method {method!r}: the return value cannot be pickled ({type(exc).__name__}: {exc})"


def _redirect_output(path: str) -> None:
    """Send this process's stdout and stderr (Python's and the C level's) to the actor's log file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)  # a log line is readable as soon as it is printed
