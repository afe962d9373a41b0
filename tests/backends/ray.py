"""Fixtures for the Ray backend: one real local Ray per test session, a fresh client per test.

Starting Ray costs seconds, so ``ray_cluster`` starts it once (session scope) with the
job-submission server that binary jobs need (it lives in Ray's dashboard process).
``ray_client`` is then cheap: it attaches to that connection in a namespace of its
own, so actor names never collide between tests, and its shutdown kills the test's
actors and jobs, so a long session does not pile up idle actor processes.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Logical CPUs: Ray schedules on these, not on the machine's cores. Enough for the
# conformance suite's concurrent jobs and actors (each takes one by default).
RAY_TEST_CPUS = 8


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray started once for the whole session (skips if Ray is not installed)."""
    ray = pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')
    if ray.is_initialized():  # someone else's session: reuse it, leave it running
        yield ray
        return
    # Test modules are imported from tests/ directories that pytest put on sys.path;
    # Ray's worker processes inherit the environment of the raylet started here, so
    # they can import the same modules when they unpickle test classes and functions.
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([before] if before else [])])
    ray.init(
        address="local",
        num_cpus=RAY_TEST_CPUS,
        include_dashboard=True,  # hosts the job-submission server used by binary jobs
        log_to_driver=False,  # job output is checked through Fray's logs(), not the driver's stderr
        configure_logging=False,
    )
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def ray_client(ray_cluster: Any) -> Iterator[Any]:
    """A RayClient on the session's Ray, in a namespace of its own; shut down after the test."""
    from fray.ray import RayClient

    client = RayClient(namespace=f"test-{uuid.uuid4().hex[:8]}")
    yield client
    client.shutdown(wait=False)
