"""Taking live stacks inside a process: :func:`capture`, and the per-process stack server (:func:`serve`, :func:`ask`).

Every process Fray runs user code in calls :func:`serve` once: it starts one daemon thread
blocked in ``accept()`` on a Unix socket at :func:`socket_path` (``<dir>/<pid>.sock``). That is
the whole cost while nobody asks: one idle thread and one socket file, nothing on the call
path. :func:`ask` (run by whoever relays a ``stacks()`` request on the same host: the local
backend, a Fray worker, another backend's host process) connects, sends a tiny JSON request
``{"locals": bool}`` and reads back JSON of the captured :class:`~fray.stacks.ThreadStack`
list. It never hangs (one deadline covers connect, send and read) and never raises for a
process that ended: it reports it in :attr:`ProcessStacks.error` with the pid and host.

Authentication is the socket directory: it is created mode 0700 and must belong to this
user, so only the same user (or root) can connect (``docs/security.md``). The answer is JSON,
never pickle, so asking cannot run code in the asker.

After ``fork()`` the child has no server thread (only the parent's listening socket): an
``os.register_at_fork`` hook drops the parent's state and, if the parent was serving, starts
the child's own server at the child's pid (from a thread, a moment later).
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import errno
import json
import linecache
import os
import reprlib
import socket
import stat
import sys
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from types import FrameType
from typing import Any

from fray.stacks import FrameInfo, ProcessStacks, ThreadStack

__all__ = [
    "ask",
    "ask_all",
    "capture",
    "child_pids",
    "remove_socket",
    "running_task",
    "serve",
    "serving",
    "socket_dir",
    "socket_path",
    "thread_task",
    "thread_tasks",
]

_REPR_LIMIT = 200
_MAX_FRAMES = 200  # a runaway recursion must not make the answer megabytes long
_REQUEST_LIMIT = 4096
# How long the server waits for an asker's request before dropping it: a connected asker
# that sends nothing must not keep the (single) server thread from answering others.
_REQUEST_SECONDS = 5.0


def capture(
    *, locals: bool = False, threads: Collection[int] | None = None, skip_current: bool = True
) -> tuple[ThreadStack, ...]:
    """The stack of every thread of this process (those in ``threads``, by ident, if given).

    ``skip_current`` leaves out the calling thread (the stack server's own, or the thread of
    whoever asked). ``locals`` adds each frame's local variables as truncated reprs.
    """
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    current = threading.get_ident()
    stacks = []
    for ident, frame in sys._current_frames().items():
        if skip_current and ident == current:
            continue
        if threads is not None and ident not in threads:
            continue
        stacks.append(ThreadStack(names.get(ident, f"<unnamed {ident}>"), ident, _frames(frame, locals)))
    stacks.sort(key=lambda stack: (stack.ident != threading.main_thread().ident, stack.name))
    return tuple(stacks)


def _frames(frame: FrameType | None, with_locals: bool) -> tuple[FrameInfo, ...]:
    frames: list[FrameInfo] = []
    while frame is not None and len(frames) < _MAX_FRAMES:
        code = frame.f_code
        line = frame.f_lineno or code.co_firstlineno
        frames.append(
            FrameInfo(
                file=code.co_filename,
                line=line,
                function=code.co_name,
                source=linecache.getline(code.co_filename, line).strip(),
                locals=_locals(frame) if with_locals else None,
            )
        )
        frame = frame.f_back
    frames.reverse()
    return tuple(frames)


# Bounded reprs: a local holding a list of ten million items must not make the process build its
# whole repr (seconds, gigabytes) to keep 200 characters of it. Containers show their first items;
# other objects' own __repr__ runs and is cut.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR_LIMIT
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 12
_REPR.maxarray = 12
_REPR.maxlevel = 3


def _locals(frame: FrameType) -> tuple[tuple[str, str], ...]:
    if frame.f_locals is frame.f_globals:
        return ()  # a module's top level: its "locals" are every global of the module, which says nothing
    out = []
    for name, value in list(frame.f_locals.items()):
        try:
            text = _REPR.repr(value)
        except BaseException as exc:  # a user's __repr__ may raise anything; the stack must still come back
            text = f"<repr failed: {type(exc).__name__}>"
        if len(text) > _REPR_LIMIT:
            text = text[: _REPR_LIMIT - 3] + "..."
        out.append((str(name), text))
    return tuple(out)


_task: str | None = None  # the job-context task this process runs now (one at a time: a task worker's)


@contextlib.contextmanager
def running_task(task_id: str) -> Iterator[None]:
    """Around a job-context task's run in a task worker process: its answers carry the task's id.

    One assignment each way: nothing else is done unless somebody asks.
    """
    global _task
    _task = task_id
    try:
        yield
    finally:
        _task = None


# Job-context tasks that run on threads of this process (the local backend's LocalJobContext):
# thread ident -> (task id, id of the job that created the task). Set and cleared per task, read
# only when somebody asks; single dict operations need no lock under the GIL.
_thread_tasks: dict[int, tuple[str, str | None]] = {}


@contextlib.contextmanager
def thread_task(task_id: str, job_id: str | None) -> Iterator[None]:
    """Around a job-context task run on the calling thread: ``stacks()`` of job ``job_id`` shows it."""
    ident = threading.get_ident()
    _thread_tasks[ident] = (task_id, job_id)
    try:
        yield
    finally:
        _thread_tasks.pop(ident, None)


def thread_tasks(job_id: str | None) -> list[tuple[int, str]]:
    """``(thread ident, task id)`` of the tasks job ``job_id`` created that run on threads of this process now."""
    return [(ident, task) for ident, (task, job) in list(_thread_tasks.items()) if job == job_id]


def socket_dir() -> str:
    """The private directory of this user's stack sockets (mode 0700; created if missing).

    A fixed path under ``/tmp`` (not ``$TMPDIR`` or ``$XDG_RUNTIME_DIR``), because the asker and
    the process asked may have different environments (a Fray worker gives each task its own
    ``TMPDIR``). ``FRAY_STACKS_DIR`` overrides it for both sides.
    """
    return os.environ.get("FRAY_STACKS_DIR") or f"/tmp/fray-stacks-{os.getuid()}"


def socket_path(pid: int) -> str:
    """Where process ``pid``'s stack server listens."""
    return os.path.join(socket_dir(), f"{pid}.sock")


