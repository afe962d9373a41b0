"""The dashboard's HTML, rendered on the server from the operator API's plain data.

Every value is escaped with :func:`html.escape`. Pages link one small script
(:data:`SCRIPT`, served from ``/static/app.js``) that swaps in fragments sent over
server-sent events; there is no build step and nothing is loaded from elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from fray.cluster.server.dashboard.stacks import stacks_button
from fray.resources import format_size

__all__ = [
    "SCRIPT",
    "STYLE",
    "actors_page",
    "job_page",
    "job_rows",
    "jobs_page",
    "login_page",
    "logs_page",
    "page",
    "queues_page",
    "workers_page",
]

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2329; }
header { background: #1d2329; color: #fff; padding: 8px 16px; display: flex; gap: 18px; align-items: center; }
header a { color: #cfe3ff; text-decoration: none; } header .who { margin-left: auto; }
header form { display: inline; } header button { background: none; border: 1px solid #cfe3ff; color: #cfe3ff; }
main { padding: 12px 16px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 16px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6e8; vertical-align: top; }
th { background: #f4f6f7; } td.num { text-align: right; }
.state-running { color: #0b62d6; } .state-pending { color: #8a6d00; } .state-succeeded { color: #137333; }
.state-failed { color: #c5221f; } .state-stopped { color: #5f6368; }
pre.log { background: #111; color: #e8e8e8; padding: 8px; min-height: 200px; max-height: 70vh; overflow: auto; }
.muted { color: #5f6368; } .error { color: #c5221f; white-space: pre-line; }
td.why { color: #8a6d00; white-space: pre-line; } section.chart { max-width: 1100px; }
.login { max-width: 360px; margin: 80px auto; } .login input { width: 100%; padding: 6px; margin: 6px 0; }
"""

# Replaces the element marked data-stream with each fragment the server sends, or appends
# lines to it (data-append); a final "end" event shows the job's last state.
SCRIPT = """
document.querySelectorAll('[data-stream]').forEach(function (el) {
  var source = new EventSource(el.dataset.stream);
  source.onmessage = function (event) {
    if (el.dataset.append !== undefined) {
      el.appendChild(document.createTextNode(event.data + '\\n'));
      el.scrollTop = el.scrollHeight;
    } else {
      el.innerHTML = event.data;
    }
  };
  source.addEventListener('end', function (event) {
    var status = document.getElementById('final');
    if (status) { status.textContent = event.data; status.className = 'state-' + event.data.split(' ')[0]; }
    source.close();
  });
});
"""


def _when(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _state(state: str) -> str:
    return f'<span class="state-{escape(state)}">{escape(state)}</span>'


def _job_link(job_id: str) -> str:
    return f'<a href="/jobs/{quote(job_id)}">{escape(job_id)}</a>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], body_attrs: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody {body_attrs}>{body}</tbody></table>"


def page(title: str, body: str, *, csrf: str = "", nav: bool = True) -> str:
    """A whole page: the header with navigation and log-out, then ``body`` (already HTML)."""
    header = ""
    if nav:
        links = "".join(
            f'<a href="{href}">{name}</a>'
            for href, name in (
                ("/jobs", "Jobs"),
                ("/utilisation", "Utilisation"),
                ("/workers", "Workers"),
                ("/actors", "Actors"),
                ("/queues", "Queues"),
            )
        )
        logout = (
            f'<form method="post" action="/logout"><input type="hidden" name="csrf" value="{escape(csrf)}">'
            '<button type="submit">Log out</button></form>'
        )
        header = f'<header><strong>Fray</strong>{links}<span class="who">{logout}</span></header>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} · Fray</title>"
        '<link rel="stylesheet" href="/static/app.css"></head>'
        f"<body>{header}<main>{body}</main>"
        '<script src="/static/app.js"></script></body></html>'
    )


def login_page(error: str = "", next_path: str = "/jobs") -> str:
    """The log-in form: the cluster token, posted (never in a URL)."""
    message = f'<p class="error">{escape(error)}</p>' if error else ""
    body = (
        '<div class="login"><h1>Fray dashboard</h1>'
        "<p>Paste the cluster token (<code>~/.config/fray/token</code>), or open the one-time link that "
        "<code>fray dashboard</code> prints.</p>"
        f'{message}<form method="post" action="/login">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<input type="password" name="token" placeholder="cluster token" autocomplete="off" autofocus>'
        '<button type="submit">Log in</button></form></div>'
    )
    return page("Log in", body, nav=False)


def job_rows(jobs: list[dict[str, Any]]) -> str:
    """The rows of the jobs table (also what the live stream sends)."""
    rows = []
    for job in jobs:
        # A pending job's reason is shown as the scheduler gave it (in the pending colour), else the error.
        why = job["pending_reason"] if job["state"] == "pending" else ""
        note = f'<td class="why">{escape(why)}</td>' if why else f'<td class="muted">{escape(job["error"])}</td>'
        rows.append(
            "<tr>"
            f"<td>{_job_link(job['job_id'])}</td><td>{_state(job['state'])}</td><td>{escape(job['band_name'])}</td>"
            f"<td>{escape(job['command'])}</td><td>{escape(job['user'])}</td>"
            f"<td>{_when(job['submitted_at'])}</td><td class=num>{_duration(job['duration'])}</td>"
            f'<td><a href="/logs/{quote(job["job_id"])}">logs</a></td>'
            f"{note}</tr>"
        )
    return "".join(rows) or '<tr><td colspan="9" class="muted">no jobs</td></tr>'


