"""The jobs' rows of the cluster store: a new job, reads that are not the scheduler's, and stale reports.

:class:`~fray.cluster.server.store.ClusterStore` calls these functions of a cursor inside its own
transactions (and holds its lock around the reads); keeping them here leaves the store
itself to the lifecycle of jobs, tasks and workers.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterable, Sequence

from fray.cluster.protocol.capacity import TaskResources
from fray.cluster.protocol.records import JobRecord, TaskKey, TaskRecord
from fray.cluster.server.store import _tables
from fray.cluster.server.store._change import Change
from fray.cluster.server.store._schema import JOB_COLS, RES_COLS, job_from, read_job, read_task, resources_params
from fray.errors import NotFound, StoreError
from fray.job import JobStatus, validate_name

__all__ = [
    "current_task",
    "job_failure",
    "job_request",
    "job_states",
    "list_jobs",
    "live_job_with_label",
    "namespace_owner",
    "submit_job",
    "timed_out",
]


def submit_job(
    change: Change,
    *,
    name: str,
    user: str,
    request: bytes,
    resources: TaskResources,
    replicas: int,
    max_retries_failure: int,
    max_retries_preemption: int,
    parent_id: str | None,
    namespace: str | None,
    label: str,
    initial_credit: float,
    timeout: float | None = None,
    band: int = 2,
) -> JobRecord:
    """Check and record a new PENDING job under a fresh id, with its first attempt's tasks.

    See ``ClusterStore.submit_job``; the caller's ``change`` holds the transaction.
    """
    cur, now = change.cur, change.now
    validate_name(name)
    if not user:
        raise StoreError("a job needs a non-empty user")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise StoreError(f"replicas={replicas!r} must be a whole number >= 1")
    if parent_id is not None:
        parent = read_job(cur, parent_id)
        if parent.state.finished:
            raise StoreError(
                f"cannot submit {name!r} as a child of job {parent_id!r}: it has already {parent.state.value}"
            )
        base = f"{parent_id}/{name}"
        namespace = namespace if namespace is not None else parent.namespace
    else:
        base = name
    job_id = ""
    for size in (2, 2, 2, 4, 4, 8):
        candidate = f"{base}-{secrets.token_hex(size)}"
        if cur.execute("SELECT 1 FROM jobs WHERE id = ?", (candidate,)).fetchone() is None:
            job_id = candidate
            break
    if not job_id:  # pragma: no cover - needs six random collisions in a row
        raise StoreError(f"could not find a free id for job {name!r}")
    namespace = namespace if namespace is not None else job_id
    _tables.ensure_user(cur, user, now, initial_credit)
    cur.execute(
        f"INSERT INTO jobs (id, parent_id, name, user_name, namespace, request, state, replicas, {RES_COLS}, "
        "max_retries_failure, max_retries_preemption, submitted_at, label, timeout, band) "
        "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            job_id,
            parent_id,
            name,
            user,
            namespace,
            sqlite3.Binary(request),
            replicas,
            *resources_params(resources),
            max_retries_failure,
            max_retries_preemption,
            now,
            label,
            timeout,
            band,
        ),
    )
    job = read_job(cur, job_id)
    change.create_tasks(job, 0)
    return job


def timed_out(cur: sqlite3.Cursor, now: float) -> list[tuple[str, float]]:
    """``(job id, timeout)`` of each unfinished job whose deadline (first start + timeout) is past ``now``."""
    # ``+state``: SQLite would otherwise walk jobs_by_state over every pending and running job -- on each
    # scheduling pass, so a pass would cost more the longer the queue; the deadline index finds only the due.
    rows = cur.execute(
        "SELECT id, timeout FROM jobs WHERE deadline <= ? AND +state IN ('pending', 'running') ORDER BY deadline",
        (now,),
    ).fetchall()
    return [(str(job_id), float(timeout)) for job_id, timeout in rows]


def job_states(cur: sqlite3.Cursor, job_ids: Sequence[str]) -> dict[str, str]:
    """The state of each of ``job_ids`` (a missing id is left out)."""
    states: dict[str, str] = {}
    # SQLite caps the number of parameters of one statement.
    for start in range(0, len(job_ids), 900):
        chunk = job_ids[start : start + 900]
        marks = ", ".join("?" * len(chunk))
        states.update(cur.execute(f"SELECT id, state FROM jobs WHERE id IN ({marks})", chunk).fetchall())
    return states


def job_request(cur: sqlite3.Cursor, job_id: str) -> bytes:
    """The opaque request bytes given at submission; raises :class:`NotFound`."""
    row = cur.execute("SELECT request FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    return bytes(row[0])


def list_jobs(
    cur: sqlite3.Cursor, states: Iterable[JobStatus] | None, parent_id: str | None, user: str | None
) -> list[JobRecord]:
    """Jobs in submission order, optionally only those in ``states``, children of ``parent_id``, of ``user``."""
    clauses: list[str] = []
    params: list[object] = []
    if states is not None:
        values = [JobStatus(s).value for s in states]
        clauses.append(f"state IN ({', '.join('?' * len(values))})" if values else "0")
        params.extend(values)
    if parent_id is not None:
        clauses.append("parent_id = ?")
        params.append(parent_id)
    if user is not None:
        clauses.append("user_name = ?")
        params.append(user)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = cur.execute(f"SELECT {JOB_COLS} FROM jobs {where} ORDER BY seq", params).fetchall()
    return [job_from(r) for r in rows]


def job_failure(cur: sqlite3.Cursor, job_id: str) -> bytes | None:
    """The final failure of a FAILED job (encoded); None otherwise; raises :class:`NotFound`."""
    row = cur.execute("SELECT failure FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    return None if row[0] is None else bytes(row[0])


def namespace_owner(cur: sqlite3.Cursor, namespace: str) -> str | None:
    """The user of the first job submitted in ``namespace`` (None if it has none)."""
    row = cur.execute("SELECT user_name FROM jobs WHERE namespace = ? ORDER BY seq LIMIT 1", (namespace,)).fetchone()
    return None if row is None else str(row[0])


def live_job_with_label(cur: sqlite3.Cursor, namespace: str, label: str) -> str | None:
    """The id of an unfinished job in ``namespace`` whose label is ``label``, if there is one."""
    row = cur.execute(
        "SELECT id FROM jobs WHERE namespace = ? AND label = ? AND state IN ('pending', 'running') LIMIT 1",
        (namespace, label),
    ).fetchone()
    return None if row is None else str(row[0])


def current_task(
    cur: sqlite3.Cursor, key: TaskKey, worker_id: str | None = None
) -> tuple[JobRecord, TaskRecord] | None:
    """The job and task for a report, or None if the report is stale.

    With ``worker_id``, a report about a task that is not (any more) on that worker is
    stale too: a fenced worker's outcomes are never accepted.
    """
    try:
        task = read_task(cur, key)
    except NotFound:
        return None  # never known here (e.g. a worker of another cluster state): nothing to record
    job = read_job(cur, key.job_id)
    if task.state.finished or task.attempt != job.attempt or job.state != JobStatus.RUNNING:
        return None
    if worker_id is not None and task.worker_id != worker_id:
        return None
    return job, task
