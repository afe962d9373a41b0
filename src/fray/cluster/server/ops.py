"""The controller's operator API: listings, cluster status, retention, dashboard log-in links.

:class:`OpsService` is served by the controller's data-only RPC as the ``ops.*``
methods (:mod:`fray.cluster.server.controller._ops_api`, which also decides who sees what), and is
called in-process by the dashboard. Every method takes and returns plain data only
(str, int, float, bool, None, bytes, and lists and dicts of them). It reads the store
through :meth:`ClusterStore.read_with` and owns one background thread, which prunes
finished jobs past the retention policy.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from fray.cluster.protocol.records import JobRecord, TaskRecord, WorkerState
from fray.cluster.server._retention import RetentionPolicy, prune_departed_workers, prune_finished_jobs
from fray.cluster.server.controller._utilisation import UtilisationSampler
from fray.cluster.server.envs._workspace import digest_of
from fray.cluster.server.store import ClusterStore, _blobs, _views
from fray.cluster.server.store._schema import JOB_COLS, TASK_COLS, job_from, read_job, task_from
from fray.cluster.server.trace import TraceJob, chrome_trace
from fray.errors import ConfigError, NotFound

__all__ = ["PRUNE_INTERVAL_SECONDS", "TIMELINE_JOBS", "OpsService", "job_history"]

logger = logging.getLogger(__name__)


# Every worker state, each counted in ``status()["capacity"]`` as ``workers_<state>``.
_WORKER_STATES = tuple(state.value for state in WorkerState)

#: How often the controller prunes finished jobs past the retention policy.
PRUNE_INTERVAL_SECONDS = 60.0

#: The most jobs one timeline holds (the newest): a bound on its size, within the store's own retention.
TIMELINE_JOBS = 10_000

_STATES = ("pending", "running", "succeeded", "failed", "stopped")


def job_history(job: JobRecord, tasks: list[TaskRecord]) -> list[dict[str, Any]]:
    """The job's state changes, oldest first, rebuilt from its attempts' task times."""
    events: list[dict[str, Any]] = [{"at": job.submitted_at, "state": "pending", "detail": "submitted"}]
    by_attempt: dict[int, list[TaskRecord]] = {}
    for task in tasks:
        by_attempt.setdefault(task.attempt, []).append(task)
    for attempt, group in sorted(by_attempt.items()):
        if attempt > 0:
            created = min(t.created_at for t in group)
            events.append({"at": created, "state": "pending", "detail": f"attempt {attempt} waits to be placed"})
        starts = [t.assigned_at for t in group if t.assigned_at is not None]
        if starts:
            workers = sorted({t.worker_id for t in group if t.worker_id})
            events.append(
                {"at": min(starts), "state": "running", "detail": f"attempt {attempt} on {', '.join(workers)}"}
            )
        if attempt < job.attempt:
            ended = [t for t in group if t.finished_at is not None and t.state.value in ("failed", "lost")]
            if ended:
                first = min(ended, key=lambda t: t.finished_at or 0.0)
                detail = f"attempt {attempt} {first.state.value}: task {first.task_index}: {first.error}".rstrip(": ")
                events.append({"at": first.finished_at, "state": "retrying", "detail": detail})
    if job.finished_at is not None:
        events.append({"at": job.finished_at, "state": job.state.value, "detail": job.error})
    return events


class OpsService:
    """Read-only views of the cluster for people, plus retention (see the module docstring).

    ``spec_command`` returns a job's command description (from its stored spec);
    ``controller`` is the controller's own service: its ``health()`` (read-only or not),
    ``logs`` and ``terminate``, and ``queue_stats()`` when it has queues. ``login_link``
    makes a one-time dashboard log-in URL when a dashboard runs.
    """

    def __init__(
        self,
        store: ClusterStore,
        *,
        spec_command: Callable[[str], str],
        controller: Any = None,
        retention: RetentionPolicy | None = None,
        address: str = "",
        clock: Callable[[], float] = time.time,
        prune_interval: float = PRUNE_INTERVAL_SECONDS,
    ) -> None:
        self._store = store
        self._spec_command = spec_command
        self._controller = controller
        self.retention = retention or RetentionPolicy()
        self.address = address
        self._clock = clock
        self._prune_interval = prune_interval
        self._started_at = clock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.login_link: Callable[[], str] | None = None
        self.dashboard_address = ""
        #: The controller's autoscaler (:class:`fray.cluster.server.controller._autoscale_host.AutoscaleHost`), when it has a VM provider.
        self.autoscaler: Any = None
        #: Utilisation over time (the dashboard's charts): a ring buffer in memory, filled while started.
        self.sampler = UtilisationSampler(self._utilisation_now, clock=clock)

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Prune once now, then every ``prune_interval`` seconds, in a background thread."""
        self._thread = threading.Thread(target=self._prune_loop, name="fray-retention", daemon=True)
        self._thread.start()
        self.sampler.start()

    def stop(self) -> None:
        """Stop the pruning and sampling threads."""
        self.sampler.stop()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _prune_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.prune()
            except Exception:  # a failed pass is retried at the next one
                logger.exception("pruning finished jobs failed")
            self._stopping.wait(self._prune_interval)

    # ----- API (data only) ----------------------------------------------------------------------

    def prune(self) -> int:
        """Delete finished jobs (and stopped or lost workers) past the retention policy now; return how many jobs went."""
        total = 0
        while not self._stopping.is_set():
            deleted = self._store.write_with(functools.partial(self._prune_batch, self._clock()))
            total += len(deleted)
            if not deleted:
                break
        unused_since = self._clock() - self.retention.max_age_seconds
        self._store.write_with(lambda cur: _blobs.prune_blobs(cur, unused_since))
        if total:
            logger.info("pruned %d finished jobs (retention: %s)", total, self.retention)
        workers = self._store.write_with(
            functools.partial(prune_departed_workers, now=self._clock(), policy=self.retention)
        )
        if workers:
            logger.info("pruned %d stopped or lost workers: %s", len(workers), ", ".join(workers))
        return total

    def _prune_batch(self, now: float, cur: sqlite3.Cursor) -> list[str]:
        return prune_finished_jobs(cur, now, self.retention)

    def _command(self, job_id: str) -> str:
        try:
            return self._spec_command(job_id)
        except Exception:  # a spec this controller cannot read still lists, without its command
            return ""

    def jobs(
        self,
        states: list[str] | None = None,
        limit: int = 50,
        namespace: str | None = None,
        name: str | None = None,
        *,
        user: str | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs newest first: at most ``limit`` (0: all), only ``states`` / ``namespace`` / ``name`` / ``user`` if given."""
        for state in states or ():
            if state not in _STATES:
                raise ConfigError(f"unknown job state {state!r}: use one of {', '.join(_STATES)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"limit={limit!r} must be a whole number >= 0 (0: no limit)")
        now = self._clock()
        rows, waiting = self._store.read_with(
            lambda cur: (
                _views.job_rows(cur, states=states, limit=limit, namespace=namespace, name=name, user=user),
                _views.pending_by_band(cur),
            )
        )
        out = []
        for job, label in rows:
            data = _views.job_dict(job, label, now, waiting)
            data["command"] = self._command(job.job_id)
            out.append(data)
        return out

    def find_jobs(self, ref: str, *, user: str | None = None) -> list[str]:
        """The ids ``ref`` names: ``[ref]`` for a job id, else the jobs named ``ref``, newest first (of ``user``)."""
        return self._store.read_with(lambda cur: _views.find_job_ids(cur, ref, user=user))

    def job_detail(self, job_id: str) -> dict[str, Any]:
        """One job with every attempt's tasks and its state history; raises NotFound."""
        now = self._clock()

        def read(cur: Any) -> tuple[JobRecord, str, list[TaskRecord], dict[int, int]]:
            job = read_job(cur, job_id)
            label = cur.execute("SELECT label FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            return job, str(label), _views.task_rows(cur, job_id), _views.pending_by_band(cur)

        job, label, tasks, waiting = self._store.read_with(read)
        data = _views.job_dict(job, label, now, waiting)
        data["command"] = self._command(job_id)
        data["tasks"] = [_views.task_dict(t) for t in tasks]
        data["history"] = job_history(job, tasks)
        children = self._store.list_jobs(parent_id=job_id)
        data["children"] = [{"job_id": c.job_id, "state": c.state.value} for c in children]
        return data

    def timeline(
        self, job_id: str | None = None, since: float | None = None, *, user: str | None = None
    ) -> dict[str, Any]:
        """The jobs as a Chrome trace (:mod:`fray.cluster.server.trace`): every stored job, or ``job_id`` alone.

        ``since`` (Unix seconds) keeps the jobs still running then or later; ``user`` keeps only that
        user's. At most :data:`TIMELINE_JOBS` jobs, the newest. Raises NotFound for an unknown ``job_id``.
        """
        now = self._clock()

        def read(cur: Any) -> list[TraceJob]:
            clause, params = _views.where(
                ("id = ?", (job_id,)) if job_id is not None else None,
                ("(finished_at IS NULL OR finished_at >= ?)", (since,)) if since is not None else None,
                ("user_name = ?", (user,)) if user is not None else None,
            )
            rows = cur.execute(
                f"SELECT {JOB_COLS}, label FROM jobs {clause} ORDER BY seq DESC LIMIT ?", (*params, TIMELINE_JOBS)
            ).fetchall()
            tasks: dict[str, list[TaskRecord]] = {}
            ids = [row[0] for row in rows]
            for chunk in range(0, len(ids), 500):  # SQLite's limit on bound parameters
                part = ids[chunk : chunk + 500]
                found = cur.execute(
                    f"SELECT {TASK_COLS} FROM tasks WHERE job_id IN ({', '.join('?' * len(part))}) "
                    "ORDER BY attempt, task_index",
                    part,
                )
                for task_row in found.fetchall():
                    task = task_from(task_row)
                    tasks.setdefault(task.job_id, []).append(task)
            return [TraceJob(job_from(row[:-1]), str(row[-1]), tuple(tasks.get(row[0], ()))) for row in rows]

        jobs = self._store.read_with(read)
        if job_id is not None and not jobs:
            raise NotFound(f"no job {job_id!r}")
        return chrome_trace(jobs, now)

    def status(self, *, user: str | None = None) -> dict[str, Any]:
        """The whole cluster at a glance: workers and their resources, jobs by state, actors, queues, health.

        With ``user``, jobs and actors are only that user's (workers and capacity are everybody's).
        """
        now = self._clock()

        def read(cur: Any) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
            return _views.worker_rows(cur, now), _views.job_counts(cur, user), _views.actor_rows(cur, user)

        workers, counts, actors = self._store.read_with(read)
        alive = [w for w in workers if w["state"] == "alive"]
        return {
            "controller": self.health(),
            "workers": workers,
            "capacity": {
                key: sum(w[key] for w in alive)
                for key in ("cpu_total", "cpu_used", "cpu_free", "ram_total", "ram_used", "ram_free")
            }
            | {f"workers_{state}": sum(w["state"] == state for w in workers) for state in _WORKER_STATES},
            "jobs": counts,
            "actors": actors,
            "queues": self.queues(),
            "autoscaler": self._autoscaler_view(),
        }

    def _utilisation_now(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        now = self._clock()
        return self._store.read_with(lambda cur: (_views.worker_rows(cur, now), _views.job_counts(cur)))

    def utilisation(self, since: float = 0.0, *, jobs: bool = True) -> dict[str, Any]:
        """Samples of the cluster taken after ``since``, oldest first, and the sampling interval and capacity.

        Each sample: ``at``, cores and bytes of memory in use and offered by the live workers, the same
        per worker, and (with ``jobs``) the stored jobs by state, cluster-wide.
        """
        samples = self.sampler.samples(since)
        if not jobs:
            for sample in samples:
                del sample["jobs"]
        return {"interval": self.sampler.interval, "capacity": self.sampler.capacity, "samples": samples}

    def health(self) -> dict[str, Any]:
        """The controller's own state: address, uptime, database, retention, and whether it is read-only (and why)."""
        storage: dict[str, Any] = dict(self._controller.health()) if self._controller is not None else {}
        return {
            "address": self.address,
            "dashboard": self.dashboard_address,
            "uptime_seconds": max(0.0, self._clock() - self._started_at),
            "database": self._store.path,
            "schema_version": self._store.schema_version,
            "read_only": storage.get("read_only"),
            "read_only_reason": storage.get("reason", ""),
            "free_bytes": storage.get("free_bytes"),
            "retention": {"max_age_seconds": self.retention.max_age_seconds, "max_jobs": self.retention.max_jobs},
        }

    def queues(self) -> list[dict[str, Any]] | None:
        """Queue statistics from the controller, or None when this controller has no queues."""
        stats = getattr(self._controller, "queue_stats", None)
        if stats is None:
            return None
        return list(stats())

    def logs(self, job_id: str, last: int | None = None, after_id: int = 0) -> list[tuple[int, str]]:
        """The job's output lines as ``(line_id, text)`` (the controller's own call; for the dashboard)."""
        if self._controller is None:
            return []
        lines: list[tuple[int, str]] = self._controller.logs(job_id, last, after_id)
        return lines

    def job_stacks(self, job_id: str, timeout: float = 10.0, locals: bool = False) -> list[dict[str, Any]]:
        """The job's live stacks as JSON (the controller's own relay to its workers; for the dashboard)."""
        if self._controller is None:
            return []
        return [process.to_json() for process in self._controller.job_stacks(job_id, timeout, locals)]

    def terminate(self, job_id: str) -> None:
        """Stop the job, its tasks and its child jobs (the controller's own call; for the dashboard)."""
        if self._controller is not None:
            self._controller.terminate(job_id, "stopped from the dashboard")

    # ----- autoscaling: VMs from a provider (docs/autoscaling.md) -------------------------------

    def _autoscaler_view(self) -> dict[str, Any] | None:
        """The autoscaler's status plus its live VMs, for ``status()`` (None without a provider)."""
        if self.autoscaler is None:
            return None
        view: dict[str, Any] = dict(self.autoscaler.status())
        view["vms"] = self.autoscaler.vms()
        return view

    def _autoscaling(self) -> Any:
        if self.autoscaler is None:
            raise ConfigError("this cluster has no VM provider (it was started without --config)")
        return self.autoscaler

    def vms(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        """Every VM: id, group, slice, state, worker id, created/ready times, reason (deleted ones too if asked)."""
        vms: list[dict[str, Any]] = self._autoscaling().vms(include_deleted)
        return vms

    def autoscaler_status(self) -> dict[str, Any]:
        """Per scale group its state, target and VMs by state; unmet demand with machine-readable codes."""
        status: dict[str, Any] = self._autoscaling().status()
        return status

    def vm_preempt(self, vm_id: str) -> None:
        """The provider reclaims the VM now (fault injection; the simulated provider only)."""
        self._autoscaling().preempt(vm_id)

    def vm_quota(self, group: str, exhausted: bool) -> None:
        """The provider refuses creates in ``group`` with a quota error, or stops doing so (simulated only)."""
        self._autoscaling().set_quota(group, exhausted)

    def vm_fail_boot(self, group: str, count: int) -> None:
        """The next ``count`` VMs created in ``group`` never finish booting (simulated only)."""
        self._autoscaling().fail_boot(group, count)

    def delete_all_vms(self) -> int:
        """Stop creating VMs and delete every one (``fray cluster down``); returns how many were deleted."""
        count: int = self._autoscaling().delete_all()
        return count

    # ----- workspaces: opaque bytes by content hash ---------------------------------------------

    def has_blob(self, digest: str) -> bool:
        """True if the blob ``digest`` (``sha256:<hex>``) is stored: a client then need not upload it."""
        return self._store.read_with(lambda cur: _blobs.has_blob(cur, digest))

    def put_blob(self, digest: str, data: bytes) -> bool:
        """Store ``data`` under its digest, which is checked; returns True."""
        if not isinstance(data, bytes) or digest_of(data) != digest:
            raise ConfigError(f"put_blob({digest!r}): the data does not have that sha256 digest")
        now = self._clock()
        self._store.write_with(lambda cur: _blobs.put_blob(cur, digest, data, now))
        return True

    def get_blob(self, digest: str) -> bytes:
        """The blob ``digest``; raises NotFound (for example after it was pruned)."""
        now = self._clock()
        data = self._store.write_with(lambda cur: _blobs.get_blob(cur, digest, now))
        if data is None:
            raise NotFound(f"no blob {digest!r} on this controller (pruned, or never uploaded)")
        return data

    def serve_dashboard(self, token: bytes, host: str, port: int) -> Any:
        """Start the web dashboard on this API (log-in with ``token``); None without the dashboard extra."""
        try:
            from fray.cluster.server.dashboard import Dashboard  # optional: needs fray[dashboard]
        except ImportError as exc:
            logger.warning("no dashboard: %s (install it with: pip install 'fray[dashboard]')", exc)
            return None
        dashboard = Dashboard(self, token, host, port).start()
        self.login_link = dashboard.login_link
        self.dashboard_address = dashboard.address
        return dashboard

    def dashboard_login(self) -> str:
        """A one-time URL that logs a browser in to the dashboard ("" when no dashboard runs)."""
        return self.login_link() if self.login_link is not None else ""
