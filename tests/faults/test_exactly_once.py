"""Exactly-once completion and fencing (issue 10, cases 1 and 2), with real processes and real signals."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from fray import Entrypoint, EnvironmentConfig, JobRequest, JobStatus
from fray.cluster.server.launcher import LocalCluster
from support import alive, wait_until

from .helpers import client_of, gated_then_mark, lines, wait_lines, with_workers

JOBS = 8


@pytest.mark.slow
@pytest.mark.parametrize("outage", [2.0, 6.0, 12.0])
def test_jobs_finishing_during_a_controller_outage_complete_exactly_once(
    cluster: LocalCluster, tmp_path: Path, outage: float
) -> None:
    # Several workers: before the fix each one independently lost the race between its two loops.
    client = with_workers(cluster, 2, 2, 2, 2)
    jobs = [
        client.submit(
            JobRequest(name=f"j{i}", entrypoint=Entrypoint.from_callable(gated_then_mark, args=(str(tmp_path),)))
        )
        for i in range(JOBS)
    ]
    for i in range(JOBS):
        wait_lines(tmp_path / f"j{i}.started", 1, f"job j{i} to start")
    cluster.kill_controller()
    down_since = time.monotonic()
    (tmp_path / "go").touch()
    for i in range(JOBS):  # every job finishes while the controller is down
        wait_lines(tmp_path / f"j{i}.done", 1, f"job j{i} to finish during the outage")
    # The outage itself is the fault being injected: hold it for its full length.
    time.sleep(max(0.0, outage - (time.monotonic() - down_since)))
    cluster.start_controller()
    for job in jobs:
        assert job.wait(timeout=90) == JobStatus.SUCCEEDED
        assert job.view().attempt == 0, "a job that finished during the outage was run again"
    for i in range(JOBS):
        assert len(lines(tmp_path / f"j{i}.started")) == 1, f"j{i} started twice"
        assert len(lines(tmp_path / f"j{i}.done")) == 1, f"j{i} completed twice"
    assert all(w.poll() is None for w in cluster.workers.values()), "the workers rode out the outage"


@pytest.mark.slow
@pytest.mark.parametrize("environment", ["worker", "workspace"])
def test_a_paused_worker_is_fenced_and_no_task_completes_twice(
    cluster: LocalCluster, tmp_path: Path, environment: str
) -> None:
    client = with_workers(cluster, 8)
    env = None
    if environment == "workspace":  # not forked from the warm interpreter, but still launched (and fenced) by it
        project = tmp_path / "project"
        project.mkdir()
        (project / "pyproject.toml").write_text('[project]\nname = "fenced"\nversion = "0"\n')
        env = EnvironmentConfig(workspace=str(project))
    jobs = [
        client.submit(
            JobRequest(
                name=f"p{i}",
                entrypoint=Entrypoint.from_callable(gated_then_mark, args=(str(tmp_path),)),
                max_retries_preemption=5,
                environment=env,
            )
        )
        for i in range(4)
    ]
    first = [wait_lines(tmp_path / f"p{i}.started", 1, f"job p{i} to start")[0] for i in range(4)]
    cluster.add_worker("w-b", "--cpu", "8")
    cluster.wait_for_workers(2)
    paused = cluster.workers["w-a"]
    paused.send_signal(signal.SIGSTOP)  # frozen: no heartbeats, no lease renewals
    try:
        for i in range(4):  # declared lost, and every job started again on the other worker
            started = wait_lines(tmp_path / f"p{i}.started", 2, f"job p{i} to restart elsewhere")
            assert started[1].split()[:2] == ["1", "w-b"]
        # The paused worker's tasks were killed by its lease before their replacements started.
        for line in first:
            pid = int(line.split()[2])
            assert not alive(pid), "a task of the frozen worker still runs beside its replacement"
        (tmp_path / "go").touch()
        for job in jobs:
            assert job.wait(timeout=90) == JobStatus.SUCCEEDED
    finally:
        paused.send_signal(signal.SIGCONT)

    def rejoined() -> bool:
        return any(w.info.worker_id == "w-a" and w.info.alive for w in client_of(cluster)._controller.list_workers())

    wait_until(rejoined, what="the paused worker to rejoin")
    for i, job in enumerate(jobs):
        done = lines(tmp_path / f"p{i}.done")
        assert len(done) == 1 and done[0].startswith("1 w-b"), f"p{i} completed {len(done)} times: {done}"
        assert job.status() == JobStatus.SUCCEEDED
