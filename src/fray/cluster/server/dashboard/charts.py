"""The Utilisation page: cores, memory, jobs by state and per-worker use over the last hour, drawn as charts.

The page is rendered on the server with the latest numbers; its charts are drawn in the
browser by uPlot (MIT, vendored unmodified in ``static/`` with its licence, served from
this package: the dashboard works offline) from ``/data/utilisation``, which
:func:`chart_data` shapes from the controller's samples
(:meth:`fray.cluster.server.ops.OpsService.utilisation`) into one column per series.
"""

from __future__ import annotations

from html import escape
from importlib import resources
from typing import Any

from fray.cluster.server.dashboard import pages
from fray.resources import format_size

__all__ = ["STATIC_FILES", "chart_data", "static_file", "utilisation_page"]

#: Files served from ``/static/NAME`` out of this package's ``static`` folder, with their media types.
STATIC_FILES = {
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
    "charts.js": "text/javascript",
}

_GIB = float(1 << 30)
_JOB_STATES = ("pending", "running", "succeeded", "failed", "stopped")


def static_file(name: str) -> tuple[bytes, str] | None:
    """The bytes and media type of the static file ``name``, or None if there is no such file to serve."""
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        return None
    return resources.files("fray.cluster.server.dashboard").joinpath("static", name).read_bytes(), media_type


# The jobs chart colours each state as the rest of the dashboard does; equal counts draw one line over
# another, so each state's line is thinner than the one before it and all of them stay visible.
_STATE_WIDTHS = {"pending": 8.0, "running": 6.0, "succeeded": 4.0, "failed": 2.5, "stopped": 1.25}
_STATE_COLOURS = {
    "pending": "#fbbc04",
    "running": "#4285f4",
    "succeeded": "#34a853",
    "failed": "#ea4335",
    "stopped": "#9aa0a6",
}


def _series(label: str, values: list[Any], colour: str = "", width: float = 0.0) -> dict[str, Any]:
    return (
        {"label": label, "values": values}
        | ({"colour": colour} if colour else {})
        | ({"width": width} if width else {})
    )


def chart_data(utilisation: dict[str, Any]) -> dict[str, Any]:
    """The samples as charts: shared times ``t`` and per chart its title, unit and series (one column each).

    Memory is in GiB; a worker absent from a sample (not yet joined, or lost) has ``None`` there,
    which the chart draws as a gap.
    """
    samples = utilisation["samples"]
    times = [s["at"] for s in samples]
    workers = sorted({w["worker_id"] for s in samples for w in s["workers"]})
    per_worker = [{w["worker_id"]: w for w in s["workers"]} for s in samples]
    charts = [
        {
            "id": "cpu",
            "title": "Cores in use and offered",
            "unit": "cores",
            "series": [
                _series("in use", [s["cpu_used"] for s in samples]),
                _series("offered", [s["cpu_total"] for s in samples]),
            ],
        },
        {
            "id": "ram",
            "title": "Memory in use and offered",
            "unit": "GiB",
            "series": [
                _series("in use", [round(s["ram_used"] / _GIB, 3) for s in samples]),
                _series("offered", [round(s["ram_total"] / _GIB, 3) for s in samples]),
            ],
        },
    ]
    if all("jobs" in s for s in samples):
        charts.append(
            {
                "id": "jobs",
                "title": "Jobs by state",
                "unit": "jobs",
                "series": [
                    _series(
                        state, [s["jobs"].get(state, 0) for s in samples], _STATE_COLOURS[state], _STATE_WIDTHS[state]
                    )
                    for state in _JOB_STATES
                ],
            }
        )
    charts.append(
        {
            "id": "workers",
            "title": "Cores in use per worker",
            "unit": "cores",
            "series": [
                _series(wid, [row[wid]["cpu_used"] if wid in row else None for row in per_worker]) for wid in workers
            ],
        }
    )
    charts.append(
        {
            "id": "workers_ram",
            "title": "Memory in use per worker",
            "unit": "GiB",
            "series": [
                _series(wid, [round(row[wid]["ram_used"] / _GIB, 3) if wid in row else None for row in per_worker])
                for wid in workers
            ],
        }
    )
    return {"interval": utilisation["interval"], "t": times, "charts": charts}


def utilisation_page(utilisation: dict[str, Any], csrf: str) -> str:
    """The latest sample in words and per worker, then a chart per measure (drawn by ``charts.js``)."""
    samples = utilisation["samples"]
    minutes = utilisation["interval"] * utilisation["capacity"] / 60
    head = (
        f"<h1>Utilisation</h1><p class=muted>Sampled by the controller every {utilisation['interval']:g} s; "
        f"the last {minutes:g} minutes are kept in its memory.</p>"
    )
    if not samples:
        return pages.page("Utilisation", head + '<p class="muted">No samples yet.</p>', csrf=csrf)
    last = samples[-1]
    jobs = " · ".join(f"{escape(k)} {int(v)}" for k, v in last.get("jobs", {}).items())
    summary = (
        f'<p id="latest">now: cpu {last["cpu_used"]:g} of {last["cpu_total"]:g} cores in use · '
        f"ram {format_size(last['ram_used'])} of {format_size(last['ram_total'])} in use"
        + (f" · jobs: {jobs}" if jobs else "")
        + "</p>"
    )
    workers = "".join(
        f"<tr><td>{escape(w['worker_id'])}</td><td>{w['cpu_used']:g} / {w['cpu_total']:g}</td>"
        f"<td>{format_size(w['ram_used'])} / {format_size(w['ram_total'])}</td>"
        f"<td>{int(w['tasks'])}</td></tr>"
        for w in last["workers"]
    )
    table = (
        "<table><thead><tr><th>worker</th><th>cpu in use / offered</th><th>ram in use / offered</th>"
        f"<th>tasks</th></tr></thead><tbody>{workers}</tbody></table>"
    )
    charts = "".join(
        f'<section class="chart"><h2>{escape(title)}</h2><div id="chart-{name}" data-chart="{name}"></div></section>'
        for name, title in (
            ("cpu", "Cores in use and offered"),
            ("ram", "Memory in use and offered (GiB)"),
            ("jobs", "Jobs by state"),
            ("workers", "Cores in use per worker"),
            ("workers_ram", "Memory in use per worker (GiB)"),
        )
    )
    body = (
        f"{head}{summary}{table}"
        '<link rel="stylesheet" href="/static/uPlot.min.css">'
        f'<div id="charts" data-source="/data/utilisation">{charts}</div>'
        '<p class="muted">Charts drawn with <a href="/static/uPlot.LICENSE">uPlot</a> (MIT).</p>'
        '<script src="/static/uPlot.iife.min.js"></script><script src="/static/charts.js"></script>'
    )
    return pages.page("Utilisation", body, csrf=csrf)
