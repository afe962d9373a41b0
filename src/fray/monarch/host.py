"""The Monarch actor that hosts one Fray actor inside a Monarch process.

Every Fray actor is a :class:`FrayHost` spawned on a process mesh: its constructor
builds the user's object from a cloudpickled ``(class, args, kwargs)``, and its one
endpoint, :meth:`FrayHost.invoke`, dispatches ``(method, args, kwargs)`` to that
object with :func:`fray.core.inside._eventloop.invoke` -- so user classes need no Monarch
decorators, and ``async def`` methods run on the actor's own event loop as on every
backend. A group's members are the ranks of one host mesh; each rank picks its own
:class:`MemberSpec` by its rank.

Replies are tagged tuples (see :data:`OK` ...), never exceptions, so that what the
caller sees is worded by Fray, not by Monarch:

* ``(OK, value)`` -- the value, shipped by Monarch as it is (plain data);
* ``(PICKLED, bytes)`` -- the value cloudpickled here, where a failure to pickle it
  can still be reported in Fray's words (``(UNPICKLABLE, message)``);
* ``(ERROR, RemoteFailure bytes)`` -- the method raised;
* ``(DEAD, RemoteFailure bytes)`` -- the constructor raised; the actor never served;
* ``(ENDED, Failure bytes or None)`` -- the actor ended itself (``current_actor().exit()``
  or ``fail()``) before this call ran.

Calls run on a pool of ``max_concurrency`` threads (one: in arrival order) and are
answered through an explicit response port, so the actor's Monarch message loop stays
free for the control endpoints: :meth:`FrayHost.watch_end` (answered when the actor
ends itself) and :meth:`FrayHost.notify_shutdown` (sets ``shutdown_requested``).

The same endpoint will run tasks on pre-spawned processes: a task is a call of a
stateless runner object's method (see ``docs/monarch.md``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cloudpickle
from monarch.actor import Actor, Port, current_rank, endpoint

from fray.actor_context import ActorCalls, ActorContext, ActorEnd, set_process_actor
from fray.core._lifecycle import Failure
from fray.core._remote import RemoteFailure
from fray.core._serialization import check_result_picklable
from fray.core.inside._eventloop import ActorLoop, invoke
from fray.core.inside._stacks import serve
from fray.errors import ActorContextError, ActorDiedError, SerializationError
from fray.job import JobInfo
from fray.job_info import replica_env
from fray.monarch import supervision

__all__ = ["DEAD", "ENDED", "ERROR", "OK", "PICKLED", "UNPICKLABLE", "FrayHost", "MemberSpec", "travels_as_is"]

OK, PICKLED, ERROR, UNPICKLABLE, DEAD, ENDED = "ok", "pickled", "error", "unpicklable", "dead", "ended"

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
    group: str | None = None
    index: int = 0
    max_concurrency: int = 1


class FrayHost(Actor):
    """Hosts one Fray actor per rank: builds it, serves its calls on up to ``max_concurrency`` threads."""

    def __init__(self, members: Sequence[MemberSpec], payload: bytes) -> None:
        member = members[current_rank().rank]
        self._label = member.info.name
        _redirect_output(member.log_path)
        serve()  # this process answers stacks() (fray.monarch._stacks), whatever its calls do
        # The process hosts this actor only, so the job identity and the backend can live in
        # its environment: current_job() and current_client() read them there.
        os.environ.update(replica_env(member.info, member.client_spec))
        self._loop = ActorLoop(self._label)
        self._pool = ThreadPoolExecutor(member.max_concurrency, thread_name_prefix=f"fray-actor-{self._label}")
        self._lock = threading.Lock()
        self._ended: tuple[bytes | None] | None = None  # set once the actor ended itself
        self._end_port: Any = None
        self._handle: Any = None
        self._context = ActorContext.of_actor(self._label, member.group, member.index, self._own_handle)
        self._calls = ActorCalls(self._context, on_end=self._tell_end)
        set_process_actor(self._context)
        self._instance: object | None = None
        self._failure: bytes | None = None
        try:
            cls, args, kwargs = cloudpickle.loads(payload)
            self._instance = cls(*args, **kwargs)
        except BaseException as exc:
            failure = RemoteFailure.capture(exc)
            sys.stderr.write(failure.traceback_text)
            self._failure = failure.encode()
            return
        self._calls.check_end()

    def _own_handle(self) -> Any:
        if self._handle is None:
            raise ActorContextError(
                f"actor {self._label!r}: on the Monarch backend current_actor().handle is available once the "
                "constructor has returned (from the first method call on)"
            )
        return self._handle

    @endpoint
    def ready(self, handle: Any = None) -> tuple[int, bytes | None]:
        """This process's id, and the constructor's encoded failure (None if the actor is serving).

        The creator passes the actor's own handle, which ``current_actor().handle`` returns.
        """
        if handle is not None:
            self._handle = handle
        return os.getpid(), self._failure

    @endpoint(explicit_response_port=True)
    def invoke(self, port: Port[tuple[str, Any]], method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Call ``method`` on the hosted object (on the pool); the tagged reply goes to ``port``."""
        self._pool.submit(self._serve, port, method, args, kwargs)

    @endpoint(explicit_response_port=True)
    def watch_end(self, port: Port[tuple[str, bytes | None]]) -> None:
        """Answered with ``(ENDED, Failure bytes or None)`` once the actor ends itself."""
        with self._lock:
            ended = self._ended
            if ended is None:
                self._end_port = port
        if ended is not None:
            port.send((ENDED, ended[0]))

    @endpoint
    def notify_shutdown(self, grace: float) -> bool:
        """Set ``shutdown_requested``; True once no call runs, False if some still ran after ``grace`` seconds."""
        self._context.shutdown_requested.set()
        return self._calls.wait_idle(grace)

    def _serve(self, port: Port[tuple[str, Any]], method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._calls.enter()
        except ActorDiedError:
            ended = self._ended  # set before calls are refused (ActorCalls.check_end)
            port.send((ENDED, ended[0] if ended is not None else None))
            return
        try:
            reply = self._invoke(method, args, kwargs)
        finally:
            self._calls.leave()
        port.send(reply)
        self._calls.check_end()

    def _invoke(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
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

    def _tell_end(self, end: ActorEnd) -> None:
        """The actor asked to end (``ActorCalls.check_end``): tell the creator how, once."""
        payload = None
        if end.error is not None:
            failure = Failure.from_exception(end.error)
            payload = failure.with_message(f"actor failed itself: {failure.message}").encode()
        with self._lock:
            if self._ended is not None:
                return
            self._ended = (payload,)
            port, self._end_port = self._end_port, None
        if port is not None:
            port.send((ENDED, payload))

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
