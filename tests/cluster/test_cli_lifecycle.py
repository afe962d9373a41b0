"""`fray cluster up / down / restart` after crashes: identities checked, history kept, same port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import alive, fray_cli_in, wait_until


@pytest.fixture
def fray_cli(tmp_path: Path) -> Iterator:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env["HOME"] = str(tmp_path)
    run = fray_cli_in(env)

    yield run
    run("cluster", "down", check=False)


def _state(home: Path) -> dict:
    return json.loads((home / ".config" / "fray" / "cluster.json").read_text())


def _crash_controller(home: Path) -> int:
    pid = _state(home)["processes"]["controller"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), what="the controller to die")
    return pid


def _up(fray_cli, tmp_path: Path) -> dict:
    return json.loads(
        fray_cli("cluster", "up", "--workers", "1", "--port", "0", "--dir", str(tmp_path / "c"), "--json").stdout
    )


def test_down_leaves_alone_a_process_that_reused_a_recorded_pid(fray_cli, tmp_path: Path):
    _up(fray_cli, tmp_path)
    _crash_controller(tmp_path)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        state_file = tmp_path / ".config" / "fray" / "cluster.json"
        state = _state(tmp_path)
        state["processes"]["controller"]["pid"] = bystander.pid  # as if the OS had handed the pid on
        state_file.write_text(json.dumps(state))
        out = fray_cli("cluster", "down")
        assert "left alone" in out.stderr and str(bystander.pid) in out.stderr
        assert bystander.poll() is None
        worker_pid = state["processes"]["worker-0"]["pid"]
        wait_until(lambda: not alive(worker_pid), what="the worker (still ours) to be stopped")
    finally:
        bystander.kill()
        bystander.wait()


def test_up_after_a_crash_starts_fresh_and_keeps_the_history(fray_cli, tmp_path: Path):
    _up(fray_cli, tmp_path)
    job_id = fray_cli("job", "submit", "--name", "before-crash", "--wait", "--json", "--", "true").stdout
    job_id = json.loads(job_id)["job_id"]
    old_worker = _state(tmp_path)["processes"]["worker-0"]["pid"]
    _crash_controller(tmp_path)
    refused = fray_cli("cluster", "up", "--workers", "1", "--port", "0", check=False)
    assert refused.returncode == 0, refused.stderr
    assert "is not running" in refused.stderr and "history kept" in refused.stderr
    assert not alive(old_worker)  # the crashed cluster's worker (still ours) was stopped
    listed = json.loads(fray_cli("job", "list", "--json").stdout)
    assert job_id in {row["job_id"] for row in listed}
    again = fray_cli("cluster", "up", "--port", "0", check=False)
    assert again.returncode == 2 and "already up" in again.stderr


def test_restart_brings_the_controller_back_on_the_same_port_and_database(fray_cli, tmp_path: Path):
    up = _up(fray_cli, tmp_path)
    job_id = json.loads(fray_cli("job", "submit", "--wait", "--json", "--", "true").stdout)["job_id"]
    assert "nothing to restart" in fray_cli("cluster", "restart").stdout
    _crash_controller(tmp_path)
    out = fray_cli("cluster", "restart")
    assert "restarted controller" in out.stderr
    assert _state(tmp_path)["address"] == up["address"]
    listed = json.loads(fray_cli("job", "list", "--json").stdout)
    assert job_id in {row["job_id"] for row in listed}
    status = json.loads(fray_cli("status", "--json").stdout)
    assert [w["state"] for w in status["workers"]] == ["alive"]
    assert fray_cli("job", "submit", "--wait", "--", "true").returncode == 0
