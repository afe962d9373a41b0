"""The worker's end of the fork server (:mod:`fray.cluster.server.taskproc._forkserver`): launching tasks and renewing the lease."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fray.core._private_files import write_private
from fray.process._process import die_with_parent as die_with_worker

if TYPE_CHECKING:  # the fork server imports this module for die_with_worker: not the environment builders
    from fray.cluster.server.envs._environments import Prepared

__all__ = ["ForkServer", "ForkedProcess", "die_with_worker", "fork_request"]

# A callable task's pickled entrypoint up to this size goes to its fork in the request; larger ones in a file.
_INLINE_PAYLOAD_BYTES = 1 << 20


def fork_request(
    ready: Prepared,
    payload: bytes | None,
    payload_path: Path,
    failure_path: Path,
    *,
    forked_callable: bool,
    holds_device: bool = False,
) -> dict[str, Any]:
    """What the fork server is asked to start for one task (see :mod:`._forkserver` for the fields).

    ``ready`` is the prepared environment (``argv``, ``env``, ``cwd``). A callable task run in
    a fork of the warm interpreter (``forked_callable``) gets a small entrypoint inside the
    request: writing it to a file and reading it back is a third of a millisecond of a trivial
    task's start. A large one, and the entrypoint of a callable task executed afresh, is
    written to ``payload_path`` (0600) first.

    A forked callable task that holds no device (``holds_device``) may declare its exit
    before its process is torn down (see :mod:`._forkserver`); one that holds a device is
    reported only once the device is free.
    """
    request: dict[str, Any] = {"env": ready.env, "cwd": ready.cwd}
    if forked_callable and not holds_device:
        request["declare_exit"] = True
    if forked_callable and len(payload or b"") <= _INLINE_PAYLOAD_BYTES:
        request.update(payload_data=base64.b64encode(payload or b"").decode(), failure=str(failure_path))
        return request
    if payload is not None:
        write_private(payload_path, payload)
    if forked_callable:
        request.update(payload=str(payload_path), failure=str(failure_path))
    else:
        request["argv"] = ready.argv
    return request


class ForkedProcess:
    """A task forked by the fork server: the parts of ``Popen`` the worker uses."""

    def __init__(self, pid: int, output: int) -> None:
        self.pid = pid
        self.stdout = os.fdopen(output, "rb")
        self._exited = threading.Event()
        self.returncode: int | None = None
        #: True when the fork server killed it because the worker's lease expired.
        self.fenced = False
        #: True when the child declared its exit code itself, before the kernel tore it down.
        self.declared = False

    def _set_exit(self, code: int, fenced: bool = False, declared: bool = False) -> None:
        self.returncode = code
        self.fenced = fenced
        self.declared = declared
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"task {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """Asks the fork server to fork tasks, hears of their exits, and renews the worker's lease."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "fray.cluster.server.taskproc._forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_worker,
        )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 62))
        # Launches waiting for their fork: id -> (fork done, output read end, the process once forked).
        self._waiting: dict[str, tuple[threading.Event, int, list[ForkedProcess]]] = {}
        self._children: dict[str, ForkedProcess] = {}
        self.alive = True
        threading.Thread(target=self._read, name="fray-forkserver", daemon=True).start()

    def renew(self, lease_seconds: float) -> None:
        """Extend the worker's lease by ``lease_seconds`` from now; raises OSError if the fork server is gone."""
        with self._lock:
            self._sock.sendall(json.dumps({"renew": lease_seconds}).encode() + b"\n")

    def launch(self, request: dict[str, Any]) -> ForkedProcess:
        """Fork a task process (``request``: see the fork server); raises OSError if the fork server is gone."""
        read_end, write_end = os.pipe()
        forked: list[ForkedProcess] = []
        done = threading.Event()
        with self._lock:
            task = str(next(self._ids))
            self._waiting[task] = (done, read_end, forked)
        line = json.dumps({**request, "id": task}) + "\n"
        try:
            with self._lock:
                socket.send_fds(self._sock, [line.encode()], [write_end])
        except OSError:
            self.alive = False
            with self._lock:
                self._waiting.pop(task, None)
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        if not done.wait(10.0) or not forked:
            self.alive = False
            with self._lock:
                if self._waiting.pop(task, None) is not None:
                    os.close(read_end)
            raise OSError("the fork server did not fork the task")
        return forked[0]

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in self._sock.makefile("rb"):
                message = json.loads(raw)
                if "started" in message:
                    with self._lock:
                        done, output, forked = self._waiting.pop(message["started"])
                        child = ForkedProcess(int(message["pid"]), output)
                        self._children[message["started"]] = child
                    forked.append(child)
                    done.set()
                else:
                    with self._lock:
                        exited = self._children.pop(message["exited"], None)
                    if exited is not None:
                        exited._set_exit(
                            int(message["code"]), bool(message.get("fenced")), bool(message.get("declared"))
                        )
        self.alive = False
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            children, self._children = self._children, {}
        for done, _, _ in waiting.values():
            done.set()
        for child in children.values():  # the fork server died, and its children with it
            child._set_exit(-int(signal.SIGKILL))

    def close(self) -> None:
        """Stop the fork server (its children die with it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
