"""Helpers shared by the test modules."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from fray.process._process import pid_alive

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


class FrayCli(Protocol):
    def __call__(self, *args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]: ...


def fray_cli_in(env: dict[str, str]) -> FrayCli:
    """``run("job", "list")`` runs ``fray job list`` as a user would (a subprocess with ``env``).

    With ``check`` (the default) a non-zero exit fails the test, showing what the command printed;
    ``cwd`` is the directory the command runs in (default: the test's).
    """

    def run(*args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True, timeout=120, cwd=cwd
        )
        if check and out.returncode != 0:
            raise AssertionError(f"fray {' '.join(args)} exited {out.returncode}: {out.stdout}{out.stderr}")
        return out

    return run


def alive(pid: int) -> bool:
    """True if ``pid`` is a running (not zombie) process."""
    return pid_alive(pid)


def typed(value: object) -> object:
    """``value`` with the type of every part spelled out, so that equal values of other types differ.

    ``b"x" == bytearray(b"x")`` and ``(1,) != [1]`` are Python's rules; a backend that hands back a
    bytes for a bytearray must still fail a comparison of ``typed`` forms.
    """
    if isinstance(value, dict):
        return ("dict", {key: typed(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return (type(value).__name__, [typed(item) for item in value])
    return (type(value).__name__, value)


#: Values some engines change in transit (Ray's msgpack turns a bytearray into bytes): each must come back as sent.
TYPED_VALUES = (
    bytearray(b"xy"),
    [b"a", bytearray(b"b")],
    {"k": [bytearray(b"z"), (bytearray(b"t"), 1)]},
    bytearray(300_000),
)
