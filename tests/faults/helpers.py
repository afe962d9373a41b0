"""Job bodies and small tools shared by the fault tests (task processes import this module)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fray import current_job
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
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


def start_worker(address: str, workdir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``fray worker`` for ``address`` as its own process, its stderr piped; ``env`` adds to a clean environment.

    Clean: no credential, token, CA or client spec of the test process leaks in; and the
    worker ends with this process, as the launcher's daemons do.
    """
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FRAY_TOKEN", "FRAY_CREDENTIAL", "FRAY_TLS_CA", "FRAY_CLIENT_SPEC", "FRAY_EXIT_WITH_PID")
    }
    return subprocess.Popen(
        [sys.executable, "-m", "fray.cli", "worker", "--controller", address, "--id", "w-x", "--workdir", str(workdir)],
        env={**inherited, "PYTHONUNBUFFERED": "1", "FRAY_EXIT_WITH_PID": str(os.getpid()), **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def refusal_of(worker: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The one line a refused worker exits with (failing the test unless it exits so, within ``timeout``)."""
    try:
        _, stderr = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, stderr = worker.communicate()
        raise AssertionError(f"the worker did not give up within {timeout}s; it said:\n{stderr}") from None
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert worker.returncode == 2, f"exit {worker.returncode}: {stderr}"
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    assert not any("retrying" in line or "Traceback" in line for line in lines), stderr
    return errors[0]