# The directory this process last found private: forks inherit it, so a task forked by a
# fork server does not check it again (a bind in a directory gone since checks it anew).
_checked_dir: str | None = None


def _private_dir(*, recheck: bool = False) -> str:
    global _checked_dir
    path = socket_dir()
    if path == _checked_dir and not recheck:
        return path
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    # Someone else's directory (or a link to one) at our path would let them read or spoof
    # stacks: refuse to serve there rather than trust it.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"{path} is not a private directory of uid {os.getuid()} (mode 0700)")
    _checked_dir = path
    return path


class _Server:
    def __init__(self, sweep: bool = True) -> None:
        self.pid = os.getpid()
        self.path = socket_path(self.pid)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        directory = _private_dir()
        if sweep and _sweep_due(directory):
            _sweep()
        try:
            self.sock.bind(self.path)
        except FileNotFoundError:  # the directory went since this process (or its parent) checked it
            _private_dir(recheck=True)
            self.sock.bind(self.path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            # A stale socket of an earlier process with our pid. Removed only now, not before every
            # bind: in a freshly forked task process the failed unlink cost a tenth of starting the server.
            os.unlink(self.path)
            self.sock.bind(self.path)
        self.sock.listen(8)
        # A bare thread: threading.Thread.start() waits until the thread runs, a switch there and
        # back that cost every short task process about half a millisecond (it answers as a
        # daemon thread would, and leaves itself out of the stacks it reports).
        _thread.start_new_thread(self._serve, ())

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: the process is ending, or this is a fork child dropping its parent's socket
            # An asker that vanished mid-answer (or sent garbage) must not stop the server.
            with conn, contextlib.suppress(Exception):
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_REQUEST_SECONDS)
        request = _read_all(conn, _REQUEST_LIMIT, time.monotonic() + _REQUEST_SECONDS, until_newline=True)
        want_locals = bool(json.loads(request or b"{}").get("locals", False))
        threads = capture(locals=want_locals, skip_current=True)
        reply = {
            "pid": os.getpid(),
            "task_id": _task,
            "threads": [thread.to_json() for thread in threads],
            # Which threads run job-context tasks (thread_task): an asker on another host (Iris's relay)
            # cannot look them up in this process, so they travel with the answer.
            "thread_tasks": [[ident, task] for ident, (task, _) in list(_thread_tasks.items())],
        }
        conn.sendall(json.dumps(reply).encode())

    def close(self, unlink: bool) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


