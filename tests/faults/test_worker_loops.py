"""A worker survives input that cannot be run and keeps taking work (issue 10, case 3)."""

from __future__ import annotations

import pytest

from fray import Entrypoint, EnvironmentConfig, JobFailed, JobRequest, JobStatus
from fray.cluster.launcher import LocalCluster

from .helpers import with_workers


@pytest.mark.parametrize("where", ["argv", "env"])
def test_a_nul_byte_fails_the_job_and_the_worker_keeps_working(cluster: LocalCluster, where: str) -> None:
    client = with_workers(cluster, 2)
    if where == "argv":
        request = JobRequest(name="nul", entrypoint=Entrypoint.from_binary("echo", ["a\0b"]))
    else:
        request = JobRequest(
            name="nul",
            entrypoint=Entrypoint.from_binary("true"),
            environment=EnvironmentConfig(env_vars={"BAD": "x\0y"}),
        )
    bad = client.submit(request)
    with pytest.raises(JobFailed, match="NUL byte"):
        bad.wait(timeout=60)
    for i in range(3):  # the same (only) worker still runs jobs
        good = client.submit(JobRequest(name=f"fine-{i}", entrypoint=Entrypoint.from_binary("true")))
        assert good.wait(timeout=60) == JobStatus.SUCCEEDED
