"""marin-fray's own published test suite, run against Fray: the drop-in, proven by marin's tests (issue 32).

marin publishes ``marin-fray`` (the ``fray`` package marin's code calls) with its tests in the
sdist. This module takes that sdist at test time -- ``pip download`` of
:data:`marin_venv.MARIN_VERSION`, cached under ``~/.cache/fray/marin-fray-sdist/`` like the
venv; the tests are never copied into this repository -- and runs its whole ``tests/``
directory twice in the cached Python 3.12 venv (``marin_venv.py``; marin-fray needs 3.12 and
its tests import Iris): once against marin-fray itself (its package put first on
``PYTHONPATH``), once against this checkout's Fray. Every test that passes on marin-fray
must pass on Fray, except those named in :data:`EXCEPTIONS` with their reason (at most two,
each in ``docs/marin.md``). The counts of both runs are printed. The runs start in the
background when the session starts; the test, placed last, checks them (``tests/early.py``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from marin_venv import (
    INSTALL_TIMEOUT,
    MARIN_VERSION,
    SUITE_TIMEOUT,
    VenvBuildError,
    ensure_marin_venv,
    find_python312,
    marin_fray_dir,
)

import early

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fray" / "marin-fray-sdist"
#: marin-fray's tests that may fail on Fray, each with the reason (docs/marin.md lists them too). None today.
EXCEPTIONS: dict[str, str] = {}
RUN_TIMEOUT = 10 * 60


def marin_fray_tests(venv: Path) -> Path:
    """The ``tests/`` directory of marin-fray's sdist, downloaded and unpacked once."""
    target = CACHE / MARIN_VERSION
    ready = target / ".ready"
    if ready.exists():
        return target / "tests"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return target / "tests"
        download = CACHE / f"download-{MARIN_VERSION}"
        shutil.rmtree(download, ignore_errors=True)
        # The 3.12 venv's pip: marin-fray requires Python >= 3.12, so an older pip finds no release.
        command = [str(venv / "bin/python"), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += ["-d", str(download), f"marin-fray=={MARIN_VERSION}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        archives = sorted(download.glob("marin_fray-*.tar.gz"))
        if not archives:  # pip may fail to build metadata after saving the archive; the archive is what we need
            raise VenvBuildError(f"downloading marin-fray's sdist failed: {(done.stdout + done.stderr)[-2000:]}")
        shutil.rmtree(target, ignore_errors=True)
        with tarfile.open(archives[0]) as archive:
            top = archive.getnames()[0].split("/")[0]
            archive.extractall(CACHE / "unpack", filter="data")
        (CACHE / "unpack" / top).rename(target)
        shutil.rmtree(download, ignore_errors=True)
        ready.write_text(archives[0].name)
    return target / "tests"


def outcomes(junit: Path) -> dict[str, str]:
    """``{"test_module.py::test_name[param]": "passed" | "failed" | "skipped"}`` from a JUnit report."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        file_part = next((i for i, part in enumerate(module) if part.startswith("test_")), len(module) - 1)
        name = f"{module[file_part]}.py::" + "::".join([*module[file_part + 1 :], case.get("name", "")])
        if case.find("failure") is not None or case.find("error") is not None:
            found[name] = "failed"
        elif case.find("skipped") is not None:
            found[name] = "skipped"
        else:
            found[name] = "passed"
    return found


def run_suite(python: Path, tests: Path, junit: Path, pythonpath: str | None) -> tuple[dict[str, str], str]:
    """Run marin-fray's tests with ``python``; each test's outcome and pytest's last lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FRAY_", "VIRTUAL_ENV", "RAY_"))}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    # marin's own pytest settings, but its pythonpath (its src/, which would shadow ours) and its
    # `-m 'not slow'` filter: the tests are collected from their directory with no config file.
    command = [str(python), "-m", "pytest", "-c", os.devnull, f"--rootdir={tests}", "-o", "addopts="]
    command += ["-p", "no:cacheprovider", "--import-mode=importlib", "--timeout=120", "-q", f"--junitxml={junit}"]
    command += ["--continue-on-collection-errors"]
    run = early.run([*command, str(tests)], cwd=tests, env=env, timeout=RUN_TIMEOUT)
    tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-40:])
    if not junit.exists():
        pytest.fail(f"marin-fray's suite did not run (exit {run.returncode}):\n{tail}", pytrace=False)
    return outcomes(junit), tail


