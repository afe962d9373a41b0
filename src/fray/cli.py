"""The ``fray`` command line."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

import fray
from fray._process import pid_alive
from fray.client import VALID_SPECS, parse_client_spec

_console = Console()


@click.group()
@click.version_option(fray.__version__, prog_name="fray")
def main() -> None:
    """Fray: jobs, actors and actor groups on the local backend, a Fray cluster, or Ray."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Show which backend current_client() would use here, and which engines are installed."""
    spec = os.environ.get("FRAY_CLIENT_SPEC", "").strip() or "local"
    try:
        parse_client_spec(spec)
        problem = ""
    except fray.ConfigError as exc:
        problem = str(exc)
    engines = {name: importlib.util.find_spec(name) is not None for name in ("ray", "monarch")}
    if as_json:
        click.echo(json.dumps({"version": fray.__version__, "spec": spec, "problem": problem, "engines": engines}))
        return
    table = Table(title=f"fray {fray.__version__}", show_header=False)
    table.add_row("FRAY_CLIENT_SPEC", spec + (f"  [red]{problem}[/red]" if problem else ""))
    table.add_row("valid specs", ", ".join(VALID_SPECS))
    for name, present in engines.items():
        table.add_row(f"engine {name}", "[green]installed[/green]" if present else "not installed")
    _console.print(table)


# ----- cluster processes ---------------------------------------------------------------------------

_STATE_FILE = Path.home() / ".config" / "fray" / "cluster.json"


