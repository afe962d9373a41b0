"""Live stacks on Monarch (``JobHandle.stacks()``, ``ActorHandle.stacks()``): every process is on this host.

The Monarch backend runs on one host (``docs/monarch.md``): job replicas are child processes
of the client (``fray.process._jobmain``), actors are :class:`~fray.monarch.host.FrayHost`
processes of Monarch meshes, and the tasks of a job's context run in a pool of such
processes that the job's own client spawned. Each of them serves its stacks on a Unix socket
(:mod:`fray.core.inside._stacks`), so the asker needs only their pids:

* an actor's pid comes with its first ``ready`` answer (its record keeps it; a handle from
  another process asks the actor's ``ready`` endpoint, which Monarch answers on the actor's
  message loop while its calls run on their own threads);
* a replica's pid is its child process's;
* a job-context task's process is found among the replica's descendants: every process there
  that serves stacks is asked, and those that say they run a task (``running_task`` in
  ``fray.monarch.context.TaskRunner``) are reported with that task's id.

Nothing goes through Monarch's messaging for a dead or stuck process: a process that has
ended, or does not answer within the timeout, is reported with ``error`` set.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from fray.core.inside._stacks import ask, ask_all, child_pids, socket_path
from fray.stacks import ProcessStacks

__all__ = ["actor_stacks", "job_stacks"]

#: How deep below a replica its job-context tasks' processes are looked for, and how many at most.
_DEPTH = 4
_MAX_DESCENDANTS = 256


def actor_stacks(label: str, pid: int | None, dead: str | None, timeout: float, locals: bool) -> ProcessStacks:
    """The stacks of the actor process ``pid``; ``dead`` (why it is gone) or an unknown pid are reported as errors."""
    if dead is not None:
        return ProcessStacks(label, "", pid, error=dead)
    if pid is None:
        return ProcessStacks(label, "", None, error=f"{label} has not started yet (its process did not answer ready)")
    return ask(pid, label=label, timeout=timeout, locals=locals)


def job_stacks(replicas: Sequence[tuple[int | None, int]], timeout: float, locals: bool) -> tuple[ProcessStacks, ...]:
    """Each replica (``(pid or None if not started, processes per task)``, in order), then each job-context task.

    A replica of several processes per task is its ranks (the supervisor's children, which run the
    code), one answer each. One round of asking, side by side, for replicas and every candidate task
    process, so a process that hangs costs ``timeout`` once.
    """
    slots: list[ProcessStacks | int] = []  # an answer known already, or the index of a target to ask
    targets: list[tuple[int, str, str | None]] = []
    for index, (pid, processes) in enumerate(replicas):
        label = f"replica {index}"
        if pid is None:
            slots.append(ProcessStacks(label, "", None, error=f"{label} has not started yet"))
            continue
        ranks = child_pids(pid) if processes > 1 else []
        named = [(rank, f"{label} process {n}") for n, rank in enumerate(ranks)] if ranks else [(pid, label)]
        for process, name in named:
            slots.append(len(targets))
            targets.append((process, name, None))
    asked = len(targets)
    roots = [pid for pid, _ in replicas if pid is not None]
    known = {target[0] for target in targets}  # a replica's ranks are its descendants too
    targets.extend((pid, f"process {pid}", None) for pid in _serving_descendants(roots) if pid not in known)
    answers = ask_all(targets, timeout=timeout, locals=locals) if targets else ()
    tasks = [
        ProcessStacks(f"task {answer.task_id}", answer.host, answer.pid, answer.threads, task_id=answer.task_id)
        for answer in answers[asked:]
        if answer.task_id is not None and answer.error is None
    ]
    ordered = [answers[slot] if isinstance(slot, int) else slot for slot in slots]
    return (*ordered, *sorted(tasks, key=lambda task: task.label))


def _serving_descendants(roots: Sequence[int]) -> list[int]:
    """The processes below ``roots`` (a few levels deep) that serve stacks: those that may run Fray tasks."""
    found: list[int] = []
    seen = set(roots)
    level = list(roots)
    for _ in range(_DEPTH):
        below = [child for pid in level for child in child_pids(pid) if child not in seen]
        seen.update(below)
        found.extend(pid for pid in below if os.path.exists(socket_path(pid)))
        if not below or len(seen) > _MAX_DESCENDANTS:
            break
        level = below
    return found
