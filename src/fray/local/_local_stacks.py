"""``stacks()`` of the local backend's jobs and actors: threads of this process, or processes asked over their socket.

A callable replica runs on a thread of the caller's process, so its stack is taken here
(:func:`fray.core.inside._stacks.capture` of that thread); a replica run as processes (a binary, a
``processes_per_task`` replica, a callable that must be pickled) is asked over its stack
socket, every rank of a supervised replica separately. The job's job-context tasks come
with it: those on threads (``LocalJobContext``, registered per task by
:func:`fray.core.inside._stacks.thread_task`) and those on worker processes of a
``ProcessJobContext`` the job created.
"""

from __future__ import annotations

import os
import socket
import time

from fray.core.inside._stacks import ask_all, capture, child_pids, thread_tasks
from fray.joblevel._task_owner import live_owners
from fray.process._procjob import ReplicaProcess
from fray.stacks import ProcessStacks, ThreadStack

__all__ = ["job_stacks", "thread_stacks"]


def thread_stacks(wanted: list[tuple[str, frozenset[int], str | None]], locals: bool) -> list[ProcessStacks]:
    """One :class:`ProcessStacks` per ``(label, thread idents, task id)``, all from one look at this process."""
    if not wanted:
        return []
    every = frozenset().union(*(idents for _, idents, _ in wanted))
    by_ident: dict[int, ThreadStack] = {
        stack.ident: stack for stack in capture(locals=locals, threads=every, skip_current=False)
    }
    host, pid = socket.gethostname(), os.getpid()
    out = []
    for label, idents, task in wanted:
        threads = tuple(by_ident[ident] for ident in sorted(idents) if ident in by_ident)
        if threads:
            out.append(ProcessStacks(label, host, pid, threads, task_id=task))
        else:
            out.append(
                ProcessStacks(label, host, pid, error=f"its thread has ended (pid {pid} on host {host})", task_id=task)
            )
    return out


def job_stacks(
    job_id: str,
    replicas: int,
    threads: dict[int, int],
    processes: dict[int, ReplicaProcess],
    timeout: float,
    locals: bool,
) -> tuple[ProcessStacks, ...]:
    """The stacks of job ``job_id``'s ``replicas`` (on ``threads`` or as ``processes``, by index) and its tasks."""
    deadline = time.monotonic() + timeout
    wanted: list[tuple[str, frozenset[int], str | None]] = []
    targets: list[tuple[int, str, str | None]] = []
    for index in range(replicas):
        label = f"replica {index}"
        replica = processes.get(index)
        if replica is not None:
            pid = replica.pid
            if pid is None:
                continue  # not started yet
            ranks = child_pids(pid) if replica.processes > 1 else []
            if ranks:
                targets.extend((rank, f"{label} process {n}", None) for n, rank in enumerate(ranks))
            else:
                targets.append((pid, label, None))
        elif index in threads:
            wanted.append((label, frozenset([threads[index]]), None))
    for ident, task in thread_tasks(job_id):
        wanted.append((f"task {task}", frozenset([ident]), task))
    for owner in live_owners(job_id):
        targets.extend((pid, f"task {task}", task) for pid, task in owner.running_tasks())
    out = thread_stacks(wanted, locals)
    out.extend(ask_all(targets, timeout=max(0.001, deadline - time.monotonic()), locals=locals))
    return tuple(out)
