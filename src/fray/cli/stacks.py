"""``fray job stack`` and ``fray actor stack``: what a job's replicas and tasks, or an actor, are doing right now.

Both print :func:`fray.stacks.format_stacks` (``--json``: each process's
:meth:`~fray.stacks.ProcessStacks.to_json`), taken by the controller through the workers
(``JobHandle.stacks`` on a Fray cluster): the Python stack of every thread of every process,
without ptrace. A process that does not answer within ``--timeout`` is listed with why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from fray.cli._common import Session, controller_option, echo_json
from fray.cli._errors import CliError
from fray.cli.jobs import job
from fray.stacks import ProcessStacks, format_stacks

__all__ = ["actor", "job_stack"]

_TIMEOUT_HELP = "Seconds each process has to answer (default 10)."


def _print(stacks: list[ProcessStacks], as_json: bool) -> None:
    if as_json:
        echo_json([process.to_json() for process in stacks])
    else:
        click.echo(format_stacks(stacks))


@job.command("stack")
@controller_option
@click.argument("ref", metavar="JOB")
@click.option("--locals", "with_locals", is_flag=True, help="Also show each frame's local variables (their repr).")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=60), default=10.0, help=_TIMEOUT_HELP)
@click.option("--json", "as_json", is_flag=True)
def job_stack(address: str | None, ref: str, with_locals: bool, timeout: float, as_json: bool) -> None:
    """Print the live Python stacks of a running job: every replica, and its job context's tasks."""
    session = Session.open(address)
    job_id = session.resolve_job(ref)
    stacks = session.controller.job_stacks(job_id, timeout, with_locals)
    if not stacks:
        view = session.controller.job(job_id)
        raise CliError(
            f"job {job_id} is {view.state.value}: no process of it runs, so there are no stacks to show",
            f"`fray job status {job_id}` says how it ended or why it waits; `fray job logs {job_id}` shows its output",
        )
    _print(stacks, as_json)


@click.group()
def actor() -> None:
    """Inspect actors on a Fray cluster."""


@actor.command("stack")
@controller_option
@click.argument("name")
@click.option("--namespace", default=None, help="The actor's namespace (needed when the name is in several).")
@click.option("--locals", "with_locals", is_flag=True, help="Also show each frame's local variables (their repr).")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=60), default=10.0, help=_TIMEOUT_HELP)
@click.option("--json", "as_json", is_flag=True)
def actor_stack(
    address: str | None, name: str, namespace: str | None, with_locals: bool, timeout: float, as_json: bool
) -> None:
    """Print the live Python stacks of a named actor's process (every thread: the calls it is running)."""
    session = Session.open(address)
    found = _actor_jobs(session, name, namespace)
    if not found:
        where = f" in namespace {namespace!r}" if namespace is not None else ""
        raise CliError(
            f"no running actor {name!r}{where} on the cluster at {session.address}",
            "`fray status` lists the actors with their namespaces; `fray endpoint list` their endpoints",
        )
    if len(found) > 1:
        spaces = ", ".join(sorted(ns for ns, _ in found))
        raise CliError(
            f"actor {name!r} is in {len(found)} namespaces ({spaces})",
            f"name one: fray actor stack {name} --namespace NS",
        )
    _, job_id = found[0]
    label = f"actor {name!r}"
    stacks = [
        dataclasses.replace(p, label=label) if p.label == "replica 0" else p
        for p in session.controller.job_stacks(job_id, timeout, with_locals)
    ]
    if not stacks:
        view = session.controller.job(job_id)
        raise CliError(
            f"actor {name!r} is not running: its job {job_id} is {view.state.value}",
            f"`fray job status {job_id}` says how it ended; `fray job logs {job_id}` shows its output",
        )
    _print(stacks, as_json)


def _actor_jobs(session: Session, name: str, namespace: str | None) -> list[tuple[str, str]]:
    """``(namespace, job id)`` of each running actor called ``name`` (in ``namespace`` if given)."""
    actors: list[dict[str, Any]] = session.ops.status()["actors"]
    found = {
        (a["namespace"], a["job_id"])
        for a in actors
        if a["name"] == name and (namespace is None or a["namespace"] == namespace) and a["job_id"]
    }
    return sorted(found)
