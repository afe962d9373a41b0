"""``fray.testing``: faults injected on purpose behave as the real ones, on every backend where they exist."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, FrayError, JobFailed, JobRequest, JobStatus, ResourceConfig, current_job
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.protocol.credentials import WORKER, Credential, user_principal
from fray.cluster.server.launcher import LocalCluster
from fray.errors import NotFound, PermissionDenied
from fray.testing import kill_worker, preempt
from support import wait_until


class Beacon:
    """An actor each attempt of a job reports to, so a test knows which attempt runs now."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def arrive(self, attempt: int, replica: int) -> None:
        self.seen.append((attempt, replica))

    def get(self) -> list[tuple[int, int]]:
        return list(self.seen)


def run_until_attempt(beacon, finish_on: int) -> None:
    """Report this attempt, then run until preempted -- or return at once on attempt ``finish_on``."""
    info = current_job()
    assert info is not None
    beacon.arrive(info.attempt, info.replica_index)
    if info.attempt >= finish_on:
        return
    while True:
        time.sleep(0.02)


def run_until_lost(beacon) -> None:
    """Attempt 0 reports and runs until its host is lost; a later attempt (elsewhere) just succeeds."""
    info = current_job()
    assert info is not None
    if info.attempt > 0:
        return
    beacon.arrive(info.attempt, info.replica_index)
    while True:
        time.sleep(0.02)


def _arrived(beacon, attempt: int, replicas: int = 1) -> bool:
    return sum(1 for a, _ in beacon.get() if a == attempt) >= replicas


def _job(client, beacon, name: str, *, finish_on: int, replicas: int = 1, preemptions: int = 0) -> JobRequest:
    return JobRequest(
        name=name,
        entrypoint=Entrypoint.from_callable(run_until_attempt, args=(beacon, finish_on)),
        resources=ResourceConfig(cpu=0.5),
        replicas=replicas,
        max_retries_failure=0,
        max_retries_preemption=preemptions,
    )


def test_preempted_job_is_retried_within_its_preemption_budget(client, uid):
    beacon = client.create_actor(Beacon, name=f"beacon-{uid}")
    job = client.submit(_job(client, beacon, f"preempted-{uid}", finish_on=1, preemptions=1))
    wait_until(lambda: _arrived(beacon, 0), timeout=120, what="attempt 0 running")
    preempt(job)
    # No failure retry is allowed, so only the preemption budget can have let attempt 1 run.
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    assert [a for a, _ in beacon.get()] == [0, 1]


def test_preemption_past_the_budget_fails_with_the_lifecycle_wording(client, uid):
    beacon = client.create_actor(Beacon, name=f"beacon-{uid}")
    job = client.submit(_job(client, beacon, f"exhausted-{uid}", finish_on=99, preemptions=1))
    wait_until(lambda: _arrived(beacon, 0), timeout=120, what="attempt 0 running")
    preempt(job)
    wait_until(lambda: _arrived(beacon, 1), timeout=120, what="attempt 1 running")
    preempt(job)
    with pytest.raises(JobFailed) as caught:
        job.wait(timeout=120)
    message = str(caught.value)
    assert "gave up after 2 attempts: preemption retries exhausted, 1 allowed" in message
    assert "0 failure and 1 preemption retries used" in message


def test_preempting_one_replica_retries_the_whole_gang(client, uid):
    beacon = client.create_actor(Beacon, name=f"beacon-{uid}")
    job = client.submit(_job(client, beacon, f"gang-{uid}", finish_on=1, replicas=2, preemptions=1))
    wait_until(lambda: _arrived(beacon, 0, replicas=2), timeout=120, what="both replicas of attempt 0 running")
    preempt(job, replica=1)
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    assert sorted(beacon.get()) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_preempted_replica_without_budget_fails_the_job_naming_it(client, uid):
    beacon = client.create_actor(Beacon, name=f"beacon-{uid}")
    job = client.submit(_job(client, beacon, f"nobudget-{uid}", finish_on=99, replicas=2))
    wait_until(lambda: _arrived(beacon, 0, replicas=2), timeout=120, what="both replicas running")
    preempt(job, replica=0)
    with pytest.raises(JobFailed, match="replica 0 of 2: "):
        job.wait(timeout=120)
    assert [a for a, _ in beacon.get()] == [0, 0]


