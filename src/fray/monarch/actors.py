"""Fray actors on Monarch: each actor is one rank of a :class:`~fray.monarch.host.FrayHost` mesh.

The process that created an actor keeps its state in an :class:`ActorRecord`: the
job lifecycle (PENDING until the actor answers its first ``ready`` call, RUNNING,
then FAILED when its constructor raised or its process died, STOPPED when it was
terminated), its readiness future, the id of its process and its log file. A
:class:`HostMesh` holds the process mesh that the records of one group (or one lone
actor) share, and stops it once every member has finished.

:class:`MonarchActorHandle` is what users hold. Calls go to the member's Monarch
endpoint with ``call_one``: blocking calls wait on the caller's thread, ``.remote()``
calls complete an :class:`~fray.actor.ActorFuture` through :class:`~fray.monarch.futures.CallFuture`.
Handles pickle as a Monarch actor reference: unpickled in any process on this host
(a job, another actor), they call the actor directly; unpickled in the creating
process they find its record again. See ``docs/monarch.md`` for the rules.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import ActorError

from fray.actor import ActorFuture, ActorHandleBase, RemoteMethod, check_actor_method
from fray.actor_context import SHUTDOWN_GRACE
from fray.core._lifecycle import Failure, JobLifecycle
from fray.core._remote import RemoteFailure, actor_died, remote_error
from fray.core._serialization import check_call_picklable
from fray.core.inside._logcapture import log_tail
from fray.errors import ActorDiedError, ActorUnavailableError, ConfigError, FrayError, SerializationError
from fray.monarch import supervision
from fray.monarch._stacks import actor_stacks
from fray.monarch.futures import CallFuture, send_then, when_done
from fray.monarch.host import DEAD, ENDED, ERROR, OK, PICKLED, UNPICKLABLE
from fray.process._process import KILL_GRACE, pid_alive
from fray.stacks import ProcessStacks

__all__ = ["ActorRecord", "HostMesh", "MonarchActorHandle", "MonarchActorMethod", "unwrap_reply"]

# Records of the actors this process created, by job id: a handle unpickled here finds its record.
_RECORDS: weakref.WeakValueDictionary[str, ActorRecord] = weakref.WeakValueDictionary()
_HOSTNAME = socket.gethostname()
# Seconds a terminated member's process is given before it is signalled: enough for the rest of its
# group to be terminated too (then the whole mesh is stopped gracefully instead).
_KILL_DELAY = 0.2


def _died(message: str, cause: BaseException | None = None) -> ActorDiedError:
    err = actor_died(message, cause)
    return err


class HostMesh:
    """The Monarch process mesh and host-actor mesh that one group's members (or one lone actor) live on."""

    def __init__(self, procs: Any, hosts: Any, spawn_name: str) -> None:
        self.procs = procs
        self.hosts = hosts
        self.spawn_name = spawn_name
        self.members: list[ActorRecord] = []
        self._lock = threading.Lock()
        self._stopper: threading.Thread | None = None
        self._stopping = threading.Event()  # set with _stopper: the whole mesh goes gracefully

    def watch(self) -> None:
        """Start turning failures of this mesh into dead members."""
        supervision.watch(self.spawn_name, self._on_failure)

    def _on_failure(self, reason: str) -> None:
        # Runs on a Monarch thread: only record and schedule. With several members, ask each
        # one that still looks alive: only the dead ones fail to answer.
        live = [m for m in self.members if not m.lifecycle.finished]
        if len(self.members) == 1:
            for member in live:
                member.died(reason)
            return
        for member in live:
            member.probe(reason)

    def member_finished(self) -> None:
        """A member finished: once all have, stop the processes (on a thread: stopping blocks)."""
        with self._lock:
            if self._stopper is not None or not all(m.lifecycle.finished for m in self.members):
                return
            supervision.unwatch(self.spawn_name)
            self._stopper = threading.Thread(target=self._stop, name=f"fray-stop-{self.spawn_name}", daemon=True)
            self._stopper.start()  # under the lock: join() never sees it unstarted
            self._stopping.set()

    def all_leaving(self) -> bool:
        """True when every member is dead or being terminated: the mesh will be stopped as a whole."""
        return all(member.refusing for member in self.members)

    def wait_stopping(self, timeout: float) -> bool:
        """Wait until the whole mesh is being stopped gracefully; False if it was not within ``timeout``."""
        return self._stopping.wait(timeout)

    def _stop(self) -> None:
        with contextlib.suppress(Exception):  # already stopped, or Monarch shutting down: nothing left to stop
            self.procs.stop().get(timeout=60)

    @property
    def stopping(self) -> bool:
        """True once every member finished and the mesh is being (or was) stopped."""
        with self._lock:
            return self._stopper is not None

    def join(self, timeout: float | None = None) -> None:
        """Wait until this mesh's processes are stopped (if stopping began)."""
        with self._lock:
            stopper = self._stopper
        if stopper is not None:
            stopper.join(timeout)


