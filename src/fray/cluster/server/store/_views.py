"""Read models for operators (the CLI's listings, ``fray status``, the dashboard), as functions of a cursor.

Everything returned is plain data (str, int, float, bool, None, lists and dicts of
them), ready to cross the controller's data-only API or to be rendered as JSON.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from fray.cluster.protocol.records import JobRecord, TaskRecord
from fray.cluster.server.store._schema import JOB_COLS, TASK_COLS, job_from, task_from

__all__ = [
    "actor_rows",
    "behind_note",
    "find_job_ids",
    "job_counts",
    "job_dict",
    "job_rows",
    "pending_by_band",
    "task_dict",
    "task_rows",
    "where",
    "worker_rows",
]


#: The priority bands' names (``fray.PriorityBand``), as listings show them.
BAND_NAMES = {1: "production", 2: "interactive", 3: "batch"}
# The scheduler's prefix of a reason that says the job would fit an idle cluster.
_WAITING = "waiting for capacity: "


def where(*filters: tuple[str, Sequence[Any]] | None) -> tuple[str, list[Any]]:
    """``WHERE a AND b`` (or "") and its parameters, from ``(clause, parameters)`` pairs; None pairs are left out."""
    kept = [f for f in filters if f is not None]
    clause = f"WHERE {' AND '.join(c for c, _ in kept)}" if kept else ""
    return clause, [p for _, params in kept for p in params]


def pending_by_band(cur: sqlite3.Cursor) -> dict[int, int]:
    """How many jobs of each band are pending (one indexed count): what a worse band's jobs wait behind."""
    rows = cur.execute("SELECT band, COUNT(*) FROM jobs WHERE state = 'pending' GROUP BY band").fetchall()
    return {int(band): int(count) for band, count in rows}


def behind_note(job: JobRecord, waiting: Mapping[int, int]) -> str:
    """``waits behind N job(s) of band production`` for a pending job of a worse band waiting for capacity."""
    if job.state.value != "pending" or not job.pending_reason.startswith(_WAITING):
        return ""
    parts = [
        f"{waiting[b]} job(s) of band {BAND_NAMES[b]}" for b in sorted(BAND_NAMES) if b < job.band and waiting.get(b)
    ]
    return f"; waits behind {' and '.join(parts)}" if parts else ""


def job_dict(job: JobRecord, label: str, now: float, waiting: Mapping[int, int] | None = None) -> dict[str, Any]:
    """One job as plain data (``command`` is filled in by the caller, who can read the job's spec).

    ``duration`` is the seconds it ran: from its (last) start to its end, or to ``now`` while it runs.
    ``waiting`` (:func:`pending_by_band`), when given, lets a pending job's reason name the better-band
    jobs it waits behind: a pass places every job of a better band before it.
    """
    end = job.finished_at if job.finished_at is not None else now
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state.value,
        "attempt": job.attempt,
        "user": job.user,
        "namespace": job.namespace,
        "parent_id": job.parent_id,
        "actor": label,
        "replicas": job.replicas,
        "cpu": job.resources.cpu_millis / 1000,
        "ram_bytes": job.resources.ram_bytes,
        "device": f"{job.resources.device_kind}:{job.resources.device_type}:{job.resources.device_count}"
        if job.resources.device_kind != "cpu"
        else "",
        "band": job.band,
        "band_name": BAND_NAMES.get(job.band, str(job.band)),
        "pending_reason": job.pending_reason + behind_note(job, waiting or {}),
        "error": job.error,
        "failures": job.failure_count,
        "preemptions": job.preemption_count,
        "max_retries_failure": job.max_retries_failure,
        "max_retries_preemption": job.max_retries_preemption,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration": None if job.started_at is None else max(0.0, end - job.started_at),
        "command": "",
    }


def job_rows(
    cur: sqlite3.Cursor,
    *,
    states: Sequence[str] | None = None,
    limit: int = 50,
    namespace: str | None = None,
    name: str | None = None,
    user: str | None = None,
) -> list[tuple[JobRecord, str]]:
    """Jobs newest first (at most ``limit``; 0 for all), optionally filtered; each with its actor label."""
    clause, params = where(
        (f"state IN ({', '.join('?' * len(states))})", states) if states else None,
        ("namespace = ?", (namespace,)) if namespace is not None else None,
        ("name = ?", (name,)) if name is not None else None,
        ("user_name = ?", (user,)) if user is not None else None,
    )
    tail = " LIMIT ?" if limit > 0 else ""
    if limit > 0:
        params.append(limit)
    rows = cur.execute(f"SELECT {JOB_COLS}, label FROM jobs {clause} ORDER BY seq DESC{tail}", params).fetchall()
    return [(job_from(row[:-1]), str(row[-1])) for row in rows]


