"""No silent waits: a job nothing can place says why, once, on the driver's stderr; ``info()`` and timeouts say it too.

The notice's delay is ``FRAY_PENDING_NOTICE_SECONDS`` (10 s for users); the tests set it
to a fraction of a second. What holds a job back differs by backend: no worker or node
has the cores it asks for; on the local backend (which runs whatever it is given on this
machine) every thread of ``LocalClient(max_threads=1)`` is taken.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fray import Entrypoint, JobRequest, JobStatus, ResourceConfig, wait_all
from fray.core._pending_notice import ENV_VAR
from fray.job import JobHandle
from fray.local import LocalClient

# More cores than any worker or node of the test backends has.
_TOO_MANY_CORES = 4096
_NOTICE = "is still pending after"


def nap(seconds: float) -> None:
    time.sleep(seconds)


@pytest.fixture
def quick_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "0.3")


@pytest.fixture
def held_back(client: Any, uid: str, quick_notice: None) -> Iterator[tuple[JobHandle, str]]:
    """A job that stays PENDING because nothing can place it, and a word its reason must contain."""
    started: list[JobHandle] = []
    if isinstance(client, LocalClient):
        client = LocalClient(max_threads=1, echo_logs=False)
        started.append(client.submit(JobRequest(name=f"hog-{uid}", entrypoint=Entrypoint.from_callable(nap, (20,)))))
        request = JobRequest(name=f"held-{uid}", entrypoint=Entrypoint.from_callable(print, ("ran",)))
        word = "max_threads=1"
    else:
        request = JobRequest(
            name=f"held-{uid}",
            entrypoint=Entrypoint.from_callable(print, ("ran",)),
            resources=ResourceConfig(cpu=_TOO_MANY_CORES),
        )
        word = str(_TOO_MANY_CORES)
    job = client.submit(request)
    started.append(job)
    try:
        yield job, word
    finally:
        for handle in started:
            handle.terminate()
            handle.wait(timeout=120, raise_on_failure=False)
        if isinstance(client, LocalClient):
            client.shutdown(wait=False)


def _stderr_until(capsys: pytest.CaptureFixture[str], found: str, seconds: float) -> str:
    """Everything written to stderr until ``found`` appears in it or ``seconds`` pass."""
    text = ""
    deadline = time.monotonic() + seconds
    while found not in text and time.monotonic() < deadline:
        text += capsys.readouterr().err
        time.sleep(0.05)  # a poll interval, not synchronisation: the loop waits on the condition
    return text


def test_a_job_nothing_can_place_says_why_once_on_stderr(held_back, capsys) -> None:
    job, word = held_back
    text = _stderr_until(capsys, _NOTICE, 60)
    notices = [line for line in text.splitlines() if _NOTICE in line]
    assert len(notices) == 1, text
    assert job.job_id in notices[0] and word in notices[0], notices[0]
    # Once is once: later looks print nothing more about it.
    assert _NOTICE not in _stderr_until(capsys, _NOTICE, 1.5)
    assert job.status() == JobStatus.PENDING


def test_info_carries_the_pending_reason(held_back) -> None:
    job, word = held_back
    deadline = time.monotonic() + 60
    info = job.info()
    while word not in info.pending_reason and time.monotonic() < deadline:
        time.sleep(0.1)  # a poll interval: the scheduler words the reason on its next pass
        info = job.info()
    assert info.job_id == job.job_id
    assert info.status == JobStatus.PENDING
    assert word in info.pending_reason, info


def test_timeouts_name_the_pending_job_and_why(held_back) -> None:
    job, word = held_back
    with pytest.raises(TimeoutError) as waited:
        job.wait(timeout=1.5)
    assert job.job_id in str(waited.value) and "pending" in str(waited.value)
    assert word in str(waited.value)
    with pytest.raises(TimeoutError) as all_waited:
        wait_all([job], timeout=1.5)
    message = str(all_waited.value)
    assert "1 of 1 jobs unfinished" in message
    assert f"{job.job_id} pending (" in message and word in message, message


def test_a_wait_all_timeout_names_each_unfinished_job_and_its_state(client, uid) -> None:
    done = client.submit(JobRequest(name=f"done-{uid}", entrypoint=Entrypoint.from_callable(print, ("ran",))))
    assert done.wait(timeout=120) == JobStatus.SUCCEEDED
    busy = client.submit(JobRequest(name=f"busy-{uid}", entrypoint=Entrypoint.from_callable(nap, (120,))))
    try:
        deadline = time.monotonic() + 120
        while busy.status() != JobStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.1)  # a poll interval while the job starts
        with pytest.raises(TimeoutError) as waited:
            wait_all([done, busy], timeout=1.0)
        message = str(waited.value)
        assert "1 of 2 jobs unfinished" in message and f"{busy.job_id} running" in message, message
        assert done.job_id not in message
    finally:
        busy.terminate()
        busy.wait(timeout=120, raise_on_failure=False)


def test_a_burst_nothing_can_place_says_why_in_one_line(client: Any, uid: str, quick_notice: None, capsys) -> None:
    # A thousand jobs waiting for the same thing must not print a thousand lines: one counts them.
    burst = 12
    owner = client
    started: list[JobHandle] = []
    if isinstance(client, LocalClient):
        owner = LocalClient(max_threads=1, echo_logs=False)
        started.append(owner.submit(JobRequest(name=f"hog-{uid}", entrypoint=Entrypoint.from_callable(nap, (20,)))))
        resources = ResourceConfig()
        word = "max_threads=1"
    else:
        resources = ResourceConfig(cpu=_TOO_MANY_CORES)
        word = str(_TOO_MANY_CORES)
    requests = [
        JobRequest(name=f"held{i}-{uid}", entrypoint=Entrypoint.from_callable(print, ("ran",)), resources=resources)
        for i in range(burst)
    ]
    jobs = [owner.submit(request) for request in requests]
    started.extend(jobs)
    try:
        text = _stderr_until(capsys, "still pending after", 60)
        text += _stderr_until(capsys, "never printed", 2.0)  # anything printed about the others soon after
        notices = [line for line in text.splitlines() if "still pending after" in line]
        assert len(notices) == 1, text
        assert f"{burst} jobs are still pending after" in notices[0] and word in notices[0], notices[0]
        assert jobs[0].job_id in notices[0] and f"and {burst - 3} more" in notices[0], notices[0]
    finally:
        for handle in started:
            handle.terminate()
        for handle in started:
            handle.wait(timeout=120, raise_on_failure=False)
        if owner is not client:
            owner.shutdown(wait=False)
