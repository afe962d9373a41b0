"""A warm interpreter that forks one child per task (started by the worker), and fences them.

Starting Python and importing cloudpickle costs ~100 ms of CPU per task; forking a
process that already did costs ~1 ms. The fork server stays single-threaded (so
forking it is safe) and talks to its worker over a Unix socket:

* worker -> server: one JSON line per task (``id``, ``env``, ``cwd`` and either
  ``payload_data`` (base64; or the path of a large one in ``payload``) + ``failure`` for a
  callable task run in the forked child, or ``argv`` for a program the child executes),
  with the write end of the task's output pipe attached (``SCM_RIGHTS``); and ``{"renew": seconds}`` lines, the worker's *lease*;
* server -> worker: ``{"started": id, "pid": N}`` after the fork and
  ``{"exited": id, "code": N, "fenced": bool, "declared": bool}`` when the child ends
  (negative: killed by that signal).

Each child leads its own process group (so the worker can kill it with everything it
starts) and dies with the fork server, which dies with the worker.

A *spare* child is forked ahead of the next task and waits on its own socket pair: a task
goes to it (the output pipe's write end, then its request) and starts without waiting for a
fork (~1-2 ms on a small machine, most of a trivial task's start). The spare is forked again
right after each task is handed over; it has already done what every child does first (its
process group, the death signal, closing inherited descriptors), and it is not a task: the
lease does not count it, and it ends with the fork server like any child. A spare that died
or cannot be reached is replaced by a plain fork, so a task never waits on a broken spare.

A spare that became a small callable task (the request says ``declare_exit``: no device)
*declares* its exit: after closing its output it writes its exit code on its socket pair,
then calls ``_exit``, and the fork server reports that code at once (``declared``). The
kernel's teardown of a fork of this large interpreter takes 1-2 ms, the largest single
step of a trivial job; nothing the worker or the controller does depends on it, except
freeing what the process holds. So a task that holds a device, or more than
:data:`_DECLARE_MAX_RSS` of memory, never declares: its exit is reported after ``waitpid``
as before, when its device and memory are free for the next task. A child that dies
without declaring (killed, or an ``exec``: the socket is close-on-exec) is reported by
``waitpid`` too.

The lease is what keeps a frozen worker's tasks from running beside their
replacements: the worker renews it several times a second from its own thread. If the
worker stops renewing (SIGSTOP, a hung interpreter, a machine under swap) for longer
than the lease, the fork server -- a separate process, still running -- kills every
task's process group and reports them ``fenced``. The lease is shorter than the
controller's worker timeout, so the tasks are gone before the controller can declare
the worker lost and start them elsewhere.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from fray.cluster.server.taskproc._launch import die_with_worker
from fray.core.inside import _stacks as stacks

_MAX_MESSAGE = 1 << 20
# A request up to this size fits in the spare's empty socket buffer, so handing it over never blocks the
# fork server (which also keeps the lease) on a spare still starting; a larger one goes to a fresh fork.
_SPARE_REQUEST_BYTES = 64 << 10
# A task resident in more memory than this does not declare its exit: it is reported once the memory is free.
_DECLARE_MAX_RSS = 256 << 20


def _may_declare() -> bool:
    """True if this process is small enough that its exit may be reported before the kernel tears it down."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return resident_pages * os.sysconf("SC_PAGE_SIZE") <= _DECLARE_MAX_RSS


def _detach(keep: int = -1) -> None:
    """In a forked child, before it knows its task: what every child does first.

    Its own process group, so the worker can stop it with everything it starts (the parent
    sets the group too, before it reports the pid: whichever runs first wins, and the group
    exists by the time anyone may try to kill it). Then every inherited descriptor but
    ``keep`` goes: the control socket, and above all the output pipes of other tasks received
    in the same read, which would otherwise stay open here and keep their readers from ever
    seeing end-of-file.
    """
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    die_with_worker()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if keep < 0:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    else:
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


