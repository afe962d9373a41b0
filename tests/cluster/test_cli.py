"""The cluster command line, end to end: `fray cluster up`, jobs, workers, endpoints, `fray cluster down`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import fray_cli_in


@pytest.fixture
def fray_cli(tmp_path: Path) -> Iterator:
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_TOKEN", "FRAY_CLIENT_SPEC")}
    env["HOME"] = str(tmp_path)  # the token and the cluster's state file go under ~/.config/fray
    run = fray_cli_in(env)

    yield run
    run("cluster", "down", check=False)


def test_cluster_up_jobs_and_down(fray_cli, tmp_path: Path):
    up = json.loads(fray_cli("cluster", "up", "--workers", "2", "--port", "0", "--json").stdout)
    assert up["address"].startswith("127.0.0.1:")
    token_file = tmp_path / ".config" / "fray" / "token"
    assert token_file.stat().st_mode & 0o777 == 0o600

    workers = json.loads(fray_cli("worker", "list", "--json").stdout)
    assert sorted(w["worker_id"] for w in workers) == ["worker-0", "worker-1"]
    assert {w["state"] for w in workers} == {"alive"}

    job_id = json.loads(
        fray_cli("job", "submit", "--json", "--name", "hi", "--", "bash", "-c", "echo hello $FRAY_JOB_NAME").stdout
    )["job_id"]
    assert fray_cli("job", "logs", "-f", job_id).stdout.splitlines() == ["hello hi"]
    status = json.loads(fray_cli("job", "status", "--json", job_id).stdout)
    assert status["state"] == "succeeded" and status["tasks"][0]["state"] == "succeeded"

    failing = fray_cli("job", "submit", "--wait", "--", "bash", "-c", "echo oops; exit 4", check=False)
    assert failing.returncode != 0 and "exit code 4" in failing.stderr and "oops" in failing.stdout

    stuck = json.loads(fray_cli("job", "submit", "--json", "--cpu", "999", "--", "true").stdout)["job_id"]
    status = json.loads(fray_cli("job", "status", "--json", stuck).stdout)
    assert status["state"] == "pending" and "can never be scheduled" in status["pending_reason"]
    assert "stopped" in fray_cli("job", "stop", stuck).stdout

    listed = {j["job_id"]: j["state"] for j in json.loads(fray_cli("job", "list", "--json").stdout)}
    assert listed[job_id] == "succeeded" and listed[stuck] == "stopped"
    assert json.loads(fray_cli("endpoint", "list", "--json").stdout) == []

    assert "stopped" in fray_cli("cluster", "down").stdout
    assert fray_cli("worker", "list", check=False).returncode != 0


TRAIN_PY = """
import os, sys
print("train.py ran with", sys.argv[1:])
print("sees:", sorted(os.listdir(".")))
print("data:", open("data/config.txt").read().strip())
"""


def test_job_submit_from_a_project_folder_ships_it(fray_cli, tmp_path: Path):
    """`cd myproject && fray job submit --wait -- python train.py` runs the folder's train.py, less what .gitignore excludes."""
    up = fray_cli("cluster", "up", "--workers", "1", "--port", "0", "--no-dashboard")
    said = up.stdout + up.stderr
    assert "1 worker" in said and "1 workers" not in said
    project = tmp_path / "myproject"
    (project / "data").mkdir(parents=True)
    (project / "logs").mkdir()
    (project / "train.py").write_text(TRAIN_PY)
    (project / "data" / "config.txt").write_text("lr=3e-4\n")
    (project / "logs" / "old.log").write_text("from a previous run\n")
    (project / "weights.ckpt").write_bytes(b"\0" * 1024)
    (project / ".gitignore").write_text("logs/\n*.ckpt\n")

    run = fray_cli("job", "submit", "--wait", "--", "python", "train.py", "--lr", "3e-4", cwd=project)
    assert "train.py ran with ['--lr', '3e-4']" in run.stdout
    assert "sees: ['.gitignore', 'data', 'train.py']" in run.stdout  # logs/ and *.ckpt stayed behind
    assert "data: lr=3e-4" in run.stdout
    # Said once, on stderr, with how to choose otherwise.
    assert f"shipping {project} as the job's workspace (train.py is in it)" in run.stderr
    assert "--no-workspace" in run.stderr

    # Nothing named from the folder: nothing is shipped, and nothing is said.
    bare = fray_cli("job", "submit", "--wait", "--", "bash", "-c", "ls train.py", cwd=project, check=False)
    assert bare.returncode != 0 and "shipping" not in bare.stderr

    # --workspace names the folder from elsewhere; a missing one is one line and a hint.
    shipped = fray_cli("job", "submit", "--wait", "--workspace", str(project), "--", "python", "train.py")
    assert "data: lr=3e-4" in shipped.stdout
    # A background submit leaves the job running on purpose: no script-exit notice about it.
    background = fray_cli("job", "submit", "--", "sleep", "1")
    assert background.stderr == "" and background.stdout.startswith("sleep-")
    missing = fray_cli("job", "submit", "--workspace", str(tmp_path / "nope"), "--", "true", check=False)
    assert missing.returncode != 0 and "is not a directory" in missing.stderr and "Traceback" not in missing.stderr
