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

import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from iris_venv import ROOT, SUITE_TIMEOUT, VenvBuildError, ensure_venv, find_python312

from backends.iris import iris_installed


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
        try:
            venv, built = ensure_venv(python)
        except VenvBuildError as exc:
            pytest.fail(str(exc), pytrace=False)
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
