"""A local Iris cluster that belongs to one benchmark run, and the Python 3.12 that can run it.

:class:`OwnIris` is :class:`fray.iris.localcluster.LocalIrisCluster` (Iris's local mode:
controller and workers in one child process, every task a subprocess of it) in a temp
dir of this run, with the controller on a port the kernel picks. Its stop ends exactly
its processes, found by PID: the cluster process, whose command line names this run's
config file, and its descendants; whatever of those outlives Iris's own shutdown is
killed. Iris allocates task ports itself, checking that each is free.

Iris needs Python >= 3.12 and the rest of the benchmarks run on the README's Python.
:func:`iris_python` finds an interpreter that can run Iris: the one given, this one
if it can, else the venv that ``tests/iris_backend/iris_venv.py`` caches for
this checkout under ``~/.cache/fray/iris-py312/`` (built with the same code if it is
missing); :func:`run_json` runs a script there and reads the JSON figures it prints, and
:func:`run_under_iris_python` re-runs the current script there.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from _own_processes import end, processes_marked, rss

__all__ = [
    "IrisUnavailable",
    "OwnIris",
    "iris_python",
    "print_json",
    "run_json",
    "run_under_iris_python",
    "stop_on_sigterm",
]

ROOT = Path(__file__).resolve().parents[1]
# The line a JSON-printing script marks its result with, so that other output cannot be mistaken for it.
RESULT_MARK = "FRAY-BENCH-JSON "


class IrisUnavailable(Exception):
    """Iris cannot be run here; the message says why, in one line."""


class OwnIris:
    """A local Iris cluster of ``workers`` workers of ``cpus`` CPUs each, in its own temp dir."""

    def __init__(self, *, workers: int = 2, cpus: int = 32, env: Mapping[str, str] | None = None) -> None:
        self.workers = workers
        self.cpus = cpus
        self.env = dict(env or {})
        self.workdir = ""
        self.start_seconds = 0.0
        self._cluster: Any = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the controller."""
        return str(self._cluster.address)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the controller."""
        return str(self._cluster.url)

    def start(self) -> OwnIris:
        """Start the cluster; return once every worker has registered (``start_seconds``: how long that took)."""
        from fray.iris.localcluster import LocalIrisCluster

        self.workdir = tempfile.mkdtemp(prefix="fray-bench-iris-")
        self._cluster = LocalIrisCluster(
            self.workdir, workers=self.workers, cpus=self.cpus, env=self.env, name="fray-bench"
        )
        started = time.perf_counter()
        try:
            self._cluster.start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - started
        return self

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the cluster's own log (controller and workers; tasks log to Iris's log store)."""
        if self._cluster is None:
            return ""
        try:
            text = Path(self._cluster.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def processes(self) -> list[psutil.Process]:
        """The cluster process (its command line names our config file) and all its descendants."""
        return processes_marked(str(Path(self.workdir) / "cluster.yaml")) if self.workdir else []

    def rss(self) -> int:
        """Resident memory of the cluster's processes, in bytes."""
        return rss(self.processes())

    def stop(self) -> None:
        """Stop the cluster (Iris's own shutdown), kill what of its processes is left, remove the temp dir."""
        procs = self.processes()
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None
        end(procs, grace=10, terminate=False)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = ""

    def __enter__(self) -> OwnIris:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def iris_installed() -> bool:
    """True when this interpreter can run the Iris backend."""
    return sys.version_info >= (3, 12) and importlib.util.find_spec("iris.client") is not None


def _check(python: str) -> None:
    check = "import sys; assert sys.version_info >= (3, 12), sys.version; import iris.client, fray.iris.client"
    try:
        done = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=120, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IrisUnavailable(f"{python} cannot be run: {exc}") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise IrisUnavailable(f"{python} cannot run Iris ({last})")


def iris_python(explicit: str | None = None) -> str:
    """An interpreter that can run Fray on Iris; raises :class:`IrisUnavailable` saying why there is none.

    ``explicit`` if given; else this interpreter if it can; else the test suite's cached
    Python 3.12 venv of this checkout, which is built (once, 1-2 minutes) if it is missing.
    """
    if explicit:
        _check(explicit)
        return explicit
    if iris_installed():
        return sys.executable
    suite = _suite_venv_module()
    python, found = suite.find_python312()
    if python is None:
        raise IrisUnavailable(found)
    if not (suite.venv_for(python) / ".fray-ready").exists():
        print(f"building the Python 3.12 venv for Iris with {found} (once; 1-2 minutes)...", file=sys.stderr)
    try:
        venv, _ = suite.ensure_venv(python)
    except suite.VenvBuildError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise IrisUnavailable(f"could not build the Python 3.12 venv: {first}") from exc
    venv_python = str(venv / "bin" / "python")
    _check(venv_python)
    return venv_python


def run_under_iris_python() -> None:
    """Return if this interpreter can run Iris; else replace this process by the same command under one that can.

    Exits with the reason when there is none.
    """
    if iris_installed():
        return
    try:
        python = iris_python()
    except IrisUnavailable as exc:
        sys.exit(f"Iris cannot run here: {exc}")
    print(f"(running under {python}: Iris needs Python >= 3.12)", file=sys.stderr, flush=True)
    os.execve(python, [python, *sys.argv], _clean_env())


def _suite_venv_module() -> Any:
    """The venv code the Iris tests use (``tests/iris_backend/iris_venv.py``), so both run in one venv."""
    path = str(ROOT / "tests" / "iris_backend")
    if path not in sys.path:
        sys.path.append(path)
    return importlib.import_module("iris_venv")


# The environment as it was when the benchmark started: by the time the Iris column runs, this process has
# been a Ray driver, and what Ray put in the environment must not reach the Iris cluster and its tasks.
_START_ENV = dict(os.environ)


def _clean_env() -> dict[str, str]:
    # The child runs in its own venv with this checkout installed; the caller's venv and spec are not its own.
    return {k: v for k, v in _START_ENV.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "FRAY_CLIENT_SPEC")}


def run_json(python: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python *args``, return the JSON object it printed after :data:`RESULT_MARK`.

    Its other output goes to this process's stderr. On timeout it gets SIGTERM (so it can
    stop what it started), then SIGKILL after 60 s. Raises :class:`IrisUnavailable` if it
    fails or prints no result.
    """
    process = subprocess.Popen([python, *args], stdout=subprocess.PIPE, text=True, env=_clean_env())
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        raise IrisUnavailable(f"the Iris run took longer than {timeout:.0f} s and was stopped") from None
    results = [line.removeprefix(RESULT_MARK) for line in out.splitlines() if line.startswith(RESULT_MARK)]
    others = [line for line in out.splitlines() if not line.startswith(RESULT_MARK)]
    if others:
        print("\n".join(others), file=sys.stderr)
    if process.returncode != 0 or not results:
        raise IrisUnavailable(f"the Iris run failed (exit {process.returncode}; its error is above)")
    data = json.loads(results[-1])
    assert isinstance(data, dict)
    return data


def print_json(data: dict[str, Any]) -> None:
    """Print ``data`` the way :func:`run_json` reads it."""
    print(RESULT_MARK + json.dumps(data), flush=True)


def stop_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` so ``finally`` blocks stop the cluster this process started."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
