"""The conformance suite runs every test against every backend listed here.

A backend adds itself by naming the fixture (defined in ``tests/backends/``) that
yields a ready client. Backends with an expensive start (Ray, the Fray cluster)
share one session-scoped cluster; tests use unique names so they never collide.
"""

import uuid

import pytest

BACKEND_FIXTURES = {
    "local": "local_client",
    "ray": "ray_client",
    "fray": "cluster_client",
    "monarch": "monarch_client",
}


# Conformance tests that cannot apply to a backend, in this one place: {backend: {test name: why}}.
# They are skipped for that backend only, with the reason shown. Each entry is a documented limit
# of the backend; keep the list minimal (Monarch passes every test, so its set is empty).
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "monarch": {},
}


@pytest.fixture(params=sorted(BACKEND_FIXTURES))
def client(request: pytest.FixtureRequest):
    """A client of each backend in turn."""
    reason = NOT_APPLICABLE.get(request.param, {}).get(request.node.originalname)
    if reason:
        pytest.skip(f"not applicable to {request.param}: {reason}")
    return request.getfixturevalue(BACKEND_FIXTURES[request.param])


@pytest.fixture
def uid() -> str:
    """A short unique suffix for job and actor names."""
    return uuid.uuid4().hex[:6]
