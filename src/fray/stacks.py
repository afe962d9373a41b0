"""Live stacks of a running job's replicas, tasks and actors: what ``handle.stacks()`` returns.

``JobHandle.stacks()`` and ``ActorHandle.stacks()`` answer "what is it doing": one
:class:`ProcessStacks` per process that runs the work (each replica of a job, each task of
its job context, the actor's process), holding the Python stack of every thread, taken
inside that process by Fray's own runtime (:mod:`fray.core.inside._stacks`: no ptrace, no py-spy).

These values cross process and host boundaries as JSON (:meth:`ProcessStacks.to_json` /
:meth:`ProcessStacks.from_json`), never pickle: a stack answer must never be able to run code
in the process that reads it, and it must be readable from the CLI and the dashboard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FrameInfo", "ProcessStacks", "ThreadStack", "format_stacks"]


@dataclass(frozen=True)
class FrameInfo:
    """One frame of a thread's stack.

    ``locals`` holds ``(name, repr)`` pairs (each repr truncated to about 200 characters)
    when the stacks were taken with ``locals=True``, else None.
    """

    file: str
    line: int
    function: str
    source: str
    locals: tuple[tuple[str, str], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """This frame as plain JSON types."""
        out: dict[str, Any] = {"file": self.file, "line": self.line, "function": self.function, "source": self.source}
        if self.locals is not None:
            out["locals"] = [[name, value] for name, value in self.locals]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FrameInfo:
        """The frame :meth:`to_json` wrote."""
        raw = data.get("locals")
        return cls(
            file=str(data["file"]),
            line=int(data["line"]),
            function=str(data["function"]),
            source=str(data.get("source", "")),
            locals=None if raw is None else tuple((str(name), str(value)) for name, value in raw),
        )


@dataclass(frozen=True)
class ThreadStack:
    """The stack of one thread: ``frames`` run outermost first, innermost last, like a traceback."""

    name: str
    ident: int
    frames: tuple[FrameInfo, ...]

    def to_json(self) -> dict[str, Any]:
        """This thread's stack as plain JSON types."""
        return {"name": self.name, "ident": self.ident, "frames": [frame.to_json() for frame in self.frames]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ThreadStack:
        """The thread stack :meth:`to_json` wrote."""
        return cls(
            name=str(data["name"]),
            ident=int(data["ident"]),
            frames=tuple(FrameInfo.from_json(frame) for frame in data.get("frames", ())),
        )


@dataclass(frozen=True)
class ProcessStacks:
    """The stacks of every thread of one process that runs a job's or an actor's code.

    ``label`` says what the process is (``"replica 0"``, ``"actor 'name'"``, ``"task 3f2a…"``);
    ``task_id`` is the job-context task's id for a task's process. ``error`` is set when the
    process did not answer (it ended, or it did not answer within the timeout), saying so with
    its pid and host; ``threads`` is then empty.
    """

    label: str
    host: str
    pid: int | None
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None
    task_id: str | None = None

    def format(self) -> str:
        """Human-readable, like ``py-spy dump`` or :mod:`faulthandler`: a header, then each thread's frames."""
        where = f"pid {self.pid} on {self.host}" if self.pid is not None else f"on {self.host}"
        task = f", task {self.task_id}" if self.task_id and self.task_id not in self.label else ""
        lines = [f"{self.label} ({where}{task})"]
        if self.error is not None:
            lines.append(f"  no stacks: {self.error}")
            return "\n".join(lines)
        for thread in self.threads:
            lines.append(f"Thread {thread.name} ({thread.ident})")
            for frame in thread.frames:
                lines.append(f'  File "{frame.file}", line {frame.line}, in {frame.function}')
                if frame.source:
                    lines.append(f"    {frame.source}")
                for name, value in frame.locals or ():
                    lines.append(f"        {name} = {value}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """These stacks as plain JSON types (what crosses process boundaries)."""
        return {
            "label": self.label,
            "host": self.host,
            "pid": self.pid,
            "threads": [thread.to_json() for thread in self.threads],
            "error": self.error,
            "task_id": self.task_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessStacks:
        """The stacks :meth:`to_json` wrote."""
        pid = data.get("pid")
        error = data.get("error")
        task_id = data.get("task_id")
        return cls(
            label=str(data["label"]),
            host=str(data.get("host", "")),
            pid=None if pid is None else int(pid),
            threads=tuple(ThreadStack.from_json(thread) for thread in data.get("threads", ())),
            error=None if error is None else str(error),
            task_id=None if task_id is None else str(task_id),
        )


def format_stacks(stacks: Sequence[ProcessStacks]) -> str:
    """Every process's :meth:`ProcessStacks.format`, separated by a blank line."""
    if not stacks:
        return "no processes to show: the work is not running"
    return "\n\n".join(process.format() for process in stacks)
