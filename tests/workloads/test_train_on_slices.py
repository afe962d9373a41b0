"""``examples/train_on_slices.py`` on simulated TPU slices: fray:// and Ray; the local backend's dry run.

The simulations (no TPU anywhere):

* ``fray://``: a small cluster of its own (the session cluster's workers are CPU-only)
  with four workers, two v4-16 slices of two hosts, each worker declaring what a TPU VM
  would (``--device tpu:v4-16:4 --attr tpu-name=... --attr tpu-worker-id=...``).
  A preempted slice is its workers SIGKILLed (the VMs gone) and replacement workers
  for the same slice started, as a TPU pool would recreate them.
* Ray: a multi-node Ray cluster whose nodes advertise what Ray's TPU manager makes a
  TPU VM advertise (``tests/ray/tpu_sim.py``). A process holds one Ray connection and
  the session has its own Ray, so, like ``tests/ray/test_tpu_simulation.py``, every Ray
  scenario runs in one subprocess (this module run as a script) that reports what it saw.
  A preempted slice is its nodes removed without grace and re-added.

``fray.testing.preempt(job, replica)`` (being written on another branch) is meant to do
exactly what the ``preempt`` callbacks here do; the example takes any callable of that
signature, so the tests will switch to it once it exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from fray import JobFailed, JobHandle
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from example_modules import load_example, run_script  # noqa: E402

example = load_example("train_on_slices")

SLICES = ("slice-a", "slice-b")
HOSTS = 2  # a v4-16 slice: 2 hosts of 4 chips
COORDINATOR_PORT = "8081"


def host_worker_args(slice_name: str, host: int) -> tuple[str, ...]:
    """The ``fray worker`` options of one simulated v4-16 TPU VM."""
    attributes = (f"tpu-name={slice_name}", f"tpu-worker-id={host}")
    return ("--cpu", "1", "--device", "tpu:v4-16:4", *(arg for a in attributes for arg in ("--attr", a)))


class TpuPool:
    """A dedicated fray:// cluster of two simulated v4-16 slices, whose slices can be preempted."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.generation = 0
        self.workers: dict[str, list[str]] = {}  # slice name -> its current worker ids
        for name in SLICES:
            self._start_slice(name)
        cluster.wait_for_workers(len(SLICES) * HOSTS, timeout=120)

    def _start_slice(self, name: str) -> None:
        ids = [f"{name}-h{host}-g{self.generation}" for host in range(HOSTS)]
        for host, worker_id in enumerate(ids):
            self.cluster.add_worker(worker_id, *host_worker_args(name, host))
        self.workers[name] = ids

    def preempt(self, workdir: Path) -> Any:
        """A ``preempt(job, replica)`` callback: the slice that replica runs on loses its VMs, then gets new ones."""

        def preempt(job: JobHandle, replica: int) -> None:
            victim = next(r.slice_name for r in example.read_reports(workdir) if r.slice_index == replica)
            for worker_id in self.workers[victim]:
                self.cluster.kill_worker(worker_id)
            self.generation += 1
            self._start_slice(victim)

        return preempt


@pytest.fixture(scope="module")
def tpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TpuPool]:
    # A short worker timeout: a killed slice is noticed as lost within seconds.
    with LocalCluster(tmp_path_factory.mktemp("fray-tpu"), worker_timeout=3.0) as cluster:
        cluster.start_controller(timeout=60)
        yield TpuPool(cluster)


@pytest.fixture
def tpu_client(tpu_pool: TpuPool) -> Iterator[ClusterClient]:
    client = ClusterClient(tpu_pool.cluster.address, token=tpu_pool.cluster.token)
    yield client
    client.shutdown(wait=False)


def check_multislice_gang(hosts: tuple[Any, ...], attempt: int) -> None:
    """Two slices of two hosts, each host knowing its slice, host index and the slice-0 coordinator."""
    assert [(h.slice_index, h.host) for h in hosts] == [(s, h) for s in range(2) for h in range(HOSTS)]
    assert all(h.attempt == attempt and h.slices == 2 and h.hosts == HOSTS for h in hosts)
    assert all(h.device == "tpu:v4-16" for h in hosts)
    by_slice = {s: {h.slice_name for h in hosts if h.slice_index == s} for s in range(2)}
    assert all(len(names) == 1 for names in by_slice.values())  # one replica is one whole slice
    assert by_slice[0] | by_slice[1] == set(SLICES)
    coordinators = {dict(h.megascale)["MEGASCALE_COORDINATOR_ADDRESS"] for h in hosts}
    assert len(coordinators) == 1 and coordinators.pop().endswith(f":{COORDINATOR_PORT}")
    for h in hosts:
        assert dict(h.megascale)["MEGASCALE_NUM_SLICES"] == "2"
        assert dict(h.megascale)["MEGASCALE_SLICE_ID"] == str(h.slice_index)
        assert dict(h.megascale)["MEGASCALE_PORT"] == COORDINATOR_PORT


# -- fray:// -------------------------------------------------------------------------------


@pytest.mark.slow
def test_fray_two_slices_run_as_one_gang_with_the_multislice_environment(tpu_client, uid, tmp_path):
    result = example.run(tpu_client, tmp_path, name=f"train-{uid}", timeout=180)
    assert result.attempts == 1 and not result.local_dry_run
    check_multislice_gang(result.hosts, attempt=0)


@pytest.mark.slow
def test_fray_a_preempted_slice_restarts_the_whole_gang(tpu_pool, tpu_client, uid, tmp_path):
    result = example.run(
        tpu_client, tmp_path, name=f"preempt-{uid}", preempt=tpu_pool.preempt(tmp_path), max_retries_preemption=1,
        timeout=240,
    )  # fmt: skip
    assert result.attempts == 2
    check_multislice_gang(result.hosts, attempt=1)
    first = [r for r in example.read_reports(tmp_path) if r.attempt == 0]
    assert len(first) == 2 * HOSTS  # the whole gang ran, then the whole gang ran again


