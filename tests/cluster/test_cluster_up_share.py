"""`fray cluster up --workers N` divides this machine's cores and memory among the N workers (issue 25).

Each worker offers the whole machine unless told otherwise, so before this two workers
on a 2-core machine offered 4 cores and twice its memory, without a word.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cli.cluster import up_again
from fray.resources import format_size
from support import fray_cli_in

ROOT = Path(__file__).resolve().parents[2]


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.fixture
def fray_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_TOKEN", "FRAY_CLIENT_SPEC")}
    env["HOME"] = str(tmp_path)  # the token and the cluster's state file go under ~/.config/fray
    yield env
    fray_cli_in(env)("cluster", "down", check=False)


def test_up_divides_the_machine_among_its_workers_and_the_quickstart_fits(fray_env: dict[str, str]) -> None:
    fray = fray_cli_in(fray_env)
    up = fray("cluster", "up", "--workers", "2", "--port", "0")
    cores = (os.cpu_count() or 1) / 2
    printed = " ".join((up.stdout + up.stderr).split())  # rich may wrap the line
    assert f"each worker: {cores:g} cores, {format_size(_total_memory() // 2)} RAM" in printed, printed
    workers = json.loads(fray("worker", "list", "--json").stdout)
    assert [w["cpu"] for w in workers] == [cores, cores]
    assert [w["ram"] for w in workers] == [format_size(_total_memory() // 2)] * 2
    # The README's demo on that cluster: its gang of 4 still fits a 2-core machine.
    state = json.loads((Path(fray_env["HOME"]) / ".config" / "fray" / "cluster.json").read_text())
    address = state["address"]
    # The command that starts it again alike does not spell out the share: `up` divides again by itself.
    assert "--cpu" not in up_again(state) and "--ram" not in up_again(state), up_again(state)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**fray_env, "FRAY_CLIENT_SPEC": f"fray://{address}"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tokenize" in out.stdout and "=succeeded" in out.stdout, out.stdout


def test_worker_options_given_are_kept(fray_env: dict[str, str]) -> None:
    fray = fray_cli_in(fray_env)
    fray("cluster", "up", "--workers", "2", "--port", "0", "--worker-option", "--cpu 3", "--no-dashboard")
    workers = json.loads(fray("worker", "list", "--json").stdout)
    assert [w["cpu"] for w in workers] == [3, 3]
    assert [w["ram"] for w in workers] == [format_size(_total_memory() // 2)] * 2


def test_one_worker_offers_the_whole_machine(fray_env: dict[str, str]) -> None:
    fray = fray_cli_in(fray_env)
    up = fray("cluster", "up", "--workers", "1", "--port", "0", "--no-dashboard")
    assert "each worker" not in up.stdout + up.stderr
    workers = json.loads(fray("worker", "list", "--json").stdout)
    assert [w["cpu"] for w in workers] == [os.cpu_count() or 1]
