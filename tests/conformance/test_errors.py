"""One error form and one lifecycle on every backend: what users catch, and what the messages say."""

from __future__ import annotations

import pickle
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

import fray
from fray import Entrypoint, JobFailed, JobRequest, JobStatus, RemoteError, SerializationError, current_job
from fray.core._lifecycle import Failure, RetryBudget
from support import wait_until


class QuotaExceeded(Exception):
    """A user exception class with extra state, defined in the test module (importable by workers)."""

    def __init__(self, message: str, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit

    def __reduce__(self):
        return (QuotaExceeded, (self.args[0], self.limit))


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def raise_quota(limit: int) -> None:
    raise QuotaExceeded(f"over quota {limit}", limit)


def always_fails() -> None:
    raise RuntimeError("always fails")


def replica_one_always_fails() -> None:
    info = current_job()
    assert info is not None
    if info.replica_index == 1:
        raise RuntimeError("replica 1 always fails")


def print_forever(marker: str) -> None:
    i = 0
    while True:
        i += 1
        print(f"tick {i}", flush=True)
        Path(marker).write_text(str(i))
        time.sleep(0.01)


class Service:
    """An actor whose methods fail in the ways users' actors do."""

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def quota(self, limit: int) -> None:
        raise QuotaExceeded(f"over quota {limit}", limit)

    def echo(self, value):
        return value

    def unpicklable_result(self):
        return threading.Lock()


def test_failed_job_is_both_job_failed_and_the_users_exception(client, uid):
    job = client.submit(
        JobRequest(name=f"bad-{uid}", entrypoint=Entrypoint.from_callable(raise_value_error, args=("widget broke",)))
    )
    with pytest.raises(ValueError) as info:
        job.wait(timeout=60)
    err = info.value
    assert isinstance(err, JobFailed)
    assert err.job_id == job.job_id
    assert str(err) == f"job {job.job_id!r} failed: ValueError: widget broke"
    assert err.args == ("widget broke",)
    assert isinstance(err.cause, ValueError) and str(err.cause) == "widget broke"
    assert "raise_value_error" in err.traceback_text
    # The trimmed traceback starts at the user's code: none of Fray's machinery above it.
    assert "fray/" not in err.traceback_text.split("raise_value_error")[0]
    # The original is the __cause__ (Ray's RayTaskError and marin's rule): code that checks it finds the
    # user's ValueError; printed, the error still shows where the job raised it.
    assert err.__cause__ is err.cause
    printed = "".join(traceback.format_exception(err))
    assert "raise_value_error" in printed and "widget broke" in printed


def test_user_exception_state_survives_and_the_error_pickles(client, uid):
    job = client.submit(JobRequest(name=f"quota-{uid}", entrypoint=Entrypoint.from_callable(raise_quota, args=(7,))))
    with pytest.raises(QuotaExceeded) as info:
        job.wait(timeout=60)
    err = info.value
    assert isinstance(err, JobFailed) and err.limit == 7
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, QuotaExceeded) and isinstance(again, JobFailed)
    assert str(again) == str(err) and again.limit == 7


def test_wait_all_raises_the_same_dual_exception(client, uid):
    bad = client.submit(
        JobRequest(name=f"bad-{uid}", entrypoint=Entrypoint.from_callable(raise_value_error, args=("first",)))
    )
    with pytest.raises(ValueError) as info:
        fray.wait_all([bad], timeout=60)
    assert isinstance(info.value, JobFailed)


def test_failed_actor_call_is_both_remote_error_and_the_users_exception(client, uid):
    actor = client.create_actor(Service, name=f"svc-{uid}")
    with pytest.raises(ValueError) as info:
        actor.fail("bad input")
    err = info.value
    assert isinstance(err, RemoteError)
    assert str(err) == "ValueError: bad input"
    assert err.args == ("bad input",)
    assert "in fail" in err.traceback_text
    with pytest.raises(QuotaExceeded) as quota:
        actor.quota.remote(3).result(timeout=60)
    assert isinstance(quota.value, RemoteError) and quota.value.limit == 3
    assert actor.echo(5) == 5  # the actor lives on after its methods raised


