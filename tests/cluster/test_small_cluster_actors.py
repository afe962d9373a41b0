"""The seeds' RL pattern on the smallest real cluster: two workers of one CPU each (a 2-core machine).

With one reserved CPU per actor (the old default) the curriculum and weight actors alone
would fill both workers and the rollout group would wait for ever; actors reserve nothing
by default, so everything runs, the four jobs (half a CPU each) included.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.test_actor_groups import Idle, run_rl_pattern
from fray import (
    ActorConfig,
    Entrypoint,
    JobRequest,
    JobStatus,
    ResourceConfig,
    current_client,
    get_job_context,
    wait_all,
)
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    env = {"PYTHONPATH": os.pathsep.join([tests_dir, *paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
    cluster = LocalCluster(tmp_path_factory.mktemp("small-cluster"), env=env)
    try:
        cluster.start_controller()
        cluster.add_worker("one-cpu-0", "--cpu", "1")
        cluster.add_worker("one-cpu-1", "--cpu", "1")
        cluster.wait_for_workers(2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def small_client(small_cluster: LocalCluster) -> Iterator[ClusterClient]:
    client = ClusterClient(small_cluster.address, token=small_cluster.token)
    yield client
    client.shutdown(wait=False)


def test_rl_pattern_runs_on_two_one_cpu_workers(small_client):
    run_rl_pattern(small_client, "small")


def test_an_actor_with_explicit_resources_reserves_them(small_client):
    # Two actors of one CPU fill the two workers: a third waits, saying why, while default actors still start.
    busy = [
        small_client.create_actor(Idle, name=f"cpu-{i}", resources=ResourceConfig(cpu=1, ram="0b", disk="0b"))
        for i in range(2)
    ]
    assert all(isinstance(actor.ping(), int) for actor in busy)
    third = small_client.create_actor(Idle, name="cpu-2", resources=ResourceConfig(cpu=1, ram="0b", disk="0b"))
    free = small_client.create_actor(Idle, name="free", actor_config=ActorConfig(max_concurrency=2))
    assert isinstance(free.ping(), int)
    assert not third._fray_ready().done()


# ----- lend while blocked (issue 34): a job waiting on its own work gives its CPU back ----------------------------

ONE_CPU = ResourceConfig(cpu=1, ram="0b", disk="0b")


def _square(x: int) -> int:
    return x * x


def _fan_out(count: int) -> int:
    ctx = get_job_context()
    return sum(ctx.get([ctx.create_task(_square, i, resources=ONE_CPU) for i in range(count)], timeout=120))


def _job_that_fans_out_twice() -> int:
    # The job holds one CPU, the outer task the other; the inner tasks start only if both lend theirs.
    ctx = get_job_context()
    return ctx.get(ctx.create_task(_fan_out, 5, resources=ONE_CPU), timeout=150)


def _parent_of(count: int) -> None:
    client = current_client()
    children = [
        client.submit(
            JobRequest(name=f"child{i}", entrypoint=Entrypoint.from_callable(_square, args=(i,)), resources=ONE_CPU)
        )
        for i in range(count)
    ]
    assert wait_all(children, timeout=120) == [JobStatus.SUCCEEDED] * count


def test_a_job_whose_task_fans_out_and_waits_lends_its_cpu_and_completes(small_client):
    job = small_client.submit(
        JobRequest(name="fan-out", entrypoint=Entrypoint.from_callable(_job_that_fans_out_twice), resources=ONE_CPU)
    )
    assert job.wait(timeout=180) == JobStatus.SUCCEEDED


def test_parent_jobs_filling_the_cluster_lend_their_cpus_to_their_children(small_client):
    # Two parents hold both CPUs; their children start only because the parents lend theirs while they wait.
    parents = [
        small_client.submit(
            JobRequest(name=f"parent{i}", entrypoint=Entrypoint.from_callable(_parent_of, args=(2,)), resources=ONE_CPU)
        )
        for i in range(2)
    ]
    assert wait_all(parents, timeout=180) == [JobStatus.SUCCEEDED] * 2


def _gated(gate: str) -> str:
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)  # the task's own pacing while it waits for its gate
    return "slow"


def _first_of_a_slow_and_a_fast(gate: str) -> None:
    # The job holds one CPU and the slow task the other: the fast task starts only once the job lends its CPU.
    ctx = get_job_context()
    slow = ctx.create_task(_gated, gate, resources=ONE_CPU)
    fast = ctx.create_task(_square, 7, resources=ONE_CPU)
    ready, not_ready = ctx.wait([slow, fast], num_returns=1, timeout=60)
    assert ready == [fast] and not_ready == [slow] and ctx.get(fast) == 49
    Path(gate).write_text("go")
    assert ctx.get(slow, timeout=60) == "slow"


def test_wait_for_one_returns_the_fast_task_first_on_a_full_cluster(small_client, tmp_path):
    job = small_client.submit(
        JobRequest(
            name="first-of",
            entrypoint=Entrypoint.from_callable(_first_of_a_slow_and_a_fast, args=(str(tmp_path / "gate"),)),
            resources=ONE_CPU,
        )
    )
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