_lock = threading.Lock()
_server: _Server | None = None


def serve(*, sweep: bool = True) -> None:
    """Start this process's stack server (idempotent); a failure to start only costs ``stacks()`` for it.

    Called by every process Fray runs user code in; the socket exists once it returns and is
    removed at exit. ``sweep`` first removes the sockets of processes that ended without removing theirs.
    """
    global _server
    if _server is not None and _server.pid == os.getpid():
        return
    with _lock:
        if _server is not None and _server.pid == os.getpid():
            return
        try:
            _server = _Server(sweep)
        except OSError as exc:
            # Stacks are a debugging aid: a read-only /tmp or a foreign directory must not
            # stop the job; asking this process then says it has no stack server.
            print(f"fray: live stacks unavailable in pid {os.getpid()}: {exc}", file=sys.stderr)


def serving() -> bool:
    """True if this process's stack server is running."""
    return _server is not None and _server.pid == os.getpid()


@atexit.register
def stop() -> None:
    """Stop this process's stack server and remove its socket (at exit; see :func:`remove_socket` for ``os._exit``)."""
    server = _server
    if server is not None and server.pid == os.getpid():
        server.close(unlink=True)


def remove_socket() -> None:
    """Remove this process's socket, just before it ends with ``os._exit`` (the kernel closes the rest)."""
    server = _server
    if server is not None and server.pid == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(server.path)


def _after_fork_in_child() -> None:
    global _server, _lock
    parent = _server
    _lock = threading.Lock()  # the parent's lock may have been held by another thread at fork
    _server = None
    if parent is not None:
        parent.close(unlink=False)  # the path is the parent's; it keeps serving there
        # The child's own server starts on a thread: the fork's caller gets on at once. That matters
        # for subprocess's preexec_fn children, which run this hook and exec a moment later (the
        # thread, and a socket it may have bound, end with the exec; a later sweep removes the file).
        threading.Thread(target=serve, kwargs={"sweep": False}, name="fray-stacks-start", daemon=True).start()


os.register_at_fork(after_in_child=_after_fork_in_child)


#: How often at most a starting process sweeps the directory (a stamp file's age says when one last did).
SWEEP_EVERY_SECONDS = 60.0
_STAMP = ".swept"


def _sweep_due(directory: str) -> bool:
    """True (and the stamp renewed) if no process swept ``directory`` in the last :data:`SWEEP_EVERY_SECONDS`.

    A sweep reads every socket of the directory: about a millisecond of CPU per process once
    hundreds are left by killed processes, which short tasks started by the thousand must not pay.
    """
    stamp = os.path.join(directory, _STAMP)
    try:
        if time.time() - os.stat(stamp).st_mtime < SWEEP_EVERY_SECONDS:
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
    with contextlib.suppress(OSError):
        with open(stamp, "a"):
            pass
        os.utime(stamp)
    return True