def test_preempt_refuses_what_it_cannot_preempt(client, uid):
    beacon = client.create_actor(Beacon, name=f"beacon-{uid}")
    job = client.submit(_job(client, beacon, f"refused-{uid}", finish_on=0))
    with pytest.raises(TypeError, match="job handle"):
        preempt(beacon)
    with pytest.raises(ConfigError, match="replica index"):
        preempt(job, replica=-1)
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    with pytest.raises(FrayError, match="nothing to preempt"):
        preempt(job)


def test_preempt_names_a_replica_the_job_lacks(client, uid):
    beacon = client.create_actor(Beacon, name=f"beacon-{uid}")
    job = client.submit(_job(client, beacon, f"range-{uid}", finish_on=99))
    try:
        wait_until(lambda: _arrived(beacon, 0), timeout=120, what="attempt 0 running")
        with pytest.raises(ConfigError, match=r"has 1 replica\(s\)"):
            preempt(job, replica=1)
    finally:
        job.terminate()


def test_preempt_is_refused_by_name_on_monarch(monarch_client, uid):
    job = monarch_client.submit(
        JobRequest(name=f"nopreempt-{uid}", entrypoint=Entrypoint.from_callable(time.sleep, args=(60,)))
    )
    try:
        with pytest.raises(ConfigError, match="Monarch backend does not preempt"):
            preempt(job)
    finally:
        job.terminate()


def test_only_the_jobs_user_or_the_administrator_may_preempt_it_on_a_cluster(fray_cluster, uid):
    master = fray_cluster.token.encode()
    owner = ClusterClient(fray_cluster.address, token=Credential.mint(master, user_principal(f"owner{uid}")))
    job = owner.submit(JobRequest(name=f"victim-{uid}", entrypoint=Entrypoint.from_binary("sleep", ["300"])))
    try:
        wait_until(lambda: job.status() == JobStatus.RUNNING, timeout=120, what="the job running")
        other = controller_client(fray_cluster.address, Credential.mint(master, user_principal(f"other{uid}")))
        with pytest.raises(PermissionDenied, match=f"belongs to user 'owner{uid}'"):
            other.preempt(job.job_id)
        worker = controller_client(fray_cluster.address, Credential.mint(master, WORKER))
        with pytest.raises(PermissionDenied):
            worker.preempt(job.job_id)
        assert job.view().attempt == 0 and job.status() == JobStatus.RUNNING
    finally:
        job.terminate()
        owner.shutdown(wait=False)


def test_kill_worker_is_only_for_a_fray_cluster(client, request):
    if "cluster_client" in request.fixturenames:
        pytest.skip("the Fray cluster's kill_worker is specified by test_killed_worker_is_lost_and_its_job_retried")
    with pytest.raises(ConfigError, match="only a Fray cluster"):
        kill_worker(client, "worker-0")


def test_killed_worker_is_lost_and_its_job_retried(tmp_path, uid):
    # A cluster of this test's own: the session cluster's workers are shared with other tests.
    with LocalCluster(tmp_path / "cluster", worker_timeout=3.0, env=_test_env()) as cluster:
        cluster.start_controller()
        cluster.add_worker("doomed", "--cpu", "2")
        cluster.wait_for_workers(1)
        client = ClusterClient(cluster.address, token=cluster.token)
        try:
            beacon = client.create_actor(Beacon, name=f"beacon-{uid}", resources=ResourceConfig(cpu=0))
            request = JobRequest(
                name=f"onlost-{uid}",
                entrypoint=Entrypoint.from_callable(run_until_lost, args=(beacon,)),
                resources=ResourceConfig(cpu=1),
                max_retries_preemption=1,
            )
            job = client.submit(request)
            wait_until(lambda: _arrived(beacon, 0), timeout=120, what="attempt 0 running on the doomed worker")
            kill_worker(client, "doomed")
            # Once its heartbeat is overdue the worker is lost, and the job waits for another host.
            wait_until(lambda: job.view().attempt == 1, timeout=120, what="the job retried after its worker was lost")
            assert "lost" in job.view().error
            with pytest.raises(NotFound, match="no alive worker 'doomed'"):
                kill_worker(client, "doomed")
            cluster.add_worker("spare", "--cpu", "2")
            # The beacon died with the doomed worker too, so attempt 1 does not report to it.
            assert job.wait(timeout=120) == JobStatus.SUCCEEDED
            assert job.view().attempt == 1
        finally:
            client.shutdown(wait=False)


def _test_env() -> dict[str, str]:
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    return {"PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
