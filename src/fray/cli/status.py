"""``fray status`` (the cluster at a glance) and ``fray endpoint list``."""

from __future__ import annotations

import webbrowser
from typing import Any

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fray.cli._common import (
    Session,
    controller_option,
    count_of,
    echo_json,
    format_duration,
    plain_row,
    read_state,
    stdout_console,
)
from fray.cli._errors import CliError
from fray.cli.cluster import DASHBOARD_INSTALL, dashboard_unavailable, up_again
from fray.resources import format_size

__all__ = ["dashboard", "endpoint", "no_dashboard_hint", "status"]


def _use(used: float, total: float, fmt: Any = lambda v: f"{v:g}") -> str:
    return f"{fmt(used)} / {fmt(total)}"


@click.command()
@controller_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(address: str | None, as_json: bool) -> None:
    """The cluster at a glance: workers and their resources, jobs by state, actors, queues, the controller."""
    data: dict[str, Any] = Session.open(address).ops.status()
    if as_json:
        echo_json(data)
        return
    out = stdout_console()
    health = data["controller"]
    read_only = "  [red]READ-ONLY[/red]" if health["read_only"] else ""
    out.print(
        f"[bold]controller[/bold] {health['address']}  up {format_duration(health['uptime_seconds'])}  "
        f"db {escape(health['database'])}{read_only}"
    )
    if health["read_only"]:
        out.print(f"  [red]serving reads only:[/red] {escape(health['read_only_reason'])}")
    if health["dashboard"]:
        out.print(f"  dashboard http://{health['dashboard']}/  (`fray dashboard` prints a log-in link)")
    cap = data["capacity"]
    gone = ", ".join(f"{cap.get(f'workers_{state}', 0)} {state}" for state in ("lost", "stopped"))
    out.print(
        f"[bold]capacity[/bold] {count_of(cap['workers_alive'], 'worker')} alive ({gone})  "
        f"cpu {_use(cap['cpu_used'], cap['cpu_total'])} used  "
        f"ram {_use(cap['ram_used'], cap['ram_total'], format_size)} used"
    )
    jobs = data["jobs"]
    out.print("[bold]jobs[/bold] " + "  ".join(f"{state} {count}" for state, count in jobs.items()))
    workers = Table(
        "worker", "state", "tasks", "cpu used/total", "ram used/total", "devices used/total", title="workers"
    )
    stopped = [w["worker_id"] for w in data["workers"] if w["state"] == "stopped"]
    for w in data["workers"]:
        if w["state"] == "stopped":
            continue  # listed apart, below: it left on purpose
        devices = f"{w['devices_used']} / {w['devices_total']} {' '.join(w['devices'])}" if w["devices"] else ""
        plain_row(
            workers,
            w["worker_id"],
            w["state"],
            str(w["tasks"]),
            _use(w["cpu_used"], w["cpu_total"]),
            _use(w["ram_used"], w["ram_total"], format_size),
            devices,
        )
    out.print(workers)
    if stopped:
        shown = " ".join(stopped[:_STOPPED_SHOWN]) + (
            f" ... and {len(stopped) - _STOPPED_SHOWN} more" if len(stopped) > _STOPPED_SHOWN else ""
        )
        out.print(f"[bold]stopped workers[/bold] (drained or scaled down, not lost) {len(stopped)}: {escape(shown)}")
    actors = Table("actor", "namespace", "state", "job", "endpoint", title="actors")
    for a in data["actors"]:
        plain_row(
            actors, a["name"], a["namespace"], a["state"], a["job_id"], " ".join(e["address"] for e in a["endpoints"])
        )
    out.print(actors)
    if data.get("autoscaler") is not None:
        _print_autoscaler(out, data["autoscaler"])
    if data["queues"] is None:
        out.print("[bold]queues[/bold] (this controller has no queues)")
    else:
        queues = Table(*(data["queues"][0].keys() if data["queues"] else ["queue"]), title="queues")
        for q in data["queues"]:
            plain_row(queues, *(str(v) for v in q.values()))
        out.print(queues)


# Stopped workers named by `fray status` (all of them: `fray worker list`).
_STOPPED_SHOWN = 10

# VMs listed by `fray status` (all of them: `fray cluster vm list`).
_VM_ROWS = 30


