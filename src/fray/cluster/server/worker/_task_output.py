"""A task's output on the worker, kept bounded: long lines cut, and only its head and tail once it is long.

The worker (:mod:`fray.cluster.server.worker`) reads each task's output through one :class:`OutputCap`,
which also keeps the last few lines a failure message quotes.
"""

from __future__ import annotations

import collections
from typing import Any

from fray.core._death import LAST_LINES

__all__ = ["HEAD_BYTES", "HEAD_LINES", "LAST_OUTPUT_LINES", "MAX_LINE_BYTES", "TAIL_BYTES", "TAIL_LINES", "OutputCap"]

#: How many of a failed task's last output lines its failure message quotes.
LAST_OUTPUT_LINES = LAST_LINES

#: Longest output line stored whole; a longer one keeps its first this many bytes, and a note.
MAX_LINE_BYTES = 64 * 1024
#: Output kept per task: the first and the last this many lines (and bytes), with a note of the rest.
HEAD_LINES = TAIL_LINES = 4_000
HEAD_BYTES = TAIL_BYTES = 8 << 20


class OutputCap:
    """Keeps one task's output bounded: long lines cut, and only its head and tail once it is long.

    Lines up to the head budget are passed on as they come; after that, only the most
    recent ones are kept (a bounded tail), and :meth:`finish` returns a note of what was
    dropped followed by the tail. Memory never holds more than the tail and one line.
    """

    def __init__(self) -> None:
        self._head_lines = 0
        self._head_bytes = 0
        self._tail: collections.deque[str] = collections.deque()
        self._tail_bytes = 0
        self._dropped_lines = 0
        self._dropped_bytes = 0
        self.last_lines: collections.deque[str] = collections.deque(maxlen=LAST_OUTPUT_LINES)

    @property
    def last(self) -> list[str]:
        """The task's last few lines, for a failure message."""
        return list(self.last_lines)

    def read_line(self, stream: Any) -> str | None:
        """The next line (None at the end), cut to :data:`MAX_LINE_BYTES` with a note of the rest."""
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return None
        cut = 0
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            # An overlong line: its rest is counted as it streams past, never held.
            cut = len(raw) - MAX_LINE_BYTES
            raw = raw[:MAX_LINE_BYTES]
            while more := stream.readline(MAX_LINE_BYTES):
                ends = more.endswith(b"\n")
                cut += len(more) - ends
                if ends:
                    break
        line = raw.decode(errors="replace").rstrip("\n")
        if cut:
            line += f" [fray: line cut, {cut} more bytes dropped]"
        self.last_lines.append(line)
        return line

    def keep(self, line: str) -> bool:
        """True: pass ``line`` on now (within the head); False: it went to the bounded tail."""
        size = len(line) + 1
        if self._head_lines < HEAD_LINES and self._head_bytes + size <= HEAD_BYTES:
            self._head_lines += 1
            self._head_bytes += size
            return True
        self._tail.append(line)
        self._tail_bytes += size
        while len(self._tail) > TAIL_LINES or self._tail_bytes > TAIL_BYTES:
            dropped = self._tail.popleft()
            self._tail_bytes -= len(dropped) + 1
            self._dropped_lines += 1
            self._dropped_bytes += len(dropped) + 1
        return False

    def finish(self) -> list[str]:
        """What is left to pass on at the end: a note of what was dropped, then the tail."""
        tail = list(self._tail)
        if self._dropped_lines:
            note = f"[fray: {self._dropped_lines} lines ({self._dropped_bytes} bytes) of output dropped here]"
            tail.insert(0, note)
        return tail
