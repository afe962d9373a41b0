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


def test_up_after_a_crash_refuses_then_resumes_keeping_the_history(fray_cli, tmp_path: Path):
    _up(fray_cli, tmp_path)
    job_id = fray_cli("job", "submit", "--name", "before-crash", "--wait", "--json", "--", "true").stdout
    job_id = json.loads(job_id)["job_id"]
    old_worker = _state(tmp_path)["processes"]["worker-0"]["pid"]
    _crash_controller(tmp_path)
    # Over a state directory of a cluster that is not running: refused, saying both ways on.
    refused = fray_cli("cluster", "up", "--workers", "2", "--port", "0", check=False)
    assert refused.returncode == 2, refused.stderr
    error, hint = refused.stderr.strip().splitlines()
    assert error == (
        f"error: {tmp_path / 'c'} holds the state of an earlier cluster that is not running (1 job, 1 worker, "
        f"last written {error.rsplit('last written ', 1)[1]}"
    )
    assert hint == "hint: add --resume to keep its jobs and history, or --fresh to discard them and start over"
    assert alive(old_worker), "a refusal touches nothing"
    both = fray_cli("cluster", "up", "--resume", "--fresh", check=False)
    assert both.returncode == 2 and "contradict" in both.stderr
    resumed = fray_cli("cluster", "up", "--workers", "0", "--port", "0", "--resume", check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert "is not running" in resumed.stderr and "jobs and history kept" in resumed.stderr
    assert not alive(old_worker)  # the crashed cluster's worker (still ours) was stopped
    listed = json.loads(fray_cli("job", "list", "--json").stdout)
    assert job_id in {row["job_id"] for row in listed}
    # The crashed cluster's worker (stopped by `up`) is listed as stopped at once: never alive, then lost.
    workers = json.loads(fray_cli("worker", "list", "--json").stdout)
    assert [(w["worker_id"], w["state"]) for w in workers] == [("worker-0", "stopped")]
    assert "its 1 worker listed as stopped" in resumed.stdout + resumed.stderr
    again = fray_cli("cluster", "up", "--port", "0", check=False)
    assert again.returncode == 2 and "already up" in again.stderr


def test_up_after_down_refuses_and_fresh_starts_over_without_the_old_workers(fray_cli, tmp_path: Path):
    _up(fray_cli, tmp_path)
    fray_cli("job", "submit", "--wait", "--", "true")
    fray_cli("cluster", "down")
    refused = fray_cli("cluster", "up", "--workers", "1", "--port", "0", "--dir", str(tmp_path / "c"), check=False)
    assert refused.returncode == 2 and "--resume" in refused.stderr and "--fresh" in refused.stderr
    fresh = fray_cli(
        "cluster", "up", "--workers", "2", "--port", "0", "--dir", str(tmp_path / "c"), "--fresh", "--no-dashboard"
    )
    assert "discarded the earlier cluster's state" in fresh.stderr + fresh.stdout
    assert json.loads(fray_cli("job", "list", "--json").stdout) == []
    workers = json.loads(fray_cli("worker", "list", "--json").stdout)
    assert sorted((w["worker_id"], w["state"]) for w in workers) == [("worker-0", "alive"), ("worker-1", "alive")]
    status = json.loads(fray_cli("status", "--json").stdout)["capacity"]
    assert (status["workers_alive"], status["workers_lost"], status["workers_stopped"]) == (2, 0, 0)


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
