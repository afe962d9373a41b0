"""The store's side tables -- endpoints, logs, credit -- and its consistency check, as functions of a cursor.

:class:`~fray.cluster.server.store.ClusterStore` calls these inside its own transactions;
keeping them here leaves the store itself to the lifecycle of jobs, tasks and workers.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from fray.cluster.protocol.records import Endpoint, LogLine, TaskKey, TaskState
from fray.cluster.server.credit import CreditPolicy, settle, task_rate
from fray.cluster.server.store._schema import JOB_COLS, job_from, read_tasks
from fray.errors import NotFound
from fray.job import JobStatus

__all__ = [
    "accrue_credits",
    "add_endpoint",
    "append_logs",
    "check_invariants",
    "ensure_user",
    "list_endpoints",
    "read_logs",
    "remove_endpoint",
    "set_credit",
]


def add_endpoint(cur: sqlite3.Cursor, namespace: str, name: str, address: str, task: TaskKey, now: float) -> None:
    """Publish ``name`` -> ``address`` in ``namespace`` for ``task`` (replacing that task's earlier address)."""
    cur.execute(
        "INSERT INTO endpoints (namespace, name, job_id, task_index, attempt, address, registered_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, name, job_id, task_index) DO UPDATE SET "
        "attempt = excluded.attempt, address = excluded.address, registered_at = excluded.registered_at",
        (namespace, name, task.job_id, task.task_index, task.attempt, address, now),
    )


def list_endpoints(cur: sqlite3.Cursor, namespace: str, prefix: str = "") -> list[Endpoint]:
    """Endpoints in ``namespace`` whose name starts with ``prefix``, by name then registration."""
    rows = cur.execute(
        "SELECT namespace, name, address, job_id, task_index, attempt, registered_at FROM endpoints "
        "WHERE namespace = ? AND substr(name, 1, ?) = ? ORDER BY name, registered_at, job_id, task_index",
        (namespace, len(prefix), prefix),
    ).fetchall()
    return [Endpoint(r[0], r[1], r[2], TaskKey(r[3], r[4], r[5]), r[6]) for r in rows]


def remove_endpoint(cur: sqlite3.Cursor, namespace: str, name: str, task: TaskKey | None) -> int:
    """Remove ``name`` from ``namespace`` (only ``task``'s registration if given); return how many."""
    if task is None:
        cur.execute("DELETE FROM endpoints WHERE namespace = ? AND name = ?", (namespace, name))
    else:
        cur.execute(
            "DELETE FROM endpoints WHERE namespace = ? AND name = ? AND job_id = ? AND task_index = ? AND attempt = ?",
            (namespace, name, task.job_id, task.task_index, task.attempt),
        )
    return cur.rowcount


def append_logs(cur: sqlite3.Cursor, task: TaskKey, lines: Sequence[str], max_lines: int) -> None:
    """Append output lines of ``task``; beyond ``max_lines`` per task the oldest are dropped."""
    cur.execute(
        "UPDATE tasks SET log_lines = log_lines + ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
        (len(lines), task.job_id, task.attempt, task.task_index),
    )
    if cur.rowcount != 1:
        raise NotFound(f"no task {task}")
    cur.executemany(
        "INSERT INTO logs (job_id, attempt, task_index, line) VALUES (?, ?, ?, ?)",
        [(task.job_id, task.attempt, task.task_index, line) for line in lines],
    )
    count = cur.execute(
        "SELECT log_lines FROM tasks WHERE job_id = ? AND attempt = ? AND task_index = ?",
        (task.job_id, task.attempt, task.task_index),
    ).fetchone()[0]
    excess = count - max_lines
    if excess > 0:
        cur.execute(
            "DELETE FROM logs WHERE id IN (SELECT id FROM logs WHERE job_id = ? AND attempt = ? "
            "AND task_index = ? ORDER BY id LIMIT ?)",
            (task.job_id, task.attempt, task.task_index, excess),
        )
        cur.execute(
            "UPDATE tasks SET log_lines = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
            (max_lines, task.job_id, task.attempt, task.task_index),
        )


def read_logs(cur: sqlite3.Cursor, job_id: str, after_id: int, last: int | None) -> list[LogLine]:
    """Stored lines of ``job_id`` with id > ``after_id``, oldest first (only the ``last`` n if given)."""
    if last is None:
        rows = cur.execute(
            "SELECT id, task_index, attempt, line FROM logs WHERE job_id = ? AND id > ? ORDER BY id",
            (job_id, after_id),
        ).fetchall()
    else:
        rows = cur.execute(
            "SELECT id, task_index, attempt, line FROM logs WHERE job_id = ? AND id > ? ORDER BY id DESC LIMIT ?",
            (job_id, after_id, max(0, last)),
        ).fetchall()
        rows.reverse()
    return [LogLine(r[0], r[1], r[2], r[3]) for r in rows]


def ensure_user(cur: sqlite3.Cursor, user: str, now: float, initial_credit: float) -> None:
    """Give ``user`` a balance (``initial_credit``) if they have none yet."""
    cur.execute("INSERT OR IGNORE INTO users (name, balance, updated_at) VALUES (?, ?, ?)", (user, initial_credit, now))


def set_credit(cur: sqlite3.Cursor, user: str, balance: float, now: float, initial_credit: float) -> None:
    """Set ``user``'s balance (creating the user if new)."""
    ensure_user(cur, user, now, initial_credit)
    cur.execute("UPDATE users SET balance = ?, updated_at = ? WHERE name = ?", (balance, now, user))


def accrue_credits(cur: sqlite3.Cursor, now: float, policy: CreditPolicy) -> dict[str, float]:
    """Bill running tasks up to ``now``, regenerate balances, and return the new balances."""
    rows = cur.execute(
        "SELECT t.job_id, t.attempt, t.task_index, t.charged_until, j.user_name, j.cpu_millis, "
        "j.ram_bytes, j.device_kind, j.device_count FROM tasks t JOIN jobs j ON j.id = t.job_id "
        "WHERE t.state = 'running'"
    ).fetchall()
    used: dict[str, float] = {}
    for _, _, _, since, user, cpu, ram, kind, count in rows:
        if since is not None:
            used[user] = used.get(user, 0.0) + task_rate(cpu, ram, kind, count, policy) * max(0.0, now - since)
    cur.executemany(
        "UPDATE tasks SET charged_until = ? WHERE job_id = ? AND attempt = ? AND task_index = ?",
        [(now, r[0], r[1], r[2]) for r in rows],
    )
    balances: dict[str, float] = {}
    for name, balance, updated in cur.execute("SELECT name, balance, updated_at FROM users").fetchall():
        balances[name] = settle(balance, now - updated, used.get(name, 0.0), policy)
    cur.executemany(
        "UPDATE users SET balance = ?, updated_at = ? WHERE name = ?",
        [(b, now, name) for name, b in balances.items()],
    )
    return balances


def check_invariants(cur: sqlite3.Cursor) -> list[str]:
    """Cross-check the stored state; return a description of every inconsistency (empty if none)."""
    problems: list[str] = []
    integrity = cur.execute("PRAGMA integrity_check").fetchone()[0]
    if integrity != "ok":
        problems.append(f"sqlite integrity_check: {integrity}")
    alive = {r[0] for r in cur.execute("SELECT id FROM workers WHERE state = 'alive'")}
    jobs = [job_from(r) for r in cur.execute(f"SELECT {JOB_COLS} FROM jobs ORDER BY seq").fetchall()]
    by_id = {j.job_id: j for j in jobs}
    for job in jobs:
        tasks = read_tasks(cur, job.job_id, job.attempt)
        states = {t.state for t in tasks}
        if len(tasks) != job.task_count:
            problems.append(f"{job.job_id}: {len(tasks)} tasks in attempt {job.attempt}, expected {job.task_count}")
        if job.state == JobStatus.PENDING and states - {TaskState.PENDING}:
            problems.append(f"{job.job_id}: pending job has tasks in {sorted(states)}")
        if job.state == JobStatus.RUNNING:
            if states - {TaskState.ASSIGNED, TaskState.RUNNING, TaskState.SUCCEEDED}:
                problems.append(f"{job.job_id}: running job has tasks in {sorted(states)}")
            if not states & {TaskState.ASSIGNED, TaskState.RUNNING}:
                problems.append(f"{job.job_id}: running job has no active task")
            for t in tasks:
                if t.state.active and t.worker_id not in alive:
                    problems.append(f"{t.key}: active on worker {t.worker_id!r}, which is not alive")
        if job.state.finished and states & {TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING}:
            problems.append(f"{job.job_id}: {job.state.value} job has unfinished tasks")
        if job.state == JobStatus.SUCCEEDED and states != {TaskState.SUCCEEDED}:
            problems.append(f"{job.job_id}: succeeded job has tasks in {sorted(states)}")
        parent = by_id.get(job.parent_id) if job.parent_id else None
        if job.parent_id and parent is None:
            problems.append(f"{job.job_id}: parent {job.parent_id} does not exist")
        if parent is not None and parent.state.finished and not job.state.finished:
            problems.append(f"{job.job_id}: still {job.state.value} after its parent ended")
        if job.parent_id and not job.job_id.startswith(job.parent_id + "/"):
            problems.append(f"{job.job_id}: id does not extend its parent's id {job.parent_id}")
    old_active = cur.execute(
        "SELECT t.job_id, t.attempt, t.task_index FROM tasks t JOIN jobs j ON j.id = t.job_id "
        "WHERE t.attempt != j.attempt AND t.state IN ('pending', 'assigned', 'running')"
    ).fetchall()
    problems.extend(f"{TaskKey(r[0], r[2], r[1])}: unfinished task of an old attempt" for r in old_active)
    orphans = cur.execute(
        "SELECT e.namespace, e.name FROM endpoints e LEFT JOIN tasks t ON t.job_id = e.job_id "
        "AND t.attempt = e.attempt AND t.task_index = e.task_index "
        "WHERE t.state IS NULL OR t.state NOT IN ('assigned', 'running')"
    ).fetchall()
    problems.extend(f"endpoint {ns}/{name}: its task is not active" for ns, name in orphans)
    return problems
