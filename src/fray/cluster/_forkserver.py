"""A warm interpreter that forks one child per callable task (started by the worker).

Starting Python and importing cloudpickle costs ~100 ms of CPU per task; forking a
process that already did costs ~1 ms. The fork server stays single-threaded (so
forking it is safe) and talks to its worker over a Unix socket:

* worker -> server: one JSON line per task (``payload``, ``failure``, ``env``, ``cwd``),
  with the write end of the task's output pipe attached (``SCM_RIGHTS``);
* server -> worker: ``{"started": id, "pid": N}`` after the fork and
  ``{"exited": id, "code": N}`` when the child ends (negative: killed by that signal).

Each child leads its own process group (so the worker can kill it with everything it
starts) and dies with the fork server, which dies with the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

_MAX_MESSAGE = 1 << 20


def _set_parent_death_signal() -> None:
    if sys.platform != "linux":
        return
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run_child(request: dict[str, Any], output: int) -> None:
    """In the forked child: become the task and never return."""
    code = 1
    try:
        # Its own process group, so the worker can stop it with everything it starts. The
        # parent sets the group too, before it reports the pid: whichever runs first wins,
        # and the group exists by the time anyone may try to kill it.
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        _set_parent_death_signal()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(output, 1)
        os.dup2(output, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        # Everything else goes: the control socket, and above all the output pipes of other
        # tasks received in the same read, which would otherwise stay open here and keep
        # their readers from ever seeing end-of-file.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path.insert(0, request["cwd"])
        from fray.cluster import _task

        code = _task.main(["_task", request["payload"], request["failure"]])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket) -> None:
    """Fork a child per request until the worker closes the socket."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake select()
    children: dict[int, str] = {}
    buffer = b""
    # A descriptor arrives with the first bytes of its request, which may be split over reads.
    pending_fds: list[int] = []
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            task = children.pop(pid, None)
            if task is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                sock.sendall(json.dumps({"exited": task, "code": code}).encode() + b"\n")
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4)
        if not data:
            return  # the worker is gone: so are we (and, by their death signal, our children)
        buffer += data
        pending_fds.extend(fds)
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            output = pending_fds.pop(0)
            pid = os.fork()
            if pid == 0:
                _run_child(request, output)
            with contextlib.suppress(OSError):  # the child may have done it (or exited) already
                os.setpgid(pid, pid)
            os.close(output)
            children[pid] = request["id"]
            sock.sendall(json.dumps({"started": request["id"], "pid": pid}).encode() + b"\n")


def main() -> None:
    """Entry point: the inherited socket's file descriptor is in ``argv[1]``."""
    _set_parent_death_signal()
    # Warm up what every task needs, so forked children start with it imported.
    import cloudpickle  # noqa: F401

    import fray
    import fray.cluster._task
    import fray.cluster.client  # noqa: F401

    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)


if __name__ == "__main__":
    main()
