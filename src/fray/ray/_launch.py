"""How one :class:`~fray.ray.RayClient` starts work on Ray: what its jobs share.

A :class:`Launcher` holds the per-client pieces every job kind uses: the Ray task that
runs a replica (with its options cached per kind of job), the runtime env of a job,
Ray's job-submission client for binary jobs, and the reaper thread that settles the
callable jobs nobody waits on (so their retries still happen on their own).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from typing import Any, Protocol

from fray.core._client_core import random_hex
from fray.job import JobRequest
from fray.ray._connection import prepare_token_auth
from fray.ray.inside import _worker
from fray.ray.resources import head_node_resource, ray_options
from fray.resources import ResourceConfig

__all__ = ["Launcher", "Watched", "unique_suffix", "user_env"]


def unique_suffix() -> str:
    """Sixteen hex digits: unique across every client of a cluster."""
    return random_hex(16)


def user_env(request: JobRequest) -> dict[str, str]:
    """The environment variables the request asks for."""
    return dict(request.environment.env_vars) if request.environment is not None else {}


def runtime_env(request: JobRequest, env: dict[str, str]) -> dict[str, Any]:
    """The Ray runtime env for ``request``: env vars, working dir, pip packages, container image."""
    result: dict[str, Any] = {"env_vars": dict(env)}
    environment = request.environment
    if environment is not None:
        if environment.workspace:
            result["working_dir"] = environment.workspace
        if environment.pip_packages:
            result["pip"] = list(environment.pip_packages)
        if environment.docker_image:
            result["image_uri"] = environment.docker_image
    return result


def _needs_runtime_env(request: JobRequest) -> bool:
    environment = request.environment
    return environment is not None and bool(
        environment.workspace or environment.pip_packages or environment.docker_image
    )


class Watched(Protocol):
    """What the reaper needs of a callable job."""

    @property
    def finished(self) -> bool:
        """True once the job's status is final."""
        ...

    def _collect(
        self, attempt: int, refs: list[Any], ready: list[Any], fetched: tuple[str, Any] | None = None
    ) -> None: ...


