"""``fray cluster up`` / ``down`` / ``restart``: a controller and workers on this machine, in the background.

``up`` records every process it starts in ``~/.config/fray/cluster.json`` with its
identity (PID, start time, command line; :mod:`fray.process._procident`). ``down`` signals a
process only while it still has that identity, so a PID reused by another program
is never touched. ``up`` over the state directory of a cluster that is not running (after
``down``, or a crash: the stale record's leftover processes are stopped) refuses unless told
``--resume`` (the same database: jobs and history kept; the old cluster's local workers are
listed as stopped, not lost) or ``--fresh`` (the database discarded); ``restart`` brings back a
dead controller (and dead workers) on the same database and port.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from fray.cli._common import STATE_FILE, TOKEN_FILE, console, count_of, echo_json, read_state
from fray.cli._errors import CliError
from fray.cli.daemons import check_port_free
from fray.cli.vms import vm
from fray.cluster.protocol.controller_client import ops_client
from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import Provider
from fray.cluster.server.launcher import LocalCluster
from fray.core._private_files import write_private
from fray.core._timefmt import format_time
from fray.errors import ConfigError, FrayError
from fray.process._procident import ProcessIdentity, identify
from fray.resources import format_size

__all__ = ["DASHBOARD_INSTALL", "DEFAULT_DIR", "cluster", "dashboard_unavailable", "up_again"]

#: Where ``fray cluster up`` keeps the controller's database and every process's log.
DEFAULT_DIR = Path.home() / ".local" / "state" / "fray" / "cluster"

#: What gives a controller its web dashboard.
DASHBOARD_INSTALL = 'pip install "fray[dashboard]"'

# Seconds a process gets to exit after SIGTERM before `down` sends SIGKILL.
_STOP_GRACE = 10.0
# The copy of the cluster file `up --config` started with: what `down` opens the provider from.
_APPLIED_CONFIG = "cluster.yaml"
# The controller's --worker-timeout for a cluster without --config (a cluster file says its own).
_DEFAULT_WORKER_TIMEOUT = 10.0
# What `fray cluster up` gives every worker unless told otherwise (see cluster_up).
_DEFAULT_WORKER_ARGS = ["--attr", "preemptible=false"]


@click.group()
def cluster() -> None:
    """Start, stop and restart a Fray cluster on this machine (and look at its VMs: `fray cluster vm`)."""


cluster.add_command(vm)


def _token() -> str:
    token = os.environ.get("FRAY_TOKEN") or (TOKEN_FILE.read_text().strip() if TOKEN_FILE.exists() else "")
    if not token:
        token = secrets.token_hex(16)
        write_private(TOKEN_FILE, token)
    return token


def _recorded(state: dict[str, Any]) -> dict[str, ProcessIdentity]:
    """The processes a state file names (none for a file written before identities were recorded)."""
    return {name: ProcessIdentity.from_json(data) for name, data in state.get("processes", {}).items()}


def _write_state(
    launcher: LocalCluster, worker_args: list[str], ready_seconds: float, dashboard: str, config: str | None
) -> dict[str, Any]:
    procs = {"controller": launcher.controller, **launcher.workers}
    identities = {}
    for name, proc in procs.items():
        found = identify(proc.pid) if proc is not None else None
        if found is not None:
            identities[name] = found.to_json()
    state = {
        "version": 2,
        "address": launcher.address,
        "port": launcher.port,
        "directory": str(launcher.directory),
        "controller_args": launcher.controller_args,
        "worker_args": worker_args,
        "workers": sorted(launcher.workers),
        "processes": identities,
        "dashboard": dashboard,
        "ready_seconds": round(ready_seconds, 3),
        "worker_timeout": launcher.worker_timeout,
    }
    if config is not None:
        state["config"] = str(Path(config).resolve())
    write_private(STATE_FILE, json.dumps(state, indent=2))
    return state


def _stop(processes: dict[str, ProcessIdentity]) -> list[str]:
    """SIGTERM the processes that still are who they were, SIGKILL those left after the grace; return notes.

    The workers go first, while the controller still runs: each drains and tells it that it leaves,
    so the database lists them as stopped (not lost) for the next ``up --resume``.
    """
    notes: list[str] = []
    workers = {name: identity for name, identity in processes.items() if name != "controller"}
    controller = {name: identity for name, identity in processes.items() if name == "controller"}
    for group in (workers, controller):
        ours = {}
        for name, identity in group.items():
            if identity.alive():
                ours[name] = identity
                with contextlib.suppress(ProcessLookupError):
                    os.kill(identity.pid, signal.SIGTERM)
            elif identify(identity.pid) is not None:
                notes.append(
                    f"pid {identity.pid} is no longer the cluster's {name} (another program has it): left alone"
                )
        deadline = time.monotonic() + _STOP_GRACE
        for identity in ours.values():
            while not identity.ended() and time.monotonic() < deadline:
                time.sleep(0.02)  # polling another process's exit: there is nothing to block on
            if identity.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(identity.pid, signal.SIGKILL)
    return notes


def _retention_args(days: float | None, jobs: int | None) -> list[str]:
    args = []
    if days is not None:
        args += ["--retention-days", f"{days:g}"]
    if jobs is not None:
        args += ["--retention-jobs", str(jobs)]
    return args


def dashboard_unavailable() -> str:
    """Why this Python cannot serve the web dashboard (the dashboard extra's import error), or "" if it can."""
    try:
        import fray.cluster.server.dashboard  # noqa: F401  # the controller imports exactly this to serve it
    except ImportError as exc:
        return str(exc)
    return ""


def up_again(state: dict[str, Any]) -> str:
    """The commands that stop the recorded cluster and start it again alike, on the same database and port.

    ``restart`` only revives dead processes, so a change to a running controller (a dashboard
    it did not serve) needs ``down`` then ``up``; ``up``'s options are rebuilt from the record
    so that, for example, a longer retention is not silently reset to the default.
    """
    args = ["fray", "cluster", "up"]
    workers = len(state.get("workers", []))
    if workers != 2 and not state.get("config"):  # a --config cluster's --config is among its controller args
        args += ["--workers", str(workers)]
    if int(state.get("port", 7100)) != 7100:
        args += ["--port", str(state["port"])]
    if state.get("directory") and Path(state["directory"]) != DEFAULT_DIR:
        args += ["--dir", str(state["directory"])]
    controller_args = [arg for arg in state.get("controller_args", []) if arg != "--no-dashboard"]
    if controller_args[-2:] == ["--dashboard-port", "0"]:
        controller_args = controller_args[:-2]
    args += controller_args
    worker_args = list(state.get("worker_args", _DEFAULT_WORKER_ARGS))
    auto = _machine_share(workers, [])  # `up` adds this machine's share again by itself
    for tail in (auto, auto[2:], auto[:2]):
        if tail and worker_args[-len(tail) :] == tail:
            worker_args = worker_args[: -len(tail)]
            break
    if worker_args != _DEFAULT_WORKER_ARGS:
        args += ["--worker-option", " ".join(worker_args)]
    return "fray cluster down && " + shlex.join([*args, "--resume"])


@cluster.command("up")
@click.option("--workers", type=click.IntRange(min=0), default=None, help="How many workers [default: 2].")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A cluster file: workers come from its VM provider through the autoscaler (see examples/cluster.yaml).",
)
@click.option(
    "--dry-run", is_flag=True, help="With --config: print the provider calls start-up would make; start nothing."
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=7100, show_default=True, help="Controller port (0: any)."
)
@click.option("--dir", "directory", default=None, help=f"State and logs [default: {DEFAULT_DIR}].")
@click.option("--worker-option", "worker_options", multiple=True, help="Extra option for every worker, e.g. '--cpu 4'.")
@click.option("--retention-days", type=float, default=None, help="Keep finished jobs this many days [default: 7].")
@click.option("--retention-jobs", type=int, default=None, help="Keep at most N finished jobs [default: 10000].")
@click.option(
    "--dashboard-port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Dashboard port (0: any)."
)
@click.option("--no-dashboard", is_flag=True, help="Serve no web dashboard.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--resume", is_flag=True, help="Over an earlier cluster's state directory: keep its database (jobs, history)."
)
@click.option(
    "--fresh", is_flag=True, help="Over an earlier cluster's state directory: discard its database and start over."
)
def cluster_up(
    workers: int | None,
    config_path: str | None,
    dry_run: bool,
    port: int,
    directory: str | None,
    worker_options: tuple[str, ...],
    retention_days: float | None,
    retention_jobs: int | None,
    dashboard_port: int,
    no_dashboard: bool,
    as_json: bool,
    resume: bool,
    fresh: bool,
) -> None:
    """Start a controller and N workers (or, with --config, a VM provider's) in the background; print how to use them.

    Over the state directory of an earlier cluster that is not running, say --resume (keep its jobs and history)
    or --fresh (discard them).
    """
    config = _load_config(config_path, workers, dry_run)
    if config is not None and dry_run:
        _print_plan(config, port)
        return
    if resume and fresh:
        raise CliError(
            "--resume and --fresh contradict each other",
            "--resume keeps the earlier cluster's jobs and history, --fresh discards them: give one",
        )
    workers = 0 if config is not None else 2 if workers is None else workers
    state = read_state()
    processes: dict[str, ProcessIdentity] = {}
    if state is not None:
        processes = _recorded(state)
        controller = processes.get("controller")
        if controller is not None and controller.alive():
            raise CliError(
                f"a cluster is already up at {state.get('address')} (recorded in {STATE_FILE})",
                "use it (FRAY_CLIENT_SPEC=fray://" + str(state.get("address")) + "), or `fray cluster down` first",
            )
        directory = directory or state.get("directory")
    directory = directory or str(DEFAULT_DIR)
    earlier = _earlier_cluster(Path(directory))
    if earlier and not (resume or fresh):
        raise CliError(
            f"{directory} holds the state of an earlier cluster that is not running ({earlier})",
            "add --resume to keep its jobs and history, or --fresh to discard them and start over",
        )
    if state is not None:
        console.print(
            f"[yellow]the cluster recorded in {STATE_FILE} is not running[/yellow] (its controller is gone); "
            "stopping what is left of it"
        )
        for note in _stop(processes):
            console.print(f"  {note}")
        STATE_FILE.unlink(missing_ok=True)
    if earlier and fresh:
        _discard_state(Path(directory))
        console.print(f"discarded the earlier cluster's state in {directory}: starting over")
    elif earlier:
        retired = _retire_workers(Path(directory)) if config is None and not (state or {}).get("config") else 0
        console.print(
            f"resuming the earlier cluster's state in {directory}: jobs and history kept"
            + (f"; its {count_of(retired, 'worker')} listed as stopped" if retired else "")
        )
    check_port_free("127.0.0.1", port)
    if not no_dashboard:
        check_port_free("127.0.0.1", dashboard_port, "--dashboard-port")
    token = _token()
    if config is not None and config_path is not None:
        write_private(Path(directory) / _APPLIED_CONFIG, Path(config_path).read_text())
    started = time.monotonic()
    launcher = LocalCluster(
        directory,
        exit_with_owner=False,
        token=token,
        port=port,
        worker_timeout=config.worker_timeout if config is not None else _DEFAULT_WORKER_TIMEOUT,
        controller_args=_retention_args(retention_days, retention_jobs)
        + (["--no-dashboard"] if no_dashboard else ["--dashboard-port", str(dashboard_port)])
        + (["--config", str(Path(config_path).resolve())] if config is not None and config_path else []),
    )
    extra = [part for option in worker_options for part in option.split()]
    if not any(part.startswith("preemptible=") for part in extra):
        # Workers on this one machine are never preempted; saying so lets
        # ResourceConfig(preemptible=False) actors (curriculum, coordinators) run here.
        extra += _DEFAULT_WORKER_ARGS
    share = _machine_share(workers, extra) if config is None else []
    extra += share
    try:
        what = (
            "a controller and its autoscaler"
            if config is not None
            else f"a controller and {count_of(workers, 'worker')}"
        )
        status = console.status(f"starting {what}...")
        with status if not as_json else contextlib.nullcontext():
            launcher.start(workers, *extra)
    except FrayError as exc:
        launcher.stop()
        raise CliError(str(exc), f"read the logs in {directory}") from None
    elapsed = time.monotonic() - started
    state = _write_state(launcher, extra, elapsed, _dashboard_address(launcher), config_path if config else None)
    if as_json:
        echo_json(state)
        return
    if config is not None:
        console.print(
            f"[green]Fray cluster up[/green] in {elapsed:.2f}s: controller [bold]{launcher.address}[/bold], "
            f"workers from the {config.provider.kind} provider ({state['config']})"
        )
        for line in _group_lines(config):
            console.print(escape(line))
        console.print("  watch VMs: fray cluster vm list   (scale groups and unmet demand: fray status)")
    else:
        console.print(
            f"[green]Fray cluster up[/green] in {elapsed:.2f}s: controller [bold]{launcher.address}[/bold], "
            f"{count_of(workers, 'worker')}"
        )
        if share:
            console.print(
                escape(
                    f"  each worker: {_share_text(share)} (this machine divided among them; "
                    "--worker-option '--cpu N --ram SIZE' sets it)"
                )
            )
    console.print(f"  use it:   export FRAY_CLIENT_SPEC=fray://{launcher.address}")
    console.print(f"  token:    {'$FRAY_TOKEN' if os.environ.get('FRAY_TOKEN') else TOKEN_FILE}")
    console.print(f"  state:    {directory}/controller.db   logs: {directory}/*.log")
    if state["dashboard"]:
        console.print(f"  dashboard: http://{state['dashboard']}/   (log in: `fray dashboard`)")
    elif not no_dashboard:
        console.print(escape(f"  dashboard: none ({_why_no_dashboard(state)})"))
    console.print("  stop it:  fray cluster down")