def _print_autoscaler(out: Any, scaler: dict[str, Any]) -> None:
    """Scale groups with their state, target and VMs by state; why demand is unmet."""
    groups = Table("group", "priority", "state", "min", "target", "max", "VMs by state", title="scale groups")
    for g in scaler["groups"]:
        vms = "  ".join(f"{state} {count}" for state, count in sorted(g["vms"].items())) or "none"
        state = Text(g["state"], style="" if g["state"] == "ok" else "yellow")
        plain_row(groups, g["name"], str(g["priority"]), state, str(g["min"]), str(g["target"]), str(g["max"]), vms)
    out.print(groups)
    vms = scaler.get("vms", [])
    if vms:
        table = Table("vm", "group", "slice", "state", "worker", "ready at", title="VMs")
        for vm in vms[:_VM_ROWS]:
            plain_row(
                table, vm["id"], vm["group"], vm["slice"], vm["state"], vm["worker_id"] or "", vm["ready_at"] or ""
            )
        out.print(table)
        if len(vms) > _VM_ROWS:
            out.print(f"  ... and {len(vms) - _VM_ROWS} more (`fray cluster vm list` lists them all)")
    if scaler["unmet_count"]:
        codes = "  ".join(f"{code} {count}" for code, count in sorted(scaler["unmet_by_code"].items()))
        out.print(f"[bold]unmet demand[/bold] {scaler['unmet_count']} jobs ({codes})")
        for entry in scaler["unmet"][:10]:
            out.print(f"  {entry['job_id']}: \\[{entry['code']}] {escape(entry['message'])}")
    if scaler.get("waiting_for_vms"):
        out.print(f"[bold]waiting for VMs[/bold] {scaler['waiting_for_vms']} jobs")


@click.group()
def endpoint() -> None:
    """Inspect registered actor endpoints."""


@endpoint.command("list")
@controller_option
@click.option("--namespace", default=None, help="Only this namespace (default: all).")
@click.option("--json", "as_json", is_flag=True)
def endpoint_list(address: str | None, namespace: str | None, as_json: bool) -> None:
    """List actor endpoints by namespace."""
    rows = [
        {"namespace": e.namespace, "name": e.name, "address": e.address, "job_id": e.task.job_id}
        for e in Session.open(address).controller.list_endpoints(namespace)
    ]
    if as_json:
        echo_json(rows)
        return
    table = Table("namespace", "name", "address", "job")
    for row in rows:
        plain_row(table, row["namespace"], row["name"], row["address"], row["job_id"])
    stdout_console().print(table)


def no_dashboard_hint(address: str, state: dict[str, Any] | None, missing: str) -> str:
    """How to get a dashboard from the controller at ``address``, which serves none.

    ``state`` is what ``fray cluster up`` recorded (None if nothing); ``missing`` is why this
    Python cannot serve a dashboard ("" if it can). A controller that runs cannot start one
    (and ``fray cluster restart`` leaves running processes alone), so the recorded cluster is
    stopped and started again; any other controller is restarted by whoever runs it.
    """
    if state is None or state.get("address") != address:
        return (
            f"on the controller's machine install the dashboard extra ({DASHBOARD_INSTALL}) and restart "
            "`fray controller` there without --no-dashboard"
        )
    again = up_again(state)
    if missing:
        return f"install the dashboard extra ({DASHBOARD_INSTALL}), then restart the cluster: {again}"
    if "--no-dashboard" in state.get("controller_args", []):
        return f"the cluster was started with --no-dashboard; start it again with one: {again}"
    return f"the controller's log says why ({state.get('directory')}/controller.log); start the cluster again: {again}"


@click.command()
@controller_option
@click.option("--open", "open_browser", is_flag=True, help="Open the link in a browser on this machine.")
def dashboard(address: str | None, open_browser: bool) -> None:
    """Print a one-time link that logs a browser in to the cluster's web dashboard."""
    session = Session.open(address)
    link: str = session.ops.dashboard_login()
    if not link:
        raise CliError(
            f"the controller at {session.address} serves no dashboard",
            no_dashboard_hint(session.address, read_state(), dashboard_unavailable()),
        )
    click.echo(link)
    click.echo("(the link logs in once, within five minutes; or log in with the cluster token)", err=True)
    if open_browser:
        webbrowser.open(link)
