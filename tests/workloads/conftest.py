"""The seeds' workloads (``examples/``) run end to end on local, ``fray://`` and Ray.

Each example module has a ``run(client, ...)`` entry point that the test calls with a
client of each backend (the session's Ray and Fray cluster are shared with the other
suites). Example modules are loaded from ``examples/`` by path and pickled by value, so
the cluster's and Ray's worker processes need not import them, exactly as when a user
runs ``python examples/NAME.py`` (where the module is ``__main__``).
"""

from __future__ import annotations

import uuid

import pytest

WORKLOAD_BACKENDS = {
    "local": "local_client",
    "fray": "cluster_client",
    "ray": "ray_client",
}


@pytest.fixture(params=sorted(WORKLOAD_BACKENDS))
def client(request: pytest.FixtureRequest):
    """A client of each workload backend in turn."""
    return request.getfixturevalue(WORKLOAD_BACKENDS[request.param])


@pytest.fixture
def uid() -> str:
    """A short unique suffix for job, actor and queue names."""
    return uuid.uuid4().hex[:6]