def test_retry_exhausted_message_is_the_same_everywhere(client, uid):
    job = client.submit(
        JobRequest(
            name=f"exhaust-{uid}",
            entrypoint=Entrypoint.from_callable(always_fails),
            max_retries_failure=2,
        )
    )
    with pytest.raises(RuntimeError) as info:
        job.wait(timeout=120)
    expected = RetryBudget(2, 100, failures=2).exhausted_message(Failure("RuntimeError: always fails"))
    assert str(info.value) == f"job {job.job_id!r} failed: {expected}"


def test_gang_retry_exhausted_message_is_the_same_everywhere(client, uid):
    job = client.submit(
        JobRequest(
            name=f"gang-{uid}",
            entrypoint=Entrypoint.from_callable(replica_one_always_fails),
            replicas=2,
            max_retries_failure=1,
        )
    )
    with pytest.raises(RuntimeError) as info:
        job.wait(timeout=120)
    failure = Failure("RuntimeError: replica 1 always fails").in_replica(1, 2)
    expected = RetryBudget(1, 100, failures=1).exhausted_message(failure)
    assert str(info.value) == f"job {job.job_id!r} failed: {expected}"


def test_job_without_retries_fails_with_the_plain_reason(client, uid):
    job = client.submit(JobRequest(name=f"once-{uid}", entrypoint=Entrypoint.from_callable(always_fails)))
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=60)
    assert str(info.value) == f"job {job.job_id!r} failed: RuntimeError: always fails"


def test_binary_failure_reads_the_same_everywhere(client, uid):
    job = client.submit(
        JobRequest(
            name=f"exit-{uid}",
            entrypoint=Entrypoint.from_binary(sys.executable, ["-c", "print('about to fail'); raise SystemExit(3)"]),
        )
    )
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=120)
    err = info.value
    assert err.exit_code == 3
    assert err.message.startswith(f"{sys.executable!r} exit code 3; last output:")
    assert "about to fail" in err.message


def test_unpicklable_actor_argument_is_refused_with_the_same_error(client, uid):
    actor = client.create_actor(Service, name=f"svc-{uid}")
    lock = threading.Lock()
    with pytest.raises(SerializationError) as info:
        actor.echo(lock)
    message = str(info.value)
    assert message.startswith(f"actor {actor_name(uid)!r}, method 'echo': argument 0 cannot be pickled")
    with pytest.raises(SerializationError) as kw:
        actor.echo.remote(value=lock)
    assert "keyword argument 'value' cannot be pickled" in str(kw.value)
    assert actor.echo(1) == 1


def actor_name(uid: str) -> str:
    return f"svc-{uid}"


def test_unpicklable_actor_result_is_a_serialization_error(client, uid):
    actor = client.create_actor(Service, name=f"svc-{uid}")
    with pytest.raises(SerializationError) as info:
        actor.unpicklable_result()
    assert "unpicklable_result" in str(info.value)
    assert actor.echo(2) == 2


def test_terminated_callable_job_stops_running(client, uid, tmp_path: Path):
    marker = tmp_path / "ticks"
    job = client.submit(
        JobRequest(name=f"loop-{uid}", entrypoint=Entrypoint.from_callable(print_forever, args=(str(marker),)))
    )
    wait_until(lambda: marker.exists() and int(marker.read_text() or 0) >= 3, timeout=60, what="the job to tick")
    job.terminate()
    assert job.wait(timeout=30) == JobStatus.STOPPED
    seen = marker.read_text()
    # The job ticks every 10 ms while it runs: a window of 50 ticks shows that it no longer does.
    time.sleep(0.5)
    assert marker.read_text() == seen
    lines = job.logs()
    time.sleep(0.2)
    assert job.logs() == lines


def test_a_remote_traceback_names_the_file_and_line_of_code_shipped_by_value(client, uid):
    # A function defined inside another cannot be imported by name: every backend that runs it
    # elsewhere ships its code by value. Its traceback must still read as a local one would.
    def fails_here() -> None:
        raise LookupError("shipped by value")  # the line the traceback shows

    request = JobRequest(name=f"byvalue-{uid}", entrypoint=Entrypoint.from_callable(fails_here))
    with pytest.raises(JobFailed) as info:
        client.submit(request).wait(timeout=120)
    text = info.value.traceback_text
    assert f'File "{__file__}", line' in text and "in fails_here" in text, text
    assert 'raise LookupError("shipped by value")  # the line the traceback shows' in text, text
