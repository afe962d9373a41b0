"""The driver-exit rule on Ray: binary jobs outlive the driver unless detached=False; the exit hook stops the
attached ones and names the ones that keep running."""

from __future__ import annotations

from typing import Any

import pytest

from fray.job import Entrypoint, JobRequest, JobStatus
from fray.ray import _driver_exit
from support import wait_until


def test_the_exit_hook_stops_attached_binary_jobs_and_names_the_detached_ones(
    ray_client: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    import ray

    # Binary jobs go through Ray's job API, which finds the cluster by itself and gives up when another
    # Ray runs on the same machine: name ours.
    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)

    def sleeper(name: str) -> JobRequest:
        return JobRequest(name=name, entrypoint=Entrypoint.from_binary("sleep", ["300"]))

    kept = ray_client.submit(sleeper("kept"))
    attached = ray_client.submit(sleeper("attached"), detached=False)
    try:
        wait_until(lambda: attached.status() == JobStatus.RUNNING and kept.status() == JobStatus.RUNNING, 120)
        _driver_exit.RULE.settle()  # what runs when the script exits
        wait_until(lambda: attached.status() == JobStatus.STOPPED, 120, "the attached job to stop")
        assert kept.status() == JobStatus.RUNNING
        notice = capsys.readouterr().err
        assert f"keeps running on Ray: {kept.job_id}" in notice
        assert f"stopped 1 job submitted with detached=False: {attached.job_id}" in notice
    finally:
        kept.terminate()
