"""Short network blips change nothing (issue 34): a worker cut off for up to 60 % of its timeout keeps its tasks.

The controller runs on a simulated host (``tests/netns.py``); the worker runs here and reaches it
over the host's link, which the test cuts for 40 % and then 60 % of the worker timeout. The
worker's keep-alive (``fray.cluster.server.worker._keepalive``) keeps its last contact at most
lease/16 old when a cut starts and renews the lease within lease/32 of the heal, so the lease
(0.75 x the timeout) never lapses: the tasks' processes live on, their jobs stay on attempt 0, the
worker keeps its epoch (the controller never declared it lost), and each job completes once.
Longer cuts are ``tests/faults/test_partition.py``'s.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, JobStatus, current_job
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.protocol.records import WorkerState
from fray.cluster.server.launcher import LocalCluster
from netns import Hosts
from support import alive, wait_until

WORKER_TIMEOUT = 5.0  # the figure: --worker-timeout 5, cuts of 2 s and 3 s


def beat_until_told(directory: str, tag: str) -> None:
    """Write this attempt's pid, then beat every 50 ms until ``<tag>.go`` exists."""
    info = current_job()
    assert info is not None
    base = Path(directory)
    (base / f"{tag}.pid-{info.attempt}").write_text(str(os.getpid()))
    while not (base / f"{tag}.go").exists():
        with open(base / f"{tag}.beats-{info.attempt}", "a") as file:
            file.write(f"{time.time()!r}\n")
        time.sleep(0.05)


@pytest.mark.slow
def test_a_worker_cut_off_for_up_to_60_percent_of_its_timeout_keeps_its_tasks(
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
        cluster.add_worker("w-here", "--cpu", "2")
        cluster.wait_for_workers(1)
        client = ClusterClient(cluster.address, token=cluster.token)
        ctl = controller_client(cluster.address, cluster.token, ca=cluster.ca_file)
        jobs = {
            tag: client.submit(
                JobRequest(
                    name=tag,
                    entrypoint=Entrypoint.from_callable(beat_until_told, args=(str(tmp_path), tag)),
                    max_retries_preemption=3,
                )
            )
            for tag in ("a", "b")
        }
        for tag in jobs:
            wait_until((tmp_path / f"{tag}.beats-0").exists, timeout=60, what=f"job {tag} to start")
        pids = {tag: int((tmp_path / f"{tag}.pid-0").read_text()) for tag in jobs}
        (epoch,) = [w.epoch for w in ctl.list_workers() if w.info.worker_id == "w-here"]

        for fraction in (0.4, 0.6):
            cut_at = time.time()
            hosts.cut(host)
            time.sleep(fraction * WORKER_TIMEOUT)
            hosts.heal(host)
            healed_at = time.time()
            # Past the lease's end, had it lapsed at the cut (0.75 x the timeout), plus a margin.
            time.sleep(max(0.0, cut_at + 0.75 * WORKER_TIMEOUT + 1.0 - time.time()))
            for tag, pid in pids.items():
                assert alive(pid), f"a {fraction:.0%} cut ({healed_at - cut_at:.1f}s) stopped job {tag}'s task"
                assert jobs[tag].view().attempt == 0, f"a {fraction:.0%} cut gave job {tag} a new attempt"
            (worker,) = [w for w in ctl.list_workers() if w.info.worker_id == "w-here"]
            assert worker.state == WorkerState.ALIVE and worker.epoch == epoch, "the controller lost the worker"

        for tag in jobs:
            (tmp_path / f"{tag}.go").touch()
        for tag, job in jobs.items():
            assert job.wait(timeout=60) == JobStatus.SUCCEEDED
            assert job.view().attempt == 0, f"job {tag} ran more than once"
            assert not (tmp_path / f"{tag}.pid-1").exists(), f"job {tag} started a second attempt"
        ctl.close()
        client.shutdown()
