"""``fray cluster vm``: the VMs of a ``--config`` cluster, and the provider faults a user can rehearse.

Every command goes through the controller's operator API (the autoscaler owns the VMs;
the provider only carries out its calls), so that what ``vm list`` shows is what the
autoscaler believes, and an injected fault reaches the provider the controller uses.
On a cluster started without ``--config`` each command exits 2 saying so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click
from rich.table import Table

from fray.cli._common import Session, controller_option, echo_json, format_time, plain_row, stdout_console
from fray.cli._errors import CliError
from fray.errors import ConfigError, VmNotFound

__all__ = ["vm"]

T = TypeVar("T")

# The columns of `vm list`, in order (also the keys of `--json`).
_COLUMNS = ("id", "group", "slice", "state", "worker_id", "created_at", "ready_at", "reason")


@click.group()
def vm() -> None:
    """The VMs the autoscaler runs (a cluster started with `fray cluster up --config`), and fault injection."""


def _ops_call(address: str | None, call: Callable[[Any], T]) -> T:
    """Run ``call(ops)`` on the controller; a cluster without a provider is the user's mistake (exit 2)."""
    session = Session.open(address)
    try:
        return call(session.ops)
    except ConfigError as exc:
        text = str(exc.args[0]) if exc.args else str(exc)
        if "no VM provider" in text:
            raise CliError(
                f"the cluster at {session.address} has no VM provider (it was started without --config)",
                "start one with `fray cluster up --config cluster.yaml` (examples/cluster.yaml is one)",
            ) from None
        raise
    finally:
        session.ops.close()


@vm.command("list")
@controller_option
@click.option("--all", "include_deleted", is_flag=True, help="Include deleted VMs.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def vm_list(address: str | None, include_deleted: bool, as_json: bool) -> None:
    """List the VMs: id, group, slice, state, worker id, created and ready times, and why a VM FAILED."""
    rows: list[dict[str, Any]] = _ops_call(address, lambda ops: list(ops.vms(include_deleted)))
    if as_json:
        echo_json([{key: row.get(key) for key in _COLUMNS} for row in rows])
        return
    if not rows:
        click.echo("no VMs" + ("" if include_deleted else " (`--all` includes deleted ones)"))
        return
    table = Table("vm", "group", "slice", "state", "worker", "created", "ready", "reason")
    for row in rows:
        plain_row(table, *(_cell(row.get(key)) for key in _COLUMNS))
    stdout_console().print(table)


def _cell(value: object) -> str:
    if value is None:
        return ""
    text = str(value)
    # ISO 8601 times in the CLI's one format for people (fray.core._timefmt); --json has them whole.
    if len(text) > 19 and text[4:5] == "-" and text[10:11] == "T":
        with contextlib.suppress(ValueError):
            return format_time(datetime.fromisoformat(text).timestamp())
    return text


@vm.command("preempt")
@controller_option
@click.argument("vm_id")
def vm_preempt(address: str | None, vm_id: str) -> None:
    """Reclaim VM_ID now, as a cloud would: its worker dies without notice and the VM is FAILED (preempted)."""
    try:
        _ops_call(address, lambda ops: ops.vm_preempt(vm_id))
    except VmNotFound as exc:
        raise CliError(str(exc) or f"no VM {vm_id!r}", "`fray cluster vm list` shows the VMs") from None
    click.echo(f"VM {vm_id} preempted: its tasks are retried within their jobs' preemption budgets")


@vm.command("quota")
@controller_option
@click.argument("group")
@click.option("--exhausted", "state", flag_value="exhausted", help="The provider refuses creates in GROUP (quota).")
@click.option("--available", "state", flag_value="available", help="The provider accepts creates in GROUP again.")
def vm_quota(address: str | None, group: str, state: str | None) -> None:
    """Make the provider answer creates in GROUP with a quota error (--exhausted), or stop doing so (--available)."""
    if state is None:
        raise CliError("say which: --exhausted or --available", f"e.g. fray cluster vm quota {group} --exhausted")
    exhausted = state == "exhausted"

    def set_quota(ops: Any) -> str:
        ops.vm_quota(group, exhausted)
        groups = (ops.status().get("autoscaler") or {}).get("groups", [])
        return next((str(g["state"]) for g in groups if g["name"] == group), "")

    now = _ops_call(address, set_quota)
    if exhausted:
        click.echo(f"quota of group {group} exhausted: its demand goes to the next group by priority")
    elif "until" in now:
        # The autoscaler learns of a quota only from a refusal, and tries the group again when its block ends.
        click.echo(
            f"the provider accepts creates in group {group} again; the autoscaler keeps the group {now} "
            "(provider.quota_block_seconds after the last refusal), then creates VMs there again"
        )
    else:
        click.echo(f"quota of group {group} available again: the autoscaler creates VMs there when demand needs them")


@vm.command("fail-boot")
@controller_option
@click.argument("group")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="How many VMs.")
def vm_fail_boot(address: str | None, group: str, count: int) -> None:
    """Make the next COUNT VMs created in GROUP never finish booting (their workers never start)."""
    _ops_call(address, lambda ops: ops.vm_fail_boot(group, count))
    click.echo(f"the next {count} VM(s) created in group {group} will fail to boot")
