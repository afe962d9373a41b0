"""A worker's part of ``stacks()``: ask its task processes for their stacks, answer the controller.

The controller's :class:`~fray.cluster.protocol.messages.StacksAsk` names tasks running on
this worker; the worker asks each task's process over its stack socket
(:func:`fray.core.inside._stacks.ask`, on this host), side by side, within the ask's timeout, and
sends the answers back with ``stacks_answer``. A replica of several processes
(``processes_per_task``) is supervised by a process that runs no user code: its ranks (its
children with a stack socket) are asked instead. This runs on a thread of its own, so the
command loop goes on polling meanwhile.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from fray.cluster.protocol.messages import StacksAsk
from fray.cluster.protocol.records import TaskKey
from fray.core.inside._stacks import ask_all, child_pids, socket_path
from fray.stacks import ProcessStacks

__all__ = ["answer_stacks_soon"]

logger = logging.getLogger(__name__)


def answer_stacks_soon(
    ask: StacksAsk, pid_of: Callable[[TaskKey], int | None], send: Callable[[int, list[ProcessStacks]], object]
) -> None:
    """Answer ``ask`` from a new thread: ``pid_of(task)`` is its process (None: not running), ``send`` answers."""
    threading.Thread(target=_answer, args=(ask, pid_of, send), name="fray-worker-stacks", daemon=True).start()


def _answer(
    ask: StacksAsk, pid_of: Callable[[TaskKey], int | None], send: Callable[[int, list[ProcessStacks]], object]
) -> None:
    host = socket.gethostname()
    targets: list[tuple[int, str, str | None]] = []
    ended: list[ProcessStacks] = []
    for key, label in ask.tasks:
        pid = pid_of(key)
        if pid is None:
            ended.append(ProcessStacks(label, host, None, error=f"the task's process has ended (host {host})"))
            continue
        targets.extend(_processes(pid, label))
    answers = list(ask_all(targets, timeout=ask.timeout, locals=ask.locals, host=host)) + ended
    try:
        send(ask.request_id, answers)
    except Exception as exc:  # the controller went away meanwhile: nobody waits for this answer any more
        logger.warning("could not answer stacks request %d: %s", ask.request_id, exc)


def _processes(pid: int, label: str) -> list[tuple[int, str, str | None]]:
    """The processes to ask for task process ``pid``: itself, or the ranks it supervises."""
    if os.path.exists(socket_path(pid)):
        return [(pid, label, None)]
    ranks = [child for child in child_pids(pid) if os.path.exists(socket_path(child))]
    if ranks:
        return [(rank, f"{label} process {n}", None) for n, rank in enumerate(ranks)]
    return [(pid, label, None)]  # asked anyway: the answer says why it has no stacks
