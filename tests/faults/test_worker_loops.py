"""A worker survives input that cannot be run and keeps taking work (issue 10, case 3); a SIGTERM drains it (issue 36)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from fray import ActorConfig, Entrypoint, EnvironmentConfig, JobFailed, JobRequest, JobStatus
from fray.cluster.protocol.controller_client import ops_client
from fray.cluster.protocol.records import WorkerState
from fray.cluster.server.launcher import LocalCluster
from fray.errors import ActorDiedError, ActorUnavailableError
from support import alive, wait_until

from .helpers import client_of, gated_then_mark, lines, wait_lines, with_workers


@pytest.mark.parametrize("where", ["argv", "env"])
def test_a_nul_byte_fails_the_job_and_the_worker_keeps_working(cluster: LocalCluster, where: str) -> None:
    client = with_workers(cluster, 2)
    if where == "argv":
        request = JobRequest(name="nul", entrypoint=Entrypoint.from_binary("echo", ["a\0b"]))
    else:
        request = JobRequest(
            name="nul",
            entrypoint=Entrypoint.from_binary("true"),
            environment=EnvironmentConfig(env_vars={"BAD": "x\0y"}),
        )
    bad = client.submit(request)
    with pytest.raises(JobFailed, match="NUL byte"):
        bad.wait(timeout=60)
    for i in range(3):  # the same (only) worker still runs jobs
        good = client.submit(JobRequest(name=f"fine-{i}", entrypoint=Entrypoint.from_binary("true")))
        assert good.wait(timeout=60) == JobStatus.SUCCEEDED


def test_a_sigterm_drains_the_worker_its_job_is_preempted_and_completes_once_elsewhere(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    client = with_workers(cluster, 2)
    job = client.submit(
        JobRequest(
            name="drained",
            entrypoint=Entrypoint.from_callable(gated_then_mark, args=(str(tmp_path),)),
            max_retries_failure=0,  # a drain counted as the job's failure would fail it
            max_retries_preemption=3,
        )
    )
    first = wait_lines(tmp_path / "drained.started", 1, "the job to start on w-a")
    assert first[0].split()[:2] == ["0", "w-a"]
    cluster.add_worker("w-b", "--cpu", "2")
    cluster.wait_for_workers(2)
    worker = cluster.workers["w-a"]
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=40) == 0, "a drained worker exits cleanly"
    drain_seconds = time.monotonic() - signalled
    starts = wait_lines(tmp_path / "drained.started", 2, "the job to start again on w-b")
    assert starts[1].split()[:2] == ["1", "w-b"]
    (tmp_path / "go").touch()
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    view = job.view()
    assert view.attempt == 1
    assert len(lines(tmp_path / "drained.done")) == 1, "the job completed exactly once"
    assert lines(tmp_path / "drained.done")[0].split()[:2] == ["1", "w-b"]
    states = {w.info.worker_id: w.state for w in client._controller.list_workers()}
    assert states == {"w-a": WorkerState.STOPPED, "w-b": WorkerState.ALIVE}
    ops = ops_client(cluster.address, cluster.token)
    try:
        detail = ops.job_detail(job.job_id)
    finally:
        ops.close()
    assert (detail["failures"], detail["preemptions"]) == (0, 1), "the drain was a preemption, not a failure"
    first_attempt = [t for t in detail["tasks"] if t["attempt"] == 0]
    assert [(t["state"], t["worker"]) for t in first_attempt] == [("lost", "w-a")]
    assert "left the cluster (SIGTERM" in first_attempt[0]["error"]
    print(f"SIGTERM to worker exit: {drain_seconds:.3f}s")
    assert drain_seconds < 10


def test_a_drain_is_bounded_by_drain_seconds_even_for_a_task_that_ignores_sigterm(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.add_worker("w-a", "--cpu", "1", "--drain-seconds", "1")
    cluster.wait_for_workers(1)
    client = client_of(cluster)
    marker = tmp_path / "started"
    stubborn = client.submit(
        JobRequest(
            name="stubborn",
            entrypoint=Entrypoint.from_binary("sh", ["-c", f"trap '' TERM; echo $$ >> {marker}; sleep 600"]),
            max_retries_preemption=1,
        )
    )
    wait_lines(marker, 1, "the task to start")
    worker = cluster.workers["w-a"]
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    took = time.monotonic() - signalled
    print(f"SIGTERM to exit with a task ignoring SIGTERM, --drain-seconds 1: {took:.3f}s")
    assert 1.0 <= took < 6.0, "it waited for the task, up to --drain-seconds, then killed it and left"
    assert not alive(int(lines(marker)[0])), "the task was killed before the worker left"
    ops = ops_client(cluster.address, cluster.token)
    try:
        detail = ops.job_detail(stubborn.job_id)
    finally:
        ops.close()
    assert (detail["state"], detail["failures"], detail["preemptions"]) == ("pending", 0, 1), detail
    assert [t["state"] for t in detail["tasks"] if t["attempt"] == 0] == ["lost"]
    stubborn.terminate()
    client.shutdown()


class WhereAmI:
    """An actor that says which worker it runs on."""

    def where(self) -> str:
        return os.environ["FRAY_WORKER_ID"]


def test_an_actor_on_a_drained_worker_restarts_elsewhere_instead_of_ending(cluster: LocalCluster) -> None:
    # An actor exits 0 on SIGTERM (it stops serving cleanly): a drain must not count that as its job's end.
    client = with_workers(cluster, 1)
    actor = client.create_actor(WhereAmI, name="where", actor_config=ActorConfig(max_restarts=2))
    assert actor.where.remote().result(timeout=60) == "w-a"
    cluster.add_worker("w-b", "--cpu", "1")
    cluster.wait_for_workers(2)
    cluster.workers["w-a"].send_signal(signal.SIGTERM)
    assert cluster.workers["w-a"].wait(timeout=30) == 0
    assert wait_until(lambda: _where(actor) == "w-b", timeout=60, what="the actor to serve again on w-b")
    client.shutdown()


def _where(actor: Any) -> str | None:
    try:
        return str(actor.where.remote().result(timeout=10))
    except (ActorDiedError, ActorUnavailableError):
        return None
