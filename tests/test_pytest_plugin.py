"""``pytest -p fray.testing``: a test that hangs on Fray work prints that work's live stacks before its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HUNG_TEST = textwrap.dedent(
    """
    import threading

    import pytest

    import fray
    from fray import JobRequest


    def hung_here(flag):
        threading.Event().wait()  # never set: the job is stuck here


    def actor_stuck_in_its_method():
        threading.Event().wait()


    class Stuck:
        def block(self):
            actor_stuck_in_its_method()


    @pytest.mark.timeout({timeout})
    def test_waits_for_a_job_that_never_ends():
        client = fray.client_from_spec("local")
        job = client.submit(JobRequest(name="hung", entrypoint=fray.Entrypoint.from_callable(hung_here, args=(1,))))
        actor = client.create_actor(Stuck, name="stuck")
        actor.block.remote()
        job.wait()
    """
)


def _run(tmp_path: Path, *args: str, timeout: float = 3) -> str:
    (tmp_path / "test_hung.py").write_text(HUNG_TEST.format(timeout=timeout))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", os.devnull, *args, "test_hung.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order it was written
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout  # the hung test failed (timed out); nothing else broke
    return run.stdout


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_a_timed_out_test_prints_its_remote_work_s_stacks_first(tmp_path: Path, method: str) -> None:
    output = _run(tmp_path, "-p", "fray.testing", f"--timeout-method={method}", "-s")
    assert "fray: live stacks of 2 running job(s) and actor(s)" in output, output
    ours = output.index("fray: live stacks")
    # Where the job and the actor are stuck, with the file and line, before pytest-timeout's own report.
    assert output.index("in hung_here", ours) < output.index("Timeout", ours), output
    assert "in actor_stuck_in_its_method" in output[ours:], output
    assert "threading.Event().wait()  # never set" in output[ours:], output


def test_without_the_plugin_nothing_is_printed(tmp_path: Path) -> None:
    output = _run(tmp_path, "-s")
    assert "fray: live stacks" not in output and "Timeout" in output
