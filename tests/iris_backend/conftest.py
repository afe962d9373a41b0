"""Tests of the Iris backend. Modules that import Iris are collected only where Iris is installed;
elsewhere ``test_iris_suite.py`` runs them in a Python 3.12 venv."""

import uuid

import pytest

from backends.iris import iris_installed

collect_ignore = [] if iris_installed() else ["test_mapping.py", "test_iris_backend.py", "test_actor_wire.py"]


@pytest.fixture
def uid() -> str:
    """A short unique suffix for job and actor names."""
    return uuid.uuid4().hex[:6]
