"""The driver-exit rule on a Fray cluster: a script's jobs outlive it unless detached=False, its actors end
with it, and at exit it says which jobs keep running and how to list and stop them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from fray.job import JobStatus
from support import wait_until

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import fray
    from fray import Entrypoint, JobRequest

    class Holder:
        def ping(self):
            return "pong"

    client = fray.current_client()
    sleeper = lambda name: JobRequest(name=name, entrypoint=Entrypoint.from_binary("sleep", ["300"]))
    kept = client.submit(sleeper("kept"))
    attached = client.submit(sleeper("attached"), detached=False)
    done = client.submit(JobRequest(name="done", entrypoint=Entrypoint.from_binary("true")))
    done.wait(timeout=120)
    actor = client.create_actor(Holder, name="holder")
    assert actor.ping() == "pong"
    print(json.dumps({"kept": kept.job_id, "attached": attached.job_id, "namespace": client.namespace,
                      "actor_job": actor._job_id}))
    """
)


def test_jobs_outlive_the_script_unless_attached_and_the_script_says_so(fray_cluster: LocalCluster, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(tmp_path), FRAY_TOKEN=fray_cluster.token, FRAY_CLIENT_SPEC=f"fray://{fray_cluster.address}")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    ids = json.loads(out.stdout)
    client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
    try:
        controller = client._controller
        assert controller.job(ids["kept"]).state == JobStatus.RUNNING
        wait_until(lambda: controller.job(ids["attached"]).state == JobStatus.STOPPED, what="the attached job to stop")
        wait_until(lambda: controller.job(ids["actor_job"]).state == JobStatus.STOPPED, what="the actor to stop")
        notice = out.stderr
        assert (
            f"1 job of this script keeps running on the Fray cluster at {fray_cluster.address}: {ids['kept']}" in notice
        )
        assert f"fray job stop --namespace {ids['namespace']}" in notice
        assert f"stopped 1 job submitted with detached=False: {ids['attached']}" in notice

        # The CLI lists and stops the script's leftovers by namespace.
        cli_env = {**env, "HOME": str(tmp_path)}
        listed = subprocess.run(
            [sys.executable, "-m", "fray.cli", "job", "list", "--json", "--namespace", ids["namespace"]],
            env=cli_env,
            capture_output=True,
            text=True,
        )
        states = {row["job_id"]: row["state"] for row in json.loads(listed.stdout)}
        assert states[ids["kept"]] == "running"
        stopped = subprocess.run(
            [sys.executable, "-m", "fray.cli", "job", "stop", "--namespace", ids["namespace"]],
            env=cli_env,
            capture_output=True,
            text=True,
        )
        assert stopped.returncode == 0 and f"{ids['kept']} stopped" in stopped.stdout
    finally:
        client.shutdown(wait=False)
