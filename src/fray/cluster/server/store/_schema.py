"""How the cluster's records are laid out in SQLite: the schema, its version, and rows to records.

Only :mod:`fray.cluster.server.store` and its helpers read this; everything else sees the
records of :mod:`fray.cluster.protocol.records`.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

from fray.cluster.protocol.capacity import Device, TaskResources, WorkerInfo
from fray.cluster.protocol.records import (
    JobRecord,
    SchedulerInput,
    TaskKey,
    TaskRecord,
    TaskState,
    WorkerRecord,
    WorkerState,
)
from fray.cluster.server.scheduler import PendingJob, RunningTask
from fray.errors import NotFound, StoreError
from fray.job import JobStatus

__all__ = [
    "ACTIVE",
    "JOB_COLS",
    "RES_COLS",
    "SCHEMA_VERSION",
    "TASK_COLS",
    "WORKER_COLS",
    "active_keys_on",
    "create_or_migrate",
    "job_from",
    "read_job",
    "read_pending",
    "read_scheduler_input",
    "read_task",
    "read_tasks",
    "resources_from",
    "resources_params",
    "task_from",
    "with_reason",
    "worker_from",
    "write_worker",
]

#: The version of the layout below; :func:`create_or_migrate` brings older files up to it.
SCHEMA_VERSION = 7

SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE users (
    name TEXT PRIMARY KEY,
    balance REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    parent_id TEXT,
    name TEXT NOT NULL,
    user_name TEXT NOT NULL,
    namespace TEXT NOT NULL,
    request BLOB NOT NULL,
    state TEXT NOT NULL,
    replicas INTEGER NOT NULL,
    cpu_millis INTEGER NOT NULL,
    ram_bytes INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    device_kind TEXT NOT NULL,
    device_type TEXT NOT NULL,
    device_count INTEGER NOT NULL,
    preemptible INTEGER NOT NULL,
    regions TEXT,
    max_retries_failure INTEGER NOT NULL,
    max_retries_preemption INTEGER NOT NULL,
    failure_count INTEGER NOT NULL DEFAULT 0,
    preemption_count INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0,
    pending_reason TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    failure BLOB,
    label TEXT NOT NULL DEFAULT '',
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    timeout REAL,
    deadline REAL,
    band INTEGER NOT NULL DEFAULT 2
);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_deadline ON jobs (deadline) WHERE deadline IS NOT NULL;
CREATE INDEX jobs_by_parent ON jobs (parent_id);
CREATE INDEX jobs_by_label ON jobs (namespace, label, state);
CREATE TABLE tasks (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    task_index INTEGER NOT NULL,
    replica_index INTEGER NOT NULL,
    host_index INTEGER NOT NULL,
    state TEXT NOT NULL,
    worker_id TEXT,
    exit_code INTEGER,
    error TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    assigned_at REAL,
    started_at REAL,
    finished_at REAL,
    charged_until REAL,
    log_lines INTEGER NOT NULL DEFAULT 0,
    failure BLOB,
    PRIMARY KEY (job_id, attempt, task_index)
) WITHOUT ROWID;
CREATE INDEX tasks_by_state ON tasks (state);
CREATE INDEX tasks_by_worker ON tasks (worker_id, state);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    cpu_millis INTEGER NOT NULL,
    ram_bytes INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    devices TEXT NOT NULL,
    attributes TEXT NOT NULL,
    state TEXT NOT NULL,
    registered_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    health TEXT NOT NULL DEFAULT ''
);
CREATE TABLE credentials (
    id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL,
    via TEXT NOT NULL DEFAULT ''
);
CREATE TABLE endpoints (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    job_id TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    address TEXT NOT NULL,
    registered_at REAL NOT NULL,
    PRIMARY KEY (namespace, name, job_id, task_index)
);
CREATE INDEX endpoints_by_task ON endpoints (job_id, attempt, task_index);
CREATE TABLE logs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    task_index INTEGER NOT NULL,
    line TEXT NOT NULL
);
CREATE INDEX logs_by_job ON logs (job_id, id);
CREATE INDEX logs_by_task ON logs (job_id, attempt, task_index, id);
CREATE TABLE blobs (
    digest TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL,
    used_at REAL NOT NULL
);
"""

