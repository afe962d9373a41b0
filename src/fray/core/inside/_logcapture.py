"""Route ``print`` output of in-process jobs to each job's own log.

Jobs that run as threads share one ``sys.stdout``; to keep a log per job, the
process streams are wrapped once by a router that looks up the writing thread's
job in a context variable, appends to that job's :class:`LogBuffer`, and still
passes the text through to the real stream.
"""

from __future__ import annotations

import collections
import contextvars
import io
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from fray.errors import ConfigError

MAX_LINES = 100_000


class LogBuffer:
    """The last :data:`MAX_LINES` lines written by one job; thread-safe.

    Each writer (one per replica thread or process) keeps its own unfinished line, so
    replicas printing at the same time never splice their lines together.
    """

    def __init__(self, *, echo: bool = True, max_lines: int = MAX_LINES) -> None:
        self.echo = echo
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._writers: list[LogWriter] = []

    def writer(self) -> LogWriter:
        """A new writer whose complete lines land in this buffer."""
        writer = LogWriter(self)
        with self._lock:
            self._writers.append(writer)
        return writer

    def write(self, text: str) -> None:
        """Append text that ends its own lines (a trailing partial line is kept as a line)."""
        with self._lock:
            self._lines.extend(text.rstrip("\n").split("\n"))

    def _extend(self, lines: list[str]) -> None:
        with self._lock:
            self._lines.extend(lines)

    def lines(self, max_lines: int | None = None) -> tuple[str, ...]:
        """All lines so far (including unfinished ones), or only the last ``max_lines`` (see :func:`log_tail`)."""
        with self._lock:
            lines = list(self._lines) + [w.partial for w in self._writers if w.partial]
        return log_tail(lines, max_lines)


def log_tail(lines: Sequence[str], max_lines: int | None) -> tuple[str, ...]:
    """What ``JobHandle.logs(max_lines)`` returns on every backend: the last ``max_lines`` of ``lines``.

    ``None`` or ``0`` (marin's default) means every line; a negative or non-whole number
    is a ConfigError. A tuple, as marin's handles return.
    """
    if max_lines is None or max_lines == 0:
        return tuple(lines)
    if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 0:
        raise ConfigError(f"logs(max_lines={max_lines!r}) must be a whole number >= 0 (0 or None: every line)")
    return tuple(lines[-max_lines:])


class LogWriter:
    """One stream of text into a :class:`LogBuffer`, split into lines."""

    def __init__(self, buffer: LogBuffer) -> None:
        self.buffer = buffer
        self.echo = buffer.echo
        self.partial = ""

    def write(self, text: str) -> None:
        """Append text; complete lines go to the buffer, the rest waits for its newline."""
        pieces = (self.partial + text).split("\n")
        self.partial = pieces.pop()
        if pieces:
            self.buffer._extend(pieces)


class TaskOutput:
    """The output of one short task run in a process of its own engine (a Ray task).

    Nothing is allocated until the task prints: most quick tasks never do, and they
    should not pay for a :class:`LogBuffer` they leave empty.
    """

    __slots__ = ("_buffer", "_writer")
    echo = True

    def __init__(self) -> None:
        self._buffer: LogBuffer | None = None
        self._writer: LogWriter | None = None

    def write(self, text: str) -> None:
        """Append text (see :meth:`LogWriter.write`)."""
        if self._writer is None:
            self._buffer = LogBuffer()
            self._writer = self._buffer.writer()
        self._writer.write(text)

    def text(self) -> str:
        """Everything printed so far, as lines joined by newlines ("" if nothing)."""
        return "" if self._buffer is None else "\n".join(self._buffer.lines())


_sink: contextvars.ContextVar[LogWriter | TaskOutput | None] = contextvars.ContextVar("fray_log_sink", default=None)


class _Router(io.TextIOBase):
    """Stands in for sys.stdout / sys.stderr: tees a job thread's writes into its LogBuffer."""

    def __init__(self, target: TextIO) -> None:
        self.target = target

    def write(self, text: str) -> int:
        sink = _sink.get()
        if sink is not None:
            sink.write(text)
            if not sink.echo:
                return len(text)
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", "utf-8")


_install_lock = threading.Lock()


def _install() -> None:
    # Checked on every job start, not once: test runners and notebooks swap sys.stdout
    # for their own capture objects, and the router must sit on top of whichever is current.
    if type(sys.stdout) is _Router and type(sys.stderr) is _Router:
        return
    with _install_lock:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if not isinstance(stream, _Router):
                setattr(sys, name, _Router(stream))


@contextmanager
def capture_to(buffer: LogBuffer | TaskOutput) -> Iterator[None]:
    """Within the block, this thread's prints go to ``buffer`` (and, if ``buffer.echo``, to the real stream)."""
    _install()
    token = _sink.set(buffer.writer() if isinstance(buffer, LogBuffer) else buffer)
    try:
        yield
    finally:
        _sink.reset(token)