@pytest.mark.slow
def test_fray_a_user_error_fails_the_job_after_its_failure_retries(tpu_client, uid, tmp_path):
    with pytest.raises(JobFailed, match="learning_rate must be positive") as info:
        example.run(tpu_client, tmp_path, name=f"bad-{uid}", learning_rate=-1.0, max_retries_failure=1, timeout=240)
    assert isinstance(info.value, ValueError)  # the training code's own exception
    attempts = sorted({r.attempt for r in example.read_reports(tmp_path)})
    assert attempts == [0, 1]


# -- local: a dry run, no slices ------------------------------------------------------------


def test_local_runs_each_slice_once_without_slice_environment(local_client, uid, tmp_path):
    result = example.run(local_client, tmp_path, name=f"train-{uid}")
    assert result.local_dry_run and result.attempts == 1
    assert [(h.slice_index, h.slices, h.slice_name, h.host, h.megascale) for h in result.hosts] == [
        (0, 2, None, None, ()),
        (1, 2, None, None, ()),
    ]
    assert {h.device for h in result.hosts} == {"tpu:v4-16"}


def test_local_user_error_fails_after_its_failure_retries(local_client, uid, tmp_path):
    with pytest.raises(JobFailed, match="learning_rate must be positive") as info:
        example.run(local_client, tmp_path, name=f"bad-{uid}", learning_rate=-1.0, max_retries_failure=2)
    assert isinstance(info.value, ValueError)
    assert sorted({r.attempt for r in example.read_reports(tmp_path)}) == [0, 1, 2]


def test_the_example_runs_as_a_script_on_the_local_backend():
    out = run_script("train_on_slices", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "local backend: no TPU slices here" in out.stdout
    assert "training job finished after 1 attempt(s) on 2 host process(es)" in out.stdout
    assert "slice 1 (no slice) host -: device tpu:v4-16, megascale coordinator none" in out.stdout


# -- Ray: every scenario in one subprocess with its own simulated pod --------------------------


@pytest.fixture(scope="module")
def ray_sim(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')
    output = tmp_path_factory.mktemp("ray-tpu") / "results.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "FRAY_CLIENT_SPEC"))}
    proc = subprocess.run(
        [sys.executable, __file__, str(output)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0 or not output.exists():
        pytest.fail(f"the Ray TPU simulation failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    results: dict[str, Any] = json.loads(output.read_text())
    return results


def reports_of(data: list[dict[str, Any]]) -> tuple[Any, ...]:
    return tuple(example.HostReport(**{**d, "megascale": tuple(tuple(p) for p in d["megascale"])}) for d in data)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_two_slices_run_as_one_gang_with_the_multislice_environment(ray_sim):
    assert ray_sim["plain"]["attempts"] == 1
    check_multislice_gang(reports_of(ray_sim["plain"]["hosts"]), attempt=0)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_a_preempted_slice_restarts_the_whole_gang(ray_sim):
    assert ray_sim["preempt"]["attempts"] == 2
    check_multislice_gang(reports_of(ray_sim["preempt"]["hosts"]), attempt=1)
    assert ray_sim["preempt_first_attempt_hosts"] == 2 * HOSTS


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_a_user_error_fails_the_job_after_its_failure_retries(ray_sim):
    assert ray_sim["bad"]["is_value_error"]
    assert "learning_rate must be positive" in ray_sim["bad"]["error"]
    assert ray_sim["bad"]["attempts"] == [0, 1]


def _ray_main(output: str) -> None:
    """Start a simulated two-slice pod on Ray, run every scenario, write what happened to ``output``."""
    import shutil
    import tempfile

    from ray.cluster_utils import Cluster

    import ray
    from fray.ray import RayClient

    sys.path.insert(0, str(HERE.parent / "ray"))
    from tpu_sim import tpu_host_args

    results: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="fray-train-"))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        nodes = {(s, h): cluster.add_node(**tpu_host_args(s, h)) for s in SLICES for h in range(HOSTS)}
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        client = RayClient(namespace="train-on-slices")

        workdir = str(base / "plain")
        os.mkdir(workdir)
        results["plain"] = asdict(example.run(client, workdir, name="plain", timeout=240))

        workdir = str(base / "preempt")
        os.mkdir(workdir)

        def preempt(job: JobHandle, replica: int) -> None:
            victim = next(r.slice_name for r in example.read_reports(workdir) if r.slice_index == replica)
            for host in range(HOSTS):
                cluster.remove_node(nodes[(victim, host)], allow_graceful=False)
            for host in range(HOSTS):
                nodes[(victim, host)] = cluster.add_node(**tpu_host_args(victim, host))

        result = example.run(client, workdir, name="preempt", preempt=preempt, max_retries_preemption=1, timeout=300)
        results["preempt"] = asdict(result)
        results["preempt_first_attempt_hosts"] = len([r for r in example.read_reports(workdir) if r.attempt == 0])

        workdir = str(base / "bad")
        os.mkdir(workdir)
        try:
            example.run(client, workdir, name="bad", learning_rate=-1.0, max_retries_failure=1, timeout=300)
            results["bad"] = {"error": None, "is_value_error": False}
        except JobFailed as exc:
            results["bad"] = {"error": str(exc), "is_value_error": isinstance(exc, ValueError)}
        results["bad"]["attempts"] = sorted({r.attempt for r in example.read_reports(workdir)})
        client.shutdown(wait=False)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        Path(output).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    _ray_main(sys.argv[1])
