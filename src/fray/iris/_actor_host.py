"""The host side of Fray actors on Iris: what runs inside each task of an actor group's Iris job.

:func:`host_actor` is the tasks' entrypoint (marin's :func:`_host_actor` is the same path). Task
``i`` is member ``i`` of the group: it constructs the instance (a raising constructor fails the
task at once, with the exception on its failure line), serves it with Iris's ``ActorServer`` on
the port Iris allocated (``ports=["actor"]``), with the instance's public methods callable by name
(``fray.iris._wire`` says what travels), and registers the address in Iris's endpoint registry as
``{job id}/{group name}-{i}``. If Iris refuses the registration because the task is already
terminal (its job was cancelled while the actor started), the server stops and the task ends,
logging an error, without a failure. Calls run on up to ``ActorConfig.max_concurrency`` server
threads (one: in arrival order); ``async def`` methods run on the actor's own loop. Two more
threads answer Fray's controls meanwhile (which instance serves, ``kill_actor``, and ``stacks()``:
``fray_stacks`` takes the live stacks of the actor's threads, see ``fray.iris._stacks``).
``current_actor()`` works in the constructor and methods; an actor that ends itself stops its
server gracefully, then its task ends (SUCCEEDED, or FAILED with the exception given to
``fail()``).

Iris's ``ActorServer``, ``iris_ctx`` and ``get_job_info`` are looked up on ``fray.iris_backend``
when used: that module is marin's seam, where marin's tests replace them.

**Restarts.** Iris retries a failed task whatever failed it, a raising constructor included,
while Fray restarts an actor only when its process died (a crash, a signal, the OOM killer).
So an actor with ``ActorConfig(max_restarts=N)`` is supervised inside its own task: the task's
process starts the actor in a child process (``python -m fray.iris._actor_host``), which serves
on the task's port; when the child dies after its constructor returned, the supervisor counts
the death with :class:`~fray.core._lifecycle.ActorRestartBudget` and starts a new child (the
constructor runs anew, on the same port and endpoint), or, with the budget used up, fails the
task with the budget's words. A constructor that raises, ``exit()`` and ``fail()`` end the
child, and so the task, as they end an unsupervised actor. Each instance has its own id
(:meth:`_Dispatch.fray_instance`), by which handles tell a restarted actor from a network fault.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import cloudpickle
from connectrpc.code import Code
from connectrpc.errors import ConnectError

from fray.actor import public_methods
from fray.actor_context import ActorCalls, ActorContext, set_process_actor
from fray.core._death import describe_exit
from fray.core._lifecycle import ActorRestartBudget
from fray.core._remote import RemoteFailure
from fray.core._serialization import check_result_picklable
from fray.core.inside._eventloop import ActorLoop, invoke
from fray.core.inside._stacks import capture
from fray.errors import ActorDiedError, SerializationError
from fray.iris import _connect, _task
from fray.iris._seams import seam
from fray.iris._stacks import announce
from fray.iris._wire import CallFailed, Pickled, call_arguments

__all__ = ["host_actor"]

logger = logging.getLogger(__name__)

# What a supervised child tells its supervisor, one line each on a pipe of their own.
_READY = "ready"
# Server threads beyond the actor's max_concurrency, for the control methods.
_CONTROL_THREADS = 2
# The port Iris allocates to each task of an actor group (fray.iris._submit.ACTOR_PORT).
_ACTOR_PORT = "actor"


class _Dispatch:
    """Runs calls of one Fray actor's methods for Iris's actor server, and answers two controls.

    Arguments arrive pickled by the caller (so an unpicklable one is refused there, before
    anything is sent); values leave pickled (so a value that cannot be pickled is a
    SerializationError naming the method) and a raised exception as :class:`CallFailed`. Once
    the actor ended itself (``current_actor().exit()`` / ``fail()``), calls are answered with
    :class:`~fray.errors.ActorDiedError` and the host's main thread is woken.
    """

    def __init__(self, name: str, instance: object, context: ActorContext, concurrency: int) -> None:
        self._name = name
        self._instance = instance
        self._context = context
        self._loop = ActorLoop(name)
        # The actor's own limit; the server has threads to spare for the controls, which must
        # answer while a method runs (a handle asking which instance serves; kill_actor).
        self._slots = threading.Semaphore(concurrency)
        self._calls = ActorCalls(context)
        self._id = uuid.uuid4().hex
        #: Set once the actor ended itself: the host's main thread wakes.
        self.ended = self._calls.done

    def call(self, method: str, *args: Any, **kwargs: Any) -> Pickled:
        """Run ``method`` with the call's arguments; its value pickled, or :class:`CallFailed`."""
        try:
            self._calls.enter()
        except ActorDiedError as death:
            raise CallFailed(RemoteFailure.capture(death).encode()) from None
        try:
            call_args, call_kwargs = call_arguments(args, kwargs)
            with self._slots:
                value = invoke(self._instance, method, call_args, call_kwargs, self._loop)
        except Exception as exc:
            raise CallFailed(RemoteFailure.capture(exc).encode()) from None
        finally:
            self._calls.leave()
            self._calls.check_end()
        try:
            return Pickled(cloudpickle.dumps(value))
        except Exception as exc:
            try:
                check_result_picklable(self._name, method, value)
            except SerializationError as err:
                raise CallFailed(RemoteFailure.capture(err).encode()) from None
            raise CallFailed(RemoteFailure.capture(exc).encode()) from None

    def fray_instance(self) -> str:
        """This instance's id: a handle whose call broke sees a restart as a new id."""
        return self._id

    def fray_stacks(self, locals: bool = False) -> dict[str, Any]:
        """This process's pid, host and every thread's stack but this control thread's, as JSON (``stacks()``)."""
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "threads": [thread.to_json() for thread in capture(locals=locals, skip_current=True)],
        }

    def fray_crash(self) -> None:
        """Die at once, as a crash would (``fray.testing.kill_actor``)."""
        os.kill(os.getpid(), signal.SIGKILL)

    def served(self, methods: list[str]) -> _Served:
        """What Iris's server serves: ``methods`` of the instance, then the controls, callable by name."""
        served = _Served()
        for method in methods:
            served.__dict__[method] = partial(self.call, method)
        served.__dict__["fray_instance"] = self.fray_instance
        served.__dict__["fray_crash"] = self.fray_crash
        served.__dict__["fray_stacks"] = self.fray_stacks
        return served

    def check_end(self) -> None:
        """After the constructor: if the actor asked to end, refuse later calls and wake the host."""
        self._calls.check_end()


