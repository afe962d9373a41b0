"""The controller's part of ``stacks()`` on a Fray cluster: ask the workers, wait for their answers, never hang.

A client asks the controller for a job's live stacks (``job_stacks``). The controller finds the
job's running tasks and those of its running descendants (a job context's executors are child
jobs), sends each worker that holds some a :class:`~fray.cluster.protocol.messages.StacksAsk` in
its outbox (workers pull: the ask wakes the worker's long poll), and waits -- holding none of
the service's locks -- until every worker answered (``stacks_answer``) or the timeout passed.
A worker that did not answer in time, or is no longer alive, becomes one
:class:`~fray.stacks.ProcessStacks` per task it holds, with ``error`` saying so. Each worker
asks its task processes itself (:func:`fray.core.inside._stacks.ask`): the controller never connects
to a task, and never sees anything but JSON-shaped data.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from fray.cluster.protocol.messages import StacksAsk
from fray.cluster.protocol.records import TaskKey, TaskState
from fray.cluster.server.store import ClusterStore
from fray.errors import ProtocolError
from fray.job import JobStatus
from fray.stacks import ProcessStacks

__all__ = ["MAX_STACKS_TIMEOUT", "StacksRelay"]

#: The longest ``timeout`` a stacks request may ask for (seconds).
MAX_STACKS_TIMEOUT = 60.0
# What the relay adds to a request's timeout for the round trips around the worker's own asks.
_RELAY_SLACK = 2.0
# Descendant jobs deeper than this are not visited (a job tree is shallow; a loop must not run away).
_MAX_DEPTH = 8


class _Request:
    def __init__(self, workers: set[str]) -> None:
        self.waiting = set(workers)
        self.answers: dict[str, list[ProcessStacks]] = {}


class StacksRelay:
    """Relays stacks requests to workers and their answers back (see the module docstring).

    ``send(asks)`` queues each worker's :class:`StacksAsk` (with the service's lock held, by the
    caller's function) and returns the workers that are not alive.
    """

    def __init__(self, store: ClusterStore, send: Callable[[dict[str, StacksAsk]], list[str]]) -> None:
        self._store = store
        self._send = send
        self._cond = threading.Condition()  # its own lock: never the service's
        self._ids = itertools.count(1)
        self._open: dict[int, _Request] = {}

    def job_stacks(self, job_id: str, timeout: float, locals: bool) -> list[ProcessStacks]:
        """The live stacks of job ``job_id``'s running tasks and its running descendants' (see the module docstring)."""
        timeout = min(max(float(timeout), 0.1), MAX_STACKS_TIMEOUT)
        targets = self._targets(job_id)
        if not targets:
            return []
        by_worker: dict[str, list[tuple[TaskKey, str]]] = {}
        for worker_id, key, label in targets:
            by_worker.setdefault(worker_id, []).append((key, label))
        request_id = next(self._ids)
        with self._cond:
            self._open[request_id] = request = _Request(set(by_worker))
        try:
            asks = {w: StacksAsk(request_id, tuple(tasks), timeout, locals) for w, tasks in by_worker.items()}
            gone = set(self._send(asks))
            deadline = time.monotonic() + timeout + _RELAY_SLACK
            with self._cond:
                request.waiting -= gone
                while request.waiting:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                answers = dict(request.answers)
        finally:
            with self._cond:
                self._open.pop(request_id, None)
        out: list[ProcessStacks] = []
        for worker_id, tasks in by_worker.items():
            answer = answers.get(worker_id)
            if answer is not None:
                out.extend(_relabel(process, job_id) for process in answer)
                continue
            host = self._host(worker_id)
            why = "is not alive" if worker_id in gone else f"did not answer within {timeout:g} s"
            out.extend(
                ProcessStacks(label, host, None, error=f"worker {worker_id} (host {host}) {why}") for _, label in tasks
            )
        return out

    def answer(self, worker_id: str, request_id: int, stacks: list[Any]) -> bool:
        """Worker ``worker_id``'s answer to ``request_id`` (JSON of :class:`ProcessStacks`); False if nobody waits."""
        try:
            parsed = [ProcessStacks.from_json(process) for process in stacks]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"stacks_answer: malformed stacks from worker {worker_id!r}: {exc}") from None
        with self._cond:
            request = self._open.get(request_id)
            if request is None or worker_id not in request.waiting:
                return False
            request.waiting.discard(worker_id)
            request.answers[worker_id] = parsed
            self._cond.notify_all()
        return True

    def _targets(self, job_id: str) -> list[tuple[str, TaskKey, str]]:
        """``(worker, task, label)`` of every running task of the job and of its running descendants."""
        out: list[tuple[str, TaskKey, str]] = []
        level = [(job_id, 0)]
        while level:
            current, depth = level.pop()
            for task in self._store.get_tasks(current):
                if task.state == TaskState.RUNNING and task.worker_id is not None:
                    label = f"replica {task.replica_index}"
                    if current != job_id:
                        label = f"job {current.removeprefix(job_id + '/')} {label}"
                    out.append((task.worker_id, task.key, label))
            if depth < _MAX_DEPTH:
                children = self._store.list_jobs(states=[JobStatus.RUNNING], parent_id=current)
                level.extend((child.job_id, depth + 1) for child in children)
        return out

    def _host(self, worker_id: str) -> str:
        try:
            address = self._store.get_worker(worker_id).address
        except Exception:  # a worker the store forgot: its id is all there is to say
            return "unknown"
        return address.rpartition(":")[0] or address


def _relabel(process: ProcessStacks, job_id: str) -> ProcessStacks:
    # An executor of a job context (a descendant job) running a task says which: name it by its task.
    if process.task_id and not process.label.startswith("task "):
        return dataclasses.replace(process, label=f"task {process.task_id}")
    return process
