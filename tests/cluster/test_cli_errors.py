"""Every user mistake on the command line: one `error:` line, one `hint:` line, exit code 2, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fray.cluster.server.launcher import LocalCluster

Run = Callable[..., subprocess.CompletedProcess[str]]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env["HOME"] = str(home)
    env.update(extra)
    return env


def _runner(env: dict[str, str]) -> Run:
    def run(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fray.cli", *args],
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


@pytest.fixture
def fray_cli(fray_cluster: LocalCluster, tmp_path: Path) -> Run:
    """`fray` against the session's cluster (its token and address in the environment)."""
    return _runner(_env(tmp_path, FRAY_TOKEN=fray_cluster.token, FRAY_CLIENT_SPEC=f"fray://{fray_cluster.address}"))


def assert_user_error(out: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit code 2, exactly `error: ...` and `hint: ...` on stderr, no traceback; return the error line."""
    assert out.returncode == 2, f"exit {out.returncode}: {out.stdout}{out.stderr}"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_controller_fails_fast_with_the_address_and_the_way_out(tmp_path: Path):
    port = _free_port()
    run = _runner(_env(tmp_path, FRAY_TOKEN="x", FRAY_CLIENT_SPEC=f"fray://127.0.0.1:{port}"))
    started = time.monotonic()
    out = run("job", "list")
    elapsed = time.monotonic() - started
    assert_user_error(out, f"127.0.0.1:{port}", "FRAY_CLIENT_SPEC")
    assert "fray cluster up" in out.stderr
    print(f"unreachable controller reported after {elapsed:.2f}s (issue 12 asks for <= 3 s)")


def test_no_cluster_anywhere(tmp_path: Path):
    out = _runner(_env(tmp_path))("job", "list")
    assert_user_error(out, "no Fray cluster")
    assert "fray cluster up" in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("job", "status", "nosuchjob"),
        ("job", "stop", "nosuchjob"),
        ("job", "logs", "nosuchjob"),
        ("job", "logs", "-f", "nosuchjob"),
    ],
)
def test_unknown_job(fray_cli: Run, args: tuple[str, ...]):
    assert_user_error(fray_cli(*args), "no job 'nosuchjob'")


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (("--ram", "lots"), "'lots' is not a size"),
        (("--cpu", "-1"), "must not be negative"),
        (("--name", "a b"), "'a b' is invalid"),
        (("--env", "NOEQUALS"), "--env 'NOEQUALS'"),
        (("--replicas", "0"), "replicas=0"),
    ],
)
def test_bad_submit_options(fray_cli: Run, options: tuple[str, ...], fragment: str):
    assert_user_error(fray_cli("job", "submit", *options, "--", "true"), fragment)


def test_wrong_token(fray_cli: Run):
    out = fray_cli("job", "list", extra_env={"FRAY_TOKEN": "not-the-token"})
    assert_user_error(out, "refused this cluster token")


def test_usage_errors_are_user_errors_too(fray_cli: Run):
    assert_user_error(fray_cli("job", "list", "--bogus"), "--bogus")
    assert_user_error(fray_cli("job", "list", "--state", "nosuchstate"), "nosuchstate")
    assert_user_error(fray_cli("job", "submit"), "COMMAND")


def test_debug_shows_the_traceback(fray_cli: Run):
    wrong = {"FRAY_TOKEN": "not-the-token"}
    for out in (
        fray_cli("--debug", "job", "list", extra_env=wrong),
        fray_cli("job", "list", extra_env={**wrong, "FRAY_DEBUG": "1"}),
    ):
        assert out.returncode == 1
        assert "Traceback" in out.stderr and "AuthenticationError" in out.stderr


def test_jobs_are_named_by_id_or_by_unique_name(fray_cli: Run):
    name = f"named-{os.getpid()}"
    submitted = fray_cli("job", "submit", "--name", name, "--wait", "--", "bash", "-c", "echo from-$FRAY_JOB_NAME")
    assert submitted.returncode == 0, submitted.stderr
    assert f"from-{name}" in submitted.stdout
    by_name = fray_cli("job", "logs", name)
    assert by_name.returncode == 0 and by_name.stdout.strip() == f"from-{name}"
    assert fray_cli("job", "status", name).returncode == 0
    again = fray_cli("job", "submit", "--name", name, "--", "true")
    assert again.returncode == 0
    assert_user_error(fray_cli("job", "logs", name), f"'{name}' names 2 jobs")
    job_id = again.stdout.strip()
    assert fray_cli("job", "logs", job_id).returncode == 0


def test_cluster_up_on_a_busy_port(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _runner(_env(tmp_path))("cluster", "up", "--workers", "0", "--port", str(port))
    assert_user_error(out, f"port {port}", "in use")
    assert "--port" in out.stderr
