"""Fixtures for the Fray cluster backend: a real controller and workers, started once per session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster


@pytest.fixture(scope="session")
def fray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A controller and two workers (real processes on 127.0.0.1), shared by the whole session."""
    # Task processes must import the test modules that define the jobs' functions and actors.
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    env = {"PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
    cluster = LocalCluster(tmp_path_factory.mktemp("fray-cluster"), env=env)
    try:
        # One worker is non-preemptible, as a real cluster's head-like hosts are, so that
        # ResourceConfig(preemptible=False) has somewhere to go.
        cluster.start_controller()
        cluster.add_worker("worker-0", "--cpu", "8", "--attr", "preemptible=false")
        cluster.add_worker("worker-1", "--cpu", "8")
        cluster.wait_for_workers(2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_client(fray_cluster: LocalCluster) -> Iterator[ClusterClient]:
    """A client of the shared cluster; each test gets its own namespace."""
    client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
    yield client
    client.shutdown(wait=False)
