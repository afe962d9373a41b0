"""Fixtures of the Ray-specific tests (the Ray cluster fixtures live in tests/backends/ray.py)."""

import uuid

import pytest


@pytest.fixture
def uid() -> str:
    """A short unique suffix for job and actor names."""
    return uuid.uuid4().hex[:6]
