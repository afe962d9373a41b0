"""Priority bands (``JobRequest.priority``, ``ActorConfig.priority``) every backend must show: the same numbers as
Iris's bands, refused by name when they are not one, and inherited by what a job submits."""

from __future__ import annotations

import pytest
from test_jobs import Recorder

from fray import (
    ActorConfig,
    ConfigError,
    Entrypoint,
    JobRequest,
    JobStatus,
    PriorityBand,
    current_client,
    current_job,
)


def report_band(recorder, tag: str) -> None:
    info = current_job()
    assert info is not None
    recorder.add((tag, info.priority_band))


def submit_a_child_with_priority(recorder, priority: int) -> None:
    report_band(recorder, "parent")
    child = current_client().submit(
        JobRequest(
            name="child", entrypoint=Entrypoint.from_callable(report_band, args=(recorder, "child")), priority=priority
        )
    )
    assert child.wait(timeout=90) == JobStatus.SUCCEEDED


class BandReporter:
    def band(self) -> int:
        info = current_job()
        assert info is not None
        return info.priority_band


@pytest.mark.parametrize("bad", [4, -1, 7, True, "batch", 2.0])
def test_a_priority_that_is_not_a_band_is_refused_naming_the_bands(bad):
    with pytest.raises(
        ConfigError, match=r"is not a priority band: use 1 \(production\), 2 \(interactive\), 3 \(batch\)"
    ):
        JobRequest(name="x", entrypoint=Entrypoint.from_binary("true"), priority=bad)
    with pytest.raises(ConfigError, match=r"ActorConfig\(priority=.*is not a priority band"):
        ActorConfig(priority=bad)


def test_the_bands_are_iris_s_numbers():
    assert [int(b) for b in PriorityBand] == [0, 1, 2, 3]
    assert [b.label for b in PriorityBand] == ["inherit", "production", "interactive", "batch"]


@pytest.mark.parametrize(("priority", "band"), [(0, 2), (PriorityBand.PRODUCTION, 1), (3, 3)])
def test_a_job_runs_in_its_band_a_top_level_default_is_interactive(client, uid, priority, band):
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(
        JobRequest(
            name=f"band-{uid}",
            entrypoint=Entrypoint.from_callable(report_band, args=(recorder, "job")),
            priority=priority,
        )
    )
    assert job.wait(timeout=90) == JobStatus.SUCCEEDED
    assert recorder.get() == [("job", band)]


def test_a_job_s_children_inherit_its_band_unless_they_name_one(client, uid):
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    inherit = client.submit(
        JobRequest(
            name=f"batch-{uid}",
            entrypoint=Entrypoint.from_callable(submit_a_child_with_priority, args=(recorder, 0)),
            priority=PriorityBand.BATCH,
        )
    )
    assert inherit.wait(timeout=120) == JobStatus.SUCCEEDED
    named = client.submit(
        JobRequest(
            name=f"batch2-{uid}",
            entrypoint=Entrypoint.from_callable(submit_a_child_with_priority, args=(recorder, 1)),
            priority=PriorityBand.BATCH,
        )
    )
    assert named.wait(timeout=120) == JobStatus.SUCCEEDED
    assert recorder.get() == [("parent", 3), ("child", 3), ("parent", 3), ("child", 1)]


def test_an_actor_runs_in_its_band(client, uid):
    batch = client.create_actor(BandReporter, name=f"bands-{uid}", actor_config=ActorConfig(priority=3))
    default = client.create_actor(BandReporter, name=f"bandd-{uid}")
    assert batch.band() == 3
    assert default.band() == 2
