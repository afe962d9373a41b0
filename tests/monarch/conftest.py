"""Fixtures of the Monarch-specific tests (the ``monarch_client`` fixture lives in ``tests/backends/monarch.py``)."""

import uuid

import pytest


@pytest.fixture
def uid() -> str:
    """A short unique suffix for job and actor names."""
    return uuid.uuid4().hex[:6]
