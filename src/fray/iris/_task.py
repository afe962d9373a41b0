"""What runs inside an Iris task on Fray's behalf: who am I, run the callable, report how it ended.

Iris ships back only a task's state, exit code and logs, never a return value or an
exception. So a callable that raises is reported the way Fray reports every remote
exception, :meth:`RemoteFailure.encode`, written to the task's stderr as one tagged
base64 line (:data:`FAILURE_TAG`) after the readable traceback, and the task exits with
:data:`FAILED_EXIT`. The client finds that line with Iris's log query (a substring
match, per task and attempt) and hides it from ``logs()``. Logs are the one channel
Iris keeps for every task on every platform, for as long as it keeps the job.

Iris may publish a task's last lines a little after its final state, so every Fray
task ends its output with an end line (:data:`END_TAG`) on stdout and on stderr: once
both are in Iris's log store, so is everything the task printed before them.

``processes_per_task=N`` runs N ranked processes of the entrypoint in each task. On GPUs
Iris's own multi-GPU supervisor does (composed into the command at submit,
``fray.iris.entrypoints.wrap_multiprocess``); elsewhere Fray's shared supervisor does
(``fray.process._ranks``), started here, inside the task, once the task's identity is known
(its arguments in :data:`RANKS_ENV`). Either way each process gets Fray's rank variables; the
shared supervisor tags each line with ``[proc I]``, and the failure and end lines are read
through the tag (:func:`untagged`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shlex
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from fray.core._lifecycle import exit_status
from fray.core._remote import RemoteFailure
from fray.job import JobInfo
from fray.job_info import job_env
from fray.priority import TOP_LEVEL_BAND

__all__ = [
    "ARG_PREFIX",
    "BINARY_WRAPPER",
    "END_TAG",
    "FAILED_EXIT",
    "FAILURE_TAG",
    "binary_command",
    "decode_failure_line",
    "encode_failure_line",
    "enter",
    "identity",
    "ranks_args",
    "run_callable",
    "untagged",
]

#: Prefix of the one log line that carries an encoded :class:`RemoteFailure`.
FAILURE_TAG = "[fray-iris-failure] "
#: The line a Fray task writes last, on stdout and on stderr (Fray's ``logs()`` hides it).
END_TAG = "[fray-iris-end]"
#: Exit code of a task whose Python code raised (and wrote a failure line). Unusual on
#: purpose, so that a user's own ``sys.exit(1)`` is not mistaken for one.
FAILED_EXIT = 113

#: Environment variables the client sets on every replica besides :func:`fray.job.replica_env`'s.
HOSTS_ENV = "FRAY_IRIS_HOSTS_PER_REPLICA"
#: The arguments of Fray's rank supervisor (``-m fray.process._ranks --nproc N --``), set at submit
#: for a job of N processes per task that Iris's multi-GPU supervisor does not run.
RANKS_ENV = "FRAY_IRIS_RANKS"

#: The tag Fray's rank supervisor puts before each line of process I (``fray.process._ranks.tag``).
_PROC_TAG = re.compile(r"^\[proc \d+\] ")

#: What every word of a binary entrypoint's command is passed with (the wrapper strips it). Iris's
#: process runtime rewrites each argument that starts with one of its container mount paths
#: (``/tmp``, ``/app``, ``/cache``, ...) to that mount's directory on the host, so a command under
#: ``/tmp`` -- the driver's own venv, a script -- would name a file that is not there (exit 127).
#: With the prefix no word starts with ``/``: the command runs as written, as on every backend.
ARG_PREFIX = "="

#: A binary entrypoint runs as ``bash -c BINARY_WRAPPER fray-iris =COMMAND =ARGS...``: it sets the
#: per-task Fray variables from Iris's ``IRIS_TASK_ID`` (``/user/job/INDEX:ATTEMPT``), runs the
#: command (each word without its :data:`ARG_PREFIX`), writes the end lines and exits with the
#: command's exit code.
BINARY_WRAPPER = (
    't="${IRIS_TASK_ID%:*}"; j="${t%/*}"; r="${j#/*/}"; '
    'case "$r" in */*) n="${j%"/${r#*/}"}";; *) n="$j";; esac; '
    'export FRAY_JOB_ID="$j" FRAY_NAMESPACE="$n" FRAY_ATTEMPT="${IRIS_TASK_ID##*:}" '
    "FRAY_REPLICA_INDEX=$(( ${t##*/} / ${FRAY_IRIS_HOSTS_PER_REPLICA:-1} )); "
    # A process of Iris's multi-GPU supervisor: its rank as Fray's variables.
    'if [ -n "${IRIS_MULTIGPU_PROCESS_COUNT:-}" ]; then g="$IRIS_MULTIGPU_PROCESS_COUNT"; '
    'export FRAY_LOCAL_PROCESS_INDEX="$IRIS_MULTIGPU_PROCESS_INDEX" FRAY_LOCAL_PROCESS_COUNT="$g" '
    "FRAY_PROCESS_INDEX=$(( FRAY_REPLICA_INDEX * g + IRIS_MULTIGPU_PROCESS_INDEX )) "
    "FRAY_PROCESS_COUNT=$(( ${FRAY_REPLICA_COUNT:-1} * g )); fi; "
    'a=(); for w in "$@"; do a+=("${w#' + ARG_PREFIX + '}"); done; '
    # N processes per task: Fray's rank supervisor runs them (RANKS_ENV: its arguments, word-split).
    'if [ -n "${FRAY_IRIS_RANKS:-}" ]; then a=("${IRIS_PYTHON:-python3}" $FRAY_IRIS_RANKS "${a[@]}"); fi; '
    f'"${{a[@]}}"; rc=$?; echo "{END_TAG}"; echo "{END_TAG}" >&2; exit $rc'
)


def binary_command(argv: Sequence[str]) -> list[str]:
    """The command Iris runs for a binary entrypoint ``argv`` (see :data:`BINARY_WRAPPER`)."""
    return ["bash", "-c", BINARY_WRAPPER, "fray-iris", *(ARG_PREFIX + word for word in argv)]


def encode_failure_line(failure: RemoteFailure) -> str:
    """The log line that carries ``failure``."""
    return FAILURE_TAG + base64.b64encode(failure.encode()).decode("ascii")


def untagged(line: str) -> tuple[str, str]:
    """``line`` without the ``[proc I]`` tag of Fray's rank supervisor, and the tag (``""`` if none)."""
    match = _PROC_TAG.match(line)
    if match is None:
        return line, ""
    return line[match.end() :], match.group(0)


