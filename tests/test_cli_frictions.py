"""A new user's first steps (issue 25), driven as the user took them: ``fray`` and the examples as subprocesses.

Optional packages are made unimportable, where a test needs them missing, by a
``sitecustomize`` on ``PYTHONPATH`` that refuses them (inherited by the processes the
command starts), so nothing is uninstalled and the result does not depend on what is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.test_cli_errors import Run, _env, _runner, assert_user_error
from fray.cli.cluster import DEFAULT_DIR, up_again
from fray.cli.status import no_dashboard_hint
from fray.client import client_from_spec
from fray.cluster.server.launcher import LocalCluster
from fray.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent

_BLOCKER = """
import os
import sys

_BLOCKED = set(filter(None, os.environ.get("FRAY_TEST_BLOCKED_MODULES", "").split(",")))


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
"""


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """Environment variables that make ``modules`` unimportable in a subprocess (and its children)."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_BLOCKER)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "FRAY_TEST_BLOCKED_MODULES": ",".join(modules)}


def _engine_rows(out: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0].startswith("engine "):
            rows[cells[0].removeprefix("engine ")] = cells[1]
    assert set(rows) == {"ray", "monarch", "iris"}, out.stdout
    return rows


def test_info_names_the_extra_of_each_missing_engine(tmp_path: Path):
    run = _runner(_env(tmp_path))
    as_installed = _engine_rows(run("info"))
    none_installed = _engine_rows(run("info", extra_env=_without(tmp_path, "ray", "monarch", "iris")))
    for rows in (as_installed, none_installed):
        for name, text in rows.items():
            assert 'pip install "fray"' not in text, text  # what was left once rich took "[ray]" for markup
            if "not installed" in text:
                assert f'pip install "fray[{name}]"' in text, (name, text)
            else:
                assert text.startswith(("installed", "usable")), (name, text)
    assert none_installed == {
        "ray": 'not installed: pip install "fray[ray]"',
        "monarch": 'not installed: pip install "fray[monarch]"',
        "iris": 'not installed: pip install "fray[iris]" (Python >= 3.12)',
    }


def test_cluster_down_with_nothing_up_says_so_and_succeeds(tmp_path: Path):
    run = _runner(_env(tmp_path))
    for _ in range(2):  # safe to repeat, as a cleanup step in a script would
        out = run("cluster", "down")
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""
        assert out.stdout.strip().splitlines() == [
            f"no Fray cluster is up (nothing recorded in {tmp_path}/.config/fray/cluster.json): nothing to stop"
        ]


@pytest.mark.parametrize("spec", ["fary://127.0.0.1:7100", "fray://127.0.0.1", "fray", "fray://127.0.0.1:7100/x"])
def test_a_bad_client_spec_is_refused_not_ignored(fray_cluster: LocalCluster, tmp_path: Path, spec: str):
    # As the user had it: a cluster recorded by `fray cluster up`, and a typo in FRAY_CLIENT_SPEC.
    state = tmp_path / ".config" / "fray" / "cluster.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"address": fray_cluster.address}))
    run = _runner(_env(tmp_path, FRAY_TOKEN=fray_cluster.token))
    assert run("job", "list").returncode == 0  # the recorded cluster answers without the spec
    with pytest.raises(ConfigError) as raised:
        client_from_spec(spec)
    error = assert_user_error(run("job", "list", extra_env={"FRAY_CLIENT_SPEC": spec}), "FRAY_CLIENT_SPEC")
    assert error == f"error: FRAY_CLIENT_SPEC: {raised.value}"


def _run_example(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env={k: v for k, v in os.environ.items() if k != "FRAY_CLIENT_SPEC"} | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("example", "module", "extra"), [("data_pipeline.py", "fsspec", "examples"), ("ray_in_fray.py", "ray", "ray")]
)
def test_an_example_names_the_extra_it_needs(tmp_path: Path, example: str, module: str, extra: str):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dependency.startswith(module) for dependency in extras[extra]), extras[extra]
    out = _run_example(example, _without(tmp_path, module))
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f'{example} needs {module}: pip install "fray[{extra}]"']


@pytest.fixture
def cluster_without_dashboard(tmp_path: Path) -> Iterator[tuple[Run, subprocess.CompletedProcess[str]]]:
    """`fray cluster up` in a temporary HOME with the dashboard extra unimportable; `down` afterwards."""
    run = _runner(_env(tmp_path, **_without(tmp_path, "starlette", "uvicorn")))
    up = run("cluster", "up", "--workers", "0", "--port", "0", "--dir", str(tmp_path / "c"))
    try:
        assert up.returncode == 0, up.stderr
        yield run, up
    finally:
        down = run("cluster", "down")
        assert down.returncode == 0, down.stderr


def test_cluster_up_says_the_dashboard_extra_is_missing_and_dashboard_says_what_works(
    cluster_without_dashboard: tuple[Run, subprocess.CompletedProcess[str]], tmp_path: Path
):
    run, up = cluster_without_dashboard
    state = json.loads((tmp_path / ".config" / "fray" / "cluster.json").read_text())
    again = f"fray cluster down && fray cluster up --workers 0 --port {state['port']} --dir {tmp_path / 'c'} --resume"
    notes = [line for line in up.stderr.splitlines() if "dashboard" in line]
    assert notes == [
        f'  dashboard: none (the dashboard extra is not installed: pip install "fray[dashboard]", then `{again}`)'
    ]
    out = run("dashboard")
    assert_user_error(out, f"the controller at {state['address']} serves no dashboard")
    assert out.stderr.splitlines()[1] == (
        f'hint: install the dashboard extra (pip install "fray[dashboard]"), then restart the cluster: {again}'
    )
    # What the old hint suggested, and what does not work on a running cluster.
    restart = run("cluster", "restart")
    assert restart.returncode == 0 and "nothing to restart" in restart.stdout


def test_the_dashboard_hint_for_each_reason():
    state = {
        "address": "127.0.0.1:7100",
        "port": 7100,
        "directory": str(DEFAULT_DIR),
        "workers": ["worker-0", "worker-1"],
        "controller_args": ["--retention-days", "30", "--no-dashboard"],
        "worker_args": ["--attr", "preemptible=false"],
    }
    # A longer retention survives the restart; the dashboard flag is what goes; the database is kept (--resume).
    assert up_again(state) == "fray cluster down && fray cluster up --retention-days 30 --resume"
    assert no_dashboard_hint("127.0.0.1:7100", state, "") == (
        "the cluster was started with --no-dashboard; start it again with one: "
        "fray cluster down && fray cluster up --retention-days 30 --resume"
    )
    assert no_dashboard_hint("127.0.0.1:7100", state, "No module named 'uvicorn'").startswith(
        'install the dashboard extra (pip install "fray[dashboard]"), then restart the cluster: fray cluster down && '
    )
    for recorded in (None, state):  # a controller `fray cluster up` did not start
        hint = no_dashboard_hint("10.0.0.5:7100", recorded, "")
        assert "fray[dashboard]" in hint and "`fray controller`" in hint and "fray cluster" not in hint
    custom = {**state, "workers": ["worker-0"], "worker_args": ["--cpu", "4", "--attr", "preemptible=false"]}
    assert up_again(custom) == (
        "fray cluster down && fray cluster up --workers 1 --retention-days 30 "
        "--worker-option '--cpu 4 --attr preemptible=false' --resume"
    )
