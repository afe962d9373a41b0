"""A worker cut off from its controller (issue 23): its tasks stop before their replacements start.

The controller and a second worker run on a simulated host (``tests/netns.py``); the first
worker runs here and reaches them over the host's link, which the test cuts. The worker here
can no longer renew its tasks' lease (0.75 x the worker timeout after the controller last
answered); the controller declares it lost only after the whole timeout and retries its job on
the worker inside the host. Every attempt writes a heartbeat line with the time: no line of the
cut-off attempt may come after the first line of its replacement.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, JobStatus, current_job
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from netns import Hosts
from support import alive, wait_until

WORKER_TIMEOUT = 3.0


def beat(directory: str) -> None:
    """Attempt 0 writes a heartbeat every 50 ms until it is stopped; a later attempt writes one and ends."""
    info = current_job()
    assert info is not None
    path = Path(directory) / f"beats-{info.attempt}"
    (Path(directory) / f"pid-{info.attempt}").write_text(str(os.getpid()))
    while True:
        with open(path, "a") as file:
            file.write(f"{time.time()!r}\n")
        if info.attempt > 0:
            return
        time.sleep(0.05)


def _times(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
def test_a_cut_off_workers_task_stops_before_its_replacement_starts(
    tmp_path: Path, hosts: Hosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = hosts.add()
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.startswith(tests_dir))}
    with LocalCluster(
        tmp_path / "cluster", worker_timeout=WORKER_TIMEOUT, env=env, host=host.address, controller_prefix=host.prefix
    ) as cluster:
        cluster.start_controller()
        assert cluster.ca_file is not None
        monkeypatch.setenv("FRAY_TLS_CA", str(cluster.ca_file))
        cluster.add_worker("w-here", "--cpu", "1")
        cluster.wait_for_workers(1)
        client = ClusterClient(cluster.address, token=cluster.token)
        job = client.submit(
            JobRequest(
                name="beating",
                entrypoint=Entrypoint.from_callable(beat, args=(str(tmp_path),)),
                max_retries_preemption=1,
            )
        )
        wait_until((tmp_path / "beats-0").exists, timeout=60, what="attempt 0 to beat on the worker here")
        first_pid = int((tmp_path / "pid-0").read_text())
        cluster.add_worker("w-there", "--cpu", "1", prefix=host.prefix)  # beside the controller: never cut off
        cluster.wait_for_workers(2)

        hosts.cut(host)
        replaced = wait_until((tmp_path / "beats-1").exists, timeout=60, what="the replacement on the other worker")
        assert replaced
        assert not alive(first_pid), "the cut-off attempt still runs beside its replacement"
        last_of_cut_off, first_of_replacement = max(_times(tmp_path / "beats-0")), min(_times(tmp_path / "beats-1"))
        assert last_of_cut_off < first_of_replacement, "the cut-off attempt beat after its replacement had started"

        hosts.heal(host)
        assert job.wait(timeout=60) == JobStatus.SUCCEEDED
        view = job.view()
        assert view.attempt == 1, "the job ran exactly one more attempt"
        cluster.wait_for_workers(2, timeout=60)  # the healed worker rejoined (under a new epoch)
        assert cluster.workers["w-here"].poll() is None, "the cut-off worker rode out the partition"
        client.shutdown()