def _run_child(
    request: dict[str, Any], output: int, *, detached: bool = False, declare: tuple[socket.socket, int] | None = None
) -> None:
    """In the forked child: become the task and never return.

    ``declare`` is the socket to declare the exit code on, and the pid that may declare it (not a
    process the task forked, which would come back here when its copy of the task returns).
    """
    code = 1
    try:
        os.dup2(output, 1)
        os.dup2(output, 2)
        if detached:  # a spare: its other descriptors went before the task came
            if output > 2:
                os.close(output)
        else:
            _detach()
        _replace_environment(request["env"])
        os.chdir(request["cwd"])
        argv = request.get("argv")
        if argv is not None:
            stacks.remove_socket()  # a spare's: the program it becomes serves no stacks
            try:
                os.execvpe(argv[0], argv, request["env"])
            except (OSError, ValueError) as exc:
                sys.stderr.write(f"[fray] cannot start {argv[0]!r}: {exc}\n")
                code = 127
                return
        sys.path.insert(0, request["cwd"])
        from fray.process import _jobmain

        inline = request.get("payload_data")
        payload = None if inline is None else base64.b64decode(inline)
        code = _jobmain.main(["_jobmain", request.get("payload", ""), request["failure"]], payload=payload)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # The worker sees the end of the output now, not after the kernel has torn down this fork
        # of a large interpreter (about a millisecond): it finishes the task's log meanwhile.
        with contextlib.suppress(OSError):
            os.closerange(0, 3)
        stacks.remove_socket()  # os._exit runs no atexit hook: remove the socket here, not in a later sweep
        if declare is not None and os.getpid() == declare[1] and _may_declare():
            with contextlib.suppress(OSError):  # the fork server is gone: nobody to tell
                declare[0].send(bytes([code & 0xFF]))  # what waitpid would say of _exit(code)
        os._exit(code)


def _run_spare(sock: socket.socket) -> None:
    """In a spare child: wait for a task (its output descriptor, then its request) and become it; never return."""
    try:
        _detach(keep=sock.fileno())
        # The spare's pid is its task's: its stack server starts now, while it waits, not on the task's path.
        stacks.serve(sweep=False)
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        if not fds:  # the fork server ended, or let this spare go
            stacks.remove_socket()
            os._exit(0)
        chunks = []
        while chunk := sock.recv(_MAX_MESSAGE):  # the request, up to the fork server's end-of-file
            chunks.append(chunk)
        request = json.loads(b"".join(chunks))
        declare = None
        if _declares(request):
            declare = (sock, os.getpid())
        else:
            sock.close()
    except BaseException:
        os._exit(1)
    _run_child(request, fds[0], detached=True, declare=declare)


def _declares(request: dict[str, Any]) -> bool:
    """True if the task of ``request``, given to a spare, declares its exit (a callable task without a device)."""
    return bool(request.get("declare_exit")) and "argv" not in request


def _replace_environment(env: dict[str, str]) -> None:
    """Make ``os.environ`` exactly ``env``, touching only what differs.

    ``os.environ.clear()`` removes one variable at a time from the front of the mapping
    and then ``update`` sets them all again: ~0.6 ms per task, though a task's
    environment is mostly the worker's own.
    """
    environ = os.environ
    for key in [key for key in environ if key not in env]:
        del environ[key]
    for key, value in env.items():
        if environ.get(key) != value:
            environ[key] = value