def decode_failure_line(line: str) -> RemoteFailure | None:
    """The failure a line written by :func:`encode_failure_line` carries (tagged or not), or None if it is not one."""
    text = untagged(line.strip())[0]
    if not text.startswith(FAILURE_TAG.strip()):
        return None
    try:
        return RemoteFailure.decode(base64.b64decode(text[len(FAILURE_TAG.strip()) :].strip(), validate=True))
    except (ValueError, binascii.Error):
        return None


def identity() -> JobInfo:
    """This task's Fray identity, from the variables Iris sets on every task and the client's own.

    Read from the environment rather than through ``iris.cluster.client.get_job_info``: the
    same values, without importing Iris's client in every task (most of a second each).
    ``IRIS_TASK_ID`` is ``/user/root-job/.../job/INDEX:ATTEMPT``.
    """
    raw = os.environ.get("IRIS_TASK_ID", "")
    task, colon, attempt = raw.rpartition(":")
    if not colon:  # no attempt given: the first
        task, attempt = raw, "0"
    job_id, _, index = task.rpartition("/")
    parts = job_id.strip("/").split("/")
    if not raw or not index.isdigit() or not attempt.isdigit() or len(parts) < 2:
        raise RuntimeError(f"not inside an Iris task: IRIS_TASK_ID={raw!r}")
    hosts = max(1, int(os.environ.get(HOSTS_ENV, "1")))
    tasks = int(os.environ.get("IRIS_NUM_TASKS", "1"))
    return JobInfo(
        job_id=job_id,
        name=os.environ.get("FRAY_JOB_NAME") or parts[-1],
        replica_index=int(index) // hosts,
        replica_count=int(os.environ.get("FRAY_REPLICA_COUNT") or max(1, tasks // hosts)),
        namespace="/" + "/".join(parts[:2]),
        attempt=int(attempt),
        priority_band=int(os.environ.get("FRAY_PRIORITY_BAND") or TOP_LEVEL_BAND),
    )


def enter() -> JobInfo:
    """Publish this task's identity in the environment, where :func:`fray.current_job` reads it.

    In a process of Iris's multi-GPU supervisor, its rank is published as Fray's rank variables too.
    """
    info = identity()
    os.environ.update(job_env(info))
    local, count = os.environ.get("IRIS_MULTIGPU_PROCESS_INDEX"), os.environ.get("IRIS_MULTIGPU_PROCESS_COUNT")
    if local and count and "FRAY_LOCAL_PROCESS_INDEX" not in os.environ:
        from fray.process._ranks import rank_env

        os.environ.update(rank_env(os.environ, int(local), int(count)))
    return info


def ranks_args(processes: int) -> list[str]:
    """What :data:`RANKS_ENV` holds for ``processes`` per task: the rank supervisor's arguments, before ``argv``."""
    from fray.process._ranks import ranked_argv

    command = ranked_argv(["ARGV"], processes, python="PYTHON")
    return command[1:-1]  # without the interpreter (the task's own) and the command


def write_end() -> None:
    """Write the end lines (see the module's docstring)."""
    for stream in (sys.stdout, sys.stderr):
        stream.write(f"{END_TAG}\n")
        stream.flush()


def exit_with_failure(exc: BaseException) -> None:
    """Write ``exc``'s traceback, its failure line and the end lines, then end the process with FAILED_EXIT."""
    failure = RemoteFailure.capture(exc)
    try:
        sys.stdout.flush()
        text = failure.traceback_text or "".join(traceback.format_exception(exc))
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.write(encode_failure_line(failure) + "\n")
        write_end()
    finally:
        # os._exit: the job has failed; threads the user's code left running must not keep it alive.
        os._exit(FAILED_EXIT)


def run_callable(payload: bytes) -> None:
    """Iris's entrypoint for a Fray callable job: unpickle ``(fn, args, kwargs)`` and call it.

    With :data:`RANKS_ENV` set, this process becomes the rank supervisor of N processes that each
    run the callable (``python -m fray.iris._task PAYLOAD_FILE``).
    """
    enter()
    ranks = os.environ.get(RANKS_ENV)
    if ranks and "FRAY_LOCAL_PROCESS_INDEX" not in os.environ:
        _supervise_ranks(payload, shlex.split(ranks))
    from fray.iris._stacks import announce

    announce()  # this process answers stacks() through Iris (fray.iris._stacks): one idle thread until asked
    try:
        fn, args, kwargs = _load(payload)
        fn(*args, **kwargs)
    except BaseException as exc:
        if exit_status(exc) != 0:  # sys.exit(0) ends a job as cleanly as returning does
            exit_with_failure(exc)
    write_end()


def _load(payload: bytes) -> Any:
    return cloudpickle.loads(payload)


def _supervise_ranks(payload: bytes, ranks: list[str]) -> None:
    """Become Fray's rank supervisor (exec) of processes that each run ``payload``, kept in the task's workdir."""
    path = Path(os.environ.get("IRIS_WORKDIR") or os.getcwd(), "fray-callable.pkl")
    path.write_bytes(payload)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, *ranks, sys.executable, "-m", "fray.iris._task", str(path)]
    os.execv(argv[0], argv)


if __name__ == "__main__":  # one process of a multi-process replica (see _supervise_ranks)
    run_callable(Path(sys.argv[1]).read_bytes())