class _Served:
    """The object registered with Iris's ``ActorServer``: its public attributes are the callable methods.

    Iris serves every public callable attribute of what is registered; this one has only those
    :meth:`_Dispatch.served` put on it, so nothing of the server's own machinery is callable.
    """


@dataclass(frozen=True)
class _Member:
    """Where one task of an actor group serves: its member's name and index, its endpoint and address."""

    name: str
    group: str | None
    index: int
    job_id: str
    endpoint: str
    host: str
    port: int


def _member(name_prefix: str, opts: dict[str, Any]) -> _Member:
    """This task's member, from Iris's task context (``iris_ctx``, ``get_job_info``)."""
    ctx = seam("iris_ctx")()
    info = seam("get_job_info")()
    index = int(info.task_index) // max(1, int(opts.get("hosts", 1)))
    job_id = str(ctx.job_id)
    single = bool(opts.get("single"))
    return _Member(
        name=name_prefix if single else f"{name_prefix}-{index}",
        group=None if single else name_prefix,
        index=index,
        job_id=job_id,
        endpoint=f"{job_id}/{name_prefix}-{index}",
        # Bind only the address Iris advertises for this task: peers are told to use it, nothing else needs it.
        host=info.advertise_host,
        port=int(ctx.get_port(_ACTOR_PORT)),
    )


