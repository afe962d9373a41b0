"""A replica that dies says what killed it (issue 35): Fray's memory limit, a signal by name, its last output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, ResourceConfig
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import ops_client
from fray.cluster.server.dashboard.pages import job_page
from fray.cluster.server.launcher import LocalCluster
from fray.cluster.server.worker._memory import group_rss, kill_threshold, memory_limit
from fray.errors import ActorDiedError, JobFailed


def grab_a_gibibyte() -> None:
    """Write to 1 GiB of memory, 32 MiB at a time (every page touched), then hold it."""
    print("MARKER-OOM before the allocation", file=sys.stderr, flush=True)
    held = []
    for _ in range(32):
        held.append(b"x" * (32 << 20))  # written, so resident: a bytearray of zeros may not be
        time.sleep(0.05)
    time.sleep(60)


def kill_myself() -> None:
    print("MARKER-KILL last words", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _cli(cluster: LocalCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(home), FRAY_TOKEN=cluster.token, FRAY_CLIENT_SPEC=f"fray://{cluster.address}")
    return subprocess.run([sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True)


def test_a_job_past_its_ram_fails_out_of_memory_with_the_limit_and_its_last_output(
    cluster_client: ClusterClient, fray_cluster: LocalCluster, tmp_path: Path
):
    job = cluster_client.submit(
        JobRequest(
            name="oom", entrypoint=Entrypoint.from_callable(grab_a_gibibyte), resources=ResourceConfig(ram="200m")
        )
    )
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=60)
    message = info.value.message
    assert "out of memory: used " in message, message
    assert "its limit is ram=200m (200 MiB); peak RSS " in message, message
    assert "MARKER-OOM before the allocation" in message
    assert "MARKER-OOM before the allocation" in info.value.last_output
    # Killed near the limit, long before the whole gibibyte.
    used = int(message.split("out of memory: used ")[1].split(" MiB")[0])
    assert 200 < used < 700, message
    status = _cli(fray_cluster, tmp_path, "job", "status", job.job_id)
    assert status.returncode == 0, status.stderr
    assert "out of memory" in status.stdout and "ram=200m" in status.stdout, status.stdout
    assert "MARKER-OOM" in status.stdout
    # The dashboard's job page shows the same words (its error style keeps their lines apart).
    ops = ops_client(fray_cluster.address, fray_cluster.token)
    html = job_page(ops.job_detail(job.job_id), csrf="x")
    ops.close()
    assert "out of memory: used " in html and "ram=200m (200 MiB)" in html and "MARKER-OOM" in html


def test_a_job_that_sigkills_itself_fails_naming_sigkill_with_its_last_output(
    cluster_client: ClusterClient, fray_cluster: LocalCluster, tmp_path: Path
):
    job = cluster_client.submit(JobRequest(name="suicide", entrypoint=Entrypoint.from_callable(kill_myself)))
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=60)
    message = info.value.message
    assert "killed by SIGKILL (the kernel's OOM killer or another process)" in message, message
    assert "MARKER-KILL last words" in message
    assert info.value.exit_code == -signal.SIGKILL
    status = _cli(fray_cluster, tmp_path, "job", "status", job.job_id)
    assert "killed by SIGKILL" in status.stdout and "MARKER-KILL" in status.stdout, status.stdout


def test_the_default_ram_is_no_limit_and_the_threshold_has_its_slack():
    assert memory_limit(0) == 0
    assert memory_limit(128 << 20) == 0  # ResourceConfig's default: a reservation only
    assert memory_limit(200 << 20) == 200 << 20
    assert kill_threshold(200 << 20) == (200 << 20) + (20 << 20) + (16 << 20)
    mine = os.getpgid(0)
    assert group_rss([mine])[mine] > 0


class Fragile:
    def crash(self) -> None:
        print("MARKER-ACTOR going down", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def ping(self) -> str:
        return "pong"


def test_an_actor_whose_process_is_killed_says_sigkill_in_actor_died_error(cluster_client: ClusterClient):
    actor = cluster_client.create_actor(Fragile, name="fragile-death")
    assert actor.ping() == "pong"
    with pytest.raises(ActorDiedError):
        actor.crash()
    deadline = time.monotonic() + 30
    said = ""
    while "killed by SIGKILL" not in said and time.monotonic() < deadline:
        try:  # the next call learns the death from the controller, with its cause
            actor.ping()
        except ActorDiedError as exc:
            said = str(exc)
        time.sleep(0.2)
    assert "killed by SIGKILL" in said and "MARKER-ACTOR going down" in said, said
