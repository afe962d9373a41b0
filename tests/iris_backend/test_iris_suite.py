"""Run the Iris part of the suite from an interpreter that cannot import Iris.

Iris needs Python >= 3.12; the suite runs on the README's Python (3.11 here and in CI).
When this interpreter cannot run the Iris backend, the test below builds -- once,
cached under ``~/.cache/fray/iris-py312/`` and keyed by ``pyproject.toml`` (which holds
the Iris pins), the interpreter's version and this checkout's path -- a Python 3.12 venv
with ``fray[iris,test]`` installed editable from this checkout, runs
``pytest tests/conformance tests/iris_backend -k iris`` in it, and fails listing every failing
test id with its short error. With no Python 3.12 on this machine it is skipped, and
the skip says why. The run starts in the background when the session starts and this test, placed last,
checks it (``tests/early.py``). Where the Iris backend can run directly (Python >= 3.12 with
``fray[iris]``), the Iris tests run in the session itself and this module has no test.

The 3.12 interpreter is ``$FRAY_PYTHON312`` if set, else ``python3.12`` on ``PATH``,
else the newest pyenv 3.12.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from iris_venv import ROOT, SUITE_TIMEOUT, VenvBuildError, ensure_venv, find_python312

import early
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


@dataclass(frozen=True)
class SuiteRun:
    """What running the Iris suite in the 3.12 venv gave: a reason it could not run, or its outcome."""

    skipped: str | None = None
    broken: str | None = None  # the venv could not be built
    found: str = ""
    built: str = ""
    returncode: int = 0
    output: tuple[str, ...] = ()
    junit: Path | None = None
    seconds: float = 0.0


def run_iris_suite() -> SuiteRun:
    """Build (or reuse) the 3.12 venv and run the Iris tests in it; started early, in the background."""
    python, found = find_python312()
    if python is None:
        return SuiteRun(skipped=f"the Iris backend's tests did not run: Iris needs Python >= 3.12 and {found}")
    try:
        venv, built = ensure_venv(python)
    except VenvBuildError as exc:
        return SuiteRun(broken=str(exc))
    junit = Path(tempfile.mkdtemp(prefix="fray-iris-suite-")) / "iris.xml"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "FRAY_CLIENT_SPEC")}
    started = time.monotonic()
    pytest_args = ["tests/conformance", "tests/iris_backend", "-k", "iris", "-q", "-p", "no:cacheprovider"]
    run = early.run(
        [str(venv / "bin/python"), "-m", "pytest", *pytest_args, f"--junitxml={junit}"],
        cwd=ROOT,
        env=env,
        timeout=SUITE_TIMEOUT,
    )
    output = tuple((run.stdout + run.stderr).strip().splitlines())
    return SuiteRun(None, None, found, built, run.returncode, output, junit, time.monotonic() - started)


if not iris_installed():

    @pytest.mark.timeout(SUITE_TIMEOUT + 300)
    @pytest.mark.runs_early.with_args(run_iris_suite)
    def test_iris_backend_in_a_python312_venv(request: pytest.FixtureRequest) -> None:
        suite: SuiteRun = early.result(request)
        if suite.skipped:
            pytest.skip(suite.skipped)
        if suite.broken:
            pytest.fail(suite.broken, pytrace=False)
        assert suite.junit is not None
        summary = suite.output[-1] if suite.output else "(no output)"
        if not suite.junit.exists():
            pytest.fail(
                f"the Iris suite did not run (exit {suite.returncode}):\n" + "\n".join(suite.output[-40:]),
                pytrace=False,
            )
        total, failed = failures_in(suite.junit)
        shutil.rmtree(suite.junit.parent, ignore_errors=True)
        if failed or suite.returncode != 0 or total == 0:
            pytest.fail(
                f"Iris suite on {suite.found}: {len(failed)} of {total} failed ({summary})\n"
                + "\n".join(failed or suite.output[-40:]),
                pytrace=False,
            )
        print(f"Iris suite on {suite.found}, venv {suite.built}: {summary} in {suite.seconds:.0f}s")


def test_without_python312_the_reason_names_what_was_tried(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("FRAY_PYTHON312", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    python, reason = find_python312()
    assert python is None and "no Python >= 3.12 found" in reason and "pyenv" in reason
    monkeypatch.setenv("FRAY_PYTHON312", str(tmp_path / "missing-python"))
    assert find_python312()[0] is None
