"""The host side of a Fray actor on Iris: what runs inside the actor's Iris task.

:func:`host_actor` is the task's entrypoint. It constructs the instance (a raising
constructor fails the job at once, with the exception on its failure line), serves it with
``iris.actor.server.ActorServer`` on the port Iris allocated (``ports=["actor"]``) and
registers the address in Iris's endpoint registry under the namespace-qualified name
``/user/root-job/<actor name>``. Calls run on up to ``ActorConfig.max_concurrency`` server
threads (one: in arrival order); ``async def`` methods run on the actor's own loop.
``current_actor()`` works in the constructor and methods; an actor that ends itself stops its
server gracefully, then its task ends (SUCCEEDED, or FAILED with the exception given to
``fail()``).

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

import os
import pickle
import signal
import subprocess
import sys
import threading
import uuid
from typing import Any

import cloudpickle

from fray.actor_context import ActorContext, set_process_actor
from fray.core._eventloop import ActorLoop, invoke
from fray.core._lifecycle import ActorRestartBudget
from fray.core._remote import RemoteFailure, self_ended
from fray.core._serialization import check_result_picklable
from fray.errors import ActorDiedError, SerializationError
from fray.iris import _task
from fray.iris.actor import IrisActorHandle, endpoint_name
from fray.iris.job import IrisJobHandle, JobMeta

__all__ = ["host_actor"]

# What a supervised child tells its supervisor, one line each on a pipe of their own.
_READY = "ready"
# Server threads beyond the actor's max_concurrency, for the control methods.
_CONTROL_THREADS = 2


class _Dispatch:
    """What Iris's actor server serves for one Fray actor: a method that runs the actor's methods, and two controls.

    Arguments arrive pickled by the caller (so an unpicklable one is refused there,
    before anything is sent); results and exceptions leave as bytes, so that a result
    that cannot be pickled and a method that raised are told apart from transport errors.
    Once the actor ended itself (``current_actor().exit()`` / ``fail()``), calls are
    answered with :class:`~fray.errors.ActorDiedError` and the host's main thread is woken.
    """

    def __init__(self, name: str, instance: object, context: ActorContext, concurrency: int) -> None:
        self._name = name
        self._instance = instance
        self._context = context
        self._loop = ActorLoop(name)
        self._lock = threading.Lock()
        # The actor's own limit; the server has threads to spare for the controls, which must
        # answer while a method runs (a handle asking which instance serves; kill_actor).
        self._slots = threading.Semaphore(concurrency)
        self._death: ActorDiedError | None = None
        self._id = uuid.uuid4().hex
        self.ended = threading.Event()

    def fray_call(self, method: str, payload: bytes) -> tuple[bool, bytes]:
        with self._lock:
            death = self._death
        if death is not None:
            return False, RemoteFailure.capture(death).encode()
        try:
            args, kwargs = cloudpickle.loads(payload)
            with self._slots:
                value = invoke(self._instance, method, args, kwargs, self._loop)
        except Exception as exc:
            return False, RemoteFailure.capture(exc).encode()
        finally:
            self.check_end()
        try:
            return True, cloudpickle.dumps(value)
        except Exception as exc:
            try:
                check_result_picklable(self._name, method, value)
            except SerializationError as err:
                return False, RemoteFailure.capture(err).encode()
            return False, RemoteFailure.capture(exc).encode()

    def fray_instance(self) -> str:
        """This instance's id: a handle whose call broke sees a restart as a new id."""
        return self._id

    def fray_crash(self) -> None:
        """Die at once, as a crash would (``fray.testing.kill_actor``)."""
        os.kill(os.getpid(), signal.SIGKILL)

    def check_end(self) -> None:
        """After a call (or the constructor): if the actor asked to end, refuse later calls and wake the host."""
        end = self._context.end_request()
        if end is None:
            return
        death = self_ended(self._name, end.error)
        with self._lock:
            if self._death is None:
                self._death = death
        self.ended.set()


def host_actor(payload: bytes, name: str, options: dict[str, Any] | None = None) -> None:
    """Iris's entrypoint for a Fray actor job: serve the actor here, or supervise it when it may restart.

    ``options`` carries the actor's group and index, ``max_concurrency``, ``max_restarts``,
    ``max_task_retries`` and the controller address its own handle uses.
    """
    from iris.client.client import iris_ctx
    from iris.cluster.client import get_job_info

    opts = options or {}
    info = _task.enter()
    try:
        ctx = iris_ctx()
        job_info = get_job_info()
        assert job_info is not None  # enter() succeeded, so this is an Iris task
        # Bind only the address Iris advertises for this task: peers are told to use it, nothing else needs it.
        host, port = job_info.advertise_host, ctx.get_port("actor")
        endpoint = endpoint_name(info.job_id, name)
    except BaseException as exc:  # callers must learn why the actor never served, as for its constructor
        _task.exit_with_failure(exc)

    def register() -> None:
        ctx.registry.register(endpoint, f"http://{host}:{port}")

    if int(opts.get("max_restarts") or 0) > 0:
        _supervise(payload, name, opts, host, port, register)
    else:
        _serve(payload, name, opts, host, port, info.job_id, register)


