"""What a :class:`~fray.joblevel._task_owner.TaskOwner` sends its workers: a task to run, the reply to a get or wait.

Both carry object bytes only to a worker that does not hold them yet, and record that it
does from then on (workers cache every object they were sent until the owner frees it).
Called with the owner's lock held; the owner sends the ``(header, blobs)`` built here.
"""

from __future__ import annotations

from typing import Any

from fray.joblevel._task_records import PENDING, ObjectRecord, Request, TaskRecord, WorkerRecord
from fray.joblevel._taskwire import ONCE

__all__ = ["reply_message", "run_message"]

Message = tuple[tuple[Any, ...], list[bytes]]


def run_message(
    worker: WorkerRecord, task: TaskRecord, objects: dict[str, ObjectRecord], functions: dict[str, bytes]
) -> Message:
    """The ``run`` message of ``task`` for ``worker``: with the function and argument objects it lacks."""
    blobs: list[bytes] = []
    with_fn = task.fn_key not in worker.fn_keys
    if with_fn:
        blobs.append(task.fn_blob if task.fn_blob is not None else functions[task.fn_key])
        if not task.fn_key.startswith(ONCE):
            worker.fn_keys.add(task.fn_key)
    blobs.append(task.args_blob)
    sent = []
    for dep_id in task.deps:
        if dep_id not in worker.cached:
            obj = objects[dep_id]
            sent.append((dep_id, obj.kind, len(obj.frames)))
            blobs.extend(obj.frames)
            worker.cached.add(dep_id)
            obj.holders.add(worker.wid)
    return ("run", task.task_id, task.name, task.fn_key, with_fn, sent), blobs


def reply_message(request: Request, objects: dict[str, ObjectRecord], *, timed_out: bool = False) -> Message:
    """The reply to a worker's wait (the refs ready), its get (the values), or that it timed out."""
    worker = request.worker
    blobs: list[bytes] = []
    if request.num_returns is not None:
        ready = [i for i in request.ids if (o := objects.get(i)) is None or o.kind is not PENDING]
        header: tuple[Any, ...] = ("reply", request.rid, "ready", ready)
    elif timed_out:
        header = ("reply", request.rid, "timeout", request.count)
    else:
        entries = []
        for ref_id in request.ids:
            obj = objects.get(ref_id)
            if obj is None:
                entries.append((ref_id, "gone", 1))
                blobs.append(f"object {ref_id!r} is gone: its owner freed it".encode())
                continue
            entries.append((ref_id, obj.kind or "lost", len(obj.frames)))
            blobs.extend(obj.frames)
            obj.holders.add(worker.wid)
            worker.cached.add(ref_id)
        header = ("reply", request.rid, "values", entries)
    return header, blobs
