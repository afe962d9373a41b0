"""A Fray cluster's jobs as a Chrome trace (``fray timeline``, ``ClusterClient.timeline``).

:func:`chrome_trace` turns the store's job and task records -- the same rows the dashboard's
job page draws (:mod:`fray.cluster.server.dashboard.timeline`) -- into the Chrome trace event
format that Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open::

    {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}

* one *process* per worker (``process_name`` metadata; tasks never placed are under
  ``not placed``), one *thread* (track) per replica of each job on it;
* a complete event (``"ph": "X"``) for each attempt's wait to be placed (``cat`` ``pending``:
  from the attempt's creation to its placement) and for its run (``cat`` ``running``: from its
  placement on a worker -- its environment's setup included -- to its end, or to now while it
  runs), named after the job, with ``args`` ``job_id``,
  ``attempt``, ``replica``, ``outcome`` (the task's state: ``succeeded``, ``failed``, ``lost``,
  ``killed``, ``running``, ...), and the exit code and error where there is one;
* instant events (``"ph": "i"``): ``lost`` where a task's host went away (a preemption, a
  lost or drained worker), ``retry`` where a job's next attempt was made after a failed or lost
  one, ``actor restart`` where that job is an actor's.

Times are microseconds since the trace's first event (``otherData.start_unix`` is that
moment in Unix seconds). Nothing is recorded for the trace: it is read from what the store
keeps anyway, so it is always on, and bounded as the store is (finished jobs are pruned after
the retention policy, 7 days and 10,000 jobs by default: :mod:`fray.cluster.server._retention`;
each task keeps one row per attempt). Tasks of a job context (``create_task``) run inside
their executor jobs and are not stored one by one, so they show as their executors' spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fray.cluster.protocol.records import JobRecord, TaskRecord, TaskState

__all__ = ["NOT_PLACED", "TraceJob", "chrome_trace"]

#: The process that holds the tasks no worker was given (still pending, or stopped before placement).
NOT_PLACED = "not placed"


@dataclass(frozen=True)
class TraceJob:
    """One job as the trace needs it: its record, its actor label ("" for a plain job), every attempt's tasks."""

    job: JobRecord
    label: str
    tasks: tuple[TaskRecord, ...]


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def chrome_trace(jobs: Sequence[TraceJob], now: float) -> dict[str, Any]:
    """The Chrome trace of ``jobs`` (see the module); spans still open end at ``now`` (Unix seconds)."""
    times = [t.created_at for entry in jobs for t in entry.tasks] + [entry.job.submitted_at for entry in jobs]
    start = min(times) if times else now

    def ts(at: float) -> float:
        return round((at - start) * 1e6, 1)

    pids: dict[str, int] = {}
    tids: dict[tuple[int, str, int], int] = {}
    events: list[dict[str, Any]] = []

    def pid_of(worker: str) -> int:
        if worker not in pids:
            pids[worker] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[worker], "args": {"name": worker}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pids[worker], "args": {"sort_index": 0}})
        return pids[worker]

    def tid_of(pid: int, job: JobRecord, replica: int, label: str) -> int:
        key = (pid, job.job_id, replica)
        if key not in tids:
            tids[key] = len(tids) + 1
            what = f"actor {label}" if label else job.name
            name = f"{what} [{job.job_id}] replica {replica}" if job.task_count > 1 else f"{what} [{job.job_id}]"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[key], "args": {"name": name}})
        return tids[key]

    for entry in sorted(jobs, key=lambda e: e.job.submitted_at):
        job = entry.job
        first_of_attempt: dict[int, float] = {}
        for task in entry.tasks:
            first_of_attempt[task.attempt] = min(first_of_attempt.get(task.attempt, task.created_at), task.created_at)
        for task in entry.tasks:
            pid = pid_of(task.worker_id or NOT_PLACED)
            tid = tid_of(pid, job, task.task_index, entry.label)
            args: dict[str, Any] = {
                "job_id": job.job_id,
                "attempt": task.attempt,
                "replica": task.replica_index,
                "outcome": task.state.value,
            }
            if task.exit_code is not None:
                args["exit_code"] = task.exit_code
            if task.error:
                args["error"] = task.error
            placed = task.assigned_at if task.assigned_at is not None else task.started_at
            waited_until = placed if placed is not None else (task.finished_at or now)
            events.append({
                "ph": "X", "name": job.name, "cat": "pending", "pid": pid, "tid": tid, "ts": ts(task.created_at),
                "dur": round(max(0.0, ts(waited_until) - ts(task.created_at)), 1), "args": {**args, "outcome": "placed" if placed else task.state.value},
            })  # fmt: skip
            # From its placement: a worker reports a short task's start with its end, so the start the
            # store records can be as late as the end; setting up its environment is part of its run.
            ran_from = placed
            if ran_from is not None:
                until = task.finished_at if task.finished_at is not None else now
                events.append({
                    "ph": "X", "name": job.name, "cat": "running", "pid": pid, "tid": tid, "ts": ts(ran_from),
                    "dur": round(max(0.0, ts(until) - ts(ran_from)), 1), "args": args,
                })  # fmt: skip
            if task.state == TaskState.LOST and task.finished_at is not None:
                events.append({
                    "ph": "i", "s": "t", "name": "lost", "cat": "preemption", "pid": pid, "tid": tid,
                    "ts": ts(task.finished_at), "args": {**args, "reason": _first_line(task.error)},
                })  # fmt: skip
        for attempt, made in sorted(first_of_attempt.items()):
            if attempt == 0:
                continue
            # On the track of the attempt's first task: where the retry shows beside what it replaced.
            first = min((t for t in entry.tasks if t.attempt == attempt), key=lambda t: t.task_index)
            pid = pid_of(first.worker_id or NOT_PLACED)
            what = "actor restart" if entry.label else "retry"
            events.append({
                "ph": "i", "s": "p", "name": what, "cat": "retry", "pid": pid,
                "tid": tid_of(pid, job, first.task_index, entry.label), "ts": ts(made),
                "args": {"job_id": job.job_id, "attempt": attempt, "name": job.name},
            })  # fmt: skip
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "fray timeline", "start_unix": start, "jobs": len(jobs)},
    }
