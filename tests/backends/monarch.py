"""Fixtures for the Monarch backend: real Monarch processes on this host, a fresh client per test.

Monarch needs no daemon, so each test gets its own :class:`~fray.monarch.MonarchClient`
(its actors are processes it starts and stops). The session fixture only puts the
test directories on ``PYTHONPATH`` for the whole session: Monarch's actor processes
and the jobs' processes are started at any time and must import the test modules
that define the actors and job functions.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def monarch_env() -> Iterator[None]:
    """Skip (saying why) without torchmonarch; otherwise make the test modules importable by child processes."""
    pytest.importorskip("monarch.actor", reason='the Monarch backend needs torchmonarch: pip install "fray[monarch]"')
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@pytest.fixture
def monarch_client(monarch_env: None) -> Iterator[Any]:
    """A MonarchClient; shut down (its jobs terminated, its actor processes stopped) after the test."""
    from fray.monarch import MonarchClient

    client = MonarchClient()
    yield client
    client.shutdown(wait=False)