def _sweep() -> None:
    """Remove the sockets of processes that ended without removing theirs (killed, or exec'd after fork)."""
    directory = socket_dir()
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            stem, _, ext = name.partition(".")
            if ext != "sock" or not stem.isdigit():
                continue
            try:
                os.kill(int(stem), 0)
            except ProcessLookupError:
                path = os.path.join(directory, name)
                if _nobody_listens(path):  # not a live server of another pid namespace sharing this /tmp
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            except PermissionError:
                pass


def _nobody_listens(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.1)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:
            return False
    return False


def _read_all(conn: socket.socket, limit: int | None, deadline: float, *, until_newline: bool = False) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if until_newline and b"\n" in chunk:
            break
        if limit is not None and size > limit:
            raise ValueError("request too long")
    return b"".join(chunks)


def ask(
    pid: int,
    *,
    label: str,
    timeout: float,
    locals: bool = False,
    host: str | None = None,
    task_id: str | None = None,
) -> ProcessStacks:
    """The stacks of process ``pid`` on this host, or a :class:`ProcessStacks` whose ``error`` says why not.

    Never raises for a process that ended or does not answer, and returns within ``timeout``.
    """
    host = host or socket.gethostname()
    if pid == os.getpid():  # asking ourselves over a socket would only add a thread hop
        return ProcessStacks(label, host, pid, capture(locals=locals), task_id=task_id or _task)

    def failed(why: str) -> ProcessStacks:
        return ProcessStacks(label, host, pid, error=f"{why} (pid {pid} on host {host})", task_id=task_id)

    deadline = time.monotonic() + max(timeout, 0.001)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(max(timeout, 0.001))
        try:
            conn.connect(socket_path(pid))
        except (FileNotFoundError, ConnectionRefusedError):
            return failed(_why_no_server(pid))
        conn.sendall(json.dumps({"locals": bool(locals)}).encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        reply: Any = json.loads(_read_all(conn, None, deadline))
        threads = tuple(ThreadStack.from_json(thread) for thread in reply["threads"])
        running = reply.get("task_id")
        return ProcessStacks(label, host, pid, threads, task_id=task_id or (None if running is None else str(running)))
    except TimeoutError:
        return failed(f"did not answer within {round(timeout, 1):g} s")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return failed(f"no answer: {type(exc).__name__}: {exc}")
    finally:
        conn.close()


def _why_no_server(pid: int) -> str:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "the process has ended"
    except PermissionError:
        return "the process belongs to another user"
    return "the process has no stack server (it runs no Fray runtime, or has not started it yet)"


def ask_all(
    targets: Sequence[tuple[int, str, str | None]], *, timeout: float, locals: bool = False, host: str | None = None
) -> tuple[ProcessStacks, ...]:
    """:func:`ask` each ``(pid, label, task_id)`` of ``targets`` side by side: all answers within about ``timeout``."""
    if len(targets) <= 1:
        return tuple(
            ask(pid, label=label, timeout=timeout, locals=locals, host=host, task_id=task)
            for pid, label, task in targets
        )
    answers: list[ProcessStacks | None] = [None] * len(targets)

    def one(index: int) -> None:
        pid, label, task = targets[index]
        answers[index] = ask(pid, label=label, timeout=timeout, locals=locals, host=host, task_id=task)

    threads = [
        threading.Thread(target=one, args=(i,), name="fray-stacks-ask", daemon=True) for i in range(len(targets))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 1.0)
    host = host or socket.gethostname()
    return tuple(
        answer
        if answer is not None
        else ProcessStacks(
            label,
            host,
            pid,
            error=f"did not answer within {round(timeout, 1):g} s (pid {pid} on host {host})",
            task_id=task,
        )
        for answer, (pid, label, task) in zip(answers, targets, strict=True)
    )


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid`` (from ``/proc``; empty where there is none)."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                children.extend(int(child) for child in f.read().split())
    return sorted(set(children))
