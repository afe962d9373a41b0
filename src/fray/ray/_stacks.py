"""Live stacks on Ray (``JobHandle.stacks()``, ``ActorHandle.stacks()``): who asks whom, on which node.

Every Ray worker process that runs Fray's code for a job replica, a job-context task or an
actor starts the per-process stack server of :mod:`fray.core.inside._stacks` (a Unix socket: it
answers only on its own host). The caller may be on another node, so:

* **job replicas and job-context tasks** leave their pid and Ray node id in Ray's key-value
  store once they have run for a moment (the key a replica already writes to say it started,
  ``fray.ray.inside._worker``; a task's own key under the job's id). :func:`ask_on_nodes`
  then runs one tiny Ray task per node (``num_cpus=0``, pinned to the node with
  ``NodeAffinitySchedulingStrategy(soft=False)``) that asks those pids on their host
  (:func:`relay`). This works however busy the replica is: the relay is a process of its
  own, and the stack server is a thread of the replica that needs no free Ray slot.
* **actors** answer through a method of their control concurrency group
  (``fray.ray.inside._actor_host``), which runs beside the user's calls whatever
  ``max_concurrency`` they use: no relay, no pid to look up.

No ptrace, no py-spy: the stacks are taken inside each process by Python itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Sequence
from typing import Any

from fray.stacks import ProcessStacks

__all__ = ["RELAY_SLACK", "Target", "ask_on_nodes", "job_stacks", "relay", "task_key", "task_prefix"]

#: Seconds of the caller's timeout kept for the relay's own start and reply: the processes
#: themselves are given the rest, so a silent one is reported before the caller gives up.
RELAY_SLACK = 1.0

#: What to ask: (label, Ray node id, pid, task id or None).
Target = tuple[str, str, int, str | None]


def task_prefix(job_id: str) -> bytes:
    """The key-value store prefix under which the running job-context tasks of job ``job_id`` say where they run."""
    return f"stacks-task/{job_id}/".encode()


def task_key(job_id: str, task_id: str) -> bytes:
    """The key of one running job-context task of job ``job_id`` (its value: ``"pid node"``)."""
    return task_prefix(job_id) + task_id.encode()


def relay(targets: list[tuple[int, str, str | None]], locals: bool, timeout: float) -> list[dict[str, Any]]:
    """The body of the Ray task that asks processes of its own node (pid, label, task id) for their stacks.

    Returns JSON (:meth:`ProcessStacks.to_json`), never pickled objects of its own making: what
    comes back is data.
    """
    from fray.core.inside._stacks import ask_all

    return [answer.to_json() for answer in ask_all(targets, timeout=timeout, locals=locals)]


def job_stacks(
    job_id: str, replica_keys: Sequence[bytes], ended: Collection[int], timeout: float, locals: bool
) -> tuple[ProcessStacks, ...]:
    """Every replica of a job's running attempt (by its started key, in order), then its running tasks.

    A replica that has ended (its index in ``ended``), or has not said where it runs yet (it waits
    for resources, or started less than ``fray.ray.inside._worker.STARTED_AFTER`` seconds ago), is
    reported with ``error`` set.
    """
    from ray.experimental import internal_kv

    from fray.ray.inside._worker import KV_NAMESPACE

    slots: list[ProcessStacks | int] = []  # an answer already known, or the index of a target to ask
    targets: list[Target] = []
    for index, key in enumerate(replica_keys):
        where = None if index in ended else internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if not where:
            why = (
                "it has ended"
                if index in ended
                else "it has not started yet (it waits for resources, or has run for less than a moment)"
            )
            slots.append(ProcessStacks(f"replica {index}", "", None, error=f"replica {index}: {why}"))
            continue
        slots.append(len(targets))
        pid, node = where.decode().split()
        targets.append((f"replica {index}", node, int(pid), None))
    prefix = task_prefix(job_id)
    for key in sorted(internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE)):
        where = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if where:  # else the task ended in between
            pid, node = where.decode().split()
            task = key[len(prefix) :].decode()
            slots.append(len(targets))
            targets.append((f"task {task}", node, int(pid), task))
    answers = ask_on_nodes(targets, timeout, locals) if targets else []
    return tuple(answers[slot] if isinstance(slot, int) else slot for slot in slots)


def ask_on_nodes(targets: Sequence[Target], timeout: float, locals: bool) -> list[ProcessStacks]:
    """Ask every target on its own node through one relay task per node; answers in the order of ``targets``.

    Within ``timeout`` seconds in all: a node whose relay did not answer (lost, or Ray could not
    start a worker there in time) has each of its processes reported with ``error`` set.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import ray

    deadline = time.monotonic() + timeout
    by_node: dict[str, list[int]] = {}
    for index, (_, node, _, _) in enumerate(targets):
        by_node.setdefault(node, []).append(index)
    remote = _relay_task()
    ask_timeout = max(timeout - RELAY_SLACK, timeout / 2)
    refs: dict[str, Any] = {}
    for node, indexes in by_node.items():
        asks = [(targets[i][2], targets[i][0], targets[i][3]) for i in indexes]
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        refs[node] = remote.options(scheduling_strategy=strategy, name="fray-stacks-relay").remote(
            asks, locals, ask_timeout
        )
    answers: list[ProcessStacks | None] = [None] * len(targets)
    for node, ref in refs.items():
        indexes = by_node[node]
        try:
            replies = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            with contextlib.suppress(Exception):  # a relay that never started must not start later
                ray.cancel(ref, force=True)
            why = f"the relay on Ray node {node[:12]} did not answer within {timeout:g} s"
        except Exception as exc:  # the node is gone, or Ray could not place the relay there
            why = f"the relay on Ray node {node[:12]} failed: {type(exc).__name__}: {_first_line(exc)}"
        else:
            for i, reply in zip(indexes, replies, strict=True):
                answers[i] = ProcessStacks.from_json(reply)
            continue
        host = _host_of(node)
        for i in indexes:
            label, _, pid, task = targets[i]
            answers[i] = ProcessStacks(label, host, pid, error=f"{why} (pid {pid})", task_id=task)
    return [answer for answer in answers if answer is not None]


_relay_remote: Any = None


def _relay_task() -> Any:
    """The relay as a Ray remote function, made once per process (Ray exports a function once)."""
    global _relay_remote
    if _relay_remote is None:
        import ray

        _relay_remote = ray.remote(num_cpus=0, max_retries=0)(relay)
    return _relay_remote


def _host_of(node: str) -> str:
    """Ray node ``node``'s host name, for a message (its id where Ray no longer knows it)."""
    import ray

    try:
        for info in ray.nodes():
            if info.get("NodeID") == node:
                return str(info.get("NodeManagerHostname") or info.get("NodeManagerAddress") or node)
    except Exception:
        pass
    return f"Ray node {node[:12]}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
