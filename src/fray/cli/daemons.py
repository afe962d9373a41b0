"""``fray controller`` and ``fray worker``: the cluster's daemons, run in the foreground; ``fray worker list`` and
``revoke``; ``fray token`` (join tokens and user credentials, made and revoked by the administrator)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

import fray
from fray.cli._common import Session, controller_option, echo_json, format_time, plain_row, stdout_console
from fray.cli._errors import CliError
from fray.cluster.server._retention import DEFAULT_MAX_JOBS
from fray.cluster.server.launcher import DEFAULT_DRAIN_SECONDS, OWNER_ENV
from fray.errors import ConfigError, PermissionDenied

__all__ = ["DEFAULT_DB", "busy_port_error", "check_port_free", "controller", "token", "worker"]

#: Where ``fray controller`` keeps its SQLite file unless told.
DEFAULT_DB = Path.home() / ".local" / "state" / "fray" / "controller.db"


def wait_for_signal(
    stop: Callable[[], None],
    done: threading.Event | None = None,
    *,
    again: Callable[[], None] | None = None,
    why: list[str] | None = None,
) -> None:
    """Block until SIGTERM or SIGINT (or the owner process named by ``FRAY_EXIT_WITH_PID`` is gone), then ``stop``.

    Setting ``done`` (from another thread: a daemon that gave up) also ends the wait. A second
    signal calls ``again`` (while ``stop`` runs); ``why`` gets the first signal's name appended.
    """
    ended = done if done is not None else threading.Event()
    signals: list[str] = why if why is not None else []

    def handler(signum: int, frame: object) -> None:
        if ended.is_set() and again is not None:
            again()
        elif not ended.is_set():
            signals.append(signal.Signals(signum).name)
        ended.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    owner = os.environ.pop(OWNER_ENV, "")  # not passed on to the tasks of a worker
    if owner.isdigit():
        threading.Thread(target=_watch_owner, args=(int(owner), ended), name="fray-owner-watch", daemon=True).start()
    ended.wait()
    stop()


def _watch_owner(pid: int, done: threading.Event) -> None:
    # A test run killed before its fixtures' finalizers ran leaves its cluster without an
    # owner: end with it, as a SIGTERM would, instead of serving nobody for ever.
    while not done.wait(1.0):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            done.set()
        except PermissionError:
            pass  # alive, owned by someone else (a recycled PID cannot be told apart here)


def busy_port_error(host: str, port: int, option: str = "--port") -> CliError:
    """The error for a port something else already listens on."""
    return CliError(
        f"port {port} on {host} is already in use",
        f"choose another with {option} N ({option} 0 picks a free one), or stop what listens there "
        f"(`ss -ltnp 'sport = :{port}'` shows it)",
    )


def check_port_free(host: str, port: int, option: str = "--port") -> None:
    """Raise the busy-port error now if ``host:port`` cannot be bound (0 is always free)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise busy_port_error(host, port, option) from None
            raise


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", default=7100, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free).")
@click.option("--db", "db_path", default=str(DEFAULT_DB), show_default=True, help="The SQLite file with all state.")
@click.option("--worker-timeout", default=10.0, show_default=True, help="Seconds of silence before a worker is lost.")
@click.option("--address-file", type=click.Path(dir_okay=False), help="Write HOST:PORT here once serving.")
@click.option("--retention-days", type=float, default=7.0, show_default=True, help="Keep finished jobs this many days.")
@click.option(
    "--retention-jobs", type=int, default=DEFAULT_MAX_JOBS, show_default=True, help="Keep at most N finished jobs."
)
@click.option(
    "--dashboard-port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Dashboard port (0: any)."
)
@click.option("--no-dashboard", is_flag=True, help="Serve no web dashboard.")
@click.option(
    "--tls-dir", default=None, help="Cluster CA and certificate (made if missing) when --host is not loopback."
)
@click.option(
    "--record-ca/--no-record-ca",
    default=True,
    show_default=True,
    help="With TLS, record where the CA is (~/.config/fray/cas/HOST-PORT.pem) for this user's fray commands here.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A cluster file (provider and scale groups): workers come from VMs the autoscaler creates.",
)
def controller(
    host: str,
    port: int,
    db_path: str,
    worker_timeout: float,
    address_file: str | None,
    retention_days: float,
    retention_jobs: int,
    dashboard_port: int,
    no_dashboard: bool,
    tls_dir: str | None,
    record_ca: bool,
    config_path: str | None,
) -> None:
    """Run the cluster controller in the foreground (state in SQLite; needs FRAY_TOKEN)."""
    from fray.cluster.protocol.controller_client import load_token
    from fray.cluster.server._retention import RetentionPolicy
    from fray.cluster.server.controller import Controller

    token = load_token()
    if token is None:
        raise CliError(
            "the controller needs a cluster token and found none",
            "set FRAY_TOKEN or write one to ~/.config/fray/token: the controller never runs unauthenticated",
        )
    try:
        retention = RetentionPolicy(max_age_seconds=retention_days * 86400, max_jobs=retention_jobs)
    except ConfigError as exc:
        raise CliError(str(exc), "e.g. --retention-days 7 --retention-jobs 10000") from None
    cluster_config = _cluster_config(config_path) if config_path else None
    if cluster_config is not None and _defaulted("worker_timeout"):
        worker_timeout = cluster_config.worker_timeout  # the cluster file's, unless the command line says
    os.umask(0o077)  # the state, its journal and the TLS keys: for this user only
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    if not no_dashboard:
        check_port_free(host, dashboard_port, "--dashboard-port")
    try:
        ctl = Controller(
            db_path,
            host=host,
            port=port,
            token=token,
            worker_timeout=worker_timeout,
            retention=retention,
            dashboard_port=None if no_dashboard else dashboard_port,
            tls_dir=tls_dir,
            record_ca=record_ca,
        ).start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise busy_port_error(host, port) from None
        raise
    if address_file:
        tmp = Path(address_file + ".tmp")
        tmp.write_text(ctl.address)
        tmp.replace(address_file)
    click.echo(f"fray controller serving on {ctl.address} (state: {db_path})", err=True)
    if ctl.tls_files is not None:
        recorded = f" (recorded in {ctl.ca_record}: this user's fray commands here find it)" if ctl.ca_record else ""
        click.echo(
            f"TLS beyond this machine: the cluster CA is {ctl.tls_files.ca_cert}{recorded}; workers join with "
            f"`fray token create --role worker --controller {ctl.address}`'s line, users elsewhere use a credential "
            "(--role user:NAME) or FRAY_TLS_CA",
            err=True,
        )
    if ctl.dashboard is not None:
        click.echo(f"fray dashboard on {ctl.dashboard.url} (`fray dashboard` prints a log-in link)", err=True)
    if cluster_config is None:
        wait_for_signal(ctl.stop)
        return
    host_ = _start_autoscaling(ctl, cluster_config, Path(db_path).parent, token)
    click.echo(
        f"autoscaling {len(cluster_config.scale_groups)} scale groups through the "
        f"{cluster_config.provider.kind} provider ({config_path})",
        err=True,
    )

    def stop() -> None:
        host_.stop()
        ctl.stop()

    wait_for_signal(stop)


