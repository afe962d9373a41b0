"""The ``fray`` command line."""

from __future__ import annotations

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
@click.option("--db", "db_path", default=str(Path.home() / ".local" / "state" / "fray" / "controller.db"), show_default=True)
@click.option("--worker-timeout", default=10.0, show_default=True, help="Seconds of silence before a worker is lost.")
@click.option("--address-file", type=click.Path(dir_okay=False), help="Write HOST:PORT here once serving.")
def controller(host: str, port: int, db_path: str, worker_timeout: float, address_file: str | None) -> None:
    """Run the cluster controller (state in SQLite; needs FRAY_TOKEN)."""
    from fray.cluster.client import load_token
    from fray.cluster.controller import Controller

    token = load_token()
    if token is None:
        raise click.UsageError("set FRAY_TOKEN (or write ~/.config/fray/token): the controller never runs unauthenticated")
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    ctl = Controller(db_path, host=host, port=port, token=token, worker_timeout=worker_timeout).start()
    if address_file:
        tmp = Path(address_file + ".tmp")
        tmp.write_text(ctl.address)
        tmp.replace(address_file)
    click.echo(f"fray controller serving on {ctl.address} (state: {db_path})", err=True)
    _wait_for_signal(ctl.stop)


def _parse_device(text: str) -> Any:
    from fray.cluster.scheduler import Device

    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("gpu", "tpu") or not parts[2].isdigit():
        raise click.BadParameter(f"{text!r}: use KIND:TYPE:COUNT, e.g. gpu:H100:8 or tpu:v5litepod-16:4")
    return Device(parts[0], parts[1], int(parts[2]))


@main.command()
@click.option("--controller", "address", required=True, help="The controller's HOST:PORT.")
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
    """Run a worker that takes tasks from the controller at --controller."""
    from fray.cluster.client import load_token
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


if __name__ == "__main__":
    main()