@dataclass(frozen=True)
class SuiteRuns:
    """marin-fray's suite run twice: on marin-fray, then on Fray (or why it could not run)."""

    skipped: str | None = None
    broken: str | None = None
    built: str = ""
    on_marin: dict[str, str] = field(default_factory=dict)
    marin_tail: str = ""
    on_fray: dict[str, str] = field(default_factory=dict)
    fray_tail: str = ""
    seconds: float = 0.0


def run_both() -> SuiteRuns:
    """Get the venv and marin-fray's tests, then run them on marin-fray and on Fray; started early, in the background."""
    python, found = find_python312()
    if python is None:
        return SuiteRuns(skipped=f"marin-fray's suite did not run: it needs Python >= 3.12 and {found}")
    try:
        venv, built = ensure_marin_venv(python)
        tests = marin_fray_tests(venv)
    except VenvBuildError as exc:
        return SuiteRuns(broken=str(exc))
    interpreter = venv / "bin" / "python"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fray-marin-fray-suite-") as tmp:
        on_marin, marin_tail = run_suite(interpreter, tests, Path(tmp) / "marin.xml", str(marin_fray_dir(venv)))
        on_fray, fray_tail = run_suite(interpreter, tests, Path(tmp) / "fray.xml", None)
    return SuiteRuns(None, None, built, on_marin, marin_tail, on_fray, fray_tail, time.monotonic() - started)


@pytest.mark.timeout(SUITE_TIMEOUT + INSTALL_TIMEOUT + 2 * RUN_TIMEOUT + 15 * 60)
@pytest.mark.runs_early.with_args(run_both)
def test_marin_frays_own_suite_passes_on_fray(request: pytest.FixtureRequest) -> None:
    runs: SuiteRuns = early.result(request)
    if runs.skipped:
        pytest.skip(runs.skipped)
    if runs.broken:
        pytest.fail(runs.broken, pytrace=False)
    on_marin, marin_tail, on_fray, fray_tail = runs.on_marin, runs.marin_tail, runs.on_fray, runs.fray_tail
    built = runs.built

    def count(results: dict[str, str]) -> str:
        return ", ".join(f"{sum(v == k for v in results.values())} {k}" for k in ("passed", "failed", "skipped"))

    print(f"marin-fray {MARIN_VERSION}'s suite ({built}; {runs.seconds:.0f}s):")
    print(f"  on marin-fray: {count(on_marin)}")
    print(f"  on Fray:       {count(on_fray)} ({len(EXCEPTIONS)} documented exceptions)")
    assert on_marin, f"no test of marin-fray's suite ran on marin-fray:\n{marin_tail}"
    assert sum(v == "passed" for v in on_marin.values()) >= 0.9 * len(on_marin), (
        f"marin-fray's own suite fails on marin-fray here; the comparison would mean little:\n{marin_tail}"
    )
    regressed = sorted(
        name for name, result in on_marin.items() if result == "passed" and on_fray.get(name) != "passed"
    )
    unexpected = [name for name in regressed if name not in EXCEPTIONS]
    assert not unexpected, (
        f"{len(unexpected)} of marin-fray's tests pass on marin-fray but not on Fray: {unexpected}\n{fray_tail}"
    )
    stale = [name for name in EXCEPTIONS if on_fray.get(name) == "passed"]
    assert not stale, f"documented exceptions that now pass (drop them from EXCEPTIONS and docs/marin.md): {stale}"
