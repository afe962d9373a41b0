"""Fixtures for the fault tests: a real controller and workers, started fresh for each test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.server.launcher import LocalCluster
from netns import hosts  # noqa: F401 - the simulated hosts fixture, for the tests here


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A controller (worker timeout 2 s) with no workers yet; the test adds them."""
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.startswith(tests_dir))}
    with LocalCluster(tmp_path / "cluster", worker_timeout=2.0, env=env) as c:
        c.start_controller()
        yield c
