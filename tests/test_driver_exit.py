"""The driver-exit rule on the local backend: jobs run inside the script and end with it, and it says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import time
    import fray
    from fray import Entrypoint, JobRequest

    client = fray.current_client()
    client.submit(JobRequest(name="finished", entrypoint=Entrypoint.from_callable(print, args=("x",)))).wait()
    running = client.submit(JobRequest(name="forever", entrypoint=Entrypoint.from_binary("sleep", ["300"])))
    while running.status().value != "running":
        time.sleep(0.01)
    print(running.job_id)
    """
)


def test_local_jobs_end_with_the_script_and_it_says_which():
    env = {**os.environ, "FRAY_CLIENT_SPEC": "local"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    assert "fray: 1 job ends with this script (the local backend runs jobs inside the script's process)" in out.stderr
    assert job_id in out.stderr and "finished" not in out.stderr