def _defaulted(parameter: str) -> bool:
    """Whether the current command's ``parameter`` was left at its default (not given on the command line)."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(parameter) == ParameterSource.DEFAULT


def _cluster_config(path: str) -> Any:
    from fray.cluster.server.autoscale.config import ClusterConfig

    try:
        return ClusterConfig.load(Path(path).resolve())
    except ConfigError as exc:
        raise CliError(str(exc), "see docs/autoscaling.md for the cluster file's keys") from None


def _start_autoscaling(ctl: Any, config: Any, cluster_dir: Path, token: bytes) -> Any:
    """The provider of ``config`` (its state in ``cluster_dir/vms``) and an autoscaler on ``ctl``."""
    from fray.cluster.protocol.credentials import WORKER, Credential, write_credential
    from fray.cluster.server.autoscale.providers import make_provider, vm_controller_address
    from fray.cluster.server.controller._autoscale_host import start_autoscaling
    from fray.core._private_files import private_dir

    # The worker credential `fray cluster up` gives its workers; made here for a controller started by hand.
    credential_file = cluster_dir / "worker.credential"
    try:
        credential = Credential.decode(credential_file.read_text())
    except (OSError, ConfigError):
        credential = Credential.mint(token, WORKER)
        write_credential(credential_file, credential)
    join_token = None
    current: dict[str, str] = {}
    if config.provider.kind != "simulated":
        made, join_token = ctl.service.create_token("worker", ttl=365 * 86400.0)
        current["id"] = made.credential_id
    try:
        provider = make_provider(
            config,
            state_dir=private_dir(cluster_dir / "vms"),
            controller=vm_controller_address(config, ctl.address),
            credential=credential.encode(),
            join_token=join_token,
        )
    except ConfigError as exc:
        ctl.stop()
        raise CliError(str(exc), "fix the provider: section of the cluster file") from None

    def tokens_revoked(ids: set[str]) -> None:
        # Revoking one VM's worker revokes the join token every VM got: VMs created from now on get a new one.
        rotate = getattr(provider, "rotate_join_token", None)
        if current.get("id") in ids and rotate is not None:
            made, line = ctl.service.create_token("worker", ttl=365 * 86400.0)
            current["id"] = made.credential_id
            rotate(line)

    ctl.service.tokens_revoked = tokens_revoked
    return start_autoscaling(ctl, config, provider)


def _parse_device(text: str) -> Any:
    from fray.cluster.protocol.capacity import Device

    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("gpu", "tpu") or not parts[2].isdigit():
        raise CliError(f"--device {text!r} is not KIND:TYPE:COUNT", "e.g. --device gpu:H100:8 or tpu:v5litepod-16:4")
    return Device(parts[0], parts[1], int(parts[2]))


def _size(option: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return fray.parse_size(text)
    except ConfigError as exc:
        raise CliError(f"{option} {text!r}: {exc}", f"e.g. {option} 16g") from None


@click.group(invoke_without_command=True)
@click.option("--controller", "address", default=None, help="The controller's HOST:PORT.")
@click.option("--id", "worker_id", default=None, help="Worker id (default: host name plus a random suffix).")
@click.option("--cpu", type=float, default=None, help="Cores to offer (default: all).")
@click.option("--ram", default=None, help="Memory to offer, e.g. 16g (default: all).")
@click.option("--disk", default=None, help="Disk to offer, e.g. 100g (default: free space).")
@click.option("--device", "devices", multiple=True, help="An accelerator, KIND:TYPE:COUNT (repeatable).")
@click.option("--attr", "attrs", multiple=True, help="An attribute KEY=VALUE, e.g. preemptible=false (repeatable).")
@click.option("--workdir", default=None, help="Where task directories, cached environments and its credential go.")
@click.option(
    "--join",
    "join",
    default=None,
    envvar="FRAY_JOIN",
    help="A join token (fray token create --role worker): checks the controller, then gets this worker's credential.",
)
@click.option(
    "--drain-seconds",
    type=click.FloatRange(min=0),
    default=DEFAULT_DRAIN_SECONDS,
    show_default=True,
    help="On SIGTERM/SIGINT the worker takes no new task, sends SIGTERM to its tasks and gives them this long "
    "to end (then SIGKILL; a second signal: at once); they run again elsewhere as preempted, and the worker "
    "is listed as stopped, not lost.",
)
def worker(
    address: str,
    worker_id: str | None,
    cpu: float | None,
    ram: str | None,
    disk: str | None,
    devices: tuple[str, ...],
    attrs: tuple[str, ...],
    workdir: str | None,
    join: str | None,
    drain_seconds: float,
) -> None:
    """Run a worker that takes tasks from the controller at --controller (or: fray worker list / revoke).

    SIGTERM or SIGINT drains it: see --drain-seconds.
    """
    if click.get_current_context().invoked_subcommand is not None:
        return
    if not address:
        raise CliError("fray worker needs the controller's address", "fray worker --controller HOST:PORT --join TOKEN")
    # Imported here, not at the top: every `fray` command loads this module, and only a worker needs these.
    from fray.cluster.server.envs._environments import runtime_available
    from fray.cluster.server.envs._shipping import CONTAINER_RUNTIME_ATTRIBUTE
    from fray.cluster.server.worker import Worker

    attributes = {}
    for item in attrs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--attr {item!r} is not KEY=VALUE", "e.g. --attr preemptible=false")
        attributes[key] = value
    if CONTAINER_RUNTIME_ATTRIBUTE not in attributes:
        runtime = runtime_available()  # lets the scheduler's users know docker_image jobs can run here
        if runtime is not None:
            attributes[CONTAINER_RUNTIME_ATTRIBUTE] = runtime
    if cpu is not None and cpu <= 0:
        raise CliError(f"--cpu {cpu:g} must be a positive number of cores", "e.g. --cpu 4")
    gave_up = threading.Event()
    if join is not None and not join.strip():
        raise CliError("--join is empty", "pass the line `fray token create --role worker` printed")
    try:
        node = Worker(
            address,
            token=None,  # FRAY_CREDENTIAL (the worker credential), else the cluster token (see fray.cluster.protocol.credentials)
            worker_id=worker_id,
            cpu=cpu,
            ram_bytes=_size("--ram", ram),
            disk_bytes=_size("--disk", disk),
            devices=tuple(_parse_device(d) for d in devices),
            attributes=attributes,
            workdir=workdir,
            on_refused=lambda _reason: gave_up.set(),
            join=join,
            drain_seconds=drain_seconds,
        ).start()
    except ConfigError as exc:  # a malformed join token
        raise CliError(
            str(exc), "fray token create --role worker (run by the administrator) prints a join token"
        ) from None
    click.echo(f"fray worker {node.worker_id} taking tasks from {address}", err=True)
    why: list[str] = []

    def drain() -> None:
        if node.refusal is not None:
            node.stop()
            return
        reason = why[0] if why else "its owner process ended"
        tasks = len(node.running)
        if tasks:
            click.echo(
                f"fray worker {node.worker_id}: {reason}: draining; {tasks} tasks get up to {drain_seconds:g}s to end, "
                "then run again elsewhere (signal again to stop them now)",
                err=True,
            )
        told = node.drain(reason)
        if told:
            click.echo(f"fray worker {node.worker_id} left the cluster (listed as stopped)", err=True)

    wait_for_signal(drain, gave_up, again=node.hand_back_now, why=why)
    if node.refusal is not None:
        # One line, reason and fix together: the last line of the worker's log then says it all.
        raise CliError(node.refusal)


def _ago(now: float, then: float) -> str:
    seconds = max(0.0, now - then)
    if seconds < 120:
        return f"{seconds:.1f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


@worker.command("list")
@controller_option
@click.option("--json", "as_json", is_flag=True)
def worker_list(address: str | None, as_json: bool) -> None:
    """List the workers the controller knows: state (alive, lost, revoked; stopped ones apart), last contact, resources."""
    rows: list[dict[str, Any]] = [
        {
            "worker_id": w.info.worker_id,
            "state": w.state.value,
            "cpu": w.info.cpu_millis / 1000,
            "ram": fray.resources.format_size(w.info.ram_bytes),
            "devices": [f"{d.kind}:{d.type}:{d.count}" for d in w.info.devices],
            "attributes": w.info.attributes,
            "last_heartbeat": w.last_heartbeat,
            "last_contact": w.last_heartbeat,
            "epoch": w.epoch,
        }
        for w in Session.open(address).controller.list_workers()
    ]
    if as_json:
        echo_json(rows)
        return
    now = time.time()
    out = stdout_console()
    # Stopped workers (drained, or their VM scaled down) left on purpose: listed apart from the others.
    for title, group in (
        (None, [row for row in rows if row["state"] != "stopped"]),
        ("stopped (drained or scaled down; listed for an hour)", [row for row in rows if row["state"] == "stopped"]),
    ):
        if title is not None and not group:
            continue
        table = Table("worker", "state", "last contact", "cpu", "ram", "devices", "attributes", title=title)
        for row in group:
            attrs = " ".join(f"{k}={v}" for k, v in row["attributes"].items())
            plain_row(
                table,
                row["worker_id"],
                row["state"],
                _ago(now, row["last_contact"]),
                f"{row['cpu']:g}",
                row["ram"],
                " ".join(row["devices"]),
                attrs,
            )
        out.print(table)


@worker.command("revoke")
@controller_option
@click.argument("worker_id")
def worker_revoke(address: str | None, worker_id: str) -> None:
    """Revoke a worker's credential now: it is lost (its tasks run again elsewhere) and must join with a new token."""
    from fray.errors import NotFound

    try:
        record = Session.open(address).controller.revoke_worker(worker_id)
    except NotFound:
        raise CliError(f"no worker {worker_id!r} on this cluster", "`fray worker list` shows the workers") from None
    except PermissionDenied as exc:
        raise _administrators_only(exc) from None
    click.echo(
        f"worker {record.info.worker_id} revoked ({record.state.value}); its tasks get new attempts elsewhere, "
        "and the join token it joined with joins no other worker"
    )