class ActorRecord:
    """One actor's state in the process that created it."""

    def __init__(self, name: str, job_id: str, cls: type, ref: Any, mesh: HostMesh, log_path: Path) -> None:
        self.name = name
        self.job_id = job_id
        self.cls = cls
        self.ref = ref  # the member's rank of the host-actor mesh
        self.mesh = mesh
        self.log_path = log_path
        self.lifecycle = JobLifecycle(job_id)
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.pid: int | None = None
        self.terminating = False
        self._death: ActorDiedError | None = None
        self._lock = threading.Lock()
        _RECORDS[job_id] = self

    def __repr__(self) -> str:
        return f"ActorRecord({self.name!r}, {self.lifecycle.status.value})"

    # ----- becoming ready ----------------------------------------------------------------------

    def await_ready(self, handle: MonarchActorHandle) -> None:
        """Ask the actor whether it is serving (giving it ``handle``, its own); the answer goes to :meth:`_on_ready`."""
        when_done(self.ref.ready.call_one(handle), self._on_ready)

    def _on_ready(self, result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            self.died(_reason(exc))
            return
        pid, failure = result
        with self._lock:
            self.pid = pid
        if self.lifecycle.finished:  # terminated while it was starting: the process goes now
            self._kill_process()
            return
        if failure is not None:
            self.init_failed(RemoteFailure.decode(failure))
            return
        self.lifecycle.start()
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.ready.set_result(None)
        when_done(self.ref.watch_end.call_one(), self._on_end)

    def _on_end(self, result: Any, exc: BaseException | None) -> None:
        if exc is None:  # an error means the actor died or was stopped: reported elsewhere
            self.ended(result[1])

    def probe(self, reason: str) -> None:
        """Check with a cheap call whether this member is still alive; if not, it died of ``reason``."""
        send_then(self.ref.ready.call_one, lambda _, exc: self.died(reason) if exc is not None else None)

    # ----- ending ------------------------------------------------------------------------------

    def init_failed(self, remote: RemoteFailure) -> None:
        """The constructor raised ``remote``: the actor never serves."""
        message = f"actor {self.name!r} died in __init__: {remote.summary}"
        self._finish(
            _died(message, remote_error(remote)),
            lambda: self.lifecycle.fail(Failure.from_remote(remote).with_message(message)),
        )

    def died(self, reason: str) -> None:
        """The actor's process died (or the actor can no longer be reached) of ``reason``."""
        message = f"actor {self.name!r} died: {reason}"
        self._finish(_died(message), lambda: self.lifecycle.fail(Failure(message)))

    def ended(self, payload: bytes | None) -> None:
        """The actor ended itself: ``exit()`` (``payload`` None) or ``fail()`` (an encoded :class:`Failure`)."""
        if payload is None:
            death = _died(f"actor {self.name!r} ended itself (current_actor().exit())")
            move: Callable[[], bool] = self.lifecycle.succeed
        else:
            failure = Failure.decode(payload)
            death = _died(
                f"actor {self.name!r} {failure.message}",
                remote_error(failure.remote) if failure.remote is not None else None,
            )
            move = functools.partial(self.lifecycle.fail, failure)
        if self._finish(death, move):
            self._kill_process()

    def terminate(self) -> None:
        """Stop the actor: its code sees ``shutdown_requested`` (a grace for running calls), then it goes.

        Its job ends STOPPED, its callers get ActorDiedError, its process is stopped.
        """
        self.terminating = True  # from now on calls fail, and answers still to come are dropped
        if self.ready.done() and not self.dead:
            with contextlib.suppress(Exception):  # dead already, or Monarch going away: stop it regardless
                self.ref.notify_shutdown.call_one(SHUTDOWN_GRACE).get(timeout=SHUTDOWN_GRACE + 5.0)
        if self._finish(_died(f"actor {self.name!r} was terminated"), self.lifecycle.stop):
            self._kill_process()

    def _finish(self, death: ActorDiedError, move: Callable[[], bool]) -> bool:
        with self._lock:
            if self._death is not None:
                return False
            self._death = death
        move()
        if not self.ready.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.ready.set_exception(self.death_error())
        self.mesh.member_finished()
        return True

    def _kill_process(self) -> None:
        # Monarch stops a mesh gracefully, but only a whole mesh, ~0.5 s each, one after another.
        # Once every member finished, the mesh is stopped that way (HostMesh.member_finished); a
        # member terminated while others still serve is signalled directly instead, as binary jobs
        # are. The signal waits a moment, so that a group shut down member by member is stopped as
        # one mesh: a process Fray kills looks like a crash to Monarch, and Monarch 0.7.0 exits the
        # owning process when another process later calls an actor that crashed (docs/monarch.md).
        timer = threading.Timer(_KILL_DELAY, self._kill_unless_stopping)
        timer.daemon = True
        timer.start()

    def _kill_unless_stopping(self) -> None:
        # A group shut down as a whole (every member terminating) is stopped as one mesh once the
        # last member finished; under load a member's shutdown grace may outlast _KILL_DELAY, so
        # wait for that (bounded by the grace) rather than signal a member of a leaving group.
        if self.mesh.all_leaving() and self.mesh.wait_stopping(SHUTDOWN_GRACE + 5.0):
            return
        with self._lock:
            pid = self.pid
        if pid is None or self.mesh.stopping:  # not started yet (_on_ready kills it), or stopped gracefully
            return
        _signal_group(pid, signal.SIGTERM)
        timer = threading.Timer(KILL_GRACE, lambda: pid_alive(pid) and _signal_group(pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def death_error(self) -> ActorDiedError:
        """A fresh ActorDiedError saying why the actor is gone (one per caller: shared exceptions tangle)."""
        death = self._death
        if death is None and self.terminating:
            return _died(f"actor {self.name!r} was terminated")
        assert death is not None
        return _died(str(death), death.__cause__)

    @property
    def refusing(self) -> bool:
        """True once the actor is dead or being terminated: calls fail with :meth:`death_error`."""
        return self._death is not None or self.terminating

    @property
    def dead(self) -> bool:
        """True once the actor died or was terminated."""
        return self._death is not None

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The actor process's output lines (its stdout and stderr go to one file)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        return log_tail(text.splitlines(), max_lines)


def unwrap_reply(name: str, method: str, reply: tuple[str, Any], record: ActorRecord | None = None) -> Any:
    """The value of a :class:`~fray.monarch.host.FrayHost` reply, or the Fray error it stands for."""
    tag, payload = reply
    if record is not None and record.terminating:  # answered while it was being terminated: the call died with it
        raise record.death_error()
    if tag == OK:
        return payload
    if tag == PICKLED:
        return cloudpickle.loads(payload)
    if tag == ERROR:
        raise remote_error(RemoteFailure.decode(payload))
    if tag == UNPICKLABLE:
        raise SerializationError(payload)
    if tag == ENDED:
        if record is not None:
            record.ended(payload)
            raise record.death_error()
        if payload is None:
            raise _died(f"actor {name!r} ended itself (current_actor().exit())")
        failure = Failure.decode(payload)
        raise _died(f"actor {name!r} {failure.message}", remote_error(failure.remote) if failure.remote else None)
    if tag == DEAD:
        remote = RemoteFailure.decode(payload)
        if record is not None:
            record.init_failed(remote)
            raise record.death_error()
        raise _died(f"actor {name!r} died in __init__: {remote.summary}", remote_error(remote))
    raise FrayError(f"actor {name!r}, method {method!r}: unexpected reply {tag!r} from its Monarch host")


def _signal_group(pid: int, sig: int) -> bool:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    return True


def _reason(exc: BaseException) -> str:
    return supervision.reason_of(exc) if isinstance(exc, SupervisionError) else f"{type(exc).__name__}: {exc}"


# ----- handles -------------------------------------------------------------------------------------


#: The method object of a Monarch actor's handle: the one :class:`~fray.actor.RemoteMethod` of every backend.
MonarchActorMethod = RemoteMethod


class MonarchActorHandle(ActorHandleBase):
    """A deferred, picklable handle to a Fray actor on Monarch (see the module docstring)."""

    def __init__(self, name: str, cls: type, ref: Any, job_id: str, host: str = _HOSTNAME, death: str = "") -> None:
        self._name = name
        self._cls = cls
        self._ref = ref  # None in a handle pickled after the actor ended: its processes are gone
        self._job_id = job_id
        self._host = host
        self._death = death
        self._record = _RECORDS.get(job_id) if host == _HOSTNAME else None
        self._ready: concurrent.futures.Future[None] | None = None

    def __repr__(self) -> str:
        return f"MonarchActorHandle({self._name!r}, {self._cls.__name__})"

    def __getattr__(self, method_name: str) -> RemoteMethod:
        if method_name.startswith("__"):
            raise AttributeError(method_name)
        check_actor_method(self._cls, method_name)
        return RemoteMethod(self, method_name)

    def _fray_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorFuture:
        """Send the call now; its result arrives in the returned future."""
        try:
            sent = self._send(method, args, kwargs)
        except ActorDiedError as exc:  # a dead actor's calls fail in their future, as on every backend
            failed = ActorFuture()
            failed.set_exception(exc)
            return failed

        def convert(reply: Any, exc: BaseException | None) -> Any:
            if exc is not None:
                raise self._translate(exc) from exc
            return self._unwrap(method, reply)

        return CallFuture(sent, convert)

    def _fray_call_sync(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make the call and block for its result (no future in between)."""
        sent = self._send(method, args, kwargs)
        try:
            reply = sent.get()
        except Exception as exc:
            raise self._translate(exc) from exc
        return self._unwrap(method, reply)

    def __reduce__(self) -> tuple[object, ...]:
        record = self._record
        if record is not None and record.dead:  # Monarch cannot pickle a stopped mesh, and need not
            return (
                _restore_handle,
                (self._name, self._cls, None, self._job_id, self._host, str(record.death_error())),
            )
        return (_restore_handle, (self._name, self._cls, self._ref, self._job_id, self._host, self._death))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MonarchActorHandle) and other._job_id == self._job_id

    def __hash__(self) -> int:
        return hash(self._job_id)

    def _fray_kill(self) -> None:
        raise ConfigError(
            f"kill_actor({self!r}): the Monarch backend does not kill actor processes on purpose: Monarch 0.7.0 "
            "exits the process that created an actor soon after another process calls a crashed one "
            "(docs/monarch.md); test crash handling on the local, Ray or Fray cluster backend"
        )

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of the actor process's threads, asked on this host (``fray.monarch._stacks``).

        The creating process knows the pid; a handle elsewhere asks the actor's ``ready`` endpoint
        for it (answered on Monarch's message loop, beside the calls running).
        """
        label = f"actor {self._name!r}"
        record = self._record
        if record is not None:
            with record._lock:
                pid = record.pid
            dead = str(record.death_error()) if record.refusing else None
            return (actor_stacks(label, pid, dead, timeout, locals),)
        if self._ref is None:
            return (actor_stacks(label, None, str(_died(self._death)), timeout, locals),)
        if self._host != _HOSTNAME:
            return (ProcessStacks(label, self._host, None, error=f"{label} lives on host {self._host!r}, not here"),)
        started = time.monotonic()
        try:
            pid, _ = self._ref.ready.call_one().get(timeout=timeout)
        except Exception as exc:
            return (actor_stacks(label, None, f"no answer: {self._translate(exc)}", timeout, locals),)
        return (actor_stacks(label, pid, None, max(0.1, timeout - (time.monotonic() - started)), locals),)

    @property
    def monarch_ref(self) -> Any:
        """The Monarch ``ActorMesh`` of this actor's :class:`~fray.monarch.host.FrayHost` (one rank)."""
        return self._ref

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        if self._record is not None:
            return self._record.ready
        if self._ready is None and self._ref is None:
            self._ready = concurrent.futures.Future()
            self._ready.set_exception(_died(self._death))
        if self._ready is None:
            # A handle from another process: ask the actor itself.
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._ready = future

            def settle(result: Any, exc: BaseException | None) -> None:
                if exc is not None:
                    future.set_exception(self._translate(exc))
                elif result[1] is not None:
                    remote = RemoteFailure.decode(result[1])
                    future.set_exception(_died(f"actor {self._name!r} died in __init__: {remote.summary}"))
                else:
                    future.set_result(None)

            try:
                when_done(self._ref.ready.call_one(), settle)
            except Exception as exc:
                future.set_exception(self._translate(exc))
        return self._ready

    # ----- one call ----------------------------------------------------------------------------

    def _send(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        record = self._record
        if record is not None and record.refusing:
            raise record.death_error()
        if self._ref is None:
            raise _died(self._death)
        if self._host != _HOSTNAME:
            raise ActorUnavailableError(
                f"actor {self._name!r} lives on host {self._host!r}, this is {_HOSTNAME!r}: Monarch actor handles "
                "work only on the host that created the actor (the Monarch backend runs on one host)"
            )
        try:
            return self._ref.invoke.call_one(method, args, kwargs)
        except Exception as exc:
            # Monarch pickles the arguments right here; when that failed, say which one, in Fray's words.
            check_call_picklable(self._name, method, args, kwargs)
            raise self._translate(exc) from exc

    def _unwrap(self, method: str, reply: tuple[str, Any]) -> Any:
        return unwrap_reply(self._name, method, reply, self._record)

    def _translate(self, exc: BaseException) -> BaseException:
        """The Fray error for a Monarch error raised by a call to this actor."""
        record = self._record
        if isinstance(exc, SupervisionError):
            reason = _reason(exc)
            if record is not None:
                record.died(reason)  # no-op if it already ended (terminated: the first reason stands)
                return record.death_error()
            return _died(f"actor {self._name!r} died: {reason}", exc)
        if record is not None and record.dead:
            return record.death_error()
        if isinstance(exc, ActorError):
            # The host itself failed to handle the call (e.g. an argument's class cannot be imported there).
            inner = getattr(exc, "exception", None)
            return remote_error(RemoteFailure.capture(inner if isinstance(inner, BaseException) else exc))
        return ActorUnavailableError(f"actor {self._name!r}: the call failed in Monarch: {type(exc).__name__}: {exc}")


def _restore_handle(name: str, cls: type, ref: Any, job_id: str, host: str, death: str) -> MonarchActorHandle:
    # Unpickled in another process (a job, another actor): that process now calls a Fray actor's
    # mesh, and a failure of that mesh must become ActorDiedError for its calls, not end the process.
    supervision.call_from_here()
    return MonarchActorHandle(name, cls, ref, job_id, host, death)
