"""A worker whose fork server cannot start runs its tasks as fresh processes: nothing waits, nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

import fray.cluster.server.worker as worker_module
from fray import Entrypoint, JobRequest, JobStatus
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from fray.cluster.server.worker import Worker


def _shout(word: str) -> None:
    print(word.upper())


def test_tasks_start_as_fresh_processes_when_the_fork_server_cannot(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The fork server is what a callable task is normally forked from, with its entrypoint in
    # the fork request. Without it the worker starts a new interpreter, which must find the
    # entrypoint in the task's directory all the same.
    def cannot_start() -> None:
        raise OSError("cannot start the fork server (injected)")

    monkeypatch.setattr(worker_module, "ForkServer", cannot_start)
    # A fresh interpreter imports this test's module by name, as the worker's own environment allows.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    worker = Worker(cluster.address, token=cluster.worker_credential, workdir=str(tmp_path / "w"), cpu=1).start()
    client = ClusterClient(cluster.address, token=cluster.token)
    try:
        job = client.submit(JobRequest(name="shout", entrypoint=Entrypoint.from_callable(_shout, args=("hello",))))
        assert job.wait(60) == JobStatus.SUCCEEDED
        assert "HELLO" in job.logs()
        program = client.submit(JobRequest(name="true", entrypoint=Entrypoint.from_binary("true", [])))
        assert program.wait(60) == JobStatus.SUCCEEDED
    finally:
        client.shutdown(wait=False)
        worker.stop()
