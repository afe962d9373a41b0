"""``fray job ...``: submit, list, inspect, follow and stop jobs on a Fray cluster."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

import fray
from fray.cli._common import (
    Session,
    console,
    controller_option,
    echo_json,
    format_duration,
    format_time,
    plain_row,
    stdout_console,
)
from fray.cli._errors import CliError
from fray.errors import ConfigError
from fray.job import JobStatus

__all__ = ["job"]

_STATES = [s.value for s in JobStatus]


@click.group()
def job() -> None:
    """Submit and inspect jobs on a Fray cluster (jobs are named by id or by unique name)."""


def _option_error(exc: ConfigError, option: str, example: str) -> CliError:
    return CliError(str(exc).splitlines()[0], f"fix {option}, e.g. {example}")


def _request(
    command: tuple[str, ...],
    name: str | None,
    cpu: float,
    ram: str,
    replicas: int,
    retries: int,
    env: dict[str, str],
    workspace: str | None,
) -> fray.JobRequest:
    job_name = name or "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(command[0]).name)[:64]
    try:
        fray.job.validate_name(job_name)
    except ConfigError as exc:
        raise _option_error(exc, "--name", "--name train-v2 (letters, digits, '.', '_', '-')") from None
    try:
        resources = fray.ResourceConfig(cpu=cpu, ram=ram)
    except ConfigError as exc:
        option = "--ram" if "ram" in str(exc) else "--cpu"
        raise _option_error(exc, option, "--cpu 2 --ram 4g") from None
    try:
        environment = fray.EnvironmentConfig(env_vars=env, workspace=workspace)
        return fray.JobRequest(
            name=job_name,
            entrypoint=fray.Entrypoint.from_binary(command[0], list(command[1:])),
            resources=resources,
            environment=environment,
            replicas=replicas,
            max_retries_failure=retries,
        )
    except ConfigError as exc:
        option = "--env" if "env_vars" in str(exc) else ("--replicas" if "replicas" in str(exc) else "--retries")
        raise _option_error(exc, option, "--replicas 2 --retries 1 --env KEY=VALUE") from None


@job.command("submit", context_settings={"ignore_unknown_options": True})
@controller_option
@click.option("--name", default=None, help="Job name (default: the command's name).")
@click.option("--cpu", type=float, default=1, show_default=True, help="Cores per replica.")
@click.option("--ram", default="128m", show_default=True, help="Memory per replica, e.g. 4g.")
@click.option("--replicas", type=int, default=1, show_default=True)
@click.option("--retries", type=int, default=0, show_default=True, help="max_retries_failure")
@click.option("--env", "env_vars", multiple=True, help="KEY=VALUE for the job (repeatable).")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False),
    default=None,
    help="Ship DIR (less what its .gitignore excludes; at most 256 MiB packed) as the job's working directory. "
    "Default: the current directory when COMMAND names a file in it (python train.py).",
)
@click.option("--no-workspace", is_flag=True, help="Ship nothing: COMMAND runs in the worker's task directory.")
@click.option(
    "--wait", "wait_", is_flag=True, help="Stream the job's output until it ends; exit 1 unless it succeeded."
)
@click.option("--json", "as_json", is_flag=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def job_submit(
    address: str | None,
    name: str | None,
    cpu: float,
    ram: str,
    replicas: int,
    retries: int,
    env_vars: tuple[str, ...],
    workspace: str | None,
    no_workspace: bool,
    wait_: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (after `--`) as a job: fray job submit -- python train.py --lr 3e-4

    Run from a project folder, the folder is shipped with the job and COMMAND runs in it.
    """
    from fray.cluster.client import ClusterClient
    from fray.core._driver_exit import hand_over

    env = {}
    for item in env_vars:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--env {item!r} is not KEY=VALUE", "e.g. --env LR=3e-4 (repeat --env for more)")
        env[key] = value
    if workspace is not None and no_workspace:
        raise CliError("--workspace and --no-workspace contradict each other", "give one of them")
    if workspace is None and not no_workspace:
        workspace = _implied_workspace(command)
    request = _request(command, name, cpu, ram, replicas, retries, env, workspace)
    session = Session.open(address)
    try:
        client = ClusterClient(session.address)
        handle = client.submit(request)
    except ConfigError as exc:
        if workspace is None or "workspace" not in str(exc):
            raise
        raise CliError(
            str(exc).splitlines()[0], "choose a smaller folder with --workspace DIR, or --no-workspace"
        ) from None
    hand_over(client)  # the job outlives this command on purpose: no script-exit notice
    if as_json and not wait_:
        echo_json({"job_id": handle.job_id})
        return
    if not wait_:
        click.echo(handle.job_id)
        return
    click.echo(f"job {handle.job_id} submitted; streaming its output (Ctrl-C stops watching, not the job)", err=True)
    final = follow(session, handle.job_id, output_to_stderr=as_json)  # --json keeps stdout for the JSON
    _finish(final, as_json)