def jobs_page(jobs: list[dict[str, Any]], counts: dict[str, int], state: str, csrf: str) -> str:
    """Jobs, newest first, updated live."""
    filters = " · ".join(
        f'<a href="/jobs?state={s}">{s} ({counts.get(s, 0)})</a>'
        for s in ("pending", "running", "succeeded", "failed", "stopped")
    )
    stream = "/stream/jobs" + (f"?state={quote(state)}" if state else "")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("job", "state", "band", "command", "user", "submitted", "ran", "output", "why / error")
    )
    body = (
        f'<h1>Jobs</h1><p><a href="/jobs">all</a> · {filters}</p>'
        f'<table><thead><tr>{head}</tr></thead><tbody id="jobs" data-stream="{escape(stream)}">'
        f"{job_rows(jobs)}</tbody></table>"
    )
    return page("Jobs", body, csrf=csrf)


def job_page(job: dict[str, Any], csrf: str, timeline: str = "") -> str:
    """One job: what it runs, its tasks in every attempt (and ``timeline``, their HTML timeline), its history,
    why it waits, and a stop button."""
    job_id = job["job_id"]
    stop = ""
    if job["state"] in ("pending", "running"):
        stop = (
            f'<form method="post" action="/stop/{quote(job_id)}"><input type="hidden" name="csrf" '
            f'value="{escape(csrf)}"><button type="submit">Stop this job</button></form>'
        )
    facts = [
        ("state", _state(job["state"])),
        ("command", escape(job["command"])),
        ("actor", escape(job["actor"])),
        ("user / namespace", f"{escape(job['user'])} / {escape(job['namespace'])}"),
        ("parent", _job_link(job["parent_id"]) if job["parent_id"] else ""),
        ("resources", f"{job['cpu']:g} cpu, {format_size(job['ram_bytes'])} ram {escape(job['device'])}"),
        ("replicas / attempt", f"{job['replicas']} / {job['attempt']}"),
        ("failures", _retries(job["failures"], job["max_retries_failure"])),
        ("band", escape(job["band_name"])),
        ("preemptions", _retries(job["preemptions"], job["max_retries_preemption"])),
        (
            "submitted / started / ended",
            f"{_when(job['submitted_at'])} / {_when(job['started_at'])} / {_when(job['finished_at'])}",
        ),
        ("why pending", f'<span class="state-pending">{escape(job["pending_reason"])}</span>'),
        ("error", f'<span class="error">{escape(job["error"])}</span>'),
    ]
    facts_html = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in facts if v)
    tasks = _table(
        ("attempt", "task", "replica", "state", "worker", "exit", "started", "ended", "error"),
        (
            (
                str(t["attempt"]),
                str(t["task"]),
                str(t["replica"]),
                _state(t["state"]),
                escape(t["worker"] or ""),
                "" if t["exit_code"] is None else str(t["exit_code"]),
                _when(t["started_at"]),
                _when(t["finished_at"]),
                f'<span class="error">{escape(t["error"])}</span>',
            )
            for t in job["tasks"]
        ),
    )
    history = _table(
        ("at", "state", "detail"),
        ((_when(e["at"]), _state(e["state"]), escape(e["detail"] or "")) for e in job["history"]),
    )
    children = _table(("child job", "state"), ((_job_link(c["job_id"]), _state(c["state"])) for c in job["children"]))
    live = stacks_button(job_id, "stacks") if job["state"] == "running" else ""
    body = (
        f'<h1>{escape(job_id)}</h1><p><a href="/logs/{quote(job_id)}">Output (live)</a></p>{stop}{live}'
        f"<table>{facts_html}</table>"
        + (f'<h2>Timeline</h2><div id="timeline">{timeline}</div>' if timeline else "")
        + f"<h2>Tasks</h2>{tasks}<h2>History</h2>{history}"
        + (f"<h2>Child jobs</h2>{children}" if job["children"] else "")
    )
    return page(job_id, body, csrf=csrf)


def logs_page(job_id: str, lines: list[str], state: str, csrf: str) -> str:
    """A job's output, followed live until the job ends."""
    text = escape("".join(line + "\n" for line in lines))
    final = f'<span id="final" class="state-{escape(state)}">{escape(state)}</span>'
    body = (
        f"<h1>Output of {_job_link(job_id)}</h1><p>state: {final}</p>"
        f'<pre class="log" id="log" data-append data-stream="/stream/logs/{quote(job_id)}">{text}</pre>'
    )
    return page(f"Output of {job_id}", body, csrf=csrf)