def _serve(
    payload: bytes,
    name: str,
    opts: dict[str, Any],
    host: str,
    port: int,
    job_id: str,
    serving: Any,
) -> None:
    """Construct the actor and serve it on ``host:port`` until it ends; ``serving()`` once it does."""
    from iris.actor.server import ActorServer

    try:
        actor_class, args, kwargs = cloudpickle.loads(payload)
        meta = JobMeta(name, actor_class.__qualname__, False, 1, 1, 0, 0)
        address = opts.get("address")
        concurrency = int(opts.get("max_concurrency", 1))
        retries = int(opts.get("max_task_retries") or 0)
        context = ActorContext(
            name,
            opts.get("group"),
            int(opts.get("index", 0)),
            lambda: IrisActorHandle(
                name,
                IrisJobHandle(job_id, meta, address),
                actor_class,
                address,
                None,
                concurrency,
                max_task_retries=retries,
            ),
        )
        set_process_actor(context)
        instance = actor_class(*args, **kwargs)
    except BaseException as exc:
        _task.exit_with_failure(exc)
    dispatch = _Dispatch(name, instance, context, concurrency)
    dispatch.check_end()
    try:
        endpoint = endpoint_name(job_id, name)
        server = ActorServer(host=host, port=port, max_concurrency=concurrency + _CONTROL_THREADS)
        server.register(endpoint, dispatch)
        port = server.serve_background()
        serving()
    except BaseException as exc:  # callers must learn why the actor never served, as for its constructor
        _task.exit_with_failure(exc)
    print(f"[fray] actor {name!r} serving at {host}:{port}", flush=True)
    dispatch.ended.wait()  # until the actor ends itself, or Iris kills the job (terminate / shutdown)
    server.stop()  # graceful: the answer to the call that asked goes out first
    end = context.end_request()
    if end is not None and end.error is not None:
        _task.exit_with_failure(end.error)
    _task.write_end()


def _supervise(payload: bytes, name: str, opts: dict[str, Any], host: str, port: int, register: Any) -> None:
    """Run the actor in child processes, one at a time, restarting it within ``max_restarts`` (module docstring)."""
    budget = ActorRestartBudget(int(opts["max_restarts"]), int(opts.get("max_task_retries") or 0))
    registered = threading.Event()

    def serving() -> None:
        if not registered.is_set():  # once: every instance serves on the same port, under the same endpoint
            register()
            registered.set()

    while True:
        served, code = _run_child(payload, name, opts, host, port, serving)
        if code in (0, _task.FAILED_EXIT):
            # It ended itself (exit / fail), or its constructor raised: the child wrote how, and the end lines.
            os._exit(code)
        reason = f"killed by signal {-code}" if code < 0 else f"its process exited with code {code}"
        if not served:
            _task.exit_with_failure(ActorDiedError(f"actor {name!r} died before it served ({reason})"))
        budget, restart, words = budget.decide(name, reason)
        print(f"[fray] {words}", flush=True)
        if not restart:
            _task.exit_with_failure(ActorDiedError(words))


def _run_child(payload: bytes, name: str, opts: dict[str, Any], host: str, port: int, serving: Any) -> tuple[bool, int]:
    """Start one instance in a child process and wait for it to end: (whether it served, its exit code).

    ``serving()`` is called when the child says it serves.
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
    child.stdin.write(pickle.dumps((payload, name, opts, host, port)))
    child.stdin.close()
    served = threading.Event()

    def watch() -> None:
        with os.fdopen(read_fd, "r") as lines:
            for line in lines:
                if line.strip() == _READY:
                    served.set()
                    serving()

    watcher = threading.Thread(target=watch, name=f"fray-actor-child-{name}", daemon=True)
    watcher.start()
    code = child.wait()
    watcher.join(timeout=5)
    return served.is_set(), code


def _child_main(report_fd: int) -> None:
    """``python -m fray.iris._actor_host FD``: one supervised instance (its arguments pickled on stdin)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the supervisor
    payload, name, opts, host, port = pickle.loads(sys.stdin.buffer.read())
    info = _task.enter()
    report = os.fdopen(report_fd, "w")

    def serving() -> None:
        report.write(_READY + "\n")
        report.flush()

    _serve(payload, name, opts, host, port, info.job_id, serving)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