def _implied_workspace(command: tuple[str, ...]) -> str | None:
    """The current directory, when ``command`` names a file in it by a relative path (said on stderr); else None."""
    here = Path.cwd()
    named = next(
        (arg for arg in command if not arg.startswith("-") and not Path(arg).is_absolute() and (here / arg).is_file()),
        None,
    )
    if named is None:
        return None
    click.echo(
        f"shipping {here} as the job's workspace ({named} is in it); --workspace DIR or --no-workspace to choose",
        err=True,
    )
    return str(here)


def _finish(final: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json({"job_id": final["job_id"], "state": final["state"], "error": final["error"]})
    ran = format_duration(final["duration"])
    line = f"job {final['job_id']} {final['state']}" + (f" after {ran}" if ran else "")
    if final["state"] == JobStatus.SUCCEEDED.value:
        console.print(f"[green]{line}[/green]", highlight=False)
        return
    raise CliError(f"{line}: {final['error'] or 'no error recorded'}", f"see `fray job status {final['job_id']}`", 1)


@contextlib.contextmanager
def _progress_line(job_id: str) -> Iterator[Any]:
    """A live status line on a terminal (job state, elapsed time, tasks); nothing otherwise."""
    if not console.is_terminal:
        yield None
        return
    with console.status(f"job {job_id}: submitted") as status:
        yield status


def follow(session: Session, job_id: str, after_id: int = 0, *, output_to_stderr: bool = False) -> dict[str, Any]:
    """Print the job's output as it is written until the job ends (and its processes are gone); return it."""
    started = time.monotonic()
    last_id = after_id
    last_tasks = 0.0
    with _progress_line(job_id) as status:
        while True:
            view = session.controller.wait([job_id], 0.25)[0]
            for line_id, text in session.controller.logs(job_id, None, last_id):
                click.echo(text, err=output_to_stderr)
                last_id = line_id
            if view.state.finished and view.settled:
                break
            if status is not None and time.monotonic() - last_tasks > 1.0:
                last_tasks = time.monotonic()
                tasks = session.controller.tasks(job_id)
                running = sum(1 for t in tasks if t.state.value in ("assigned", "running"))
                pending = sum(1 for t in tasks if t.state.value == "pending")
                why = f" ({escape(view.pending_reason)})" if view.pending_reason else ""
                status.update(
                    f"job {job_id}: {view.state.value}{why} · {format_duration(time.monotonic() - started)} · "
                    f"tasks {running} running, {pending} pending"
                )
    detail: dict[str, Any] = session.ops.job_detail(job_id)
    return detail


@job.command("list")
@controller_option
@click.option(
    "--state", "states", multiple=True, type=click.Choice(_STATES), help="Only jobs in this state (repeatable)."
)
@click.option("--namespace", default=None, help="Only jobs of this namespace (e.g. one script's jobs).")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True, help="At most N jobs; 0: all.")
@click.option("--json", "as_json", is_flag=True)
def job_list(address: str | None, states: tuple[str, ...], namespace: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first, with their times, duration and command."""
    session = Session.open(address)
    rows: list[dict[str, Any]] = session.ops.jobs(list(states) or None, limit, namespace)
    if as_json:
        echo_json(rows)
        return
    table = Table("job", "state", "band", "submitted", "duration", "command", "why pending / error")
    for row in rows:
        plain_row(
            table,
            row["job_id"],
            row["state"],
            row["band_name"],
            format_time(row["submitted_at"]),
            format_duration(row["duration"]),
            row["command"],
            row["pending_reason"] or row["error"],
        )
    stdout_console().print(table)
    if limit and len(rows) == limit:
        click.echo(f"(the newest {limit}; --limit 0 lists all)", err=True)


@job.command("status")
@controller_option
@click.argument("ref", metavar="JOB")
@click.option("--json", "as_json", is_flag=True)
def job_status(address: str | None, ref: str, as_json: bool) -> None:
    """Show one job: its tasks in every attempt, its state history, why it is pending."""
    session = Session.open(address)
    detail: dict[str, Any] = session.ops.job_detail(session.resolve_job(ref))
    if as_json:
        echo_json(detail)
        return
    out = stdout_console()
    out.print(
        f"[bold]{escape(detail['job_id'])}[/bold]  {detail['state']}  attempt {detail['attempt']}  "
        f"band {detail['band_name']}  namespace {detail['namespace']}  user {detail['user']}"
    )
    out.print(f"  command: {detail['command']}")
    if detail["pending_reason"] or detail["error"]:
        out.print(f"  {escape(detail['pending_reason'] or detail['error'])}")
    if detail["pending_reason"] and detail["error"] and detail["error"] not in detail["pending_reason"]:
        # A job pending again after a lost or preempted attempt: say what ended that attempt.
        out.print(f"  last attempt: {escape(detail['error'])}")
    if detail["preemptions"]:
        out.print(f"  preemptions: {detail['preemptions']} of {detail['max_retries_preemption']} allowed")
    tasks = Table("attempt", "task", "replica", "state", "worker", "exit", "started", "error")
    for t in detail["tasks"]:
        plain_row(
            tasks,
            str(t["attempt"]),
            str(t["task"]),
            str(t["replica"]),
            t["state"],
            t["worker"] or "",
            "" if t["exit_code"] is None else str(t["exit_code"]),
            format_time(t["started_at"]),
            t["error"],
        )
    out.print(tasks)
    history = Table("at", "state", "detail", title="history")
    for event in detail["history"]:
        plain_row(history, format_time(event["at"]), event["state"], event["detail"] or "")
    out.print(history)


@job.command("logs")
@controller_option
@click.argument("ref", metavar="JOB")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=None, help="Only the last N lines.")
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new lines until the job ends.")
def job_logs(address: str | None, ref: str, lines: int | None, follow_: bool) -> None:
    """Print a job's output (all replicas and attempts)."""
    session = Session.open(address)
    job_id = session.resolve_job(ref)
    last_id = 0
    for line_id, text in session.controller.logs(job_id, lines):
        click.echo(text)
        last_id = line_id
    if follow_:
        final = follow(session, job_id, last_id)
        if final["state"] != JobStatus.SUCCEEDED.value:
            click.echo(f"job {job_id} {final['state']}: {final['error']}", err=True)


@job.command("stop")
@controller_option
@click.argument("refs", metavar="JOB...", nargs=-1)
@click.option("--namespace", default=None, help="Stop every unfinished job of this namespace (a script's leftovers).")
def job_stop(address: str | None, refs: tuple[str, ...], namespace: str | None) -> None:
    """Terminate jobs (their tasks and child jobs): by id or name, or all of a namespace."""
    if not refs and namespace is None:
        raise CliError("name the jobs to stop", "fray job stop JOB [JOB...], or fray job stop --namespace NS")
    session = Session.open(address)
    job_ids = [session.resolve_job(ref) for ref in refs]
    if namespace is not None:
        live = session.ops.jobs(["pending", "running"], 0, namespace)
        if not live and not refs:
            click.echo(f"no unfinished jobs in namespace {namespace!r}", err=True)
        # Parents first: stopping one stops its children too.
        job_ids += [row["job_id"] for row in sorted(live, key=lambda r: r["job_id"].count("/"))]
    for job_id in dict.fromkeys(job_ids):
        view = session.controller.terminate(job_id)
        click.echo(f"{view.job_id} {view.state.value}")
