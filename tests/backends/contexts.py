"""Fixtures for the job-level conformance suite: one job context per implementation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fray import LocalJobContext, ProcessJobContext


@pytest.fixture
def threads_context(local_client: Any) -> Iterator[LocalJobContext]:
    """Tasks on threads of the test process; actors on the test's local client."""
    context = LocalJobContext(client=local_client)
    yield context
    context.shutdown()


@pytest.fixture
def process_context(local_client: Any) -> Iterator[ProcessJobContext]:
    """Tasks on two worker processes; actors on the test's local client."""
    context = ProcessJobContext(2, client=local_client)
    yield context
    context.shutdown()


@pytest.fixture
def ray_context(ray_client: Any) -> Iterator[Any]:
    """Tasks on the session's Ray, through the test's RayClient."""
    yield ray_client._fray_job_context()


@pytest.fixture
def cluster_context(cluster_client: Any) -> Iterator[Any]:
    """Tasks on the session's Fray cluster, through the test's ClusterClient."""
    yield cluster_client._fray_job_context()


@pytest.fixture
def monarch_context(monarch_client: Any) -> Iterator[Any]:
    """Tasks on a pool of two Monarch processes of the test's MonarchClient."""
    yield monarch_client._fray_job_context()