def _administrators_only(exc: PermissionDenied) -> CliError:
    """What a command only the cluster's administrator may run says to anyone else."""
    return CliError(
        str(exc).strip().splitlines()[0],
        "only the cluster's administrator may: run it with the cluster token (FRAY_TOKEN, or ~/.config/fray/token "
        "on the machine `fray cluster up` or `fray controller` ran on), without FRAY_CREDENTIAL",
    )


@click.group()
def token() -> None:
    """Join tokens for workers and credentials for users, made and revoked by the administrator (cluster token)."""


@token.command("create")
@controller_option
@click.option(
    "--role", required=True, help="worker: a join token for `fray worker --join`; user:NAME: a user's credential."
)
@click.option("--ttl", type=float, default=None, help="Seconds it stays valid (a join token: 86400 unless told).")
def token_create(address: str | None, role: str, ttl: float | None) -> None:
    """Print one line: a join token (--role worker) or a user credential (--role user:NAME), pinning the CA."""
    try:
        made = Session.open(address).controller.create_token(role, ttl)
    except ConfigError as exc:
        raise CliError(str(exc), "e.g. fray token create --role worker --ttl 3600, or --role user:alice") from None
    except PermissionDenied as exc:
        raise _administrators_only(exc) from None
    expires = made["expires_at"]
    until = format_time(expires) if expires else "never"
    use = "fray worker --controller HOST:PORT --join '<line>'" if role == "worker" else "FRAY_CREDENTIAL='<line>'"
    click.echo(f"token {made['id']} ({role}), expires {until}; use: {use}", err=True)
    click.echo(made["line"])