def workers_page(status: dict[str, Any], csrf: str) -> str:
    """Workers and their resources: used and free."""
    cap = status["capacity"]
    summary = (
        f"<p>{cap['workers_alive']} workers alive, {cap['workers_lost']} lost, {cap.get('workers_stopped', 0)} "
        f"stopped · cpu {cap['cpu_used']:g} of "
        f"{cap['cpu_total']:g} used · ram {format_size(cap['ram_used'])} of {format_size(cap['ram_total'])} used</p>"
    )
    rows = (
        (
            escape(w["worker_id"]),
            _state(w["state"]),
            str(w["tasks"]),
            f"{w['cpu_used']:g} / {w['cpu_total']:g}",
            f"{format_size(w['ram_used'])} / {format_size(w['ram_total'])}",
            escape(" ".join(w["devices"])) + (f" ({w['devices_used']} used)" if w["devices"] else ""),
            escape(" ".join(f"{k}={v}" for k, v in w["attributes"].items())),
            f"{w['seconds_since_heartbeat']:.1f}s ago",
        )
        for w in status["workers"]
        if w["state"] != "stopped"
    )
    table = _table(
        ("worker", "state", "tasks", "cpu used / total", "ram used / total", "devices", "attributes", "heard from"),
        rows,
    )
    # Workers that left on purpose (drained, or their VM was scaled down) apart: they are not failures.
    stopped = [w for w in status["workers"] if w["state"] == "stopped"]
    if stopped:
        table += "<h2>Stopped (drained or scaled down)</h2>" + _table(
            ("worker", "cpu", "ram", "attributes", "left"),
            (
                (
                    escape(w["worker_id"]),
                    f"{w['cpu_total']:g}",
                    format_size(w["ram_total"]),
                    escape(" ".join(f"{k}={v}" for k, v in w["attributes"].items())),
                    f"{w['seconds_since_heartbeat']:.1f}s ago",
                )
                for w in stopped
            ),
        )
    return page("Workers", f"<h1>Workers</h1>{summary}{table}{_autoscaler_section(status)}", csrf=csrf)


def _autoscaler_section(status: dict[str, Any]) -> str:
    """Scale groups, VMs with their states, and why demand is unmet ("" without a VM provider)."""
    scaler = status.get("autoscaler")
    if not scaler:
        return ""
    groups = _table(
        ("group", "priority", "state", "min", "target", "max", "VMs by state", "last error"),
        (
            (
                escape(g["name"]),
                str(g["priority"]),
                escape(g["state"]),
                str(g["min"]),
                str(g["target"]),
                str(g["max"]),
                escape(" ".join(f"{k} {v}" for k, v in sorted(g["vms"].items()))),
                escape(g["last_error"]),
            )
            for g in scaler["groups"]
        ),
    )
    vms = _table(
        ("vm", "group", "slice", "state", "worker", "created", "ready"),
        (
            (
                escape(vm["id"]),
                escape(vm["group"]),
                escape(vm["slice"]),
                _state(vm["state"]),
                escape(vm["worker_id"] or ""),
                escape(vm["created_at"] or ""),
                escape(vm["ready_at"] or ""),
            )
            for vm in scaler.get("vms", [])
        ),
    )
    unmet = _table(
        ("job", "code", "why"),
        ((_job_link(e["job_id"]), escape(e["code"]), escape(e["message"])) for e in scaler["unmet"]),
    )
    return (
        f"<h2>Scale groups ({escape(scaler['provider'])} provider)</h2>{groups}<h2>VMs</h2>{vms}"
        f"<h2>Unmet demand: {scaler['unmet_count']} jobs</h2>{unmet}"
    )


def actors_page(status: dict[str, Any], csrf: str) -> str:
    """Live actors and the endpoints they serve."""
    rows = (
        (
            escape(a["name"]),
            escape(a["namespace"]),
            _state(a["state"]),
            _job_link(a["job_id"]),
            escape(a["user"]),
            "<br>".join(escape(e["address"]) for e in a["endpoints"]) or '<span class="muted">not serving yet</span>',
            stacks_button(a["job_id"], f"stacks-{n}", what=f"actor {a['name']!r}") if a["state"] == "running" else "",
        )
        for n, a in enumerate(status["actors"])
    )
    table = _table(("actor", "namespace", "state", "job", "user", "endpoints", "what it is doing"), rows)
    return page("Actors", f"<h1>Actors</h1>{table}", csrf=csrf)


def queues_page(queues: list[dict[str, Any]] | None, csrf: str) -> str:
    """Queues and their backlog, when this controller has queues."""
    if queues is None:
        return page("Queues", '<h1>Queues</h1><p class="muted">This controller has no queues.</p>', csrf=csrf)
    if not queues:
        return page("Queues", '<h1>Queues</h1><p class="muted">There are no queues yet.</p>', csrf=csrf)
    headers = list(queues[0].keys())
    rows = ([escape(str(q.get(h, ""))) for h in headers] for q in queues)
    return page("Queues", f"<h1>Queues</h1>{_table(headers, rows)}", csrf=csrf)


def _retries(count: int, allowed: int) -> str:
    """``count`` failures (or preemptions) and how many of the ``allowed`` retries they used."""
    return f"{count} ({min(count, allowed)} of {allowed} retries used)"