# The files of a controller's database in a cluster directory (SQLite's journal files with it).
_DATABASE_FILES = ("controller.db", "controller.db-wal", "controller.db-shm", "controller.db-journal")


def _earlier_cluster(directory: Path) -> str:
    """What an earlier cluster left in ``directory`` (its jobs and workers, and when), or "" if nothing."""
    database = directory / "controller.db"
    if not database.exists():
        return ""
    when = format_time(database.stat().st_mtime)
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
            jobs = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
            workers = conn.execute("SELECT COUNT(*) FROM workers").fetchone()[0]
    except sqlite3.Error:
        return f"its database, last written {when}"
    return f"{count_of(int(jobs), 'job')}, {count_of(int(workers), 'worker')}, last written {when}"


def _discard_state(directory: Path) -> None:
    """Delete the earlier cluster's database and its workers' task directories and journals (cached envs stay)."""
    for name in _DATABASE_FILES:
        (directory / name).unlink(missing_ok=True)
    for workdir in directory.glob("worker-*"):
        if not workdir.is_dir():
            continue
        for entry in workdir.iterdir():
            if entry.name == "envs":  # job environments by requirements: valid for any cluster
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _retire_workers(directory: Path) -> int:
    """List the earlier local cluster's workers still recorded alive as stopped (all its processes are gone)."""
    from fray.cluster.server.store import ClusterStore

    store = ClusterStore(directory / "controller.db")
    try:
        alive = [w.info.worker_id for w in store.list_workers(alive_only=True)]
        for worker_id in alive:
            store.stop_worker(worker_id, time.time(), "its cluster was stopped (fray cluster up --resume)")
        return len(alive)
    finally:
        store.close()


