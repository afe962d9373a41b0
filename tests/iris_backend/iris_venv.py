"""The cached Python 3.12 venv in which the Iris backend runs (Iris needs Python >= 3.12).

Built once, under ``~/.cache/fray/iris-py312/``, keyed by ``pyproject.toml`` (which holds
the Iris pins), the interpreter's version and this checkout's path, with
``fray[iris,test]`` installed editable from this checkout. Used by
``tests/iris_backend/test_iris_suite.py`` and by the Iris benchmarks
(``benchmarks/_own_iris.py``), so both run in one venv. The 3.12 interpreter is
``$FRAY_PYTHON312`` if set, else ``python3.12`` on ``PATH``, else the newest pyenv 3.12.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = [
    "CACHE",
    "ROOT",
    "SUITE_TIMEOUT",
    "VenvBuildError",
    "ensure_venv",
    "find_python312",
    "installer",
    "make_venv",
    "venv_for",
]


class VenvBuildError(RuntimeError):
    """Building the venv failed; the message ends with the installer's last lines."""


ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fray" / "iris-py312"
# How long the Iris part may take, venv build included (CI allows 90 minutes for everything).
SUITE_TIMEOUT = 45 * 60


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python312() -> tuple[str | None, str]:
    """A Python 3.12+ interpreter and where it came from, or None and what was tried."""
    candidates = [os.environ.get("FRAY_PYTHON312", ""), shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12.*/bin/python")), reverse=True)
    tried = []
    for python in filter(None, candidates):
        version = _version(python)
        if version is not None and version >= (3, 12):
            return python, f"{python} (Python {version[0]}.{version[1]})"
        tried.append(python)
    return None, "no Python >= 3.12 found (tried $FRAY_PYTHON312, python3.12 on PATH, ~/.pyenv/versions/3.12.*)" + (
        f"; not usable: {', '.join(tried)}" if tried else ""
    )


def _uv() -> list[str] | None:
    """How to run uv (``fray[envs]`` installs it beside this interpreter), or None where it is missing."""
    found = importlib.util.find_spec("uv") is not None
    return [sys.executable, "-m", "uv"] if found else None


def make_venv(python: str, venv: Path) -> list[str]:
    """The command that creates ``venv`` for ``python``, with pip in it (the marin suite's download uses it)."""
    uv = _uv()
    return [*uv, "venv", "--seed", "-q", "--python", python, str(venv)] if uv else [python, "-m", "venv", str(venv)]


def installer(venv: Path) -> list[str]:
    """``pip install`` into ``venv``: uv's (resolving and installing in parallel: seconds, not minutes), else pip's."""
    uv = _uv()
    python = str(venv / "bin/python")
    return [*uv, "pip", "install", "--python", python] if uv else [python, "-m", "pip", "install"]


def venv_for(python: str) -> Path:
    """The cached venv for ``python``: keyed by pyproject.toml (the pins), the interpreter and this checkout."""
    key = hashlib.sha256()
    key.update((ROOT / "pyproject.toml").read_bytes())
    key.update(f"{_version(python)}|{Path(python).resolve()}|{ROOT}".encode())
    return CACHE / key.hexdigest()[:16]


def ensure_venv(python: str) -> tuple[Path, str]:
    """Build the venv unless a finished one is cached; returns it and what was done (with the time it took)."""
    venv = venv_for(python)
    ready = venv / ".fray-ready"
    if ready.exists():
        return venv, f"reused {venv}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions of this checkout build one venv, not two
        if ready.exists():
            return venv, f"reused {venv}"
        shutil.rmtree(venv, ignore_errors=True)
        started = time.monotonic()
        log = CACHE / f"{venv.name}.log"
        with log.open("w") as out:
            for command in (make_venv(python, venv), [*installer(venv), "-e", f"{ROOT}[iris,test]"]):
                done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=SUITE_TIMEOUT)
                if done.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                    raise VenvBuildError(f"building the Python 3.12 venv for Iris failed: {' '.join(command)}:\n{tail}")
        took = time.monotonic() - started
        (venv / "checkout.txt").write_text(str(ROOT))
        ready.write_text(f"built in {took:.0f}s\n")
        _prune_other_venvs(venv)
    return venv, f"built {venv} in {took:.0f}s"


def _prune_other_venvs(keep: Path) -> None:
    """Remove this checkout's venvs for older pyproject.toml versions."""
    for other in CACHE.iterdir():
        if other != keep and other.is_dir() and (other / "checkout.txt").exists():
            with contextlib.suppress(OSError):
                if (other / "checkout.txt").read_text() == str(ROOT):
                    shutil.rmtree(other, ignore_errors=True)
