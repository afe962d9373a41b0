"""``ClusterClient.submit_many`` refuses exactly what ``submit`` refuses and honours what it honours.

``ClientCore.submit_many`` applies ``submit``'s check to every request before any starts
(:func:`fray.core._adopt.adopt_or_check` with the client's ``HONOURS``); the cluster only sends them.
"""

from __future__ import annotations

import pytest

from fray import ConfigError, Entrypoint, EnvironmentConfig, GpuConfig, JobRequest, JobStatus, ResourceConfig
from fray.cluster.client import ClusterClient


def noop() -> None:
    return None


def job(name: str, **fields) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_callable(noop), **fields)


def test_a_marin_setting_the_cluster_does_not_honour_is_refused_by_both_naming_it(cluster_client: ClusterClient):
    request = job("unhonoured", environment=EnvironmentConfig(sync_packages=["marin-core"]))
    assert "EnvironmentConfig.sync_packages" not in ClusterClient.HONOURS
    for submit in (cluster_client.submit, lambda r: cluster_client.submit_many([job("fine"), r])):
        with pytest.raises(ConfigError, match=r"EnvironmentConfig\(sync_packages="):
            submit(request)
    assert cluster_client._owned_work()[0] == []  # the batch was refused whole, before anything was recorded


def test_submit_many_honours_processes_per_task_and_checks_it(cluster_client: ClusterClient):
    gpus = ResourceConfig(device=GpuConfig("auto", count=3))
    with pytest.raises(ConfigError, match="processes_per_task=2 must divide the 3 GPUs"):
        cluster_client.submit_many([job("gpus", resources=gpus, processes_per_task=2)])
    handles = cluster_client.submit_many([job("two", processes_per_task=2), job("one")])
    assert [h.wait(timeout=120) for h in handles] == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED]