def find_job_ids(cur: sqlite3.Cursor, ref: str, limit: int = 20, *, user: str | None = None) -> list[str]:
    """Ids of the jobs ``ref`` names: the job whose id it is, else the jobs of that name (newest first).

    With ``user``, only that user's jobs count.
    """
    mine, params = ("", ()) if user is None else (" AND user_name = ?", (user,))
    if cur.execute(f"SELECT 1 FROM jobs WHERE id = ?{mine}", (ref, *params)).fetchone() is not None:
        return [ref]
    rows = cur.execute(
        f"SELECT id FROM jobs WHERE name = ?{mine} ORDER BY seq DESC LIMIT ?", (ref, *params, limit)
    ).fetchall()
    return [str(row[0]) for row in rows]


def task_rows(cur: sqlite3.Cursor, job_id: str) -> list[TaskRecord]:
    """Every task of every attempt of ``job_id``, by attempt then task index."""
    rows = cur.execute(f"SELECT {TASK_COLS} FROM tasks WHERE job_id = ? ORDER BY attempt, task_index", (job_id,))
    return [task_from(row) for row in rows.fetchall()]


def task_dict(task: TaskRecord) -> dict[str, Any]:
    """One task attempt as plain data."""
    return {
        "task": task.task_index,
        "attempt": task.attempt,
        "replica": task.replica_index,
        "host": task.host_index,
        "state": task.state.value,
        "worker": task.worker_id,
        "exit_code": task.exit_code,
        "error": task.error,
        "created_at": task.created_at,
        "assigned_at": task.assigned_at,
        "started_at": task.started_at,
        "finished_at": task.finished_at,
    }


def job_counts(cur: sqlite3.Cursor, user: str | None = None) -> dict[str, int]:
    """How many stored jobs (of ``user``, if given) are in each state."""
    counts = {state: 0 for state in ("pending", "running", "succeeded", "failed", "stopped")}
    mine, params = ("", ()) if user is None else (" WHERE user_name = ?", (user,))
    for state, count in cur.execute(f"SELECT state, COUNT(*) FROM jobs{mine} GROUP BY state", params):
        counts[str(state)] = int(count)
    return counts


def worker_rows(cur: sqlite3.Cursor, now: float) -> list[dict[str, Any]]:
    """Every worker with what it offers, what its assigned and running tasks use, and what is free."""
    used: dict[str, dict[str, int]] = {}
    for worker_id, cpu, ram, count, tasks in cur.execute(
        "SELECT t.worker_id, SUM(j.cpu_millis), SUM(j.ram_bytes), SUM(j.device_count), COUNT(*) "
        "FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.state IN ('assigned', 'running') GROUP BY t.worker_id"
    ):
        used[str(worker_id)] = {"cpu": int(cpu), "ram": int(ram), "devices": int(count), "tasks": int(tasks)}
    rows = []
    for wid, address, cpu, ram, disk, devices, attributes, state, registered, heartbeat in cur.execute(
        "SELECT id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, registered_at, "
        "last_heartbeat FROM workers ORDER BY id"
    ):
        mine = used.get(str(wid), {"cpu": 0, "ram": 0, "devices": 0, "tasks": 0})
        device_list = [f"{d[0]}:{d[1]}:{d[2]}" for d in json.loads(str(devices))]
        device_total = sum(int(d[2]) for d in json.loads(str(devices)))
        rows.append(
            {
                "worker_id": str(wid),
                "address": str(address),
                "state": str(state),
                "cpu_total": int(cpu) / 1000,
                "cpu_used": mine["cpu"] / 1000,
                "cpu_free": max(0, int(cpu) - mine["cpu"]) / 1000,
                "ram_total": int(ram),
                "ram_used": mine["ram"],
                "ram_free": max(0, int(ram) - mine["ram"]),
                "disk_total": int(disk),
                "devices": device_list,
                "devices_total": device_total,
                "devices_used": mine["devices"],
                "devices_free": max(0, device_total - mine["devices"]),
                "tasks": mine["tasks"],
                "attributes": json.loads(str(attributes)),
                "registered_at": float(registered),
                "seconds_since_heartbeat": max(0.0, now - float(heartbeat)),
            }
        )
    return rows


def actor_rows(cur: sqlite3.Cursor, user: str | None = None) -> list[dict[str, Any]]:
    """Live actors (jobs hosting a named actor; of ``user``, if given) with the endpoints their tasks serve."""
    endpoints: dict[str, list[dict[str, Any]]] = {}
    for namespace, name, job_id, address in cur.execute(
        "SELECT namespace, name, job_id, address FROM endpoints ORDER BY namespace, name"
    ):
        endpoints.setdefault(str(job_id), []).append({"namespace": namespace, "name": name, "address": address})
    rows = []
    mine, params = ("", ()) if user is None else (" AND user_name = ?", (user,))
    for job_id, label, namespace, state, owner, submitted in cur.execute(
        "SELECT id, label, namespace, state, user_name, submitted_at FROM jobs "
        f"WHERE label != '' AND state IN ('pending', 'running'){mine} ORDER BY namespace, label",
        params,
    ):
        rows.append(
            {
                "name": str(label),
                "namespace": str(namespace),
                "job_id": str(job_id),
                "state": str(state),
                "user": str(owner),
                "submitted_at": float(submitted),
                "endpoints": endpoints.get(str(job_id), []),
            }
        )
    return rows
