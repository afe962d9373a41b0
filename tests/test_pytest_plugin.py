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
    import pytest

    import fray
    from fray import JobRequest
    from _hung_work import Stuck, hung_here


    @pytest.mark.timeout({timeout})
    def test_waits_for_a_job_that_never_ends():
        client = fray.client_from_spec({spec!r})
        job = client.submit(JobRequest(name="hung", entrypoint=fray.Entrypoint.from_callable(hung_here, args=(1,))))
        actor = client.create_actor(Stuck, name="stuck")
        actor.block.remote()
        job.wait()
    """
)
TESTS = str(Path(__file__).resolve().parent)


def _run(tmp_path: Path, *args: str, timeout: float = 3, spec: str = "local", env: dict[str, str] | None = None) -> str:
    (tmp_path / "test_hung.py").write_text(HUNG_TEST.format(timeout=timeout, spec=spec))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}, "PYTHONPATH": TESTS, **(env or {})}
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
    timeout_at = output.index("Timeout", ours)
    assert output.index("in actor_stuck_in_its_method", ours) < timeout_at, output
    assert output.index("threading.Event().wait()  # never set", ours) < timeout_at, output


def test_without_the_plugin_nothing_is_printed(tmp_path: Path) -> None:
    output = _run(tmp_path, "-s")
    assert "fray: live stacks" not in output and "Timeout" in output


def test_on_a_fray_cluster_the_stacks_are_the_remote_processes(tmp_path: Path, fray_cluster) -> None:
    env = {"FRAY_TOKEN": fray_cluster.token}
    output = _run(tmp_path, "-p", "fray.testing", "-s", timeout=10, spec=f"fray://{fray_cluster.address}", env=env)
    ours = output.index("fray: live stacks of 2 running job(s) and actor(s)")
    timeout_at = output.index("Timeout", ours)
    assert output.index("in hung_here", ours) < timeout_at, output
    assert output.index("in actor_stuck_in_its_method", ours) < timeout_at, output
    # pytest-timeout's own dump shows this process's threads only: the job ran in a worker's process.
    assert "in hung_here" not in output[timeout_at:], output
