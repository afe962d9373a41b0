"""Live stacks on Iris (``JobHandle.stacks()``, ``ActorHandle.stacks()``): asked where the task runs, through Iris.

Every Iris task that runs Fray's code serves its stacks on a Unix socket (:mod:`fray.core.inside._stacks`),
which answers only on its own host, inside its own container. So:

* **a job's tasks** are asked through Iris's own ``ExecInContainer`` RPC (what ``iris task exec``
  uses): the controller has the task's worker run a tiny command inside the task's container
  (``docker exec`` / ``kubectl exec``; a plain subprocess on the worker's host for Iris's process
  runtime). At start each task leaves a record naming its socket and its interpreter
  (:func:`announce`), keyed by its Iris task id; the command (:data:`_RELAY`) finds that record,
  asks the socket with a few lines of standard-library Python run by the task's own interpreter,
  and prints the JSON answer. No ptrace, no py-spy, nothing installed beside the task: Iris's own
  thread dumps (``ProfileTask``) use py-spy, which needs ptrace rights, so Fray does not use them.
* **the tasks of a job's context** are threads of the job's process on Iris (``LocalJobContext``):
  the answer says which thread runs which task (``thread_tasks``), and each such thread is
  reported on its own, with its task id.
* **an actor** answers itself, through a control method of its actor server that runs on a
  thread kept beside the actor's ``max_concurrency`` (``fray.iris._actor_host``): one RPC, on the
  same network path as its calls.

Where the caller may not run commands in the task's container (Iris's authorization says who may:
the job's owner), or the task is not running, the task is reported with ``error`` set; asking
never waits longer than its timeout.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from fray.core.inside._stacks import serve, socket_dir, socket_path
from fray.stacks import ProcessStacks, ThreadStack

__all__ = ["announce", "ask_actor", "ask_tasks", "record_name", "task_target"]

# The command run in the task's container: $1 the task's record name, $2 the asking program, $3 locals
# (0/1), $4 the seconds it may take. A task's process has the record ``$1``; each rank of a task of
# several processes has ``$1@RANK``. Each record's lines: socket path, interpreter, rank, pid.
_RELAY = (
    'd="${FRAY_STACKS_DIR:-/tmp/fray-stacks-$(id -u)}"; py=""; '
    'for f in "$d/$1" "$d/$1"@*; do if [ -r "$f" ]; then { read -r _; read -r py; } < "$f"; break; fi; done; '
    'if [ -z "$py" ]; then echo "no Fray stack server was started in this task" >&2; exit 3; fi; '
    'exec "$py" -c "$2" "$3" "$4" "$d/$1" "$d/$1"@*'
)

# What asks the sockets, side by side: the request and answer of fray.core.inside._stacks (one JSON line each
# way), in standard-library Python only, so that it runs with the task's interpreter whatever its paths.
_ASK = """
import json, socket, sys, threading
with_locals, timeout = sys.argv[1] == "1", float(sys.argv[2])
records = []
for path in sys.argv[3:]:
    try:
        with open(path) as f:
            sock, _, rank, pid = f.read().split("\\n")[:4]
    except (OSError, ValueError):
        continue
    records.append((sock, rank, pid))
answers = [None] * len(records)
def ask(i):
    sock, rank, pid = records[i]
    answer = {"rank": rank, "pid": pid}
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout)
        conn.connect(sock)
        conn.sendall(json.dumps({"locals": with_locals}).encode() + b"\\n")
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        answer["answer"] = json.loads(b"".join(chunks))
    except Exception as exc:
        answer["error"] = f"no answer: {type(exc).__name__}: {exc}"
    answers[i] = answer
threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(records))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(timeout + 0.5)
late = {"error": f"did not answer within {timeout:g} s"}
out = [a if a is not None else dict(late, rank=r[1], pid=r[2]) for a, r in zip(answers, records)]
sys.stdout.write(json.dumps({"host": socket.gethostname(), "answers": out}))
"""

#: Seconds of the caller's timeout left for Iris to start the command and carry its answer back.
_EXEC_SLACK = 1.0


def record_name(task_wire: str) -> str:
    """The file name of task ``task_wire``'s record (``/user/job/0``, without the attempt) in the socket directory."""
    return "iris-" + quote(task_wire, safe="")


def announce() -> None:
    """In an Iris task: serve this process's stacks and leave the record the relay finds them by.

    The record is replaced by each attempt of the task (and by a restarted actor's new process);
    it is removed when the process exits normally. Each rank of a task of several processes
    leaves its own (``NAME@RANK``).
    """
    serve()
    raw = os.environ.get("IRIS_TASK_ID", "")
    if not raw:
        return
    task = raw.rpartition(":")[0] if ":" in raw.rsplit("/", 1)[-1] else raw
    rank = os.environ.get("FRAY_LOCAL_PROCESS_INDEX", "")
    pid = os.getpid()
    path = os.path.join(socket_dir(), record_name(task) + (f"@{rank}" if rank else ""))
    try:
        temporary = f"{path}.{pid}"
        with open(temporary, "w") as record:
            record.write(f"{socket_path(pid)}\n{sys.executable}\n{rank}\n{pid}\n")
        os.replace(temporary, path)  # whole or not at all: the relay may read it at any moment
    except OSError:
        return  # no private socket directory (serve() said why): this task has no stacks to give
    atexit.register(_remove, path, pid)


