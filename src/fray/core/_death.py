"""What killed a process, in the same words on every backend.

:func:`describe_exit` is the one place that words a replica's or an actor's end: an exit
code (``exit code 3``), a signal by name (``killed by SIGSEGV``), a SIGKILL nobody in Fray
sent (``killed by SIGKILL (the kernel's OOM killer or another process)``), Fray's own memory
limit (``out of memory: used 236 MiB, its limit is ram=200m (200 MiB)``), then the peak RSS
where it was measured and the replica's last output lines. The Fray cluster's worker, the
process engine (local binary jobs, Monarch), Ray and Iris all call it, so a user reads one
wording whatever ran the job; each backend passes what its engine reports and nothing more.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from fray.core._sizes import scaled_size

__all__ = [
    "LAST_LINES",
    "LAST_LINE_CHARS",
    "OUT_OF_MEMORY",
    "describe_exit",
    "last_lines",
    "mib",
    "out_of_memory",
    "signal_name",
]

#: How many of a dead replica's last output lines its failure carries (and its message quotes).
LAST_LINES = 20

_SIGNALS = frozenset(int(number) for number in signal.Signals)

#: Longest quoted output line kept whole; a longer one keeps its start and a note (twenty long lines stay small).
LAST_LINE_CHARS = 2000

#: The words every out-of-memory end starts with, whoever detected it.
OUT_OF_MEMORY = "out of memory"


def last_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """The last :data:`LAST_LINES` of ``lines``, each cut to :data:`LAST_LINE_CHARS` with a note."""
    return tuple(
        line
        if len(line) <= LAST_LINE_CHARS
        else f"{line[:LAST_LINE_CHARS]} [fray: {len(line) - LAST_LINE_CHARS} more characters]"
        for line in list(lines)[-LAST_LINES:]
    )


def mib(num_bytes: int) -> str:
    """``num_bytes`` in whole MiB, as failure messages write sizes (``"236 MiB"``)."""
    return f"{round(num_bytes / (1 << 20))} MiB"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; the bare number for a signal this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(
    returncode: int,
    *,
    oom_limit: int | None = None,
    used: int | None = None,
    peak_rss: int | None = None,
    stderr_tail: Sequence[str] = (),
) -> str:
    """How a process ended: ``returncode`` as ``subprocess`` gives it (negative: killed by that signal).

    ``oom_limit`` (bytes) says Fray's memory limit killed it, having measured ``used`` bytes
    resident; ``peak_rss`` is the most it was seen holding (None: never measured);
    ``stderr_tail`` its last output lines, quoted after ``; last output:``. A SIGKILL that
    Fray did not send is most often the kernel's OOM killer, and the words say so, because
    nothing else in the exit tells them apart. An exit code of 128 + N (137) is also named as
    the signal N a shell reports that way (runtimes that run the command under a shell, Ray's
    job driver or Iris's, give no more), without claiming it was one.
    """
    if oom_limit is not None:
        text = (
            f"{OUT_OF_MEMORY}: used {mib(used if used is not None else peak_rss or 0)}, "
            f"its limit is ram={scaled_size(oom_limit, 1)} ({mib(oom_limit)})"
        )
    elif returncode < 0:
        text = f"killed by {signal_name(-returncode)}"
        if -returncode == signal.SIGKILL:
            text += " (the kernel's OOM killer or another process)"
    else:
        text = f"exit code {returncode}"
        shell_signal = returncode - 128
        if 0 < shell_signal < 65 and shell_signal in _SIGNALS:
            # What a shell (or a runtime that runs the command under one) reports for a command a signal killed.
            text += f" (as a shell reports a command killed by {signal_name(shell_signal)})"
    if peak_rss and (oom_limit is not None or returncode < 0):
        text += f"; peak RSS {mib(peak_rss)}"
    if stderr_tail:
        text += "; last output:\n" + "\n".join(last_lines(stderr_tail))
    return text


def out_of_memory(detail: str) -> str:
    """The words for an out-of-memory end an engine detected itself (Ray's memory monitor): ``detail`` is what it said."""
    detail = detail.strip()
    return f"{OUT_OF_MEMORY}: {detail}" if detail else OUT_OF_MEMORY
