"""The pending notice's setting: ``FRAY_PENDING_NOTICE_SECONDS`` (the behaviour is in tests/conformance/test_pending.py)."""

from __future__ import annotations

import pytest

from fray import ConfigError, Entrypoint, JobRequest, JobStatus
from fray._pending_notice import ENV_VAR, notice_seconds
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
