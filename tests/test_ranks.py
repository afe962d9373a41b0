"""The supervisor of a replica's processes (``python -m fray.process._ranks``), run as the backends run it.

Real processes throughout; the tests synchronise on what the processes print, never on time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, GpuConfig, JobRequest, ResourceConfig
from fray.process._ranks import check_processes, gpu_shares, ranked_argv
from support import alive

PRINT_RANK = "import os; print(os.environ['FRAY_PROCESS_INDEX'], os.environ.get('CUDA_VISIBLE_DEVICES'))"


def _supervise(
    nproc: int, *command: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = ranked_argv(list(command), nproc)
    argv[argv.index("--") : argv.index("--")] = list(extra)
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    )


def _start(nproc: int, code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ranked_argv([sys.executable, "-c", code], nproc),
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_one_process_is_the_command_itself():
    assert ranked_argv(["prog", "a"], 1) == ["prog", "a"]


def test_each_process_gets_its_rank_from_the_replicas_and_its_share_of_the_gpus():
    done = _supervise(
        2,
        sys.executable,
        "-c",
        PRINT_RANK,
        extra=("--gpus", "4"),
        env={"FRAY_REPLICA_INDEX": "1", "FRAY_REPLICA_COUNT": "3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"},
    )
    assert done.returncode == 0, done.stdout
    assert sorted(done.stdout.splitlines()) == ["[proc 0] 2 4,5", "[proc 1] 3 6,7"]


def test_without_a_visible_list_the_shares_are_of_the_first_gpus():
    env = {"FRAY_REPLICA_INDEX": "0", "FRAY_REPLICA_COUNT": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = _supervise(2, sys.executable, "-c", PRINT_RANK, extra=("--gpus", "2"), env=env)
    assert sorted(done.stdout.splitlines()) == ["[proc 0] 0 0", "[proc 1] 1 1"]


def test_gpus_that_do_not_split_stop_it_before_anything_runs():
    done = _supervise(3, sys.executable, "-c", PRINT_RANK, extra=("--gpus", "4"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 127
    assert "do not split into 3 equal shares" in done.stdout
    assert gpu_shares(["a", "b", "c", "d"], 2) == [["a", "b"], ["c", "d"]]


def test_a_last_line_without_newline_is_kept_and_tagged():
    done = _supervise(2, sys.executable, "-c", "import sys; sys.stdout.write('no newline')")
    assert sorted(done.stdout.splitlines()) == ["[proc 0] no newline", "[proc 1] no newline"]


def test_the_first_failure_stops_the_others_and_is_the_exit_status(tmp_path: Path):
    # Process 1 exits 3 once process 0 has written its pid; process 0 would wait for ever but for the supervisor.
    marker = tmp_path / "up"
    code = (
        "import os, sys, threading, time\n"
        f"marker = {str(marker)!r}\n"
        "if os.environ['FRAY_LOCAL_PROCESS_INDEX'] == '0':\n"
        "    open(marker + '.tmp', 'w').write(str(os.getpid())); os.rename(marker + '.tmp', marker)\n"
        "    threading.Event().wait()\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists(marker) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    proc = _start(2, code)
    assert proc.wait(timeout=90) == 3
    assert not alive(int(marker.read_text()))


def test_a_process_killed_by_a_signal_ends_the_supervisor_with_that_signal():
    done = _supervise(
        2,
        sys.executable,
        "-c",
        "import os, signal\nif os.environ['FRAY_LOCAL_PROCESS_INDEX'] == '1': os.kill(os.getpid(), signal.SIGKILL)",
    )
    assert done.returncode == -signal.SIGKILL


def test_sigterm_to_the_supervisor_alone_reaches_every_process():
    proc = _start(2, "import os, threading; print('up', os.getpid()); threading.Event().wait()")
    assert proc.stdout is not None
    pids = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    proc.send_signal(signal.SIGTERM)  # not to its process group: forwarding must do it
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert not any(alive(pid) for pid in pids)


def test_the_failing_process_writes_the_replicas_failure_file(tmp_path: Path):
    failure = tmp_path / "failure"
    code = (
        "import os, sys\n"
        "if os.environ['FRAY_LOCAL_PROCESS_INDEX'] == '1':\n"
        "    open(sys.argv[1], 'w').write('written by process 1 to ' + os.path.basename(sys.argv[1])); sys.exit(1)\n"
    )
    done = _supervise(2, sys.executable, "-c", code, str(failure), extra=("--failure", str(failure)))
    assert done.returncode == 1
    assert failure.read_text() == "written by process 1 to failure.1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failure"]


def test_a_program_that_cannot_start_fails_the_replica_saying_why():
    done = _supervise(2, "/nonexistent/program")
    assert done.returncode == 127
    assert "cannot start process 0 of 2" in done.stdout


def test_processes_must_divide_every_gpu_choice_at_submit():
    request = JobRequest(
        name="gpus",
        entrypoint=Entrypoint.from_binary("true"),
        resources=ResourceConfig(device=GpuConfig("auto", count=4)),
        processes_per_task=4,
    )
    check_processes(request)  # 4 GPUs, 4 processes: one each
    with pytest.raises(ConfigError, match=r"processes_per_task=3 must divide the 4 GPUs"):
        check_processes(
            JobRequest(name="gpus", entrypoint=request.entrypoint, resources=request.resources, processes_per_task=3)
        )
