"""Fault injection for tests of code that uses Fray: make the failures a cluster has, on purpose.

* :func:`kill_actor` kills an actor's process the way a crash would (the local backend,
  whose actors share the script's process, simulates it by killing the actor's threads);
* :func:`preempt` ends a job's replica (or all of them) the way a preempted host would,
  so the job is retried within ``max_retries_preemption``, not its failure budget;
* :func:`kill_worker` SIGKILLs a worker of a Fray cluster (``fray://``), as a lost host.

Each works on every backend where it has a meaning and raises
:class:`~fray.errors.ConfigError`, naming the backend, where it has none. What each
backend supports is in ``docs/testing.md``.
"""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

from fray.actor import ActorHandleBase
from fray.errors import ConfigError, NotFound
from fray.job import JobHandleBase, replicas_to_preempt

__all__ = ["kill_actor", "kill_worker", "preempt", "replicas_to_preempt"]


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
