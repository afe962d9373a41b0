"""Slow out-of-process runs, started when the session starts and checked by their tests at its end.

A few tests spend minutes in another interpreter (the Iris suite and marin's code in a
Python 3.12 venv) mostly waiting on that interpreter's own clusters. Run in their place in
the session, they add their whole time to it; started at once in the background instead,
they overlap the rest of the suite. A test opts in with ``@pytest.mark.runs_early.with_args(work)``:
``conftest.py`` moves it to the end of the session and, once collection is done, hands
``work(**params)`` (``params``: the test's parametrisation) to one background thread, so the
early runs go one after another, never several at once beside the suite. The test then
calls :func:`result` and checks what the run returned; an exception of the work is raised
there, in the test. Runs of deselected tests never start.

The subprocesses are started with :func:`run` so that a session that ends early (``-x``,
Ctrl-C) kills them with their process groups instead of leaving them behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

__all__ = ["result", "run", "start", "stop"]

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-run")
_runs: dict[str, Future[Any]] = {}
_procs: set[subprocess.Popen[str]] = set()
_lock = threading.Lock()
_stopping = threading.Event()


def start(key: str, work: Callable[..., Any], params: dict[str, Any]) -> None:
    """Queue ``work(**params)`` under ``key`` (a test's node id); a second start of the same key is ignored."""
    with _lock:
        if key not in _runs:
            _runs[key] = _executor.submit(work, **params)


def result(request: pytest.FixtureRequest) -> Any:
    """What the early run of the requesting test returned (waiting for it), or its exception, raised here."""
    node = request.node
    marker = node.get_closest_marker("runs_early")
    assert marker is not None, f"{node.nodeid} has no runs_early marker"
    start(node.nodeid, marker.args[0], params_of(node))  # selected after the session started (rare)
    return _runs[node.nodeid].result()


def params_of(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)  # pytest sets it only on parametrised items
    return dict(callspec.params) if callspec is not None else {}


def run(command: list[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)``, killed with its group if the session stops."""
    if _stopping.is_set():
        raise RuntimeError("the session is ending: the early run was not started")
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    with _lock:
        _procs.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr) from None
    finally:
        with _lock:
            _procs.discard(proc)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop() -> None:
    """Drop the runs not yet started and kill the subprocesses of those running (the session is over)."""
    _stopping.set()
    for future in _runs.values():
        future.cancel()
    with _lock:
        procs = list(_procs)
    for proc in procs:
        _kill(proc)
    _executor.shutdown(wait=True)