def _remove(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child: the record is its parent's
        with contextlib.suppress(OSError):
            os.unlink(path)


def task_target(task: Any, label: str) -> tuple[str, str, str | None]:
    """What :func:`ask_tasks` takes for an Iris ``TaskStatus``: its id, ``label``, and why not if it is not running."""
    from iris.resources.state import TaskState

    state = TaskState(task.state)
    why = None if state == TaskState.RUNNING else f"is not running (Iris reports it {state.name})"
    return (task.task_id.to_wire(), label, why)


def ask_tasks(
    iris: Any, tasks: Sequence[tuple[str, str, str | None]], timeout: float, locals: bool
) -> tuple[ProcessStacks, ...]:
    """Ask each task ``(task id, label, why it cannot be asked or None)`` through Iris; all within ``timeout``.

    A task's answer is its process's stacks (label ``label``) and, for each thread that runs a
    job-context task, that thread on its own (label ``task ID``).
    """
    deadline = time.monotonic() + timeout
    answers: list[list[ProcessStacks] | None] = [None] * len(tasks)

    def one(index: int) -> None:
        task, label, why = tasks[index]
        if why is not None:
            answers[index] = [ProcessStacks(label, "", None, error=f"{label} ({task}) {why}")]
        else:
            answers[index] = _ask_one(iris, task, label, timeout, locals)

    threads = [threading.Thread(target=one, args=(i,), name="fray-iris-stacks", daemon=True) for i in range(len(tasks))]
    for thread in threads:
        thread.start()
    for thread in threads:  # daemons: one that Iris keeps waiting is left behind, never waited for past the deadline
        thread.join(max(0.0, deadline - time.monotonic()))
    out: list[ProcessStacks] = []
    for (task, label, _), answer in zip(tasks, answers, strict=True):
        if answer is None:
            answer = [
                ProcessStacks(label, "", None, error=f"{label} ({task}): Iris did not answer within {timeout:g} s")
            ]
        out.extend(answer)
    return tuple(out)


def _ask_one(iris: Any, task: str, label: str, timeout: float, locals: bool) -> list[ProcessStacks]:
    from iris.rpc import controller_pb2

    ask = max(0.5, timeout - _EXEC_SLACK)  # what each process is given: the rest is Iris's round trip
    request = controller_pb2.Controller.ExecInContainerRequest(
        task_id=task,
        command=["sh", "-c", _RELAY, "fray-stacks", record_name(task), _ASK, "1" if locals else "0", f"{ask:g}"],
        timeout_seconds=max(1, math.ceil(timeout)),
    )

    def failed(why: str) -> list[ProcessStacks]:
        return [ProcessStacks(label, "", None, error=f"{label} ({task}): {why}")]

    try:
        # Iris's client keeps its controller RPC stub here; it has no public call for this RPC.
        response = iris._cluster_client._client.exec_in_container(request)
    except Exception as exc:
        return failed(f"Iris could not run the stack relay: {type(exc).__name__}: {_first_line(exc)}")
    if response.error:
        return failed(response.error)
    if response.exit_code != 0:
        return failed((response.stderr.strip().splitlines() or [f"the relay exited {response.exit_code}"])[-1])
    try:
        reply = json.loads(response.stdout)
        host = str(reply["host"])
        return [stacks for answer in reply["answers"] for stacks in _split(label, host, answer)]
    except (ValueError, KeyError, TypeError) as exc:
        return failed(f"unreadable answer: {type(exc).__name__}: {exc}")


def _split(label: str, host: str, reply: dict[str, Any]) -> list[ProcessStacks]:
    """One process's stacks (a rank's: ``replica 0 process 1``), each job-context task's thread on its own."""
    rank = str(reply.get("rank") or "")
    label = f"{label} process {rank}" if rank else label
    pid = int(reply["pid"]) if str(reply.get("pid") or "").isdigit() else None
    if "answer" not in reply:
        return [ProcessStacks(label, host, pid, error=f"{reply.get('error')} (pid {pid} on host {host})")]
    answer = reply["answer"]
    threads = [ThreadStack.from_json(thread) for thread in answer["threads"]]
    tasks = {int(ident): str(task) for ident, task in answer.get("thread_tasks", ())}
    out = [ProcessStacks(label, host, pid, tuple(thread for thread in threads if thread.ident not in tasks))]
    for thread in threads:
        task = tasks.get(thread.ident)
        if task is not None:
            out.append(ProcessStacks(f"task {task}", host, pid, (thread,), task_id=task))
    return out


def ask_actor(rpc: Any, label: str, timeout: float, locals: bool) -> ProcessStacks:
    """Ask an actor's control method ``fray_stacks`` (see the module docstring), within ``timeout``."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fray-iris-actor-stacks")
    try:
        reply = pool.submit(lambda: rpc().fray_stacks(locals)).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return ProcessStacks(label, "", None, error=f"{label} did not answer within {timeout:g} s")
    except Exception as exc:
        return ProcessStacks(label, "", None, error=f"{label}: no answer: {type(exc).__name__}: {_first_line(exc)}")
    finally:
        pool.shutdown(wait=False)  # a call Iris keeps waiting ends on its own: never waited for here
    threads = tuple(ThreadStack.from_json(thread) for thread in reply["threads"])
    return ProcessStacks(label, str(reply["host"]), int(reply["pid"]), threads)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
