"""What the examples share when run as scripts: the extras they need, ``--help``, and the cluster they are given.

A missing extra is named in one line, with the extra that installs it. On a Fray cluster
(``fray://``) an example first reads what the cluster offers (:func:`capacity`): it sizes
itself to it (replicas, workers) or, when it can never run there, exits at once with one
line saying why (:func:`cannot_run`), instead of waiting minutes for a timeout.

Run as scripts, the examples import this module from their own directory (Python puts a
script's directory first on ``sys.path``); the extras are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["Capacity", "answer_help", "cannot_run", "capacity", "require", "require_pinned"]

#: What a worker must say to be one that is never preempted (``fray cluster up`` starts its workers so).
PINNED_HINT = "fray worker --attr preemptible=false; the workers of `fray cluster up` are"


def require(module: str, extra: str) -> None:
    """Exit with ``SCRIPT needs MODULE: pip install "fray[EXTRA]"`` unless ``module`` can be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing, or an import hook refuses the module
        found = False
    if not found:
        sys.exit(f'{Path(sys.argv[0]).name} needs {module}: pip install "fray[{extra}]"')


def answer_help(doc: str | None) -> None:
    """With ``-h`` or ``--help`` among the arguments, print the example's docstring and exit; else return."""
    if not {"-h", "--help"} & set(sys.argv[1:]):
        return
    print((doc or "").strip())
    print("\nThe backend is FRAY_CLIENT_SPEC's (local when unset): e.g. FRAY_CLIENT_SPEC=fray://HOST:PORT.")
    sys.exit(0)


def cannot_run(reason: str) -> NoReturn:
    """Exit now (status 1) with one line: ``SCRIPT cannot run on this cluster: REASON``."""
    sys.exit(f"{Path(sys.argv[0]).name} cannot run on this cluster: {reason}")


@dataclass(frozen=True)
class Capacity:
    """What the alive workers of a Fray cluster offer: cores, attributes and devices of each."""

    address: str
    workers: tuple[dict[str, Any], ...]  #: rows of the operator API's status: cpu_total, attributes, devices

    @property
    def cores(self) -> float:
        return sum(w["cpu_total"] for w in self.workers)

    @property
    def largest(self) -> float:
        """The most cores one worker offers (0 without workers)."""
        return max((w["cpu_total"] for w in self.workers), default=0.0)

    def slots(self, cpu: float) -> int:
        """How many tasks of ``cpu`` cores each fit at once, every worker idle."""
        return sum(math.floor(w["cpu_total"] / cpu + 1e-9) for w in self.workers)

    @property
    def pinned(self) -> bool:
        """True if a worker is never preempted (``ResourceConfig(preemptible=False)`` has somewhere to go)."""
        return any(str(w["attributes"].get("preemptible", "")).lower() == "false" for w in self.workers)

    def tpu_slices(self, tpu_type: str, hosts: int) -> int:
        """How many complete slices of ``tpu_type`` (``hosts`` hosts each) the workers make up."""
        members: dict[str, int] = {}
        for w in self.workers:
            if any(d.startswith(f"tpu:{tpu_type}:") for d in w["devices"]):
                name = str(w["attributes"].get("tpu-name", w["worker_id"]))
                members[name] = members.get(name, 0) + 1
        return sum(1 for count in members.values() if count >= hosts)

    def describe(self) -> str:
        return f"{len(self.workers)} workers, {self.cores:g} cores in all (the largest {self.largest:g})"


def capacity(client: Any) -> Capacity | None:
    """What the Fray cluster ``client`` talks to offers now; None on another backend, or when workers come on
    demand (an autoscaler makes VMs for what waits) or the cluster does not say."""
    from fray.cluster.client import ClusterClient
    from fray.cluster.protocol.controller_client import ops_client
    from fray.errors import FrayError

    if not isinstance(client, ClusterClient):
        return None
    ops = ops_client(client.address)
    try:
        status = ops.status()
    except FrayError:
        return None
    if status.get("autoscaler"):
        return None
    alive = tuple(w for w in status["workers"] if w["state"] == "alive")
    job_id, worker_id = os.environ.get("FRAY_JOB_ID"), os.environ.get("FRAY_WORKER_ID")
    if job_id and worker_id:
        # The script runs as a job of this cluster (fray job submit): the cores it holds stay held while its
        # own jobs wait for room, so they are not there for them.
        try:
            held = float(ops.job_detail(job_id).get("cpu", 0.0))
        except FrayError:
            held = 0.0
        alive = tuple(
            {**w, "cpu_total": max(0.0, w["cpu_total"] - held)} if w["worker_id"] == worker_id else w for w in alive
        )
    if not alive:
        cannot_run(f"the cluster at {client.address} has no alive worker (`fray worker list` shows them)")
    return Capacity(client.address, alive)


def require_pinned(cap: Capacity | None, what: str) -> None:
    """Exit unless a worker is never preempted, where ``what`` (shared state) must run."""
    if cap is not None and not cap.pinned:
        cannot_run(
            f"{what} needs a worker that is never preempted, and none of its {cap.describe()} is ({PINNED_HINT})"
        )
