"""Fault injection for tests of code that uses Fray: make the failures a cluster has, on purpose.

* :func:`kill_actor` kills an actor's process the way a crash would (the local backend,
  whose actors share the script's process, simulates it by killing the actor's threads);
* :func:`preempt` ends a job's replica (or all of them) the way a preempted host would,
  so the job is retried within ``max_retries_preemption``, not its failure budget;
* :func:`kill_worker` SIGKILLs a worker of a Fray cluster (``fray://``), as a lost host.

It is also a pytest plugin, opt-in with ``pytest -p fray.testing``: when a test times out
(pytest-timeout) or is interrupted (Ctrl-C), it prints, before the traceback, the live stacks
of every job and actor still running that the session's clients own (:func:`print_live_stacks`),
so a test that hangs on remote work says where that work is stuck.

Each works on every backend where it has a meaning and raises
:class:`~fray.errors.ConfigError`, naming the backend, where it has none. What each
backend supports is in ``docs/testing.md``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from fray.actor import ActorHandleBase
from fray.core import _driver_exit
from fray.errors import ConfigError, NotFound
from fray.job import JobHandleBase, replicas_to_preempt
from fray.stacks import format_stacks

__all__ = ["kill_actor", "kill_worker", "preempt", "print_live_stacks", "replicas_to_preempt"]


def kill_actor(handle: Any) -> None:
    """Kill the process of the actor behind ``handle``, as a crash would; returns once it is dead.

    What follows is what follows a real crash: calls in flight fail with
    :class:`~fray.errors.ActorDiedError` (or are sent again, see
    ``ActorConfig.max_task_retries``); the actor is restarted, its constructor run
    anew, if ``ActorConfig.max_restarts`` allows, and later calls reach the new
    instance; otherwise its job is FAILED and every call fails at once. Unlike
    ``terminate()``, the actor gets no warning (``shutdown_requested`` is not set).
    Raises :class:`~fray.errors.ConfigError` where the backend cannot kill one actor's
    process, and ``TypeError`` for something that is not an actor handle.
    """
    if not isinstance(handle, ActorHandleBase):
        raise TypeError(f"kill_actor() takes an actor handle (from client.create_actor), got {handle!r}")
    handle._fray_kill()


def preempt(job: Any, replica: int | None = None) -> None:
    """End replica ``replica`` of the running ``job`` (every replica if None) the way a preemption does.

    The attempt then ends as one whose host was lost: the whole gang is retried if
    ``JobRequest.max_retries_preemption`` allows (the failure budget is not touched),
    otherwise the job is FAILED with the same words as any job whose preemption
    retries ran out. Per backend: on ``local`` the replica's thread is stopped (its
    process SIGKILLed for a binary job); on ``fray://`` the controller records the
    replica's task as lost and its worker kills the process; on Ray the replica's
    worker process is SIGKILLed, which Ray reports as a lost worker.

    Returns once the preemption was delivered (on ``fray://``: recorded; elsewhere the
    job notices within moments). Raises :class:`~fray.errors.FrayError` if the job has
    no attempt running (PENDING or finished), :class:`~fray.errors.ConfigError` for a
    replica the job does not have or a backend without preemption, ``TypeError`` for
    something that is not a job handle. Actors are crashed with :func:`kill_actor`.
    """
    if not isinstance(job, JobHandleBase):
        raise TypeError(f"preempt() takes a job handle (from client.submit), got {job!r}")
    if replica is not None and (isinstance(replica, bool) or not isinstance(replica, int) or replica < 0):
        raise ConfigError(f"preempt(replica={replica!r}) must be a replica index (0, 1, ...) or None for all")
    job._fray_preempt(replica)


def kill_worker(client: Any, worker_id: str) -> None:
    """SIGKILL the process of worker ``worker_id`` of the Fray cluster ``client`` is connected to.

    As when its host is lost: the worker's tasks die with it, and once the worker's
    heartbeat is overdue (the controller's ``worker_timeout``) the controller declares
    it lost and retries its tasks' jobs within their preemption budgets. The worker must
    run on this machine (it is signalled directly). Returns once the signal was sent.
    Raises :class:`~fray.errors.ConfigError` for a client of another backend or a worker
    on another machine, :class:`~fray.errors.NotFound` for a worker the controller does
    not know or has already declared lost.
    """
    controller = getattr(client, "_controller", None)
    if controller is None or not hasattr(controller, "list_workers"):
        raise ConfigError(
            f"kill_worker({client!r}): only a Fray cluster (fray://) has workers to kill; this backend "
            f"({type(client).__module__}) has none"
        )
    workers = {w.info.worker_id: w for w in controller.list_workers() if w.state == "alive"}
    record = workers.get(worker_id)
    if record is None:
        raise NotFound(f"kill_worker: the cluster has no alive worker {worker_id!r} (alive: {sorted(workers)})")
    host, _, pid_text = record.address.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        raise ConfigError(
            f"kill_worker: worker {worker_id!r} runs at {record.address!r}, not on this machine "
            f"({socket.gethostname()}); only workers on this machine can be killed"
        )
    pid = int(pid_text)
    if not _is_worker_process(pid, worker_id):
        raise NotFound(f"kill_worker: process {pid} is not worker {worker_id!r} (it has exited)")
    os.kill(pid, signal.SIGKILL)


def _is_worker_process(pid: int, worker_id: str) -> bool:
    # Never signal a process that merely reuses a dead worker's pid: it must be that worker.
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"worker" in argv and worker_id.encode() in argv


def print_live_stacks(file: IO[str] | None = None, *, timeout: float = 10.0) -> int:
    """Print the live stacks of every unfinished job and actor of this process's clients; how many were shown.

    The clients are those that have submitted work and not shut down; each job's and actor's
    stacks are asked for at once (``handle.stacks(timeout)``), so the whole takes about
    ``timeout`` at most whatever hangs; one that cannot answer is printed with the reason.
    """
    out = sys.stderr if file is None else file
    handles: list[Any] = []
    for client in _driver_exit.watched():
        with contextlib.suppress(Exception):  # a client half shut down has nothing to show
            jobs, actors = client._owned_work()
            handles += [h for h in [*jobs, *actors] if not _finished(h)]
    if not handles:
        print("fray: no job or actor of this process's clients is running", file=out)
        return 0
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(handles)), thread_name_prefix="fray-stacks")
    futures = [pool.submit(h.stacks, timeout) for h in handles]
    deadline = time.monotonic() + timeout + 5
    print(f"fray: live stacks of {len(handles)} running job(s) and actor(s) (fray.testing)", file=out)
    for handle, future in zip(handles, futures, strict=True):
        try:
            text = format_stacks(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except concurrent.futures.TimeoutError:
            text = f"(no answer within {timeout:.0f} s)"
        except Exception as exc:  # the stacks of the others are still worth printing
            text = f"(could not take its stacks: {type(exc).__name__}: {exc})"
        print(f"--- {handle.job_id} ---\n{text}", file=out)
    pool.shutdown(wait=False, cancel_futures=True)
    out.flush()
    return len(handles)


def _finished(handle: Any) -> bool:
    try:
        return bool(handle.status().finished)
    except Exception:
        return False  # cannot tell: show it


# -- the pytest plugin (``pytest -p fray.testing``) --------------------------------------------------------------------

try:
    import pytest as _pytest
except ImportError:  # fray itself does not need pytest; without it this module is only the fault injection above
    _pytest = None  # type: ignore[assignment]

if _pytest is not None:

    @_pytest.hookimpl(hookwrapper=True, optionalhook=True)
    def pytest_timeout_set_timer(item: Any, settings: Any) -> Any:
        """Print the live stacks first when pytest-timeout fires, then let it fail the test as it does."""
        yield
        if settings.method == "signal":
            # pytest-timeout has just put its SIGALRM handler in place: run ours before it.
            timed_out = signal.getsignal(signal.SIGALRM)
            if callable(timed_out):
                signal.signal(signal.SIGALRM, _before(timed_out))
        elif settings.timeout and settings.timeout > 1:
            # The thread method ends the process at the timeout: print a moment before it.
            timer = threading.Timer(max(0.5, settings.timeout - 1.0), _print_for, args=(item,))
            timer.daemon = True
            timer.start()
            item.stash[_TIMER] = timer

    @_pytest.hookimpl(optionalhook=True)
    def pytest_timeout_cancel_timer(item: Any) -> None:
        """The test ended in time: drop the early printer of the thread method."""
        timer = item.stash.get(_TIMER, None)
        if timer is not None:
            timer.cancel()

    def pytest_keyboard_interrupt(excinfo: Any) -> None:
        """Ctrl-C: the stacks of what was running, before pytest prints where the test stood."""
        _print_bounded(5.0)

    _TIMER = _pytest.StashKey[threading.Timer]()


def _before(timed_out: Callable[..., Any]) -> Callable[..., Any]:
    def handler(signum: int, frame: Any) -> Any:
        _print_bounded(5.0)
        return timed_out(signum, frame)

    return handler


def _print_for(item: Any) -> None:
    print(f"\nfray: {item.nodeid} is about to time out", file=sys.stderr)
    _print_bounded(0.8)


def _print_bounded(timeout: float) -> None:
    # From another thread, with a deadline: the interrupted main thread may hold a client's lock,
    # and the test must still time out if the stacks cannot be had.
    printer = threading.Thread(target=print_live_stacks, kwargs={"timeout": timeout}, daemon=True)
    printer.start()
    printer.join(timeout + 8)
    if printer.is_alive():
        print("fray: the live stacks could not be had in time", file=sys.stderr)
