"""Job bodies and small tools shared by the fault tests (task processes import this module)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fray import current_job
from fray.cluster.client import ClusterClient
from fray.cluster.launcher import LocalCluster
from support import wait_until


def client_of(cluster: LocalCluster) -> ClusterClient:
    return ClusterClient(cluster.address, token=cluster.token)


def with_workers(cluster: LocalCluster, *cpus: int) -> ClusterClient:
    """Start workers ``w-a``, ``w-b``, ... offering these many cores; return a client."""
    for letter, cpu in zip("abcdefgh", cpus, strict=False):
        cluster.add_worker(f"w-{letter}", "--cpu", str(cpu))
    cluster.wait_for_workers(len(cpus))
    return client_of(cluster)


def append_line(path: Path, text: str) -> None:
    """Append one line with a single write (O_APPEND), so concurrent writers never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def gated_then_mark(directory: str) -> None:
    """Record the start, wait for ``go``, then record the completion (one line per completion)."""
    info = current_job()
    assert info is not None
    root = Path(directory)
    append_line(root / f"{info.name}.started", f"{info.attempt} {os.environ['FRAY_WORKER_ID']} {os.getpid()}")
    deadline = time.monotonic() + 300
    while not (root / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.02)
    append_line(root / f"{info.name}.done", f"{info.attempt} {os.environ['FRAY_WORKER_ID']} {os.getpid()}")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_lines(path: Path, count: int, what: str, timeout: float = 60.0) -> list[str]:
    return wait_until(lambda: len(lines(path)) >= count and lines(path), timeout=timeout, what=what)