def host_actor(payload: bytes, name_prefix: str, options: dict[str, Any] | None = None) -> None:
    """Iris's entrypoint for the tasks of a Fray actor group: serve this task's member, or supervise it.

    ``payload`` is ``cloudpickle((actor_class, args, kwargs))``; ``options`` carries
    ``max_concurrency``, ``max_restarts``, ``max_task_retries``, the controller ``address`` the
    actor's own handle uses, ``hosts`` (tasks per member) and ``single`` (an actor of
    ``create_actor``, named ``name_prefix`` itself).
    """
    opts = options or {}
    try:
        if _connect.in_task():  # publish this task's Fray identity (current_job()); a test calling in has none
            _task.enter()
        member = _member(name_prefix, opts)
    except BaseException as exc:  # callers must learn why the actor never served, as for its constructor
        _task.exit_with_failure(exc)
    if int(opts.get("max_restarts") or 0) > 0:
        _supervise(payload, opts, member)
    else:
        _serve(payload, opts, member, lambda: _register(member))


def _host_actor(actor_class: type, args: tuple, kwargs: dict, name_prefix: str, max_concurrency: int) -> None:
    """Entrypoint for actor-hosting Iris jobs (marin's): serve ``actor_class(*args, **kwargs)`` in this task.

    Task ``i`` serves member ``{name_prefix}-{i}`` at ``{job id}/{name_prefix}-{i}`` until the job
    is terminated; it is :func:`host_actor`'s path.
    """
    host_actor(cloudpickle.dumps((actor_class, args, kwargs)), name_prefix, {"max_concurrency": max_concurrency})


def _register(member: _Member) -> bool:
    """Register the member's endpoint; False (and an error logged) when Iris says the task already ended."""
    try:
        seam("iris_ctx")().registry.register(member.endpoint, f"http://{member.host}:{member.port}")
    except ConnectError as exc:
        if exc.code != Code.FAILED_PRECONDITION:
            raise
        # The task's job was cancelled (or the task failed) while the actor started: nobody will call it.
        logger.error("actor %r: Iris did not register %s (%s); stopping", member.name, member.endpoint, exc.message)
        return False
    return True


def _serve(payload: bytes, opts: dict[str, Any], member: _Member, serving: Callable[[], bool]) -> None:
    """Construct the actor and serve it on the member's port until it ends; ``serving()`` registers it."""
    announce()  # this process answers stacks() on its host too, as every Fray task does (fray.iris._stacks)
    try:
        actor_class, args, kwargs = cloudpickle.loads(payload)
        concurrency = int(opts.get("max_concurrency", 1))
        context = ActorContext.of_actor(
            member.name, member.group, member.index, partial(_own_handle, opts, member, actor_class)
        )
        set_process_actor(context)
        instance = actor_class(*args, **kwargs)
    except BaseException as exc:
        _task.exit_with_failure(exc)
    dispatch = _Dispatch(member.name, instance, context, concurrency)
    dispatch.check_end()
    try:
        server = seam("ActorServer")(host=member.host, port=member.port, max_concurrency=concurrency + _CONTROL_THREADS)
        server.register(member.endpoint, dispatch.served(public_methods(type(instance))))
        port = server.serve_background()
        registered = serving()
    except BaseException as exc:  # callers must learn why the actor never served, as for its constructor
        _task.exit_with_failure(exc)
    if not registered:
        server.stop()
        set_process_actor(None)
        return
    print(f"[fray] actor {member.name!r} serving at {member.host}:{port}", flush=True)
    dispatch.ended.wait()  # until the actor ends itself, or Iris kills the job (terminate / shutdown)
    server.stop()  # graceful: the answer to the call that asked goes out first
    end = context.end_request()
    if end is not None and end.error is not None:
        _task.exit_with_failure(end.error)
    _task.write_end()