RES_COLS = "cpu_millis, ram_bytes, disk_bytes, device_kind, device_type, device_count, preemptible, regions"
JOB_COLS = (
    "id, parent_id, name, user_name, namespace, state, replicas, " + RES_COLS + ", max_retries_failure, "
    "max_retries_preemption, failure_count, preemption_count, attempt, pending_reason, error, submitted_at, "
    "started_at, finished_at, band"
)
TASK_COLS = (
    "job_id, task_index, attempt, replica_index, host_index, state, worker_id, exit_code, error, created_at, "
    "assigned_at, started_at, finished_at"
)
ACTIVE = ("assigned", "running")


WORKER_COLS = (
    "id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, registered_at, last_heartbeat, "
    "epoch, health"
)

# Each step brings a file from version N to N + 1. Failures are encoded as
# ``fray.core._lifecycle.Failure`` from version 2 on; version 1's pickled reports are dropped
# (the controller never unpickles them) and a FAILED job keeps its message. Version 3
# gives every worker an epoch, which each registration advances (fencing), and a health
# note (empty: healthy; otherwise why the worker takes no new tasks). Version 4 adds the
# blobs table (job workspaces by content hash, :mod:`fray.cluster.server.store._blobs`); a file an
# earlier operator build gave that table already keeps it. Version 5 adds the credentials
# table: join tokens and the credentials the controller issued, so they can expire and be revoked.
# Version 6 gives jobs their timeout (seconds) and deadline (first start + timeout), indexed. Version 7
# gives jobs their priority band (1 production, 2 interactive, 3 batch): a pass orders and preempts by
# it, and the pending set is read back from these columns alone at start; older jobs were all interactive.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE jobs ADD COLUMN failure BLOB", "UPDATE tasks SET failure = NULL"),
    2: (
        "ALTER TABLE workers ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE workers ADD COLUMN health TEXT NOT NULL DEFAULT ''",
        # Version 2 stored requests as pickles, which the controller no longer opens: the jobs
        # still to run fail (saying why) and their tasks are killed when their workers return.
        "DELETE FROM endpoints",
        "UPDATE tasks SET state = 'killed', error = 'stored by an older Fray' "
        "WHERE state IN ('pending', 'assigned', 'running')",
        "UPDATE jobs SET state = 'failed', pending_reason = '', finished_at = submitted_at, error = "
        "'this job was stored by an older Fray whose requests the controller can no longer read; submit it again' "
        "WHERE state IN ('pending', 'running')",
    ),
    3: (
        "CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL, size INTEGER NOT NULL, "
        "created_at REAL NOT NULL, used_at REAL NOT NULL)",
    ),
    4: (
        "CREATE TABLE IF NOT EXISTS credentials (id TEXT PRIMARY KEY, subject TEXT NOT NULL, created_at REAL NOT NULL, "
        "expires_at REAL, revoked_at REAL, via TEXT NOT NULL DEFAULT '')",
    ),
    5: (
        "ALTER TABLE jobs ADD COLUMN timeout REAL",
        "ALTER TABLE jobs ADD COLUMN deadline REAL",
        "CREATE INDEX IF NOT EXISTS jobs_by_deadline ON jobs (deadline) WHERE deadline IS NOT NULL",
    ),
    6: ("ALTER TABLE jobs ADD COLUMN band INTEGER NOT NULL DEFAULT 2",),
}


def create_or_migrate(cur: sqlite3.Cursor, path: str) -> None:
    """Create the schema in an empty file, or migrate an older one (inside the caller's transaction)."""
    exists = cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if exists is None:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                cur.execute(statement)
        cur.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        return
    row = cur.execute("SELECT version FROM schema_version").fetchone()
    version = row[0] if row else None
    if version not in _MIGRATIONS and version != SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {version}; this Fray reads version {SCHEMA_VERSION}")
    while version != SCHEMA_VERSION:
        for statement in _MIGRATIONS[version]:
            cur.execute(statement)
        version += 1
        cur.execute("UPDATE schema_version SET version = ?", (version,))


