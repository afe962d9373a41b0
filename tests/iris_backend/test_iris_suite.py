"""Run the Iris part of the suite from an interpreter that cannot import Iris.

Iris needs Python >= 3.12; the suite runs on the README's Python (3.11 here and in CI).
When this interpreter cannot run the Iris backend, the test below builds -- once,
cached under ``~/.cache/fray/iris-py312/`` and keyed by ``pyproject.toml`` (which holds
the Iris pins), the interpreter's version and this checkout's path -- a Python 3.12 venv
with ``fray[iris,test]`` installed editable from this checkout, runs
``pytest tests/conformance tests/iris_backend -k iris`` in it, and fails listing every failing
test id with its short error. With no Python 3.12 on this machine it is skipped, and
the skip says why. Where the Iris backend can run directly (Python >= 3.12 with
``fray[iris]``), the Iris tests run in the session itself and this module has no test.

The 3.12 interpreter is ``$FRAY_PYTHON312`` if set, else ``python3.12`` on ``PATH``,
else the newest pyenv 3.12.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from backends.iris import iris_installed

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
            for command in (
                [python, "-m", "venv", str(venv)],
                [str(venv / "bin/python"), "-m", "pip", "install", "-e", f"{ROOT}[iris,test]"],
            ):
                done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=SUITE_TIMEOUT)
                if done.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                    pytest.fail(f"building the Python 3.12 venv for Iris failed: {' '.join(command)}:\n{tail}")
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


def failures_in(junit: Path) -> tuple[int, list[str]]:
    """How many tests a JUnit report lists, and ``"test id: short error"`` for each that failed or erred."""
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    failed = []
    for case in cases:
        for bad in [*case.findall("failure"), *case.findall("error")]:
            test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failed.append(f"{test_id}: {message[0][:300] if message else bad.tag}")
    return len(cases), failed


if not iris_installed():

    @pytest.mark.timeout(SUITE_TIMEOUT + 300)
    def test_iris_backend_in_a_python312_venv(tmp_path: Path) -> None:
        python, found = find_python312()
        if python is None:
            pytest.skip(f"the Iris backend's tests did not run: Iris needs Python >= 3.12 and {found}")
        venv, built = ensure_venv(python)
        junit = tmp_path / "iris.xml"
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "FRAY_CLIENT_SPEC")}
        started = time.monotonic()
        pytest_args = ["tests/conformance", "tests/iris_backend", "-k", "iris", "-q", "-p", "no:cacheprovider"]
        run = subprocess.run(
            [str(venv / "bin/python"), "-m", "pytest", *pytest_args, f"--junitxml={junit}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT,
        )
        output = (run.stdout + run.stderr).strip().splitlines()
        summary = output[-1] if output else "(no output)"
        if not junit.exists():
            pytest.fail(
                f"the Iris suite did not run (exit {run.returncode}):\n" + "\n".join(output[-40:]), pytrace=False
            )
        total, failed = failures_in(junit)
        if failed or run.returncode != 0 or total == 0:
            pytest.fail(
                f"Iris suite on {found}: {len(failed)} of {total} failed ({summary})\n"
                + "\n".join(failed or output[-40:]),
                pytrace=False,
            )
        print(f"Iris suite on {found}, venv {built}: {summary} in {time.monotonic() - started:.0f}s")


def test_without_python312_the_reason_names_what_was_tried(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("FRAY_PYTHON312", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    python, reason = find_python312()
    assert python is None and "no Python >= 3.12 found" in reason and "pyenv" in reason
    monkeypatch.setenv("FRAY_PYTHON312", str(tmp_path / "missing-python"))
    assert find_python312()[0] is None
