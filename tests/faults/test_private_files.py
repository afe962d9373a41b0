"""What Fray keeps on disk is its user's only (issue 25): 0600 files in 0700 directories, whatever the umask.

A real cluster is brought up by ``fray cluster up`` in a fresh home, under umask 022,
and runs jobs that leave every kind of state behind (a failure, a workspace, a
command); then every file and directory Fray made under that home is checked.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fray.core._private_files import open_private, private_dir, write_private
from support import fray_cli_in

CliRunner = Callable[..., "subprocess.CompletedProcess[str]"]

# A user's script: its functions live in __main__, so they travel by value to the tasks.
_JOBS = textwrap.dedent(
    """
    import json
    import sys
    from pathlib import Path

    from fray.cluster.client import ClusterClient
    from fray.job import Entrypoint, EnvironmentConfig, JobRequest

    def succeed():
        return 42

    def fail():
        raise ValueError("this job fails on purpose")

    def read_data():
        print(Path("data.txt").read_text().strip())

    address, project = sys.argv[1], sys.argv[2]
    client = ClusterClient(address)  # the token from ~/.config/fray, as any user's script finds it
    try:
        jobs = {
            "succeed": (succeed, EnvironmentConfig()),
            "fail": (fail, EnvironmentConfig()),
            "workspace": (read_data, EnvironmentConfig(workspace=project)),
        }
        statuses = {}
        for name, (function, environment) in jobs.items():
            request = JobRequest(name=name, entrypoint=Entrypoint.from_callable(function), environment=environment)
            statuses[name] = str(client.submit(request).wait(timeout=120, raise_on_failure=False))
        print(json.dumps(statuses))
    finally:
        client.shutdown(wait=False)
    """
)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The umask most systems give users: without Fray's care, its files would be world-readable."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def fray_cli(tmp_path: Path, umask_022: None) -> Iterator[tuple[CliRunner, dict[str, str]]]:
    """``fray ...`` with HOME in ``tmp_path/home``; the cluster it brings up is brought down at the end."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env["HOME"] = str(home)
    run = fray_cli_in(env)

    try:
        yield run, env
    finally:
        run("cluster", "down", check=False)


def _walk(root: Path) -> tuple[set[str], list[str]]:
    """The names of everything under ``root`` (not ``root`` itself), and those others may read, enter or write."""
    names: set[str] = set()
    offenders = []
    for current, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(current, name)
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:  # an outcome the controller acknowledged meanwhile
                continue
            names.add(name)
            if not stat.S_ISLNK(mode) and mode & 0o077:
                offenders.append(f"{stat.filemode(mode)} {path.relative_to(root)}")
    return names, sorted(offenders)


def _project(tmp_path: Path) -> Path:
    """A workspace made under umask 022: 0644 files, a 0755 directory and program."""
    project = tmp_path / "project"
    (project / "tools").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "private"\nversion = "0"\n')
    (project / "data.txt").write_text("shipped\n")
    tool = project / "tools" / "run.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    return project


def test_everything_fray_keeps_under_home_is_its_users_only(fray_cli, tmp_path: Path) -> None:
    run, env = fray_cli
    home = Path(env["HOME"])
    up = json.loads(run("cluster", "up", "--workers", "1", "--port", "0", "--json").stdout)
    run("job", "submit", "--wait", "--", "true")
    jobs = subprocess.run(
        [sys.executable, "-c", _JOBS, up["address"], str(_project(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert jobs.returncode == 0, jobs.stderr
    assert json.loads(jobs.stdout.splitlines()[-1]) == {
        "succeed": "succeeded",
        "fail": "failed",
        "workspace": "succeeded",
    }

    names, offenders = _walk(home)
    run("cluster", "down")
    _, after_down = _walk(home)

    # What the walk must have seen, or it proves nothing: the CLI's files, the controller's
    # database, a worker's task directories with a failure, an unpacked workspace, logs.
    expected = {
        "cluster.json",
        "token",
        "controller.db",
        "controller.log",
        "worker.credential",
        "worker-0.log",
        "tasks",
        "outcomes",
        "payload.pkl",
        "failure.pkl",
        "workspaces",
        "data.txt",
        "run.sh",
    }
    assert expected <= names, f"not seen under {home}: {sorted(expected - names)}"
    assert not offenders, f"readable by others while the cluster ran ({len(offenders)}):\n" + "\n".join(offenders)
    assert not after_down, f"readable by others after `fray cluster down` ({len(after_down)}):\n" + "\n".join(
        after_down
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_helpers_narrow_what_fray_made_before_and_leave_other_directories_alone(
    tmp_path: Path, umask_022: None
) -> None:
    shared = tmp_path / "config"  # like ~/.config: not Fray's
    shared.mkdir()
    own = shared / "fray"
    own.mkdir()
    state = own / "cluster.json"
    state.write_text("old")  # as an older Fray left them: 0755 and 0644
    write_private(state, "new")
    assert (_mode(shared), _mode(own), _mode(state)) == (0o755, 0o700, 0o600)
    assert state.read_text() == "new" and os.listdir(own) == ["cluster.json"]  # no temporary left
    deep = private_dir(tmp_path / "state" / "fray" / "cluster")
    assert [_mode(p) for p in (deep.parent.parent, deep.parent, deep)] == [0o700] * 3
    log = deep / "worker.log"
    log.write_text("")
    os.close(open_private(log))
    assert _mode(log) == 0o600