def resources_from(row: Sequence[Any]) -> TaskResources:
    """Build TaskResources from the 8 columns of ``RES_COLS``."""
    cpu, ram, disk, kind, dtype, count, preemptible, regions = row
    return TaskResources(
        cpu_millis=int(cpu),
        ram_bytes=int(ram),
        disk_bytes=int(disk),
        device_kind=str(kind),
        device_type=str(dtype),
        device_count=int(count),
        preemptible=bool(preemptible),
        regions=tuple(json.loads(regions)) if regions is not None else None,
    )


def resources_params(r: TaskResources) -> tuple[object, ...]:
    regions = json.dumps(list(r.regions)) if r.regions is not None else None
    return (
        r.cpu_millis,
        r.ram_bytes,
        r.disk_bytes,
        r.device_kind,
        r.device_type,
        r.device_count,
        int(r.preemptible),
        regions,
    )


def job_from(row: Sequence[Any]) -> JobRecord:
    (job_id, parent_id, name, user, namespace, state, replicas) = row[:7]
    resources = resources_from(row[7:15])
    (mrf, mrp, fc, pc, attempt, reason, error, submitted, started, finished, band) = row[15:]
    return JobRecord(
        job_id=str(job_id),
        parent_id=parent_id,
        name=str(name),
        user=str(user),
        namespace=str(namespace),
        state=JobStatus(str(state)),
        resources=resources,
        replicas=int(replicas),
        max_retries_failure=int(mrf),
        max_retries_preemption=int(mrp),
        failure_count=int(fc),
        preemption_count=int(pc),
        attempt=int(attempt),
        pending_reason=str(reason),
        error=str(error),
        submitted_at=float(submitted),
        started_at=started,
        finished_at=finished,
        band=int(band),
    )


def task_from(row: Sequence[Any]) -> TaskRecord:
    (job_id, index, attempt, replica, host, state, worker, exit_code, error, created, assigned, started, finished) = row
    return TaskRecord(
        job_id=str(job_id),
        task_index=int(index),
        attempt=int(attempt),
        replica_index=int(replica),
        host_index=int(host),
        state=TaskState(str(state)),
        worker_id=worker,
        exit_code=exit_code,
        error=str(error),
        created_at=float(created),
        assigned_at=assigned,
        started_at=started,
        finished_at=finished,
    )


def with_reason(task: TaskRecord, job: JobRecord) -> TaskRecord:
    if task.state == TaskState.PENDING and task.attempt == job.attempt and job.pending_reason:
        return dataclasses.replace(task, pending_reason=job.pending_reason)
    return task


def worker_from(row: Sequence[Any]) -> WorkerRecord:
    wid, address, cpu, ram, disk, devices, attributes, state, registered, heartbeat, epoch, health = row
    info = WorkerInfo(
        worker_id=str(wid),
        cpu_millis=int(cpu),
        ram_bytes=int(ram),
        disk_bytes=int(disk),
        devices=tuple(Device(d[0], d[1], int(d[2])) for d in json.loads(str(devices))),
        attributes=json.loads(str(attributes)),
        alive=state == WorkerState.ALIVE.value,
    )
    return WorkerRecord(
        info, str(address), WorkerState(state), float(registered), float(heartbeat), int(epoch), str(health)
    )


