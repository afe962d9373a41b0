"""Fixtures for the Iris backend: one real local Iris cluster per test session, a fresh client per test.

The cluster is Iris's own local mode (``fray.iris.localcluster``): a controller and two
workers in a child process, each task a subprocess of it. Tasks inherit that process's
environment, so it gets a ``PYTHONPATH`` with the test directories: tasks unpickle the
test modules' functions and classes by reference, as on every other backend.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def iris_installed() -> bool:
    """True when the Iris backend can run here (``fray[iris]`` on Python >= 3.12)."""
    return sys.version_info >= (3, 12) and importlib.util.find_spec("iris.client") is not None


@pytest.fixture(scope="session")
def iris_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Iris cluster (two workers) shared by the whole session."""
    if not iris_installed():
        pytest.skip('the Iris backend needs Python >= 3.12 and pip install "fray[iris]"')
    from fray.iris.localcluster import LocalIrisCluster

    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    env = {"PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
    cluster = LocalIrisCluster(tmp_path_factory.mktemp("iris-cluster"), workers=2, env=env)
    cluster.start()
    try:
        _grant_production_band(cluster.address)
        yield cluster
    finally:
        cluster.stop()


def _grant_production_band(address: str) -> None:
    """Let this user submit production jobs, as an Iris admin would (Iris's default budget stops at interactive)."""
    import getpass

    from iris.cli.connect import rpc_client
    from iris.rpc import controller_pb2, job_pb2

    from fray.iris._connect import controller_url

    with rpc_client(controller_url(address), None) as rpc:
        user = getpass.getuser()
        budget = rpc.get_user_budget(controller_pb2.Controller.GetUserBudgetRequest(user_id=user))
        rpc.set_user_budget(
            controller_pb2.Controller.SetUserBudgetRequest(
                user_id=user, budget_limit=budget.budget_limit, max_band=job_pb2.PRIORITY_BAND_PRODUCTION
            )
        )


@pytest.fixture
def iris_client(iris_cluster: Any) -> Iterator[Any]:
    """A Fray IrisClient of the shared cluster; its jobs and actors are stopped after the test."""
    from fray.iris.client import IrisClient

    client = IrisClient(iris_cluster.address)
    yield client
    client.shutdown(wait=False)