@token.command("list")
@controller_option
@click.option("--json", "as_json", is_flag=True)
def token_list(address: str | None, as_json: bool) -> None:
    """List join tokens and issued credentials (never their keys): id, for whom, state, expiry."""
    try:
        rows = Session.open(address).controller.list_credentials()
    except PermissionDenied as exc:
        raise _administrators_only(exc) from None
    if as_json:
        echo_json(rows)
        return
    table = Table("id", "for", "state", "created", "expires", "via")
    for row in rows:

        def when(t: float | None) -> str:
            return format_time(t) if t else "-"

        subject = "worker join token" if row["subject"] == "join" else row["subject"]
        plain_row(table, row["id"], subject, row["state"], when(row["created_at"]), when(row["expires_at"]), row["via"])
    stdout_console().print(table)


@token.command("revoke")
@controller_option
@click.argument("credential_id")
def token_revoke(address: str | None, credential_id: str) -> None:
    """Revoke a join token or an issued credential by id (fray token list): it stops working at once."""
    from fray.errors import NotFound

    try:
        changed = Session.open(address).controller.revoke_credential(credential_id)
    except NotFound:
        raise CliError(f"no token or credential {credential_id!r}", "`fray token list` shows their ids") from None
    except PermissionDenied as exc:
        raise _administrators_only(exc) from None
    click.echo(f"{credential_id} revoked" if changed else f"{credential_id} was already revoked")