def read_job(cur: sqlite3.Cursor, job_id: str) -> JobRecord:
    """The job ``job_id``; raises :class:`~fray.errors.NotFound`."""
    row = cur.execute(f"SELECT {JOB_COLS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    return job_from(row)


def read_task(cur: sqlite3.Cursor, key: TaskKey) -> TaskRecord:
    """One task attempt; raises :class:`~fray.errors.NotFound`."""
    row = cur.execute(
        f"SELECT {TASK_COLS} FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
        (key.job_id, key.attempt, key.task_index),
    ).fetchone()
    if row is None:
        raise NotFound(f"no task {key}")
    return task_from(row)


def read_tasks(cur: sqlite3.Cursor, job_id: str, attempt: int) -> list[TaskRecord]:
    """The tasks of ``job_id`` in ``attempt``, by task index."""
    rows = cur.execute(
        f"SELECT {TASK_COLS} FROM tasks WHERE job_id = ? AND attempt = ? ORDER BY task_index",
        (job_id, attempt),
    ).fetchall()
    return [task_from(r) for r in rows]


def active_keys_on(cur: sqlite3.Cursor, worker_id: str) -> list[TaskKey]:
    """The tasks assigned to or running on ``worker_id``."""
    rows = cur.execute(
        "SELECT job_id, task_index, attempt FROM tasks WHERE worker_id = ? AND state IN (?, ?) "
        "ORDER BY job_id, attempt, task_index",
        (worker_id, *ACTIVE),
    ).fetchall()
    return [TaskKey(r[0], r[1], r[2]) for r in rows]


def read_pending(cur: sqlite3.Cursor, job_id: str | None = None) -> list[tuple[PendingJob, str]]:
    """PENDING jobs (only ``job_id`` if given) as the scheduler sees them, with their pending reasons, by seq."""
    where = "state = 'pending'" + (" AND id = ?" if job_id is not None else "")
    return [
        (PendingJob(row[0], row[1], row[2], resources_from(row[3:11]), row[11], band=int(row[13])), str(row[12]))
        for row in cur.execute(
            f"SELECT id, user_name, replicas, {RES_COLS}, submitted_at, pending_reason, band FROM jobs WHERE {where} "
            "ORDER BY seq",
            () if job_id is None else (job_id,),
        )
    ]


def read_scheduler_input(
    cur: sqlite3.Cursor, *, pending: bool = True, lent: Collection[TaskKey] = ()
) -> SchedulerInput:
    """Pending jobs (unless ``pending=False``), alive workers, capacity-holding tasks and balances.

    The tasks in ``lent`` hold no CPU: they are blocked on their own work and lent it
    (:mod:`fray.core._lending`). Call it inside one read transaction.
    """
    jobs = tuple(job for job, _ in read_pending(cur)) if pending else ()
    workers = tuple(
        worker_from(row).info
        # An unhealthy worker keeps its tasks but gets no new ones.
        for row in cur.execute(f"SELECT {WORKER_COLS} FROM workers WHERE state = 'alive' AND health = '' ORDER BY id")
    )
    cols = ", ".join(f"j.{c.strip()}" for c in RES_COLS.split(","))
    rows = cur.execute(
        f"SELECT t.worker_id, j.user_name, {cols}, t.job_id, t.task_index, t.attempt, j.band, t.assigned_at "
        "FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.state IN (?, ?)",
        ACTIVE,
    )
    running = tuple(
        RunningTask(
            row[0],
            row[1],
            _without_cpu(resources_from(row[2:10]))
            if lent and TaskKey(row[10], row[11], row[12]) in lent
            else resources_from(row[2:10]),
            job_id=row[10],
            band=int(row[13]),
            started_at=float(row[14] or 0.0),
        )
        for row in rows
    )
    credits = {name: balance for name, balance in cur.execute("SELECT name, balance FROM users")}
    return SchedulerInput(jobs, workers, running, credits)


def _without_cpu(resources: TaskResources) -> TaskResources:
    return dataclasses.replace(resources, cpu_millis=0)


def write_worker(cur: sqlite3.Cursor, info: WorkerInfo, address: str, now: float) -> int:
    """Insert or update ``info``'s row as an ALIVE worker heard from ``now``; return its new epoch."""
    devices = json.dumps([[d.kind, d.type, d.count] for d in info.devices])
    cur.execute(
        "INSERT INTO workers (id, address, cpu_millis, ram_bytes, disk_bytes, devices, attributes, state, "
        "registered_at, last_heartbeat, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, 'alive', ?, ?, 1) "
        "ON CONFLICT (id) DO UPDATE SET address = excluded.address, cpu_millis = excluded.cpu_millis, "
        "ram_bytes = excluded.ram_bytes, disk_bytes = excluded.disk_bytes, devices = excluded.devices, "
        "attributes = excluded.attributes, state = 'alive', last_heartbeat = excluded.last_heartbeat, "
        "epoch = epoch + 1",
        (
            info.worker_id,
            address,
            info.cpu_millis,
            info.ram_bytes,
            info.disk_bytes,
            devices,
            json.dumps(dict(info.attributes), sort_keys=True),
            now,
            now,
        ),
    )
    return int(cur.execute("SELECT epoch FROM workers WHERE id = ?", (info.worker_id,)).fetchone()[0])
