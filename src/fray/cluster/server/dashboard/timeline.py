"""A job's attempts and tasks as a timeline: one bar per task, from its start to its end, coloured by outcome.

Rendered on the server as inline SVG from the job's task records (``tasks`` of
:meth:`fray.cluster.server.ops.OpsService.job_detail`): no script, and under the dashboard's
Content-Security-Policy only classes style it (the colours are in :data:`STYLE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

__all__ = ["STYLE", "timeline_svg"]

STYLE = """
svg.timeline { width: 100%; max-width: 1100px; font: 12px system-ui, sans-serif; }
svg.timeline text { fill: #1d2329; } svg.timeline .axis { stroke: #c8cdd1; }
svg.timeline .tick { fill: #5f6368; }
svg.timeline rect.bar { stroke: none; } svg.timeline rect.lane { fill: #f4f6f7; }
svg.timeline rect.wait { fill: #c8cdd1; }
rect.bar.state-succeeded { fill: #34a853; } rect.bar.state-failed { fill: #ea4335; }
rect.bar.state-lost { fill: #fa7b17; } rect.bar.state-stopped { fill: #9aa0a6; }
rect.bar.state-running, rect.bar.state-assigned { fill: #4285f4; } rect.bar.state-pending { fill: #fbbc04; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.legend i.state-succeeded { background: #34a853; } .legend i.state-failed { background: #ea4335; }
.legend i.state-lost { background: #fa7b17; } .legend i.state-stopped { background: #9aa0a6; }
.legend i.state-running { background: #4285f4; } .legend i.state-pending { background: #fbbc04; }
"""

# Geometry of the drawing, in SVG user units (the SVG scales to the page's width).
_WIDTH = 1000
_LABEL = 260
_RIGHT = 40  # room for the last tick's label
_ROW = 22
_BAR = 14
_TOP = 24


def _start(task: dict[str, Any]) -> float:
    """When the task's bar starts: it ran from its start, or was placed, or (never placed) was made."""
    for key in ("started_at", "assigned_at", "created_at"):
        if task.get(key) is not None:
            return float(task[key])
    return 0.0


def _made(task: dict[str, Any]) -> float:
    """When the task was made (its wait to be placed and started runs from here to its bar)."""
    return float(task["created_at"]) if task.get("created_at") is not None else _start(task)


def _seconds(value: float) -> str:
    if 0 < value < 1:
        return f"{value:.2g}s"
    if value < 120:
        return f"{value:.0f}s" if value >= 10 or value == int(value) else f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def _ticks(span: float) -> list[float]:
    """About five round offsets (seconds) from 0 to ``span``."""
    for step in (
        0.05,
        0.1,
        0.2,
        0.5,
        1,
        2,
        5,
        10,
        15,
        30,
        60,
        120,
        300,
        600,
        900,
        1800,
        3600,
        7200,
        14400,
        43200,
        86400,
    ):
        if span / step <= 6:
            break
    count = int(span / step + 1e-9)  # 1.0 // 0.2 is 4.0 in floating point
    return [i * step for i in range(count + 1)]


def timeline_svg(tasks: Sequence[dict[str, Any]], now: float) -> str:
    """One row per task of every attempt (oldest attempt first): a bar from its start to its end, or to ``now``,
    after a thin line for its wait to start; a bar's class and ``data-state`` are the task's state."""
    if not tasks:
        return '<p class="muted">No tasks yet.</p>'
    ordered = sorted(tasks, key=lambda t: (t["attempt"], t["replica"], t["task"]))
    begin = min(min(_made(t), _start(t)) for t in ordered)
    end = max(max(float(t["finished_at"] or now), _start(t)) for t in ordered)
    span = max(end - begin, 0.1)
    scale = (_WIDTH - _LABEL - _RIGHT) / span
    height = _TOP + _ROW * len(ordered) + 4
    parts = [
        f'<svg class="timeline" viewBox="0 0 {_WIDTH} {height}" role="img" '
        f'aria-label="timeline of {len(ordered)} tasks" preserveAspectRatio="xMinYMin meet">'
    ]
    for offset in _ticks(span):
        x = _LABEL + offset * scale
        parts.append(f'<line class="axis" x1="{x:.1f}" y1="{_TOP - 6}" x2="{x:.1f}" y2="{height}"/>')
        parts.append(f'<text class="tick" x="{x + 2:.1f}" y="{_TOP - 10}">+{_seconds(offset)}</text>')
    for row, task in enumerate(ordered):
        y = _TOP + row * _ROW
        start = _start(task)
        stop = float(task["finished_at"]) if task["finished_at"] is not None else now
        x = _LABEL + (start - begin) * scale
        width = max((stop - start) * scale, 2.0)  # a task that took no time is still seen
        worker = task["worker"] or "not placed"
        label = f"attempt {task['attempt']} · replica {task['replica']} · {worker}"
        exit_code = "" if task["exit_code"] is None else f", exit {task['exit_code']}"
        tip = f"{label}: {task['state']}{exit_code}, {_seconds(max(stop - start, 0.0))}"
        if task["error"]:
            tip += f"\n{task['error']}"
        parts.append(f'<rect class="lane" x="0" y="{y}" width="{_WIDTH}" height="{_ROW - 2}"/>')
        parts.append(f'<text x="4" y="{y + _BAR}">{escape(label)}</text>')
        if _made(task) < start:
            # The wait between the task's making and its start: a thin line before the bar.
            made = _LABEL + (_made(task) - begin) * scale
            parts.append(
                f'<rect class="wait" x="{made:.1f}" y="{y + (_ROW - 2) / 2 - 1:.1f}" '
                f'width="{(start - _made(task)) * scale:.1f}" height="2"><title>waiting to start</title></rect>'
            )
        parts.append(
            f'<rect class="bar state-{escape(task["state"])}" data-attempt="{int(task["attempt"])}" '
            f'data-task="{int(task["task"])}" data-state="{escape(task["state"])}" x="{x:.1f}" '
            f'y="{y + (_ROW - 2 - _BAR) / 2:.1f}" width="{width:.1f}" height="{_BAR}">'
            f"<title>{escape(tip)}</title></rect>"
        )
    parts.append("</svg>")
    states = sorted({t["state"] for t in ordered})
    legend = "".join(f'<span><i class="state-{escape(s)}"></i>{escape(s)}</span>' for s in states)
    return f'<div class="legend">{legend}</div>' + "".join(parts)
