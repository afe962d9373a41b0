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
    _catch_unhandled_faults()
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


# ----- a loud failure instead of a silent end ---------------------------------------------------
# Monarch answers a failure nobody handled by ending the whole process (its default fault hook).
# In a test session that would end pytest with no report, whatever test runs at that moment; here
# such a failure is written at once on the stderr pytest had before capturing, and fails the test
# during which it arrived.

_unhandled: list[str] = []
_REAL_STDERR = os.dup(2)


def _catch_unhandled_faults() -> None:
    import monarch.actor

    from fray.monarch import supervision

    def hook(failure: Any) -> None:
        report = str(failure.report()) if hasattr(failure, "report") else str(failure)
        _unhandled.append(report)
        os.write(_REAL_STDERR, f"\n!!! a Monarch failure no one handled (the test fails): {report}\n".encode())

    monarch.actor.unhandled_fault_hook = hook
    if supervision._configured:  # Fray's hook is in place already: it passes what it does not handle on to ours
        supervision._previous_hook = hook


@pytest.fixture(autouse=True)
def _no_unhandled_monarch_fault() -> Iterator[None]:
    """Fail the test during which a Monarch failure went unhandled (see _catch_unhandled_faults)."""
    seen = len(_unhandled)
    yield
    if len(_unhandled) > seen:
        pytest.fail("a Monarch failure no one handled arrived during this test:\n" + "\n".join(_unhandled[seen:]))
