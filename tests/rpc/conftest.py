"""Fixtures: actor servers running in their own (spawned) processes (see support.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from rpc.support import TOKEN, ServerProcess, start_server


@pytest.fixture(autouse=True)
def _rpc_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs with the cluster token and no inherited namespace."""
    monkeypatch.setenv("FRAY_TOKEN", TOKEN)
    monkeypatch.delenv("FRAY_NAMESPACE", raising=False)
    monkeypatch.delenv("FRAY_JOB_ID", raising=False)


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ServerProcess]:
    """One server process per test module with the common actors."""
    os.environ.setdefault("FRAY_TOKEN", TOKEN)
    server = start_server(
        {"counter": ("Counter", 1), "gate": ("Gate", 4), "rendezvous": ("Rendezvous", 2), "sleeper": ("Gate", 4)}
    )
    yield server
    server.kill()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    """Start servers for one test; all are killed at its end."""
    started: list[ServerProcess] = []

    def factory(actors: dict[str, tuple[str, int]], **kwargs: Any) -> ServerProcess:
        server = start_server(actors, **kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.kill()