class Launcher:
    """The per-client state of starting jobs on Ray."""

    REAP_PERIOD = 0.1  # seconds; how soon a job nobody waits on notices it finished or must retry
    REAP_LINGER = 2.0  # seconds the reaper outlives the last job: jobs run one at a time start no thread each
    _JOIN_TIMEOUT = 10.0  # seconds shutdown() waits for an idle reaper's last ray.wait (it takes milliseconds)

    def __init__(self, address: str | None, namespace: str, spec: str) -> None:
        self.address = address
        self.namespace = namespace
        self.spec = spec
        self.monitor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fray-ray-monitor")
        self._lock = threading.Lock()
        self._pin: str | None = None
        self._jobs_api: Any = None
        self._remote_replica: Any = None
        self._options_cache: dict[tuple[str, ResourceConfig], tuple[dict[str, Any], Any]] = {}
        # Every replica's ref not yet seen completed, with its job, attempt and the attempt's refs.
        self._pending: dict[Any, tuple[Watched, int, list[Any]]] = {}
        self._reaper: threading.Thread | None = None
        self._reaper_wake = threading.Event()
        self._closing = False

    def pin_resource(self) -> str:
        """The resource that pins work to the head node (see :func:`~fray.ray.resources.head_node_resource`)."""
        if self._pin is None:
            import ray

            self._pin = head_node_resource(ray.cluster_resources())
        return self._pin

    def replica_fn(self) -> Any:
        """The Ray remote function that runs one replica of a callable job."""
        if self._remote_replica is None:
            import ray

            # Fray runs the retry loop itself (two budgets); Ray must not retry behind its back.
            self._remote_replica = ray.remote(max_retries=0)(_worker.run_job_replica)
        return self._remote_replica

    def task_remote(self, request: JobRequest) -> tuple[dict[str, Any], Any]:
        """The Ray options for ``request``'s replicas, and the replica function with them applied.

        Cached per job name and resources: Ray validates options on every ``.options()``
        call, and repeated submissions of the same kind of job are the common case.
        """
        if _needs_runtime_env(request):
            options = self._task_options(request)
            return options, self.replica_fn().options(**options)
        key = (request.name, request.resources)
        cached = self._options_cache.get(key)
        if cached is None:
            if len(self._options_cache) >= 256:
                self._options_cache.clear()
            options = self._task_options(request)
            cached = self._options_cache[key] = (options, self.replica_fn().options(**options))
        return cached

    def _task_options(self, request: JobRequest) -> dict[str, Any]:
        options = ray_options(request.resources, pin_resource=self.pin_resource())
        options["name"] = request.name
        if _needs_runtime_env(request):
            # The replica sets its own env vars (they differ per replica); the rest is Ray's to prepare.
            options["runtime_env"] = {k: v for k, v in runtime_env(request, {}).items() if k != "env_vars"}
        return options

    def job_submission(self) -> Any:
        """Ray's ``JobSubmissionClient`` for the cluster (binary jobs)."""
        if self._jobs_api is None:
            from ray.job_submission import JobSubmissionClient

            import ray

            prepare_token_auth(self.address)
            if self.address and self.address.startswith("ray://"):
                host = self.address[len("ray://") :].rsplit(":", 1)[0]
                address = os.environ.get("RAY_API_SERVER_ADDRESS") or f"http://{host}:8265"
            else:
                # The connected cluster's own GCS, which knows its dashboard: left to itself, Ray
                # looks for "the" local cluster and gives up when this machine runs several.
                address = ray.get_runtime_context().gcs_address
            self._jobs_api = JobSubmissionClient(address)
        return self._jobs_api

    # ----- the reaper ------------------------------------------------------------------------

    def watch(self, job: Watched, attempt: int, refs: list[Any]) -> None:
        """Make sure the attempt ``refs`` of ``job`` is settled (and retried) even if nobody waits on it."""
        with self._lock:
            for ref in refs:
                self._pending[ref] = (job, attempt, refs)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="fray-ray-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                refs = list(self._pending)
                if refs:
                    idle_since = None
                else:
                    now = time.monotonic()
                    idle_since = now if idle_since is None else idle_since
                    if self._closing or now - idle_since >= self.REAP_LINGER:
                        self._reaper = None  # watch() starts a new reaper with the next job
                        return
            with contextlib.suppress(Exception):  # never let the reaper die: Ray may be shutting down under it
                if refs:
                    self._settle(refs)
            if self._reaper_wake.wait(self.REAP_PERIOD):
                self._reaper_wake.clear()  # woken once by shutdown(); a job still running is then polled as before

    def _settle(self, refs: list[Any]) -> None:
        """Settle the jobs of those ``refs`` that completed (their waiters usually did already)."""
        import ray

        # One ray.wait over every replica still running, and nothing per job that is not done:
        # a pass costs what Ray's own wait costs, even with thousands of jobs.
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        by_job: dict[Watched, tuple[int, list[Any], list[Any]]] = {}
        with self._lock:
            for ref in ready:
                job, attempt, attempt_refs = self._pending.pop(ref)
                by_job.setdefault(job, (attempt, attempt_refs, []))[2].append(ref)
        for job, (attempt, attempt_refs, done) in by_job.items():
            if not job.finished:
                job._collect(attempt, attempt_refs, done)

    def shutdown(self) -> None:
        """Stop the monitor thread, and the reaper once no job it watches is running.

        The reaper is joined when it has nothing left to watch: a Ray call still in flight
        when the caller goes on to ``ray.shutdown()`` ends the whole process. A job that
        outlives the client (detached) keeps the reaper until it finishes.
        """
        with self._lock:
            self._closing = True
            reaper = self._reaper
            busy = any(not job.finished for job, _, _ in self._pending.values())
        self._reaper_wake.set()
        if reaper is not None and not busy and reaper is not threading.current_thread():
            reaper.join(timeout=self._JOIN_TIMEOUT)
        self.monitor.shutdown(wait=True)
