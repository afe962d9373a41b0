"""marin's own code (marin-core's execution layer, zephyr's pipelines) runs on Fray unchanged (issue 22).

marin's packages need Python >= 3.12 and the suite runs on the README's Python, so each test
runs ``run_marin.py`` inside the cached Python 3.12 venv (``marin_venv.py``: the Iris suite's
venv, this checkout's Fray editable, marin-core and marin-zephyr at their published 0.2.227
with ``--no-deps``), once per backend -- local, ``fray://``, Ray and Iris -- and checks what marin's code wrote. Skipped, saying why,
where no Python 3.12 exists. The runs start in the background when the session starts; the
tests, placed last, check them (``tests/early.py``).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from marin_venv import INSTALL_TIMEOUT, ROOT, SUITE_TIMEOUT, VenvBuildError, ensure_marin_venv, find_python312

import early

SCRIPT = Path(__file__).with_name("run_marin.py")
# One backend's run: a cluster or a Ray started, two StepRunner runs and two zephyr pipelines.
RUN_TIMEOUT = 15 * 60
CLIENTS = {"local": "MarinLocalClient", "cluster": "ClusterClient", "ray": "RayClient", "iris": "IrisClient"}
# What the pipeline writes: of 0..299, every third number, with its square.
EXPECTED_ROWS = [{"i": i, "square": i * i} for i in range(0, 300, 3)]
# zephyr's Quick Start over run_marin's 90 documents: those scored above 0.5, with their word count.
QUICK_START_ROWS = [{"id": doc, "words": 4} for doc in range(90) if (doc % 10) / 10 > 0.5]


@dataclass(frozen=True)
class MarinRun:
    """What running ``run_marin.py`` for one backend in the 3.12 venv gave."""

    skipped: str | None = None
    broken: str | None = None  # the venv could not be built
    workdir: Path = Path()
    returncode: int = 0
    stdout: str = ""
    output: tuple[str, ...] = ()
    seconds: float = 0.0


def run_marin(backend: str) -> MarinRun:
    """Build (or reuse) the marin venv and run marin's code on ``backend``; started early, in the background."""
    python, found = find_python312()
    if python is None:
        return MarinRun(skipped=f"marin's code did not run: marin-core and zephyr need Python >= 3.12 and {found}")
    try:
        venv, _built = ensure_marin_venv(python)
    except VenvBuildError as exc:
        return MarinRun(broken=str(exc))
    workdir = Path(tempfile.mkdtemp(prefix=f"fray-marin-{backend}-"))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "RAY_ADDRESS")}
    env = {k: v for k, v in env.items() if not k.startswith("FRAY_")}
    started = time.monotonic()
    run = early.run(
        [str(venv / "bin" / "python"), str(SCRIPT), backend, str(workdir)], cwd=workdir, env=env, timeout=RUN_TIMEOUT
    )
    output = tuple((run.stdout + run.stderr).strip().splitlines())
    return MarinRun(None, None, workdir, run.returncode, run.stdout, output, time.monotonic() - started)


def _rows(paths: list[str]) -> list[dict]:
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines()]
    return sorted(rows, key=lambda row: row["i"])


def _gunzip_lines(path: str) -> list[str]:
    with gzip.open(path, "rt") as f:
        return f.read().splitlines()


def _status(step_path: str) -> str:
    return Path(step_path, ".executor_status").read_text().strip()


@pytest.mark.timeout(SUITE_TIMEOUT + INSTALL_TIMEOUT + 5 * RUN_TIMEOUT)
@pytest.mark.parametrize("backend", sorted(CLIENTS))
@pytest.mark.runs_early.with_args(run_marin)
def test_marin_steps_and_zephyr_pipelines_run_on_fray(backend: str, request: pytest.FixtureRequest) -> None:
    run: MarinRun = early.result(request)
    if run.skipped:
        pytest.skip(run.skipped)
    if run.broken:
        pytest.fail(run.broken, pytrace=False)
    tmp_path = run.workdir
    assert run.returncode == 0, f"marin's code failed on {backend} (exit {run.returncode}):\n" + "\n".join(
        run.output[-60:]
    )
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"{backend}: {run.seconds:.0f}s; {summary}")

    # Our Fray, not marin-fray, ran marin's code.
    assert Path(summary["fray"]).resolve().is_relative_to(ROOT / "src" / "fray")
    assert summary["client"] == CLIENTS[backend]

    # StepRunner: the inline step, then the @remote step that depends on it (a Fray job).
    assert json.loads(Path(summary["squares_path"], "squares.json").read_text()) == [n * n for n in range(10)]
    assert _status(summary["numbers_path"]) == _status(summary["squares_path"]) == "SUCCESS"
    calls = [json.loads(line) for line in (tmp_path / "calls.log").read_text().splitlines()]
    # Each step ran once: the second StepRunner run found both done and ran neither.
    assert [call["step"] for call in calls] == ["numbers", "squares", "fails"]
    runner = summary["runner_pid"]
    assert calls[0]["pid"] == runner  # inline steps run in the runner's thread
    if backend == "local":
        assert calls[1]["pid"] == runner  # the local backend runs jobs in-process
    else:
        assert calls[1]["pid"] != runner  # a real job, in a process of its own

    # A failing @remote step fails its StepRunner run and is recorded as FAILED.
    assert summary["failure_raised"] is not None
    assert _status(summary["fails_path"]) == "FAILED"

    # The zephyr pipeline that ran inside the @remote step, on the job's own current client.
    in_step = json.loads(Path(summary["squares_path"], "zephyr-results.json").read_text())
    assert in_step["client"] == CLIENTS[backend]
    assert len(in_step["results"]) == 3
    assert _rows(in_step["results"]) == EXPECTED_ROWS

    # The zephyr pipeline the driver ran with the client: its coordinator and workers are Fray actors.
    assert len(summary["zephyr_results"]) == 3
    assert _rows(summary["zephyr_results"]) == EXPECTED_ROWS

    # zephyr's published pipelines (its README): the Quick Start over gzipped files, and group_by.
    quick = sorted(
        (json.loads(line) for path in summary["quick_start_results"] for line in _gunzip_lines(path)),
        key=lambda row: row["id"],
    )
    assert quick == QUICK_START_ROWS
    assert all(
        Path(path).name.endswith(f"-of-{len(summary['quick_start_results']):05d}.jsonl.gz")
        for path in summary["quick_start_results"]
    )
    assert summary["counts_by_score"] == [{"score": score / 10, "count": 9} for score in range(10)]
    shutil.rmtree(tmp_path, ignore_errors=True)  # kept when a check failed, to be looked at
