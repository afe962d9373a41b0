"""A full disk under the controller's state (issue 10, case 4): loud, safe, and recovered from.

The state file lives on a small tmpfs that the test fills up for real (it needs root,
as on the development machines and CI; elsewhere the test is skipped, saying why).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, JobStatus, StorageError
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.server.launcher import LocalCluster
from support import wait_until

from .helpers import gated_then_mark, lines, wait_lines


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "state"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the disk-full test needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte; return the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (64 << 10, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return filler


def truncate_wal(db: Path) -> None:
    """Checkpoint the WAL into the database and empty it, so the next write must grow the file."""
    deadline = time.monotonic() + 30
    while True:
        with sqlite3.connect(db, timeout=10) as conn:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if not busy or time.monotonic() > deadline:
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_a_full_disk_makes_the_controller_read_only_and_no_finished_job_is_lost(
    tmp_path: Path, small_disk: Path
) -> None:
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.startswith(tests_dir))}
    db = small_disk / "controller.db"
    with LocalCluster(tmp_path / "cluster", worker_timeout=2.0, env=env, db_path=db) as cluster:
        cluster.start_controller()
        cluster.add_worker("w-a", "--cpu", "4")
        cluster.wait_for_workers(1)
        client = ClusterClient(cluster.address, token=cluster.token)
        control = controller_client(cluster.address, cluster.token)
        jobs = [
            client.submit(
                JobRequest(name=f"d{i}", entrypoint=Entrypoint.from_callable(gated_then_mark, args=(str(tmp_path),)))
            )
            for i in range(3)
        ]
        for i in range(3):
            wait_lines(tmp_path / f"d{i}.started", 1, f"job d{i} to start")
        wait_until(lambda: all(job.status() == JobStatus.RUNNING for job in jobs), what="the jobs to run")
        truncate_wal(db)
        filler = fill(small_disk)
        (tmp_path / "go").touch()
        for i in range(3):  # the jobs end while nothing can be written
            wait_lines(tmp_path / f"d{i}.done", 1, f"job d{i} to finish")

        health = wait_until(lambda: control.health()["read_only"] and control.health(), what="read-only mode")
        assert str(db) in health["reason"] and "free" in health["reason"]
        # (The client's submits after its first are coalesced: the refusal comes with the controller's answer.)
        refused = client.submit(JobRequest(name="refused", entrypoint=Entrypoint.from_binary("true")))
        with pytest.raises(StorageError, match=r"controller\.db.*free"):
            refused.wait(timeout=60)
        # Longer than the worker timeout: no worker is declared lost, no finished job goes back to pending.
        deadline = time.monotonic() + 3 * cluster.worker_timeout
        while time.monotonic() < deadline:
            assert all(job.status() == JobStatus.RUNNING for job in jobs), "reads keep working, nothing re-pends"
            time.sleep(0.1)

        filler.unlink()
        for job in jobs:
            assert job.wait(timeout=60) == JobStatus.SUCCEEDED
            assert job.view().attempt == 0
        wait_until(lambda: not control.health()["read_only"], what="the controller to leave read-only mode")
        for i in range(3):
            assert len(lines(tmp_path / f"d{i}.done")) == 1
        assert client.submit(JobRequest(name="after", entrypoint=Entrypoint.from_binary("true"))).wait(60) == (
            JobStatus.SUCCEEDED
        )
        control.close()
