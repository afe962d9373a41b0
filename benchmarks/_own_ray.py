"""A Ray cluster that belongs to one benchmark run, safe on a machine other people use.

``ray start --head`` with every port chosen free (GCS, dashboard, dashboard agent, client
server, metrics, runtime-env agent; worker ports left to the kernel), its own ``--temp-dir``,
and a stop that signals only this cluster's processes, found by PID: the daemons whose
command line names the temp dir, and their descendants (workers rename themselves
``ray::...``, so they are found as the raylet's children). Never ``ray stop``, which
stops every Ray cluster of the user on the machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
from _own_processes import end, processes_marked, rss

__all__ = ["OwnRay", "free_port"]


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnRay:
    """``ray start --head`` on free ports with its own temp dir; :meth:`stop` ends exactly its processes."""

    def __init__(self, num_cpus: int = 2) -> None:
        self.num_cpus = num_cpus
        self.temp_dir = ""
        self.address = ""
        self.dashboard_url = ""
        self.start_seconds = 0.0

    def start(self) -> OwnRay:
        # Short path: Ray's Unix sockets live under it and their paths are limited to 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="fray-bench-ray-", dir="/tmp")
        gcs, dashboard, agent, agent_grpc, client, metrics, runtime_env = (free_port() for _ in range(7))
        ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"
        command = [
            ray_cli,
            "start",
            "--head",
            f"--port={gcs}",
            f"--temp-dir={self.temp_dir}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--ray-client-server-port={client}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
        ]
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env=self.env(), timeout=300)
        self.start_seconds = time.perf_counter() - started
        if result.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed ({result.returncode}): {result.stderr[-2000:]}")
        self.address = f"127.0.0.1:{gcs}"
        self.dashboard_url = f"http://127.0.0.1:{dashboard}"
        return self

    @staticmethod
    def env() -> dict[str, str]:
        """The environment a client of this cluster needs (Ray 2.60 clusters require a token)."""
        return {**os.environ, "RAY_AUTH_MODE": "token"}

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: daemons naming our temp dir, and all their descendants."""
        return processes_marked(self.temp_dir) if self.temp_dir else []

    def rss(self) -> int:
        """Resident memory of this cluster's processes, in bytes."""
        return rss(self.processes())

    def stop(self) -> None:
        """SIGTERM this cluster's processes, SIGKILL what is left after 15 s, remove the temp dir."""
        end(self.processes(), grace=15)
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.temp_dir = ""

    def __enter__(self) -> OwnRay:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
