"""The driver-exit rule on every backend (``fray.core._driver_exit``): what becomes of a script's jobs when it exits.

Jobs that the backend runs outside the script keep running unless submitted with
``detached=False``, which are stopped; jobs that run inside the script end with it. One
notice on stderr says which. The test calls what the exit hook calls for a client
(``_settle_at_exit``); the scripts in ``tests/test_driver_exit.py``,
``tests/cluster/test_driver_exit.py`` and ``tests/monarch/test_monarch_driver_exit.py``
check the hook itself at a real exit.
"""

from __future__ import annotations

import pytest

from fray import Entrypoint, JobRequest, JobStatus
from support import wait_until

# Where a binary job runs: outside the script (it outlives it) or inside (it ends with it).
OUTLIVES_THE_SCRIPT = {"local": False, "monarch": False, "ray": True, "fray": True, "iris": True}


def sleeper(name: str) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_binary("sleep", ["300"]))


def _line(notice: str, words: str) -> str:
    found = [line for line in notice.splitlines() if words in line]
    assert len(found) == 1, f"expected one line with {words!r} in:\n{notice}"
    return found[0]


def test_at_exit_attached_jobs_stop_and_one_notice_names_what_is_left(
    client, uid, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    outlives = OUTLIVES_THE_SCRIPT[request.node.callspec.params["client"]]
    done = client.submit(JobRequest(name=f"done-{uid}", entrypoint=Entrypoint.from_binary("true")))
    assert done.wait(timeout=120) == JobStatus.SUCCEEDED
    kept = client.submit(sleeper(f"kept-{uid}"))
    attached = client.submit(sleeper(f"attached-{uid}"), detached=False)
    try:
        wait_until(
            lambda: kept.status() == JobStatus.RUNNING and attached.status() == JobStatus.RUNNING,
            120,
            "both jobs to run",
        )
        capsys.readouterr()
        client._settle_at_exit()  # what the exit hook runs for this client
        notice = capsys.readouterr().err
        assert done.job_id not in notice, notice
        assert all(line.startswith(("fray: ", "      ")) for line in notice.splitlines()), notice
        if outlives:
            wait_until(lambda: attached.status() == JobStatus.STOPPED, 120, "the attached job to stop")
            assert kept.status() == JobStatus.RUNNING
            keeps = _line(notice, "of this script keeps running on")
            assert kept.job_id in keeps and attached.job_id not in keeps
            assert attached.job_id in _line(notice, "stopped 1 job submitted with detached=False")
        else:
            ending = _line(notice, "jobs end with this script")
            assert kept.job_id in ending and attached.job_id in ending
            assert "keeps running" not in notice and "stopped" not in notice
    finally:
        kept.terminate()
        attached.terminate()


def test_a_shut_down_client_has_nothing_to_say_at_exit(client, uid, capsys: pytest.CaptureFixture[str]) -> None:
    job = client.submit(sleeper(f"stopped-{uid}"), detached=False)
    wait_until(lambda: job.status() == JobStatus.RUNNING, 120, "the job to run")
    client.shutdown(wait=False)
    assert job.wait(timeout=120, raise_on_failure=False) == JobStatus.STOPPED
    capsys.readouterr()
    client._settle_at_exit()
    assert capsys.readouterr().err == ""
