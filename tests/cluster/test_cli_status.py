"""`fray status` and `fray job list`: resources in use, jobs by state, actors; times, commands, limits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from support import wait_until


class Greeter:
    def hello(self) -> str:
        return "hi"


def _cli(cluster: LocalCluster, home: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(home), FRAY_TOKEN=cluster.token, FRAY_CLIENT_SPEC=f"fray://{cluster.address}")

    def run(*args: str, expect: int = 0) -> str:
        out = subprocess.run([sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True)
        assert out.returncode == expect, out.stderr
        return out.stdout

    return run


def test_job_list_newest_first_with_times_duration_and_command(fray_cluster: LocalCluster, tmp_path: Path):
    run = _cli(fray_cluster, tmp_path)
    first = run("job", "submit", "--wait", "--json", "--name", "listed-a", "--", "echo", "a b")
    run("job", "submit", "--wait", "--name", "listed-b", "--", "false", expect=1)
    first_id = json.loads(first)["job_id"]
    rows = json.loads(run("job", "list", "--json", "--limit", "0"))
    ids = [r["job_id"] for r in rows]
    assert ids.index(first_id) > min(i for i, r in enumerate(rows) if r["name"] == "listed-b")  # newest first
    mine = next(r for r in rows if r["job_id"] == first_id)
    assert mine["command"] == "echo 'a b'" and mine["state"] == "succeeded"
    assert mine["submitted_at"] <= mine["started_at"] <= mine["finished_at"]
    assert mine["duration"] is not None and mine["duration"] >= 0
    assert len(json.loads(run("job", "list", "--json", "--limit", "1"))) == 1
    failed = json.loads(run("job", "list", "--json", "--state", "failed", "--limit", "0"))
    assert failed and {r["state"] for r in failed} == {"failed"}
    assert any(r["name"] == "listed-b" for r in failed)
    table = run("job", "list")
    assert first_id in table and "echo 'a b'" in table


def test_status_shows_resources_in_use_jobs_and_actors(fray_cluster: LocalCluster, tmp_path: Path):
    run = _cli(fray_cluster, tmp_path)
    gate = tmp_path / "gate"
    job_id = run(
        "job", "submit", "--cpu", "3", "--", "bash", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    ).strip()
    client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
    actor = client.create_actor(Greeter, name="greeter")
    client.create_queue("inbox").push("first")
    try:
        assert actor.hello() == "hi"
        wait_until(lambda: client._controller.job(job_id).state.value == "running", what="the job to run")
        data = json.loads(run("status", "--json"))
        workers = {w["worker_id"]: w for w in data["workers"]}
        assert {"worker-0", "worker-1"} <= set(workers)
        busy = [w for w in workers.values() if w["cpu_used"] >= 3]
        assert busy and all(w["cpu_free"] == w["cpu_total"] - w["cpu_used"] for w in workers.values())
        assert data["jobs"]["running"] >= 2
        greeters = [a for a in data["actors"] if a["name"] == "greeter" and a["namespace"] == client.namespace]
        assert greeters and greeters[0]["endpoints"] and greeters[0]["endpoints"][0]["address"].startswith("actor://")
        queues = {q["queue"]: q for q in data["queues"]}
        assert queues[f"{client.namespace}/inbox"]["pending"] == 1
        assert data["controller"]["address"] == fray_cluster.address
        assert data["controller"]["retention"]["max_jobs"] == 10_000
        text = run("status")
        assert "worker-0" in text and "greeter" in text and "capacity" in text
    finally:
        gate.touch()
        client.shutdown(wait=False)


def test_a_drained_worker_is_listed_as_stopped_apart_from_lost_ones(tmp_path: Path):
    from fray.cluster.protocol.controller_client import ops_client
    from fray.cluster.server.dashboard.pages import workers_page

    with LocalCluster(tmp_path / "cluster", worker_timeout=2.0) as cluster:
        cluster.start(3)
        run = _cli(cluster, tmp_path)
        cluster.workers["worker-1"].send_signal(signal.SIGTERM)  # drains: it tells the controller it leaves
        assert cluster.workers["worker-1"].wait(timeout=30) == 0
        cluster.kill_worker("worker-2")  # a crash: lost after the worker timeout
        wait_until(
            lambda: (
                {w["worker_id"]: w["state"] for w in json.loads(run("worker", "list", "--json"))}
                == {"worker-0": "alive", "worker-1": "stopped", "worker-2": "lost"}
            ),
            timeout=30,
            what="one worker stopped and one lost",
        )
        status = run("status")
        assert "1 worker alive (1 lost, 1 stopped)" in status
        assert "stopped workers (drained or scaled down, not lost) 1: worker-1" in status
        table = status.split("stopped workers")[0]
        assert "worker-2" in table and "worker-1" not in table.split("workers", 1)[1], "stopped ones are apart"
        listing = run("worker", "list")
        assert listing.index("worker-2") < listing.index("stopped (drained or scaled down") < listing.index("worker-1")
        ops = ops_client(cluster.address, cluster.token)
        try:
            page = workers_page(ops.status(), csrf="")
        finally:
            ops.close()
        assert "1 workers alive, 1 lost, 1 stopped" in page
        assert page.index("worker-2") < page.index("Stopped (drained or scaled down)") < page.index("worker-1")
