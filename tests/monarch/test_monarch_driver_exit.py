"""The driver-exit rule on Monarch: jobs are processes of the script's host, end with it, and it says which."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from support import alive, wait_until

pytest.importorskip("monarch", reason='the Monarch backend needs Monarch: pip install "fray[monarch]"')

SCRIPT = textwrap.dedent(
    """
    import time
    import fray
    from fray import Entrypoint, JobRequest

    client = fray.current_client()
    client.submit(JobRequest(name="finished", entrypoint=Entrypoint.from_callable(print, args=("x",)))).wait()
    sleeper = JobRequest(name="forever", entrypoint=Entrypoint.from_binary("sleep", ["300"]))
    running = client.submit(sleeper, detached=False)
    while running.status().value != "running":
        time.sleep(0.01)
    print(running.job_id)
    """
)


def test_monarch_jobs_end_with_the_script_and_it_says_which(tmp_path):
    env = {**os.environ, "FRAY_CLIENT_SPEC": "monarch"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    assert f"fray: 1 job ends with this script (Monarch jobs are processes of this script's host): {job_id}" in (
        out.stderr
    )
    assert "finished" not in out.stderr.split("fray: 1 job ends")[1]


KILLED_DRIVER = textwrap.dedent(
    """
    import sys, time
    import fray
    from fray import Entrypoint, JobRequest

    marker = sys.argv[1]
    script = f"echo $$ > {marker}.tmp && mv {marker}.tmp {marker} && exec sleep 300"
    fray.current_client().submit(JobRequest(name="orphan", entrypoint=Entrypoint.from_binary("sh", ["-c", script])))
    print("submitted", flush=True)
    time.sleep(300)  # killed by the test long before
    """
)


def test_a_jobs_processes_end_when_its_driver_is_killed(tmp_path):
    marker = tmp_path / "job.pid"
    env = {**os.environ, "FRAY_CLIENT_SPEC": "monarch"}
    driver = subprocess.Popen(
        [sys.executable, "-c", KILLED_DRIVER, str(marker)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_until(marker.exists, timeout=120, what="the job to start")
        job_pid = int(marker.read_text())
        assert alive(job_pid)
    finally:
        driver.kill()  # SIGKILL: no atexit hook runs, nothing is reaped by the driver
        driver.wait(timeout=60)
    wait_until(lambda: not alive(job_pid), timeout=30, what="the job's process to end with its driver")
