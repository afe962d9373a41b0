"""The ``fray`` command line.

Every user mistake is reported as one ``error:`` line and one ``hint:`` line with
exit code 2, never a traceback (unless ``fray --debug`` or ``FRAY_DEBUG=1``); see
:mod:`fray.cli._errors`. The commands live in :mod:`fray.cli.cluster`,
:mod:`fray.cli.daemons`, :mod:`fray.cli.jobs` and :mod:`fray.cli.status`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

import fray
from fray.cli._common import stdout_console
from fray.cli._errors import CliError, debug_enabled, report, set_debug
from fray.cli.cluster import cluster
from fray.cli.daemons import controller, token, worker
from fray.cli.jobs import job
from fray.cli.stacks import actor
from fray.cli.status import dashboard, endpoint, status
from fray.cli.timeline import timeline
from fray.client import _BACKENDS, VALID_SPECS, detect_spec, parse_client_spec

__all__ = ["main"]


class _FrayGroup(click.Group):
    """The root command: runs the CLI and turns every exception into an error line and an exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        set_debug(False)
        try:
            result = super().main(args, prog_name or "fray", complete_var, standalone_mode=False, **extra)
        except BaseException as exc:
            if isinstance(exc, SystemExit):
                raise
            if debug_enabled() and not isinstance(exc, CliError | click.ClickException | click.exceptions.Abort):
                raise
            sys.exit(report(exc))
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=_FrayGroup)
@click.version_option(fray.__version__, prog_name="fray")
@click.option("--debug", is_flag=True, help="Show tracebacks (also: FRAY_DEBUG=1).")
def main(debug: bool) -> None:
    """Fray: jobs, actors and actor groups on the local backend, a Fray cluster, Ray, Monarch or Iris."""
    set_debug(debug)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Show which backend current_client() would use here, and which engines are installed."""
    spec = os.environ.get("FRAY_CLIENT_SPEC", "").strip() or detect_spec() or "local"
    try:
        parse_client_spec(spec)
        problem = ""
    except fray.ConfigError as exc:
        problem = str(exc)
    modules = {"ray": "ray", "monarch": "monarch", "iris": "iris.client"}
    engines = {name: _importable(module) for name, module in modules.items()}
    status = {name: "installed" if present else _not_installed(name) for name, present in engines.items()}
    if engines["monarch"]:
        status["monarch"] = _monarch_status()
    if as_json:
        fields = {"version": fray.__version__, "spec": spec, "problem": problem}
        click.echo(json.dumps({**fields, "engines": engines, "engine_status": status}))
        return
    table = Table(title=f"fray {fray.__version__}", show_header=False)
    # Install hints such as fray[monarch] look like rich markup: every value is escaped, or rich eats them.
    table.add_row("FRAY_CLIENT_SPEC", escape(spec) + (f"  [red]{escape(problem)}[/red]" if problem else ""))
    table.add_row("valid specs", escape(", ".join(VALID_SPECS)))
    for name, text in status.items():
        colour = "green" if text.startswith(("installed", "usable")) else "red" if engines[name] else ""
        table.add_row(f"engine {name}", f"[{colour}]{escape(text)}[/{colour}]" if colour else escape(text))
    stdout_console().print(table)


def _not_installed(engine: str) -> str:
    """``not installed: pip install "fray[ENGINE]"``, with the hint the client gives when that backend is missing."""
    return f"not installed: {_BACKENDS[engine][2]}"


def _monarch_status() -> str:
    """Whether the Monarch backend can run here: torchmonarch installed, and its native runtime loads."""
    try:
        version = importlib.metadata.version("torchmonarch")
    except importlib.metadata.PackageNotFoundError:
        return _not_installed("monarch")
    try:
        importlib.import_module("fray.monarch")
    except Exception as exc:  # a broken install fails in many ways; all mean "not usable"
        return f"installed (torchmonarch {version}) but not usable: {type(exc).__name__}: {exc}"
    return f"usable (torchmonarch {version})"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing
        return False


for _command in (cluster, controller, worker, token, job, actor, status, dashboard, endpoint, timeline):
    main.add_command(_command)