class _Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict[int, str] = {}
        self.fenced: set[int] = set()
        self.lease_seconds: float | None = None
        self.lease_until = 0.0
        self.buffer = b""
        # A descriptor arrives with the first bytes of its request, which may be split over reads.
        self.pending_fds: list[int] = []
        self.spare: tuple[int, socket.socket] | None = None  # (pid, our end of its socket pair)
        self.selector = selectors.DefaultSelector()
        self.declaring: dict[socket.socket, int] = {}  # a task's socket pair -> its pid, until it declares or ends
        self.declared: set[int] = set()  # tasks whose exit was reported from their declaration, not yet reaped

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def reap(self) -> None:
        while self.children or self.spare is not None:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spare is not None and pid == self.spare[0]:  # died idle: the next task forks afresh
                self.spare[1].close()
                self.spare = None
            task = self.children.pop(pid, None)
            if task is not None and pid not in self.declared:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                self.send({"exited": task, "code": code, "fenced": pid in self.fenced, "declared": False})
            self.fenced.discard(pid)
            self.declared.discard(pid)

    def take_declaration(self, sock: socket.socket) -> None:
        """Report the exit code a task wrote on its socket pair (nothing: it ended otherwise, waitpid reports it)."""
        pid = self.declaring.pop(sock)
        self.selector.unregister(sock)
        try:
            data = sock.recv(1)
        except OSError:
            data = b""
        sock.close()
        task = self.children.get(pid)
        # A task the lease fenced is reported fenced, by waitpid, whatever it wrote.
        if data and task is not None and pid not in self.fenced:
            self.declared.add(pid)
            self.send({"exited": task, "code": data[0], "fenced": False, "declared": True})

    def expire_lease(self) -> None:
        """The worker stopped renewing its lease: kill every task before the controller replaces them."""
        if self.lease_seconds is None or time.monotonic() < self.lease_until or not self.children:
            return
        sys.stderr.write(
            f"[fray] worker lease expired ({self.lease_seconds:g}s without renewal): killing "
            f"{len(self.children)} task(s) so they cannot run beside their replacements\n"
        )
        for pid in self.children:
            if pid not in self.fenced:
                self.fenced.add(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def handle(self, request: dict[str, Any]) -> None:
        if "renew" in request:
            self.lease_seconds = float(request["renew"])
            self.lease_until = time.monotonic() + self.lease_seconds
            return
        output = self.pending_fds.pop(0)
        pid = self.hand_to_spare(request, output)
        if pid is None:
            pid = os.fork()
            if pid == 0:
                _run_child(request, output)
            with contextlib.suppress(OSError):  # the child may have done it (or exited) already
                os.setpgid(pid, pid)
        os.close(output)
        self.children[pid] = request["id"]
        self.send({"started": request["id"], "pid": pid})

    def hand_to_spare(self, request: dict[str, Any], output: int) -> int | None:
        """Give the task to the waiting spare; its pid, or None (no spare, or it is gone: fork instead)."""
        if self.spare is None:
            return None
        line = json.dumps(request).encode()
        if len(line) > _SPARE_REQUEST_BYTES:  # a fresh fork inherits it instead: never wait on the spare's reads
            return None
        pid, sock = self.spare
        self.spare = None
        try:
            socket.send_fds(sock, [b"t"], [output])
            sock.sendall(line)
            if _declares(request):
                sock.shutdown(socket.SHUT_WR)  # the end of the request; the spare's declaration comes back
                self.declaring[sock] = pid
                self.selector.register(sock, selectors.EVENT_READ)
                return pid
        except OSError:
            sock.close()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)  # reaped as a stranger; it never became the task
            return None
        sock.close()
        return pid

    def fork_spare(self) -> None:
        """Fork the child that the next task will go to, unless one waits already."""
        if self.spare is not None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            _run_spare(theirs)
        theirs.close()
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        self.spare = (pid, ours)

    def timeout(self) -> float | None:
        if self.lease_seconds is None or not self.children:
            return None
        return max(0.0, self.lease_until - time.monotonic()) + 0.01


def serve(sock: socket.socket) -> None:
    """Fork a child per request until the worker closes the socket."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake the selector
    server = _Server(sock)
    server.fork_spare()
    selector = server.selector
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        events = {key.fileobj for key, _ in selector.select(server.timeout())}
        if wake_r in events:
            os.read(wake_r, 4096)
        for declaring in [e for e in events if e in server.declaring]:  # before reap(): it reports only the rest
            assert isinstance(declaring, socket.socket)
            server.take_declaration(declaring)
        server.reap()
        if sock not in events:
            server.expire_lease()
            continue
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4)
        if not data:
            return  # the worker is gone: so are we (and, by their death signal, our children)
        server.buffer += data
        server.pending_fds.extend(fds)
        while b"\n" in server.buffer:
            line, server.buffer = server.buffer.split(b"\n", 1)
            server.handle(json.loads(line))
        server.fork_spare()  # after the tasks of this read are on their way, not before
        server.expire_lease()


def main() -> None:
    """Entry point: the inherited socket's file descriptor is in ``argv[1]``."""
    die_with_worker()
    # Warm up what every task needs, so forked children start with it imported.
    import cloudpickle  # noqa: F401

    import fray
    import fray.cluster.client
    import fray.process._jobmain  # noqa: F401

    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)


if __name__ == "__main__":
    main()
