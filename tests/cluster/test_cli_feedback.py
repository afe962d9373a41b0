"""Live feedback on the command line: `job submit --wait` streams output as it is written."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from fray.job import JobStatus


def _env(cluster: LocalCluster, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    return {**env, "HOME": str(home), "FRAY_TOKEN": cluster.token, "FRAY_CLIENT_SPEC": f"fray://{cluster.address}"}


def test_submit_wait_streams_the_first_line_before_the_job_ends(fray_cluster: LocalCluster, tmp_path: Path):
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fray.cli", "job", "submit", "--name", "streamed", "--wait", "--", "bash", "-c", script],
        env=_env(fray_cluster, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        submitted = proc.stderr.readline()
        assert submitted.startswith("job streamed-") and "submitted" in submitted, submitted
        job_id = submitted.split()[1].rstrip(";")
        assert proc.stdout.readline() == "first\n"
        # The job cannot end before the gate exists: the line arrived while it was running.
        client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
        assert client._controller.job(job_id).state == JobStatus.RUNNING
        gate.touch()
        assert proc.stdout.readline() == "second\n"
        assert proc.wait(timeout=120) == 0
        final = proc.stderr.read()
        assert f"job {job_id} succeeded" in final
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_submit_wait_shows_a_progress_line_on_a_terminal(fray_cluster: LocalCluster, tmp_path: Path):
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fray.cli", "job", "submit", "--wait", "--", "bash", "-c", "sleep 2.5; echo done"],
        env={**_env(fray_cluster, tmp_path), "COLUMNS": "160"},
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    )
    os.close(terminal)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # EOF on a pty: the CLI exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    assert proc.wait(timeout=120) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "running" in screen and "tasks 1 running, 0 pending" in screen, screen
    assert proc.stdout is not None and proc.stdout.read() == "done\n"
