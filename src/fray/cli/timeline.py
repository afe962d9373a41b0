"""``fray timeline``: the cluster's jobs as a Chrome trace, for Perfetto or ``chrome://tracing``."""

from __future__ import annotations

import json
import re
import sys
import time

import click

from fray.cli._common import Session, controller_option
from fray.cli._errors import CliError

__all__ = ["parse_duration", "timeline"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"1d"`` or a bare number of seconds, in seconds; CliError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise CliError(
            f"--since {text!r} is not a duration", "write a number with s, m, h or d: --since 30m, --since 2h"
        )
    return float(match.group(1)) * _SECONDS[match.group(2).lower()]


@click.command()
@controller_option
@click.option("--job", "job_ref", default=None, help="Only this job (its id, or its name: the newest of that name).")
@click.option("--since", default=None, help="Only jobs running in this last while: 30m, 2h, 1d.")
@click.option("-o", "--output", "output", default="-", help="Where to write the trace (default: stdout).")
def timeline(address: str | None, job_ref: str | None, since: str | None, output: str) -> None:
    """Write the jobs' timeline as a Chrome trace: open it in ui.perfetto.dev or chrome://tracing.

    A track per worker and per replica; a span for each attempt's wait and run, named after its
    job, with its outcome; instant events for losses, retries and actor restarts. Read from what
    the controller keeps anyway (always on; bounded by its retention).
    """
    since_unix = time.time() - parse_duration(since) if since is not None else None
    session = Session.open(address)
    job_id = session.resolve_job(job_ref) if job_ref is not None else None
    trace = session.ops.timeline(job_id, since_unix)
    text = json.dumps(trace, separators=(",", ":"))
    if output == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise CliError(
            f"cannot write {output}: {exc.strerror or exc}", "give -o a path in a writable directory"
        ) from None
    spans = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "running")
    click.echo(
        f"wrote {output}: {trace['otherData']['jobs']} jobs, {spans} attempt spans; "
        "open it in https://ui.perfetto.dev or chrome://tracing",
        err=True,
    )
