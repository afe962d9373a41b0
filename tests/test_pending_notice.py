"""The pending notice's setting: ``FRAY_PENDING_NOTICE_SECONDS`` (the behaviour is in tests/conformance/test_pending.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, JobRequest, JobStatus
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from fray.core._pending_notice import ENV_VAR, notice_seconds
from fray.local import LocalClient


@pytest.mark.parametrize(("value", "seconds"), [("", 10.0), ("2.5", 2.5), ("0", 0.0), ("off", None), ("OFF", None)])
def test_the_setting_reads_seconds_or_off(monkeypatch: pytest.MonkeyPatch, value: str, seconds: float | None) -> None:
    monkeypatch.setenv(ENV_VAR, value)
    assert notice_seconds() == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_setting_is_named_once_and_the_default_used(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(ConfigError, match=f"{ENV_VAR}={value!r} must be a number"):
        notice_seconds()
    # At submit the job already runs: the setting is named on stderr (once), the job is not refused.
    with LocalClient(echo_logs=False) as client:
        jobs = [client.submit(JobRequest(name=f"ok{i}", entrypoint=Entrypoint.from_callable(print))) for i in range(2)]
        assert [job.wait(timeout=60) for job in jobs] == [JobStatus.SUCCEEDED] * 2
    named = [line for line in capsys.readouterr().err.splitlines() if ENV_VAR in line]
    assert len(named) == 1 and "using 10" in named[0], named


def nap(seconds: float) -> None:
    time.sleep(seconds)


def test_a_cluster_stopped_after_its_client_does_not_hold_up_later_notices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A script shut its client down and its cluster went away: no notice is due to anyone, and the
    # one watcher thread must not spend the controller's retry budget (a minute) asking about it.
    monkeypatch.setenv(ENV_VAR, "1")
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.start_controller()  # no worker: its job waits
        client = ClusterClient(cluster.address, token=cluster.token)
        client.submit(JobRequest(name="gone", entrypoint=Entrypoint.from_callable(print)))
        client.shutdown(wait=False)
    with LocalClient(max_threads=1, echo_logs=False) as local:
        hog = local.submit(JobRequest(name="hog", entrypoint=Entrypoint.from_callable(nap, (4,))))
        held = local.submit(JobRequest(name="held", entrypoint=Entrypoint.from_callable(print)))
        text = ""
        deadline = time.monotonic() + 20  # far less than the retry budget of a controller once reached
        while held.job_id not in text and time.monotonic() < deadline:
            text += capsys.readouterr().err
            time.sleep(0.05)  # a poll interval: the loop waits on the notice
        assert held.job_id in text, text
        held.terminate()
        hog.terminate()
