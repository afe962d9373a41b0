"""What happens to a script's jobs and actors when it exits: one rule for every backend, and the notice it prints.

The rule (also in the README and ``docs/architecture.md``):

* **Jobs outlive the script** that submitted them, wherever the backend runs them
  outside the script: on a Fray cluster (``fray://``) every job, on Ray the binary
  jobs (Ray's job API). ``client.submit(request, detached=False)`` ties a job to the
  script instead: it is stopped when the script exits (or its client shuts down).
* On the **local** backend, and for **callable jobs on Ray** (Ray tasks, owned by the
  script's Ray driver), jobs run inside the script and end with it whatever
  ``detached`` says.
* **Actors end with their client** (the script's exit, or ``shutdown()``), unless
  created detached (``ActorConfig(lifetime="detached")``).

So that nothing is left running or ended silently, each backend calls
:func:`report_leftovers` at interpreter exit, which prints one notice on stderr
naming the jobs that keep running (and the commands that list and stop them), the
ones stopped because they were attached, and the ones that end with the script.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["report_leftovers"]

_SHOWN = 5  # ids named in a notice; the rest are counted


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_SHOWN])
    return shown + (f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")


def _jobs(count: int) -> str:
    return f"{count} job" + ("" if count == 1 else "s")


def report_leftovers(
    where: str,
    *,
    kept: Sequence[str] = (),
    stopped: Sequence[str] = (),
    ended: Sequence[str] = (),
    list_hint: str = "",
    stop_hint: str = "",
    why_ended: str = "",
) -> None:
    """Print what the exiting script leaves behind on ``where`` (nothing when there is nothing to say)."""
    lines = []
    if kept:
        verb = "keeps" if len(kept) == 1 else "keep"
        lines.append(f"fray: {_jobs(len(kept))} of this script {verb} running on {where}: {_ids(kept)}")
        if list_hint or stop_hint:
            lines.append("      " + "; ".join(part for part in (list_hint, stop_hint) if part))
    if stopped:
        lines.append(f"fray: stopped {_jobs(len(stopped))} submitted with detached=False: {_ids(stopped)}")
    if ended:
        reason = f" ({why_ended})" if why_ended else ""
        verb = "ends" if len(ended) == 1 else "end"
        lines.append(f"fray: {_jobs(len(ended))} {verb} with this script{reason}: {_ids(ended)}")
    if lines:
        try:
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr already closed at exit: nothing more to do
            pass