def _wait_for_signal(stop: Callable[[], None]) -> None:
    done = threading.Event()

    def handler(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    done.wait()
    stop()


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", default=7100, show_default=True, type=int, help="Port to bind (0: any free port).")
@click.option(
    "--db", "db_path", default=str(Path.home() / ".local" / "state" / "fray" / "controller.db"), show_default=True
)
@click.option("--worker-timeout", default=10.0, show_default=True, help="Seconds of silence before a worker is lost.")
@click.option("--address-file", type=click.Path(dir_okay=False), help="Write HOST:PORT here once serving.")
@click.option(
    "--tls-dir", default=None, help="Cluster CA and certificate (made if missing) when --host is not loopback."
)
def controller(
    host: str, port: int, db_path: str, worker_timeout: float, address_file: str | None, tls_dir: str | None
) -> None:
    """Run the cluster controller (state in SQLite; needs FRAY_TOKEN)."""
    from fray.cluster.controller import Controller
    from fray.cluster.controller_client import load_token

    token = load_token()
    if token is None:
        raise click.UsageError(
            "set FRAY_TOKEN (or write ~/.config/fray/token): the controller never runs unauthenticated"
        )
    os.umask(0o077)  # the state, its journal and the TLS keys: for this user only
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    try:
        ctl = Controller(
            db_path, host=host, port=port, token=token, worker_timeout=worker_timeout, tls_dir=tls_dir
        ).start()
    except fray.FrayError as exc:
        raise click.ClickException(str(exc)) from None
    if address_file:
        tmp = Path(address_file + ".tmp")
        tmp.write_text(ctl.address)
        tmp.replace(address_file)
    click.echo(f"fray controller serving on {ctl.address} (state: {db_path})", err=True)
    if ctl.tls_files is not None:
        click.echo(
            f"TLS required beyond this machine; clients and workers need FRAY_TLS_CA={ctl.tls_files.ca_cert}", err=True
        )
    _wait_for_signal(ctl.stop)


def _parse_device(text: str) -> Any:
    from fray.cluster.capacity import Device

    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("gpu", "tpu") or not parts[2].isdigit():
        raise click.BadParameter(f"{text!r}: use KIND:TYPE:COUNT, e.g. gpu:H100:8 or tpu:v5litepod-16:4")
    return Device(parts[0], parts[1], int(parts[2]))


@main.group(invoke_without_command=True)
@click.option("--controller", "address", default=None, help="The controller's HOST:PORT.")
@click.option("--id", "worker_id", default=None, help="Worker id (default: host name plus a random suffix).")
@click.option("--cpu", type=float, default=None, help="Cores to offer (default: all).")
@click.option("--ram", default=None, help="Memory to offer, e.g. 16g (default: all).")
@click.option("--disk", default=None, help="Disk to offer, e.g. 100g (default: free space).")
@click.option("--device", "devices", multiple=True, help="An accelerator, KIND:TYPE:COUNT (repeatable).")
@click.option("--attr", "attrs", multiple=True, help="An attribute KEY=VALUE, e.g. preemptible=false (repeatable).")
@click.option("--workdir", default=None, help="Where task directories go.")
def worker(
    address: str,
    worker_id: str | None,
    cpu: float | None,
    ram: str | None,
    disk: str | None,
    devices: tuple[str, ...],
    attrs: tuple[str, ...],
    workdir: str | None,
) -> None:
    """Run a worker that takes tasks from the controller at --controller (or: fray worker list)."""
    if click.get_current_context().invoked_subcommand is not None:
        return
    if not address:
        raise click.UsageError("fray worker needs --controller HOST:PORT")
    from fray.cluster.controller_client import load_token
    from fray.cluster.worker import Worker

    attributes = {}
    for item in attrs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: use KEY=VALUE")
        attributes[key] = value
    node = Worker(
        address,
        token=load_token(),
        worker_id=worker_id,
        cpu=cpu,
        ram_bytes=fray.parse_size(ram) if ram else None,
        disk_bytes=fray.parse_size(disk) if disk else None,
        devices=tuple(_parse_device(d) for d in devices),
        attributes=attributes,
        workdir=workdir,
    ).start()
    click.echo(f"fray worker {node.worker_id} taking tasks from {address}", err=True)
    _wait_for_signal(node.stop)


# ----- cluster up / down ---------------------------------------------------------------------------

_TOKEN_FILE = Path.home() / ".config" / "fray" / "token"


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@main.group()
def cluster() -> None:
    """Start and stop a Fray cluster on this machine."""


@cluster.command("up")
@click.option("--workers", default=2, show_default=True, help="How many workers to start.")
@click.option("--port", default=7100, show_default=True, help="Controller port (0: any free port).")
@click.option(
    "--dir", "directory", default=str(Path.home() / ".local" / "state" / "fray" / "cluster"), show_default=True
)
@click.option("--worker-option", "worker_options", multiple=True, help="Extra option for every worker, e.g. '--cpu 4'.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def cluster_up(workers: int, port: int, directory: str, worker_options: tuple[str, ...], as_json: bool) -> None:
    """Start a controller and N workers in the background and print how to use them."""
    import secrets
    import time

    from fray.cluster.launcher import LocalCluster

    if _STATE_FILE.exists():
        raise click.ClickException(f"a cluster is already up (see {_STATE_FILE}); run `fray cluster down` first")
    token = os.environ.get("FRAY_TOKEN") or (_TOKEN_FILE.read_text().strip() if _TOKEN_FILE.exists() else "")
    if not token:
        token = secrets.token_hex(16)
        _TOKEN_FILE.parent.mkdir(parents=True, exist_ok=True)
        _TOKEN_FILE.touch(mode=0o600)
        _TOKEN_FILE.write_text(token)
    started = time.monotonic()
    launcher = LocalCluster(directory, token=token, port=port)
    extra = [part for option in worker_options for part in option.split()]
    if not any(part.startswith("preemptible=") for part in extra):
        # Workers on this one machine are never preempted; saying so lets
        # ResourceConfig(preemptible=False) actors (curriculum, coordinators) run here.
        extra += ["--attr", "preemptible=false"]
    if as_json:
        launcher.start(workers, *extra)
    else:
        with _console.status(f"starting a controller and {workers} workers..."):
            launcher.start(workers, *extra)
    elapsed = time.monotonic() - started
    state = {
        "address": launcher.address,
        "directory": directory,
        "controller_pid": launcher.controller.pid if launcher.controller else None,
        "worker_pids": {name: proc.pid for name, proc in launcher.workers.items()},
        "ready_seconds": round(elapsed, 3),
    }
    _STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    _STATE_FILE.write_text(json.dumps(state, indent=2))
    if as_json:
        _echo_json(state)
        return
    _console.print(
        f"[green]Fray cluster up[/green] in {elapsed:.2f}s: controller [bold]{launcher.address}[/bold], {workers} workers"
    )
    _console.print(f"  use it:   export FRAY_CLIENT_SPEC=fray://{launcher.address}")
    _console.print(f"  token:    {'$FRAY_TOKEN' if os.environ.get('FRAY_TOKEN') else _TOKEN_FILE}")
    _console.print(f"  logs:     {directory}/*.log")
    _console.print("  stop it:  fray cluster down")


@cluster.command("down")
def cluster_down() -> None:
    """Stop the cluster started by `fray cluster up`."""
    import time

    if not _STATE_FILE.exists():
        raise click.ClickException("no cluster is up (nothing in ~/.config/fray/cluster.json)")
    state = json.loads(_STATE_FILE.read_text())
    pids = [*state["worker_pids"].values(), state["controller_pid"]]
    for pid in pids:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for pid in pids:
        while pid and time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.02)
        if pid and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _STATE_FILE.unlink()
    _console.print(f"Fray cluster at {state['address']} stopped")


# ----- jobs, workers, endpoints --------------------------------------------------------------------

_controller_option = click.option(
    "--controller", "address", default=None, help="HOST:PORT (default: FRAY_CLIENT_SPEC, then `fray cluster up`'s)."
)


def _address(address: str | None) -> str:
    if address:
        return address
    spec = os.environ.get("FRAY_CLIENT_SPEC", "")
    if spec.startswith("fray://"):
        return parse_client_spec(spec).address or ""
    if _STATE_FILE.exists():
        return str(json.loads(_STATE_FILE.read_text())["address"])
    raise click.UsageError(
        "no cluster: pass --controller HOST:PORT, set FRAY_CLIENT_SPEC=fray://HOST:PORT, or run `fray cluster up`"
    )


def _connect(address: str | None) -> Any:
    from fray.cluster.controller_client import connect_controller

    return connect_controller(_address(address))


def _view_row(view: Any) -> dict[str, Any]:
    return {
        "job_id": view.job_id,
        "state": view.state.value,
        "attempt": view.attempt,
        "user": view.user,
        "namespace": view.namespace,
        "pending_reason": view.pending_reason,
        "error": view.error,
    }


@main.group()
def job() -> None:
    """Submit and inspect jobs on a Fray cluster."""


@job.command("submit", context_settings={"ignore_unknown_options": True})
@_controller_option
@click.option("--name", default=None, help="Job name (default: the command's name).")
@click.option("--cpu", type=float, default=1, show_default=True)
@click.option("--ram", default="128m", show_default=True)
@click.option("--replicas", default=1, show_default=True)
@click.option("--retries", default=0, show_default=True, help="max_retries_failure")
@click.option("--env", "env_vars", multiple=True, help="KEY=VALUE for the job (repeatable).")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the job and exit non-zero if it fails.")
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
    wait_: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (after `--`) as a job: fray job submit -- python train.py --lr 3e-4"""
    from fray.cluster.client import ClusterClient

    env = {}
    for item in env_vars:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: use KEY=VALUE", param_hint="--env")
        env[key] = value
    job_name = name or "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(command[0]).name)[:64]
    request = fray.JobRequest(
        name=job_name,
        entrypoint=fray.Entrypoint.from_binary(command[0], list(command[1:])),
        resources=fray.ResourceConfig(cpu=cpu, ram=ram),
        environment=fray.EnvironmentConfig(env_vars=env),
        replicas=replicas,
        max_retries_failure=retries,
    )
    handle = ClusterClient(_address(address)).submit(request)
    if as_json:
        _echo_json({"job_id": handle.job_id})
    else:
        click.echo(handle.job_id)
    if wait_:
        status = handle.wait(raise_on_failure=False)
        for line in handle.logs():
            click.echo(line)
        if status != fray.JobStatus.SUCCEEDED:
            raise click.ClickException(f"job {handle.job_id} {status.value}: {handle.view().error}")


@job.command("list")
@_controller_option
@click.option("--state", "states", multiple=True, type=click.Choice([s.value for s in fray.JobStatus]))
@click.option("--json", "as_json", is_flag=True)
def job_list(address: str | None, states: tuple[str, ...], as_json: bool) -> None:
    """List jobs, oldest first."""
    views = _connect(address).list_jobs(list(states) or None)
    rows = [_view_row(v) for v in views]
    if as_json:
        _echo_json(rows)
        return
    table = Table("job", "state", "attempt", "user", "why pending / error")
    for row in rows:
        table.add_row(
            row["job_id"], row["state"], str(row["attempt"]), row["user"], row["pending_reason"] or row["error"]
        )
    _console.print(table)


@job.command("status")
@_controller_option
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def job_status(address: str | None, job_id: str, as_json: bool) -> None:
    """Show one job and its tasks (with why each pending task is not running)."""
    controller = _connect(address)
    row = _view_row(controller.job(job_id))
    tasks = [
        {
            "task": t.task_index,
            "replica": t.replica_index,
            "state": t.state.value,
            "worker": t.worker_id,
            "exit_code": t.exit_code,
            "reason": t.pending_reason or t.error,
        }
        for t in controller.tasks(job_id)
    ]
    if as_json:
        _echo_json({**row, "tasks": tasks})
        return
    _console.print(
        f"[bold]{row['job_id']}[/bold]  {row['state']}  attempt {row['attempt']}  namespace {row['namespace']}"
    )
    if row["pending_reason"] or row["error"]:
        _console.print(f"  {row['pending_reason'] or row['error']}")
    table = Table("task", "replica", "state", "worker", "exit", "why pending / error")
    for t in tasks:
        table.add_row(
            str(t["task"]), str(t["replica"]), t["state"], t["worker"] or "", str(t["exit_code"] or ""), t["reason"]
        )
    _console.print(table)


@job.command("logs")
@_controller_option
@click.argument("job_id")
@click.option("-n", "--lines", type=int, default=None, help="Only the last N lines.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
def job_logs(address: str | None, job_id: str, lines: int | None, follow: bool) -> None:
    """Print a job's output."""
    import time

    controller = _connect(address)
    last_id = 0
    for line_id, text in controller.logs(job_id, lines):
        click.echo(text)
        last_id = line_id
    while follow:
        view = controller.wait([job_id], 1.0)[0]
        for line_id, text in controller.logs(job_id, None, last_id):
            click.echo(text)
            last_id = line_id
        if view.state.finished and view.settled:
            break
        time.sleep(0.1)


@job.command("stop")
@_controller_option
@click.argument("job_id")
def job_stop(address: str | None, job_id: str) -> None:
    """Terminate a job, its tasks and its child jobs."""
    view = _connect(address).terminate(job_id)
    click.echo(f"{view.job_id} {view.state.value}")


@worker.command("list")
@_controller_option
@click.option("--json", "as_json", is_flag=True)
def worker_list(address: str | None, as_json: bool) -> None:
    """List the workers the controller knows, with their resources and attributes."""
    rows = [
        {
            "worker_id": w.info.worker_id,
            "state": w.state.value,
            "cpu": w.info.cpu_millis / 1000,
            "ram": fray.resources.format_size(w.info.ram_bytes),
            "devices": [f"{d.kind}:{d.type}:{d.count}" for d in w.info.devices],
            "attributes": w.info.attributes,
            "last_heartbeat": w.last_heartbeat,
        }
        for w in _connect(address).list_workers()
    ]
    if as_json:
        _echo_json(rows)
        return
    table = Table("worker", "state", "cpu", "ram", "devices", "attributes")
    for row in rows:
        attrs = " ".join(f"{k}={v}" for k, v in row["attributes"].items())
        table.add_row(row["worker_id"], row["state"], f"{row['cpu']:g}", row["ram"], " ".join(row["devices"]), attrs)
    _console.print(table)


@main.group()
def endpoint() -> None:
    """Inspect registered actor endpoints."""


@endpoint.command("list")
@_controller_option
@click.option("--namespace", default=None, help="Only this namespace (default: all).")
@click.option("--json", "as_json", is_flag=True)
def endpoint_list(address: str | None, namespace: str | None, as_json: bool) -> None:
    """List actor endpoints by namespace."""
    rows = [
        {"namespace": e.namespace, "name": e.name, "address": e.address, "job_id": e.task.job_id}
        for e in _connect(address).list_endpoints(namespace)
    ]
    if as_json:
        _echo_json(rows)
        return
    table = Table("namespace", "name", "address", "job")
    for row in rows:
        table.add_row(row["namespace"], row["name"], row["address"], row["job_id"])
    _console.print(table)


if __name__ == "__main__":
    main()
