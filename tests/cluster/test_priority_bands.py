"""Priority bands on the smallest real cluster (two workers of one CPU each): order, preemption, what users see.

Issue 34's "done when": two batch jobs fill the cluster; a production job submitted then starts
within 5 s; one batch job shows one preemption ("preempted by job ID (band production)") and later
completes exactly once; a 2-replica batch gang is preempted whole; jobs of the same band, and an
interactive job behind production work, never preempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, JobStatus, PriorityBand, ResourceConfig, current_job, wait_all
from fray.cluster.client import ClusterClient, ClusterJobHandle
from fray.cluster.server.launcher import LocalCluster
from support import wait_until

ONE_CPU = ResourceConfig(cpu=1, ram="0b", disk="0b")


def _sleeper(directory: str, seconds: float) -> None:
    """Note each attempt's start and end in a file of its own (per job and replica), sleeping in between."""
    job = current_job()
    assert job is not None
    path = Path(directory) / f"{job.name}-{job.replica_index}"
    with path.open("a") as out:
        out.write(f"start {job.attempt}\n")
    time.sleep(seconds)
    with path.open("a") as out:
        out.write(f"done {job.attempt}\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    env = {"PYTHONPATH": os.pathsep.join([tests_dir, *paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
    started = LocalCluster(tmp_path_factory.mktemp("bands-cluster"), env=env)
    try:
        started.start_controller()
        started.add_worker("one-cpu-0", "--cpu", "1")
        started.add_worker("one-cpu-1", "--cpu", "1")
        started.wait_for_workers(2)
        yield started
    finally:
        started.stop()


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[ClusterClient]:
    made = ClusterClient(cluster.address, token=cluster.token)
    yield made
    made.shutdown(wait=False)


def _submit(
    client: ClusterClient, name: str, band: PriorityBand, directory: Path, seconds: float, replicas: int = 1
) -> ClusterJobHandle:
    request = JobRequest(
        name=name,
        entrypoint=Entrypoint.from_callable(_sleeper, args=(str(directory), seconds)),
        resources=ONE_CPU,
        replicas=replicas,
        priority=band,
        max_retries_preemption=3,
    )
    handle = client.submit(request)
    assert isinstance(handle, ClusterJobHandle)
    return handle


def _running(*jobs: ClusterJobHandle) -> bool:
    return all(job.view().state == JobStatus.RUNNING for job in jobs)


def _cli(cluster: LocalCluster, home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(home), FRAY_TOKEN=cluster.token, FRAY_CLIENT_SPEC=f"fray://{cluster.address}")
    out = subprocess.run([sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_production_preempts_one_batch_job_which_later_completes_once(
    client: ClusterClient, cluster: LocalCluster, tmp_path: Path
) -> None:
    batch = [_submit(client, f"batch{i}", PriorityBand.BATCH, tmp_path, 8) for i in range(2)]
    wait_until(lambda: _running(*batch), 60, "both batch jobs running")
    submitted = time.monotonic()
    production = _submit(client, "prod", PriorityBand.PRODUCTION, tmp_path, 2)
    wait_until(lambda: _running(production), 5, "the production job running within 5 s")
    assert time.monotonic() - submitted < 5
    views = [job.view() for job in batch]
    preempted = [v for v in views if v.attempt == 1]
    assert len(preempted) == 1, views
    victim = preempted[0]
    reason = f"preempted by job {production.job_id} (band production)"
    assert reason in victim.error, victim
    assert victim.band == 3 and production.view().band == 1
    status = _cli(cluster, tmp_path, "job", "status", victim.job_id)
    assert reason in status and "band batch" in status and "preemptions: 1 of 3" in status
    listing = _cli(cluster, tmp_path, "job", "list", "--limit", "3")
    assert "production" in listing and "batch" in listing
    assert production.wait(timeout=60) == JobStatus.SUCCEEDED
    assert wait_all(batch, timeout=90) == [JobStatus.SUCCEEDED] * 2
    lines = (tmp_path / f"{victim.name}-0").read_text().split()
    assert lines.count("done") == 1 and lines[-2:] == ["done", "1"]  # ran again as attempt 1, ended once
    other = next(v for v in views if v is not victim)
    assert (tmp_path / f"{other.name}-0").read_text() == "start 0\ndone 0\n"  # never preempted


def test_a_batch_gang_is_preempted_whole(client: ClusterClient, tmp_path: Path) -> None:
    gang = _submit(client, "gang", PriorityBand.BATCH, tmp_path, 6, replicas=2)
    wait_until(lambda: _running(gang), 60, "the gang running on both workers")
    production = _submit(client, "prod", PriorityBand.PRODUCTION, tmp_path, 1)
    wait_until(lambda: _running(production), 5, "the production job running within 5 s")
    view = gang.view()
    assert view.attempt == 1 and f"preempted by job {production.job_id} (band production)" in view.error
    assert gang.wait(timeout=90) == JobStatus.SUCCEEDED
    for replica in (0, 1):  # both replicas of attempt 0 were stopped (never half a gang), both ran again once
        # (a replica preempted while its process was still starting never wrote "start 0")
        text = (tmp_path / f"gang-{replica}").read_text()
        assert "done 0" not in text and text.endswith("start 1\ndone 1\n"), text


def test_the_same_band_and_interactive_behind_production_never_preempt(
    client: ClusterClient, cluster: LocalCluster, tmp_path: Path
) -> None:
    jobs = [_submit(client, f"hold{i}", PriorityBand.PRODUCTION, tmp_path, 30) for i in range(2)]
    holders = list(jobs)
    try:
        wait_until(lambda: _running(*holders), 60, "production holding both workers")
        third = _submit(client, "third", PriorityBand.PRODUCTION, tmp_path, 1)
        interactive = _submit(client, "inter", PriorityBand.INTERACTIVE, tmp_path, 1)
        jobs += [third, interactive]
        listing = _cli(cluster, tmp_path, "job", "list", "--limit", "4")
        time.sleep(3)  # several passes
        assert [h.view().attempt for h in holders] == [0, 0]
        assert _running(*holders)
        assert third.view().state == interactive.view().state == JobStatus.PENDING
        detail = _cli(cluster, tmp_path, "job", "status", interactive.job_id)
        assert "waits behind 1 job(s) of band production" in detail, detail
        assert interactive.view().pending_reason.endswith("; waits behind 1 job(s) of band production")
        assert "waits behind" not in third.view().pending_reason  # nothing better than production
        assert "interactive" in listing
    finally:
        for job in jobs:
            job.terminate()
