"""The seeds' RL pattern on the smallest real cluster: two workers of one CPU each (a 2-core machine).

With one reserved CPU per actor (the old default) the curriculum and weight actors alone
would fill both workers and the rollout group would wait for ever; actors reserve nothing
by default, so everything runs, the four jobs (half a CPU each) included.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.test_actor_groups import Idle, run_rl_pattern
from fray import ActorConfig, ResourceConfig
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
