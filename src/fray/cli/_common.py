"""What the ``fray`` commands share: where the cluster is, a session with its controller, jobs by id or name."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fray.cli._errors import CliError, set_target
from fray.client import parse_client_spec
from fray.cluster.protocol.controller_client import ControllerHandle, OpsProxy, connect_controller, ops_client
from fray.cluster.protocol.credentials import load_credential
from fray.core._timefmt import format_time as _format_time
from fray.errors import ConfigError

__all__ = [
    "CLI_RETRY_SECONDS",
    "STATE_FILE",
    "TOKEN_FILE",
    "Session",
    "console",
    "controller_option",
    "count_of",
    "echo_json",
    "format_duration",
    "format_time",
    "read_state",
    "resolve_target",
    "stdout_console",
]

#: Where ``fray cluster up`` records what it started.
STATE_FILE = Path.home() / ".config" / "fray" / "cluster.json"
#: The cluster token ``fray cluster up`` creates when there is none.
TOKEN_FILE = Path.home() / ".config" / "fray" / "token"
#: How long a CLI command retries a controller it cannot reach (jobs and scripts wait 60 s).
CLI_RETRY_SECONDS = 1.0
# How long the CLI waits to open a connection before it says the controller is unreachable.
_CONNECT_SECONDS = 2.0

# Messages are never wrapped mid-sentence (they are read by people and by grep).
console = Console(stderr=True, soft_wrap=True)

controller_option = click.option(
    "--controller", "address", default=None, help="HOST:PORT (default: FRAY_CLIENT_SPEC, then `fray cluster up`'s)."
)


def stdout_console() -> Console:
    """A rich console on stdout, for tables (no syntax highlighting of ids and numbers).

    Piped into a file or another program, tables are laid out 240 columns wide, so
    ids and commands are not wrapped mid-word for ``grep``.
    """
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=240)
    return console


def plain_row(table: Table, *cells: object) -> None:
    """Add a row of plain text: ids, commands, reason codes such as ``[at_max]`` are shown as they are.

    Rich reads ``[...]`` as markup and would eat them; every cell here is escaped.
    """
    table.add_row(*(escape(cell) if isinstance(cell, str) else cell for cell in cells))  # type: ignore[arg-type]


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, default=str))


def format_time(at: float | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS UTC`` ("" for None): the one format of every time the CLI shows."""
    return _format_time(at)


def format_duration(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``3m05s``, ``2h04m``, ``3d02h`` ("" for None)."""
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def read_state() -> dict[str, Any] | None:
    """What ``fray cluster up`` recorded, or None when it recorded nothing (or the file is unreadable)."""
    try:
        data = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def resolve_target(address: str | None) -> tuple[str, str]:
    """The controller's ``host:port`` and how it was found: ``--controller``, FRAY_CLIENT_SPEC, or the state file."""
    if address:
        _check_address(address, "--controller")
        return address, "--controller"
    spec = os.environ.get("FRAY_CLIENT_SPEC", "").strip()
    if spec:
        # The library refuses a malformed spec (a typo such as fary://); silently using the recorded
        # cluster instead would show the wrong cluster's jobs with exit 0.
        try:
            parsed = parse_client_spec(spec)
            if parsed.scheme == "fray" and not parsed.address:
                raise parsed.invalid("fray:// needs the controller's HOST:PORT")
        except ConfigError as exc:
            raise CliError(
                f"FRAY_CLIENT_SPEC: {exc}",
                "set FRAY_CLIENT_SPEC=fray://HOST:PORT (e.g. fray://127.0.0.1:7100), or unset it to use the "
                "cluster `fray cluster up` recorded",
            ) from None
        if parsed.scheme == "fray" and parsed.address:
            return parsed.address, "from FRAY_CLIENT_SPEC"
    state = read_state()
    if state is not None and state.get("address"):
        return str(state["address"]), f"from {STATE_FILE}"
    other = f" (FRAY_CLIENT_SPEC={spec} is not a Fray cluster)" if spec else ""
    raise CliError(
        f"no Fray cluster to talk to{other}",
        "run `fray cluster up`, or pass --controller HOST:PORT, or set FRAY_CLIENT_SPEC=fray://HOST:PORT",
    )


def _check_address(address: str, where: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"{where} {address!r} is not HOST:PORT", "e.g. --controller 127.0.0.1:7100")


@dataclass
class Session:
    """One command's connection to the controller: its address, the controller API and the operator API."""

    address: str
    source: str
    controller: ControllerHandle
    ops: OpsProxy

    @classmethod
    def open(cls, address: str | None) -> Session:
        """Find the controller, check within 2 s that something listens there, and connect (fails fast)."""
        found, source = resolve_target(address)
        set_target(found, source)
        host, _, port = found.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=_CONNECT_SECONDS).close()
        except OSError as exc:
            detail = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            raise CliError(
                f"cannot reach a Fray controller at {found} ({source}): {detail}", _unreachable_hint(host, int(port))
            ) from None
        credential = load_credential()
        if credential is None:
            raise CliError(
                "no credential: neither FRAY_CREDENTIAL nor FRAY_TOKEN is set, and ~/.config/fray has neither a "
                "credential nor a token file",
                "set FRAY_TOKEN to the cluster's token (`fray cluster up` writes it to ~/.config/fray/token), or "
                "FRAY_CREDENTIAL to the user credential the cluster's administrator gave you",
            )
        controller = connect_controller(found, credential, retry_seconds=CLI_RETRY_SECONDS)
        return cls(found, source, controller, ops_client(found, credential))

    def resolve_job(self, ref: str) -> str:
        """The id of the job ``ref`` names (a job id, or the name of exactly one job)."""
        ids: list[str] = self.ops.find_jobs(ref)
        if not ids:
            raise CliError(
                f"no job {ref!r} on the cluster at {self.address}",
                "`fray job list` shows job ids and names (finished jobs are pruned after the retention period)",
            )
        if len(ids) > 1:
            shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
            raise CliError(f"{ref!r} names {len(ids)} jobs ({shown})", "name the job by its id")
        return ids[0]


def _unreachable_hint(host: str, port: int) -> str:
    """How to reach a controller: the address it listens on when one of this user's serves that port elsewhere."""
    from fray.cluster.rpc.tls import is_loopback_address, recorded_controllers

    if is_loopback_address(host):
        # A controller started with --host ADDRESS listens there only, not on loopback.
        elsewhere = recorded_controllers(port)
        if elsewhere:
            return f"the controller on this machine listens on {elsewhere[0]} (its --host): --controller {elsewhere[0]}"
    return (
        "start one with `fray cluster up`, or point FRAY_CLIENT_SPEC=fray://HOST:PORT (or --controller) "
        "at a running controller"
    )


def count_of(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 worker``, ``2 workers``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
