"""An Iris cluster on this machine, in Iris's own local mode, for tests, benchmarks and trying Fray on Iris.

:class:`LocalIrisCluster` runs ``iris --config=FILE cluster start --local`` in a child
process: Iris's controller and autoscaler in that process, its workers as threads
there, each task a subprocess of it (tasks inherit that process's environment, so
``env`` is how tests make their modules importable in tasks). The controller listens
on 127.0.0.1. ``HOME`` is pointed into ``workdir`` because Iris's local mode saves a
credentials file under ``~/.config/marin``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from fray.errors import FrayError

__all__ = ["LocalIrisCluster"]

_STARTED = re.compile(r"Controller started at (http://[0-9.]+:\d+)")

_CONFIG = """\
name: {name}
platform:
  local: {{}}
controller:
  local:
    port: 0
worker_provider: {{}}
scale_groups:
  cpu:
    num_vms: 1
    resources:
      cpu: {cpus}
      ram: {ram_gb}GB
      disk: 100GB
      device_type: cpu
      device_variant: cpu
      capacity_type: on-demand
    buffer_slices: {workers}
    max_slices: {workers}
    slice_template:
      num_vms: 1
      local: {{}}
"""


class LocalIrisCluster:
    """``workers`` local Iris workers of ``cpus`` logical CPUs each, non-preemptible (on-demand capacity)."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        workers: int = 2,
        cpus: int = 32,
        ram_gb: int = 64,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        name: str = "fray-local",
    ) -> None:
        self.workdir = Path(workdir)
        self.workers = workers
        self._config = _CONFIG.format(name=name, cpus=cpus, ram_gb=ram_gb, workers=workers)
        self._env = dict(env or {})
        self._python = python
        self._process: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the controller."""
        return self.url.removeprefix("http://")

    @property
    def spec(self) -> str:
        """The Fray client spec of this cluster: ``iris://HOST:PORT``."""
        return f"iris://{self.address}"

    @property
    def log_path(self) -> Path:
        """Where the cluster process writes its output."""
        return self.workdir / "iris.log"

    def start(self, timeout: float = 120.0) -> LocalIrisCluster:
        """Start the cluster; return once the controller answers and every worker has registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "cluster.yaml"
        config.write_text(self._config)
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        # Fray's own variables describe the launching process, not the cluster's tasks.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
        env = {**inherited, "HOME": str(home), "PYTHONUNBUFFERED": "1", **self._env}
        command = "from iris.cli import main; main()"
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [self._python, "-c", command, f"--config={config}", "cluster", "start", "--local"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        try:
            self.url = self._wait_for_url(deadline)
            self._wait_for_workers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_url(self, deadline: float) -> str:
        assert self._process is not None
        while time.monotonic() < deadline:
            match = _STARTED.search(self.log_path.read_text(errors="replace"))
            if match:
                return match.group(1)
            if self._process.poll() is not None:
                raise FrayError(f"the local Iris cluster exited with {self._process.returncode}:\n{self._tail()}")
            time.sleep(0.05)
        raise FrayError(f"the local Iris cluster did not start in time:\n{self._tail()}")

    def _wait_for_workers(self, deadline: float) -> None:
        from iris.client import IrisClient as IrisLib

        client = IrisLib.remote(self.url)
        try:
            while time.monotonic() < deadline:
                if sum(1 for w in client.list_workers() if w.healthy) >= self.workers:
                    return
                time.sleep(0.1)
        finally:
            client.shutdown(wait=False)
        raise FrayError(f"only some of the {self.workers} local Iris workers registered in time:\n{self._tail()}")

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the controller, its workers and their tasks (SIGTERM, then SIGKILL after ``timeout``)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self) -> LocalIrisCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