def _own_handle(opts: dict[str, Any], member: _Member, actor_class: type) -> Any:
    """The actor's handle to itself (``current_actor().handle``), built on first use."""
    from fray.iris.actor import ActorInfo, IrisActorHandle
    from fray.iris.job import IrisJobHandle, JobMeta
    from fray.iris.members import IrisMemberJob

    count = int(os.environ.get("FRAY_REPLICA_COUNT") or 1)
    meta = JobMeta(member.name, member.name, False, count, int(opts.get("hosts", 1)), 0, 0)
    job = IrisJobHandle._by_id(member.job_id, meta, opts.get("address"))
    own: IrisJobHandle | IrisMemberJob = (
        job
        if opts.get("single")
        else IrisMemberJob(job, member.index, member.endpoint, count, int(opts.get("hosts", 1)))
    )
    info = ActorInfo(
        member.name, actor_class, own, int(opts.get("max_concurrency", 1)), int(opts.get("max_task_retries") or 0)
    )
    return IrisActorHandle._of_actor(member.endpoint, info)


def _supervise(payload: bytes, opts: dict[str, Any], member: _Member) -> None:
    """Run the actor in child processes, one at a time, restarting it within ``max_restarts`` (module docstring)."""
    budget = ActorRestartBudget(int(opts["max_restarts"]), int(opts.get("max_task_retries") or 0))
    registered = threading.Event()
    refused = threading.Event()

    def serving() -> None:
        if registered.is_set() or refused.is_set():  # once: every instance serves on the same port and endpoint
            return
        if _register(member):
            registered.set()
        else:
            refused.set()

    while True:
        served, code = _run_child(payload, opts, member, serving, refused)
        if refused.is_set():
            return  # the task already ended in Iris's eyes: nobody will call this actor
        if code in (0, _task.FAILED_EXIT):
            # It ended itself (exit / fail), or its constructor raised: the child wrote how, and the end lines.
            os._exit(code)
        reason = describe_exit(code) if code < 0 else f"its process exited with code {code}"
        if not served:
            _task.exit_with_failure(ActorDiedError(f"actor {member.name!r} died before it served ({reason})"))
        budget, restart, words = budget.decide(member.name, reason)
        print(f"[fray] {words}", flush=True)
        if not restart:
            _task.exit_with_failure(ActorDiedError(words))


def _run_child(
    payload: bytes, opts: dict[str, Any], member: _Member, serving: Callable[[], None], refused: threading.Event
) -> tuple[bool, int]:
    """Start one instance in a child process and wait for it to end: (whether it served, its exit code).

    ``serving()`` is called when the child says it serves; if that finds the registration
    refused, the child is stopped.
    """
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "fray.iris._actor_host", str(write_fd)],
        stdin=subprocess.PIPE,
        pass_fds=(write_fd,),
        # The child dies with its supervisor (see _child_main): a SIGKILLed task leaves nothing behind.
    )
    os.close(write_fd)
    assert child.stdin is not None
    child.stdin.write(pickle.dumps((payload, opts, member)))
    child.stdin.close()
    served = threading.Event()

    def watch() -> None:
        with os.fdopen(read_fd, "r") as lines:
            for line in lines:
                if line.strip() == _READY:
                    served.set()
                    serving()
                    if refused.is_set():
                        child.kill()

    watcher = threading.Thread(target=watch, name=f"fray-actor-child-{member.name}", daemon=True)
    watcher.start()
    code = child.wait()
    watcher.join(timeout=5)
    return served.is_set(), code


def _child_main(report_fd: int) -> None:
    """``python -m fray.iris._actor_host FD``: one supervised instance (its arguments pickled on stdin)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the supervisor
    payload, opts, member = pickle.loads(sys.stdin.buffer.read())
    _task.enter()
    report = os.fdopen(report_fd, "w")

    def serving() -> bool:
        report.write(_READY + "\n")
        report.flush()
        return True  # the supervisor registers the endpoint, once

    _serve(payload, opts, member, serving)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