def _machine_share(workers: int, extra: list[str]) -> list[str]:
    """``--cpu`` and ``--ram`` that give each of ``workers`` workers its share of this machine.

    A worker offers the whole machine unless told otherwise, so N workers on one machine
    would offer N times its cores and memory: jobs would be placed on cores that are not
    there. Options the user gave (``--worker-option '--cpu 4'``) are kept as they are.
    """
    if workers < 2:
        return []
    share = []
    if "--cpu" not in extra:
        share += ["--cpu", f"{(os.cpu_count() or 1) / workers:g}"]
    if "--ram" not in extra:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):  # the worker's own default then (the whole machine)
            return share
        share += ["--ram", str(total // workers)]
    return share


def _share_text(share: list[str]) -> str:
    values = dict(zip(share[::2], share[1::2], strict=True))
    parts = [f"{values['--cpu']} cores"] if "--cpu" in values else []
    if "--ram" in values:
        parts.append(f"{format_size(int(values['--ram']))} RAM")
    return ", ".join(parts)


def _load_config(path: str | None, workers: int | None, dry_run: bool) -> ClusterConfig | None:
    """The checked cluster file of ``--config`` (None without one); its mistakes are the user's."""
    if path is None:
        if dry_run:
            raise CliError("--dry-run needs --config", "e.g. fray cluster up --config cluster.yaml --dry-run")
        return None
    if workers is not None:
        raise CliError(
            "--workers cannot be combined with --config: a --config cluster's workers are its VMs",
            "drop --workers (the cluster file's scale_groups say how many VMs), or drop --config",
        )
    try:
        return ClusterConfig.load(path)
    except ConfigError as exc:
        raise CliError(
            str(exc), "examples/cluster.yaml is a complete cluster file; docs/autoscaling.md says every key"
        ) from None


def _planned_calls(config: ClusterConfig, controller: str) -> list[str]:
    """The provider module's own account of the calls start-up makes."""
    from fray.cluster.server.autoscale.providers import vm_controller_address

    controller = vm_controller_address(config, controller)
    if config.provider.kind == "gcp":
        from fray.cluster.server.autoscale import gcp

        return gcp.planned_calls(config, controller=controller)
    from fray.cluster.server.autoscale import simulated

    return simulated.planned_calls(config, controller=controller)


def _print_plan(config: ClusterConfig, port: int) -> None:
    controller = f"127.0.0.1:{port if port else '<port>'}"
    try:
        calls = _planned_calls(config, controller)
    except ConfigError as exc:
        raise CliError(str(exc), "fix the provider: section of the cluster file") from None
    except ImportError as exc:
        raise CliError(
            f"the {config.provider.kind} provider cannot be loaded: {exc}", "pip install 'fray[gcp]'"
        ) from None
    click.echo(f"dry run: nothing is started. A controller on {controller} with these scale groups:")
    given = config.provider.options.get("controller_address")
    if given is not None and str(given) != controller:
        # fray cluster up listens on loopback only: VMs dialling the file's address would find nobody there.
        click.echo(
            f"warning: the VMs would dial provider.controller_address {given}, but `fray cluster up` starts the "
            f"controller on {controller}, which they cannot reach; run `fray controller --config FILE --host "
            f"{str(given).rpartition(':')[0]} --port {str(given).rpartition(':')[2]}` on that address instead",
            err=True,
        )
    for line in _group_lines(config):
        click.echo(line)
    if calls:
        click.echo(f"at start-up it would make {len(calls)} provider call(s) (each group's min):")
        for line in calls:
            click.echo(f"  {line}")
    else:
        click.echo("at start-up it would make no provider call: every group has min 0 (VMs come with demand)")


def _group_lines(config: ClusterConfig) -> list[str]:
    """One line per scale group, in the order demand tries them."""
    lines = []
    for group in config.by_priority():
        res = group.resources
        shape = f"cpu {res.cpu:g}, ram {format_size(res.ram_bytes)}" + "".join(f", {d}" for d in res.devices)
        unit = f"slices of {group.hosts} VMs" if group.is_slice else "VMs"
        spot = ", preemptible" if group.preemptible else ""
        lines.append(
            f"  group {group.name}: {group.min}..{group.max} {unit} ({shape}{spot}), priority {group.priority}"
        )
    return lines


def _why_no_dashboard(state: dict[str, Any]) -> str:
    # The controller runs this same Python, so the extra missing here is missing there.
    if dashboard_unavailable():
        return f"the dashboard extra is not installed: {DASHBOARD_INSTALL}, then `{up_again(state)}`"
    return f"the controller started none; its log says why: {state['directory']}/controller.log"


def _dashboard_address(launcher: LocalCluster) -> str:
    """Where the new controller serves its dashboard ("" if it serves none)."""
    ops = ops_client(launcher.address, launcher.token, ca=launcher.ca_file)
    try:
        health: dict[str, Any] = ops.health()
    finally:
        ops.close()
    return str(health.get("dashboard", ""))


@cluster.command("down")
def cluster_down() -> None:
    """Stop the cluster started by `fray cluster up` (only processes that are still the ones it started).

    A ``--config`` cluster's VMs are deleted too: through the controller while it runs, then
    at the provider itself, whose listing is the truth (so a dead controller leaves no VM
    behind). With no cluster up it says so and succeeds, so it is safe to run twice or in a
    cleanup step.
    """
    state = read_state()
    if state is None:
        # Nothing to stop is what `down` wants: succeed, so scripts and cleanup steps can always run it.
        click.echo(f"no Fray cluster is up (nothing recorded in {STATE_FILE}): nothing to stop")
        return
    processes = _recorded(state)
    if not processes:
        console.print(
            f"[yellow]{STATE_FILE} was written by an older Fray and names no process identities; "
            "nothing was signalled[/yellow] (stop its processes by hand if they still run)"
        )
    if state.get("config"):
        controller = processes.get("controller")
        if controller is not None and controller.alive():
            # First the autoscaler: it stops creating, so nothing new appears while the controller stops.
            _delete_vms_through_controller(state)
    for note in _stop(processes):
        console.print(note)
    if state.get("config"):
        _delete_vms_at_provider(state)
    STATE_FILE.unlink(missing_ok=True)
    click.echo(f"Fray cluster at {state.get('address')} stopped")


def _delete_vms_through_controller(state: dict[str, Any]) -> None:
    ops = ops_client(str(state["address"]), _token(), timeout=60.0)
    try:
        deleted = int(ops.delete_all_vms())
    except (FrayError, OSError) as exc:
        console.print(escape(f"the controller did not delete the VMs ({exc}); deleting them at the provider"))
        return
    finally:
        ops.close()
    click.echo(f"the autoscaler deleted {deleted} VM(s)")


def _delete_vms_at_provider(state: dict[str, Any]) -> None:
    """Delete every VM the provider lists for this cluster (the listing is the truth, whatever the controller did)."""
    directory = Path(state["directory"])
    try:
        config = ClusterConfig.load(directory / _APPLIED_CONFIG)
        provider = _open_provider(config, state)
    except FrayError as exc:
        raise CliError(
            f"cannot open the cluster's VM provider to delete its VMs: {exc}",
            f"fix that, then run `fray cluster down` again (the cluster stays recorded in {STATE_FILE})",
        ) from None
    try:
        slices = sorted({vm.slice_id for vm in provider.list_vms()})
        for slice_id in slices:
            provider.delete_slice(slice_id)
    except FrayError as exc:
        raise CliError(
            f"deleting the cluster's VMs failed: {exc}",
            f"run `fray cluster down` again (the cluster stays recorded in {STATE_FILE})",
        ) from None
    finally:
        provider.close()
    if slices:
        click.echo(f"deleted {len(slices)} slice(s) left at the {config.provider.kind} provider")


def _open_provider(config: ClusterConfig, state: dict[str, Any]) -> Provider:
    """The cluster's provider, opened from this command: it lists and deletes, and starts no worker."""
    state_dir = Path(state["directory"]) / "vms"
    if config.provider.kind == "simulated":
        from fray.cluster.server.autoscale.simulated import SimulatedProvider

        return SimulatedProvider(state_dir, cluster=config.name)
    from fray.cluster.server.autoscale.providers import make_provider

    credential = (Path(state["directory"]) / "worker.credential").read_text().strip()
    # Listing and deleting never start a VM, so no VM needs a working join token from here.
    return make_provider(
        config,
        state_dir=state_dir,
        controller=str(state["address"]),
        credential=credential,
        join_token="unused: this provider only lists and deletes",
    )


@cluster.command("restart")
def cluster_restart() -> None:
    """Restart a dead controller (and dead workers) of the recorded cluster, on the same database and port."""
    state = read_state()
    if state is None or "processes" not in state:
        raise CliError(f"no cluster is recorded in {STATE_FILE}", "start one with `fray cluster up`")
    processes = _recorded(state)
    dead = sorted(name for name, identity in processes.items() if not identity.alive())
    dead += [name for name in state.get("workers", []) if name not in processes]
    if not dead:
        click.echo(f"nothing to restart: the cluster at {state['address']} is running")
        return
    launcher = LocalCluster(
        state["directory"],
        token=_token(),
        port=int(state["port"]),
        worker_timeout=float(state.get("worker_timeout", _DEFAULT_WORKER_TIMEOUT)),
        controller_args=state.get("controller_args", []),
        exit_with_owner=False,
    )
    launcher.address = state["address"]
    started = time.monotonic()
    try:
        if "controller" in dead:
            check_port_free("127.0.0.1", int(state["port"]))
            launcher.start_controller()
        for name in dead:
            if name != "controller":
                launcher.add_worker(name, *state.get("worker_args", []))
        launcher.wait_for_workers(len(state.get("workers", [])))
    except FrayError as exc:
        raise CliError(str(exc), f"read the logs in {state['directory']}") from None
    # Keep the identities of the processes that survived; record the new ones.
    survivors = {name: identity.to_json() for name, identity in processes.items() if name not in dead}
    for name, proc in {"controller": launcher.controller, **launcher.workers}.items():
        found = identify(proc.pid) if proc is not None else None
        if found is not None:
            survivors[name] = found.to_json()
    state["processes"] = survivors
    write_private(STATE_FILE, json.dumps(state, indent=2))
    console.print(
        f"[green]restarted[/green] {', '.join(dead)} in {time.monotonic() - started:.2f}s: "
        f"controller {state['address']} (same database, same port)"
    )
    if state.get("config") and "controller" in dead:
        click.echo("the controller adopts the VMs its provider lists (`fray cluster vm list` shows them)")
