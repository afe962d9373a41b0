"""The controller service on its own (no network, no processes): what it keeps in memory and what it hands out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.capacity import WorkerInfo
from fray.cluster.controller import ControllerService
from fray.cluster.messages import JobSpec
from fray.cluster.store import ClusterStore
from fray.job import Entrypoint, JobRequest


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClusterStore]:
    with ClusterStore(tmp_path / "cluster.db") as s:
        yield s


def test_the_spec_cache_is_bounded_and_a_dropped_spec_is_read_back(store: ClusterStore) -> None:
    service = ControllerService(store, spec_cache_size=2)
    specs = [
        JobSpec.from_request(JobRequest(name=f"job{i}", entrypoint=Entrypoint.from_binary("true", [str(i)])))
        for i in range(3)
    ]
    for spec in specs:
        service.submit(spec, user="alice")
    assert len(service._specs) == 2, "only the most recently used specs stay in memory"
    epoch = service.register_worker(WorkerInfo("w-1", 8000, 32 << 30, 100 << 30), "10.0.0.1:1", []).epoch
    assert len(service.schedule_once()) == 3
    started = service.poll("w-1", epoch, 0.0).start
    assert sorted(a.spec.argv for a in started if a.spec.argv) == [("true", "0"), ("true", "1"), ("true", "2")]
    assert len(service._specs) == 2
