"""``submit(request, adopt_existing=...)`` (marin's): a live job of the same name is adopted, or refused by name.

With ``True`` the live job's handle comes back and nothing is submitted; with ``False``
``JobAlreadyExists`` carries that handle; once the job has ended, either submits anew.
``None`` (Fray's default) submits regardless, except where the engine itself refuses a
second live job of one name (Iris), which says so with ``JobAlreadyExists`` too.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, JobAlreadyExists, JobRequest, JobStatus
from support import wait_until


def run_once_gated(gate: str, runs: str) -> None:
    """Wait for ``gate`` to exist, then record one run in ``runs``."""
    deadline = time.monotonic() + 300
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(runs, "a") as f:
        f.write("ran\n")


def wait_for_iris_cleanup(client, job_id: str) -> None:
    """On Iris, wait until its local workers removed the finished job's task directory.

    Iris names a task's work directory after the task's id (a hash of the job's name and
    the task index) and the attempt, and removes it only after reporting the task finished,
    so a job submitted under the same name at once can lose its directory to that cleanup
    (see "Known differences" in docs/iris.md).
    """
    if type(client).__name__ != "IrisClient":
        return
    from iris.cluster.types import JobName

    token = JobName.from_wire(f"{job_id}/0").to_safe_token()
    pattern = os.path.join(tempfile.gettempdir(), "iris_local_autoscaler_*", "cache", "*", "workdirs", f"{token}_*")
    wait_until(lambda: not glob.glob(pattern), what=f"Iris's workers to remove {job_id}'s work directory")


def test_adopt_existing_returns_the_live_job_or_refuses_it_by_name(client, uid, tmp_path):
    gate, runs = tmp_path / "go", tmp_path / "runs"
    request = JobRequest(f"adopt-{uid}", Entrypoint.from_callable(run_once_gated, args=(str(gate), str(runs))))
    first = client.submit(request)
    try:
        adopted = client.submit(request, adopt_existing=True)
        assert adopted.job_id == first.job_id
        assert client.submit(request, True).job_id == first.job_id  # marin passes it by position too
        assert adopted.status() in (JobStatus.PENDING, JobStatus.RUNNING)
        with pytest.raises(JobAlreadyExists, match=f"adopt-{uid}") as refused:
            client.submit(request, adopt_existing=False)
        assert refused.value.handle is not None and refused.value.handle.job_id == first.job_id
        gate.touch()
        assert adopted.wait(timeout=120) == JobStatus.SUCCEEDED  # the adopted handle follows the same job
        assert first.wait(timeout=120) == JobStatus.SUCCEEDED
    finally:
        gate.touch()
    assert runs.read_text().splitlines() == ["ran"]  # adopting submitted nothing
    wait_for_iris_cleanup(client, first.job_id)
    again = client.submit(request, adopt_existing=True)  # nothing of that name is live: a new job
    assert again.wait(timeout=120) == JobStatus.SUCCEEDED
    assert runs.read_text().splitlines() == ["ran", "ran"]


def test_adopt_existing_must_be_a_bool_or_none(client, uid):
    request = JobRequest(f"adopt-bad-{uid}", Entrypoint.from_binary("true"))
    with pytest.raises(ConfigError, match=r"adopt_existing='yes'.*True, False or None"):
        client.submit(request, adopt_existing="yes")
