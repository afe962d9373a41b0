"""The fork server's child gets exactly the environment its worker sent, nothing of its own left over."""

from __future__ import annotations

import os

import pytest

from fray.cluster.taskproc._forkserver import _replace_environment


def test_a_task_environment_is_exactly_what_the_worker_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fork server inherited the worker's environment, secrets included; the worker strips
    # those from what it sends, so whatever the request lacks must be gone in the child.
    monkeypatch.setenv("FRAY_TOKEN", "worker-secret")
    monkeypatch.setenv("FRAY_TEST_CHANGED", "old")
    monkeypatch.setenv("FRAY_TEST_KEPT", "same")
    wanted = {k: v for k, v in os.environ.items() if k != "FRAY_TOKEN"}
    wanted.update(FRAY_TEST_CHANGED="new", FRAY_TEST_ADDED="added")
    try:
        _replace_environment(wanted)
        assert dict(os.environ) == wanted
        assert "FRAY_TOKEN" not in os.environ and os.getenv("FRAY_TEST_CHANGED") == "new"
    finally:
        os.environ.pop("FRAY_TEST_ADDED", None)  # the one variable monkeypatch does not know to undo
