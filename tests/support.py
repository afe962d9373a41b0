"""Helpers shared by the test modules."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from fray._process import pid_alive

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns a truthy value and return it; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def alive(pid: int) -> bool:
    """True if ``pid`` is a running (not zombie) process."""
    return pid_alive(pid)
