"""The cluster client: what it loads, and waiting for many jobs in one long-poll."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import fray
from fray import Entrypoint, JobRequest, JobStatus
from fray.cluster.client import ClusterClient, ClusterJobHandle


def wait_for_file(path: str, timeout: float = 60.0) -> None:
    """Inside a job: block until ``path`` exists (the test's way to hold a job running)."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def test_the_client_loads_neither_the_store_nor_the_worker_daemon() -> None:
    heavy = ["fray.cluster.server.store", "fray.cluster.server.worker", "fray.cluster.server.controller", "sqlite3"]
    code = f"import sys, fray.cluster.client; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_wait_some_returns_once_any_job_finished(cluster_client: ClusterClient, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    slow = cluster_client.submit(
        JobRequest(name="slow", entrypoint=Entrypoint.from_callable(wait_for_file, args=(str(gate),)))
    )
    quick = cluster_client.submit(JobRequest(name="quick", entrypoint=Entrypoint.from_callable(print, args=("hi",))))
    statuses = ClusterJobHandle._fray_wait_some([slow, quick], 60.0)
    assert statuses[0] in (JobStatus.PENDING, JobStatus.RUNNING) and statuses[1] == JobStatus.SUCCEEDED
    # The same cluster under a second address: jobs of two "controllers" are polled side by side.
    host, port = cluster_client.address.rsplit(":", 1)
    assert host == "127.0.0.1"
    elsewhere = ClusterJobHandle(f"localhost:{port}", slow.job_id, cluster_client._token)
    statuses = ClusterJobHandle._fray_wait_some([elsewhere, quick], 60.0)
    assert statuses[0] in (JobStatus.PENDING, JobStatus.RUNNING) and statuses[1] == JobStatus.SUCCEEDED
    # Nothing finishes: the wait ends at its timeout with every job still unfinished.
    assert ClusterJobHandle._fray_wait_some([slow, elsewhere], 0.2)[0] in (JobStatus.PENDING, JobStatus.RUNNING)
    gate.touch()
    assert fray.wait_all([slow, quick], timeout=60) == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED]
