"""``fray cluster up`` / ``down``: a controller and workers on this machine, in the background."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import signal
import socket
import time
from pathlib import Path

import click

from fray._process import pid_alive
from fray.cli._common import STATE_FILE, TOKEN_FILE, console, echo_json, read_state
from fray.cli._errors import CliError
from fray.cli.daemons import busy_port_error

__all__ = ["DEFAULT_DIR", "cluster"]

#: Where ``fray cluster up`` keeps the controller's database and every process's log.
DEFAULT_DIR = Path.home() / ".local" / "state" / "fray" / "cluster"


@click.group()
def cluster() -> None:
    """Start and stop a Fray cluster on this machine."""


def _check_port_free(port: int) -> None:
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise busy_port_error("127.0.0.1", port) from None
            raise


def _token() -> str:
    token = os.environ.get("FRAY_TOKEN") or (TOKEN_FILE.read_text().strip() if TOKEN_FILE.exists() else "")
    if not token:
        token = secrets.token_hex(16)
        TOKEN_FILE.parent.mkdir(parents=True, exist_ok=True)
        TOKEN_FILE.touch(mode=0o600)
        TOKEN_FILE.write_text(token)
    return token


@cluster.command("up")
@click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True, help="How many workers.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=7100, show_default=True, help="Controller port (0: any)."
)
@click.option("--dir", "directory", default=str(DEFAULT_DIR), show_default=True, help="State and logs.")
@click.option("--worker-option", "worker_options", multiple=True, help="Extra option for every worker, e.g. '--cpu 4'.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def cluster_up(workers: int, port: int, directory: str, worker_options: tuple[str, ...], as_json: bool) -> None:
    """Start a controller and N workers in the background and print how to use them."""
    from fray.cluster.launcher import LocalCluster
    from fray.errors import FrayError

    if read_state() is not None:
        raise CliError(f"a cluster is already up (see {STATE_FILE})", "run `fray cluster down` first")
    _check_port_free(port)
    token = _token()
    started = time.monotonic()
    launcher = LocalCluster(directory, token=token, port=port)
    extra = [part for option in worker_options for part in option.split()]
    if not any(part.startswith("preemptible=") for part in extra):
        # Workers on this one machine are never preempted; saying so lets
        # ResourceConfig(preemptible=False) actors (curriculum, coordinators) run here.
        extra += ["--attr", "preemptible=false"]
    try:
        if as_json:
            launcher.start(workers, *extra)
        else:
            with console.status(f"starting a controller and {workers} workers..."):
                launcher.start(workers, *extra)
    except FrayError as exc:
        launcher.stop()
        raise CliError(str(exc), f"read the logs in {directory}") from None
    elapsed = time.monotonic() - started
    state = {
        "address": launcher.address,
        "directory": directory,
        "controller_pid": launcher.controller.pid if launcher.controller else None,
        "worker_pids": {name: proc.pid for name, proc in launcher.workers.items()},
        "ready_seconds": round(elapsed, 3),
    }
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state, indent=2))
    if as_json:
        echo_json(state)
        return
    console.print(
        f"[green]Fray cluster up[/green] in {elapsed:.2f}s: controller [bold]{launcher.address}[/bold], {workers} workers"
    )
    console.print(f"  use it:   export FRAY_CLIENT_SPEC=fray://{launcher.address}")
    console.print(f"  token:    {'$FRAY_TOKEN' if os.environ.get('FRAY_TOKEN') else TOKEN_FILE}")
    console.print(f"  logs:     {directory}/*.log")
    console.print("  stop it:  fray cluster down")


@cluster.command("down")
def cluster_down() -> None:
    """Stop the cluster started by `fray cluster up`."""
    state = read_state()
    if state is None:
        raise CliError(f"no cluster is up (nothing in {STATE_FILE})", "start one with `fray cluster up`")
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
    STATE_FILE.unlink()
    click.echo(f"Fray cluster at {state['address']} stopped")
