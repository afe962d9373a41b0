"""The shared subprocess replica runner: start, stream, kill the group, say how it ended."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle

from fray import Entrypoint
from fray.core._lifecycle import FailureKind
from fray.core.inside._logcapture import LogBuffer
from fray.job import JobInfo
from fray.process._procjob import TAIL_LINES, ReplicaProcess, callable_argv
from support import alive, wait_until


class PlanError(Exception):
    pass


def raise_plan_error() -> None:
    raise PlanError("no plan")


def succeed() -> None:
    print("fine")


INFO = JobInfo("job-1", "job", 0, 1)


def replica(argv: list[str], logs: LogBuffer | None = None, **kwargs) -> ReplicaProcess:
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **kwargs.pop("user_env", {})}
    label = kwargs.pop("label", argv[0])
    return ReplicaProcess(argv, INFO, "local", logs or LogBuffer(echo=False), label=label, user_env=env, **kwargs)


def test_success_streams_output_into_the_log():
    logs = LogBuffer(echo=False)
    assert replica(["bash", "-c", "echo one; echo two >&2; printf three"], logs).run() is None
    assert logs.lines() == ("one", "two", "three")


def test_nonzero_exit_is_a_failure_quoting_the_last_lines():
    failure = replica(["bash", "-c", "for i in $(seq 1 25); do echo line $i; done; exit 4"]).run()
    assert failure is not None and failure.exit_code == 4 and failure.kind == FailureKind.FAILURE
    assert failure.message.startswith("'bash' exit code 4; last output:")
    assert failure.message.splitlines()[1:] == [f"line {i}" for i in range(26 - TAIL_LINES, 26)]


def test_a_program_that_cannot_start_is_a_failure():
    failure = replica(["/no/such/program-xyz"]).run()
    assert failure is not None and "cannot start '/no/such/program-xyz'" in failure.message


def test_callable_failure_comes_back_as_the_users_exception(tmp_path: Path):
    payload, failure_path = tmp_path / "payload", tmp_path / "failure"
    payload.write_bytes(cloudpickle.dumps(Entrypoint.from_callable(raise_plan_error)))
    failure = replica(callable_argv(payload, failure_path), label="raise_plan_error", failure_path=failure_path).run()
    assert failure is not None and failure.remote is not None
    assert failure.message == "PlanError: no plan"
    assert "raise_plan_error" in failure.remote.traceback_text
    payload.write_bytes(cloudpickle.dumps(Entrypoint.from_callable(succeed)))
    assert replica(callable_argv(payload, tmp_path / "f2"), failure_path=tmp_path / "f2").run() is None


def test_kill_reaches_the_whole_process_group(tmp_path: Path):
    pidfile = tmp_path / "child"
    proc = replica(["bash", "-c", f"sleep 300 & echo $! > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"])
    outcome: list[object] = []
    runner = threading.Thread(target=lambda: outcome.append(proc.run()))
    runner.start()
    child = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the child's pid"))
    proc.kill()
    runner.join(30)
    assert not runner.is_alive() and proc.killed
    wait_until(lambda: not alive(child), what="the grandchild to die with its group")


def test_a_replica_killed_before_it_starts_never_runs(tmp_path: Path):
    marker = tmp_path / "ran"
    proc = replica(["bash", "-c", f"touch {marker}"])
    proc.kill()
    proc.run()
    assert proc.killed and not marker.exists()


_EXITING_CLIENT = """
import os, sys, threading, time
from pathlib import Path
from fray.core.inside._logcapture import LogBuffer
from fray.process._procjob import ReplicaProcess
pidfile = Path(sys.argv[1])
from fray.job import JobInfo
replica = ReplicaProcess(
    ["bash", "-c", f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300"],
    JobInfo("job-1", "job"), "local", LogBuffer(echo=False), label="sleep",
)
threading.Thread(target=replica.run, daemon=True).start()
while not pidfile.exists():
    time.sleep(0.01)
"""


def test_replicas_do_not_outlive_the_process_that_started_them(tmp_path: Path):
    pidfile = tmp_path / "pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", _EXITING_CLIENT, str(pidfile)], env=env, timeout=60, check=True)
    pid = int(pidfile.read_text())
    wait_until(lambda: not alive(pid), what=f"replica {pid} to die with its client")


def test_the_replica_runs_with_its_identity_and_the_users_variables():
    logs = LogBuffer(echo=False)
    script = 'echo "$FRAY_JOB_ID $FRAY_REPLICA_INDEX $FRAY_CLIENT_SPEC $COLOUR"'
    assert replica(["bash", "-c", script], logs, user_env={"COLOUR": "blue"}).run() is None
    assert logs.lines() == ("job-1 0 local blue",)
