"""The ``fray`` command line."""

from __future__ import annotations

import importlib.util
import json
import os

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
