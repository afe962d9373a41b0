"""Progress bars for long waits in Python code: shown on a terminal, silent everywhere else.

``wait_all(..., progress=True)`` and ``ActorGroup.wait_ready(..., progress=True)`` use
these. A bar is drawn (with rich, on stderr) only when stderr is a terminal, so logs
of batch jobs and CI runs never fill with progress lines.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

__all__ = ["progress_bar", "watch_ready"]


def _on_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def progress_bar(description: str, total: int, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yield ``update(done)``; a transient bar of ``done``/``total`` is drawn while the block runs, on a TTY only."""
    if not enabled or not _on_terminal():
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # No redirection of stdout: the bar may run in a thread beside code that prints.
    progress = Progress(
        *columns, console=Console(stderr=True), transient=True, redirect_stdout=False, redirect_stderr=False
    )
    with progress as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)


def _watch(futures: Sequence[concurrent.futures.Future[None]], want: int, deadline: float | None) -> None:
    with progress_bar("actors ready", len(futures)) as update:
        while True:
            ready = sum(1 for f in futures if f.done() and f.exception() is None)
            dead = sum(1 for f in futures if f.done() and f.exception() is not None)
            update(ready)
            remaining = None if deadline is None else deadline - time.monotonic()
            if ready >= want or len(futures) - dead < want or (remaining is not None and remaining <= 0):
                return
            pending = [f for f in futures if not f.done()]
            wait = 1.0 if remaining is None else min(1.0, remaining)
            concurrent.futures.wait(pending, timeout=wait, return_when=concurrent.futures.FIRST_COMPLETED)


def watch_ready(futures: Sequence[concurrent.futures.Future[None]], want: int, timeout: float | None) -> None:
    """Show how many of ``futures`` succeeded until ``want`` did, too many failed, or ``timeout`` passed.

    Runs beside the caller's own wait (a daemon thread), and stops on the same conditions.
    """
    if not _on_terminal():
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    threading.Thread(target=_watch, args=(list(futures), want, deadline), name="fray-progress", daemon=True).start()
