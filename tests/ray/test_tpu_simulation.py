"""TPU jobs on a *simulated* TPU pod: a local multi-node Ray cluster whose nodes advertise TPU resources.

See ``tpu_sim.py`` for what each simulated TPU VM advertises and why that matches a
real one. The cluster is started once, in a subprocess (a process holds one Ray
connection, and the test session already has its own cluster), which runs every
scenario and reports what it observed; the tests below check those observations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')

pytestmark = pytest.mark.slow

HOSTS = 2  # a v4-16 slice: 2 hosts of 4 chips


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every scenario of the simulated pod once and return the observations."""
    output = tmp_path_factory.mktemp("tpu-sim") / "results.json"
    script = Path(__file__).with_name("tpu_sim.py")
    proc = subprocess.run(
        [sys.executable, str(script), str(output)], capture_output=True, text=True, timeout=400, check=False
    )
    if proc.returncode != 0 or not output.exists():
        pytest.fail(f"the TPU simulation failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    results: dict[str, Any] = json.loads(output.read_text())
    return results


def slice_of(sim: dict[str, Any], node: str) -> str:
    return str(sim["node_slices"][node][0])


def test_single_slice_job_runs_once_per_host_of_one_slice(sim: dict[str, Any]) -> None:
    assert sim["single_status"] == "succeeded"
    procs = sim["single"]
    assert sorted(p["host"] for p in procs) == list(range(HOSTS))
    assert len({p["node"] for p in procs}) == HOSTS  # one process per host, on distinct hosts
    assert len({slice_of(sim, p["node"]) for p in procs}) == 1  # all on the same slice
    assert all(p["slice"] == slice_of(sim, p["node"]) for p in procs)
    host0 = next(p for p in procs if p["host"] == 0)
    assert sim["node_slices"][host0["node"]][1] == "0"  # host 0 runs on the slice's head (worker 0)
    assert all(p["megascale"] == {} for p in procs)  # single slice: no multislice coordination
    assert all(p["visible_tpu_chips"] == "0,1,2,3" for p in procs)  # Ray hands each process the host's chips


def test_multislice_job_gets_megascale_environment(sim: dict[str, Any]) -> None:
    assert sim["multi_status"] == "succeeded"
    procs = sim["multi"]
    assert len(procs) == 2 * HOSTS
    assert len({p["node"] for p in procs}) == 2 * HOSTS
    by_slice: dict[int, set[str]] = {}
    for p in procs:
        by_slice.setdefault(p["replica"], set()).add(slice_of(sim, p["node"]))
        assert p["replicas"] == 2
        assert p["megascale"]["MEGASCALE_NUM_SLICES"] == "2"
        assert p["megascale"]["MEGASCALE_SLICE_ID"] == str(p["replica"])
    assert sorted(by_slice) == [0, 1]
    assert all(len(names) == 1 for names in by_slice.values())  # each replica is exactly one slice
    assert by_slice[0] != by_slice[1]
    coordinators = {p["megascale"]["MEGASCALE_COORDINATOR_ADDRESS"] for p in procs}
    assert len(coordinators) == 1 and coordinators.pop().endswith(":8081")


def test_more_slices_than_the_pod_has_never_start_partially(sim: dict[str, Any]) -> None:
    assert sim["toomany_status_before"] == "pending"
    assert sim["toomany_ran"] == []  # gang scheduling: nothing starts unless everything can
    assert sim["toomany_status_after"] == "stopped"


def test_preempted_slice_is_retried_under_the_preemption_budget(sim: dict[str, Any]) -> None:
    assert sim["preempt_running_status"] == "running"
    assert sim["preempt_status"] == "succeeded"
    attempts = sorted({p["attempt"] for p in sim["preempt"]})
    assert attempts == [0, 1]
    assert sum(1 for p in sim["preempt"] if p["attempt"] == 1) == HOSTS


def test_preemption_with_no_budget_left_fails_the_job(sim: dict[str, Any]) -> None:
    assert sim["nobudget_status"] == "failed"
    assert "lost its worker or node" in sim["nobudget_error"]
    assert {p["attempt"] for p in sim["nobudget_ran"]} == {0}


def test_non_preemptible_work_is_pinned_to_the_head_node(sim: dict[str, Any]) -> None:
    assert sim["pin_resource"] == "head_node"
    assert sim["pinned_actor_node"] == sim["head_node"]
    assert sim["pinned_job_node"] == sim["head_node"]
