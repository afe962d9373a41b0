"""Finding and ending exactly the processes a benchmark started, on a machine other people use.

A cluster a benchmark starts (Ray, Iris) is found by PID, never by name: the processes
whose command line contains a marker only this run uses (its temp dir, its config file),
and all their descendants (workers often rename themselves). Ending them signals those
PIDs and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

__all__ = ["end", "processes_marked", "rss"]


def processes_marked(marker: str) -> list[psutil.Process]:
    """The processes whose command line contains ``marker``, and all their descendants (never this one)."""
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(marker in part for part in proc.info["cmdline"] or ()):
                roots.append(proc)
    found: dict[int, psutil.Process] = {}
    for root in roots:
        found[root.pid] = root
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                found[child.pid] = child
    found.pop(os.getpid(), None)  # a driver started with the marker in its arguments is not the cluster
    return list(found.values())


def rss(procs: list[psutil.Process]) -> int:
    """Resident memory of ``procs`` (those still running), in bytes."""
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def end(procs: list[psutil.Process], *, grace: float, terminate: bool = True) -> None:
    """SIGTERM ``procs`` (unless ``terminate`` is False: something else is stopping them), SIGKILL what
    is left after ``grace`` seconds. psutil checks each is still the process we saw, not a reused PID."""
    if terminate:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
