"""The shared lifecycle and remote-failure form, on their own (the backends' use is in tests/conformance)."""

from __future__ import annotations

import gc
import pickle
import threading
import weakref

import pytest

from fray import JobFailed, JobStatus, RemoteError
from fray.core._lifecycle import TRANSITIONS, Failure, FailureKind, JobLifecycle, RetryBudget, check_transition
from fray.core._remote import RemoteFailure, job_failed, remote_error, user_traceback
from fray.errors import IllegalTransition


def capture(exc: BaseException) -> RemoteFailure:
    try:
        raise exc
    except BaseException as caught:
        return RemoteFailure.capture(caught)


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def test_final_states_have_no_way_out_and_retry_is_running_to_pending():
    for final in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert TRANSITIONS[final] == frozenset()
        with pytest.raises(IllegalTransition):
            check_transition(final, JobStatus.RUNNING)
    check_transition(JobStatus.RUNNING, JobStatus.PENDING)
    with pytest.raises(IllegalTransition):
        check_transition(JobStatus.PENDING, JobStatus.SUCCEEDED)


def test_budget_retries_within_its_limit_and_words_the_end():
    budget = RetryBudget(max_failure=1, max_preemption=0)
    failure = Failure("RuntimeError: x")
    budget, final, reason = budget.decide(failure)
    assert final is None and reason == "retrying after failure 1 of 1 allowed: RuntimeError: x"
    budget, final, reason = budget.decide(failure)
    assert final is not None and reason == ""
    assert final.message == (
        "RuntimeError: x (gave up after 2 attempts: failure retries exhausted, 1 allowed; "
        "1 failure and 0 preemption retries used)"
    )
    lost = Failure.lost("worker w1 lost")
    assert lost.kind == FailureKind.PREEMPTION
    budget, final, _ = RetryBudget(5, 1).decide(lost)
    assert final is None
    _, final, _ = budget.decide(lost)
    assert final is not None and "preemption retries exhausted, 1 allowed" in final.message


def test_budget_without_retries_keeps_the_plain_reason():
    _, final, _ = RetryBudget(0, 100).decide(Failure("ValueError: v"))
    assert final is not None and final.message == "ValueError: v"


def test_lifecycle_finishes_once_and_retries_through_pending():
    life = JobLifecycle("j", max_retries_failure=1)
    finished: list[JobStatus] = []
    life.add_done_callback(lambda lc: finished.append(lc.status))
    assert life.start()
    assert life.attempt_failed(Failure("E: 1")) is True
    assert life.status == JobStatus.PENDING and life.attempt == 1
    assert life.pending_reason.startswith("retrying after failure 1 of 1")
    assert life.start()
    assert life.attempt_failed(Failure("E: 2")) is False
    assert life.status == JobStatus.FAILED and finished == [JobStatus.FAILED]
    assert not life.succeed() and not life.stop()
    with pytest.raises(JobFailed) as info:
        life.wait(timeout=0)
    assert "gave up after 2 attempts" in str(info.value)
    assert life.wait(timeout=0, raise_on_failure=False) == JobStatus.FAILED


def test_a_stopped_job_ignores_a_late_failure():
    life = JobLifecycle("j")
    life.start()
    assert life.stop()
    assert life.attempt_failed(Failure("E: late")) is False
    assert life.status == JobStatus.STOPPED and life.failure is None


def test_wait_times_out_on_an_unfinished_job():
    with pytest.raises(TimeoutError):
        JobLifecycle("j").wait(timeout=0.01)


def test_waiters_blocked_before_the_end_and_arriving_after_it_all_see_the_failure():
    life = JobLifecycle("j")
    seen: list[BaseException] = []

    def waiter() -> None:
        with pytest.raises(JobFailed) as caught:
            life.wait(timeout=30)
        seen.append(caught.value)

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for thread in threads:
        thread.start()
    life.start()
    assert life.attempt_failed(Failure("E: boom")) is False
    for thread in threads:
        thread.join(timeout=30)
    waiter()  # a late waiter finds the job finished without blocking
    assert len(seen) == 4 and life.finished and life.wait_done(0)


def test_failure_encoding_is_data_only_and_round_trips():
    failure = Failure.from_remote(capture(KeyError("k"))).in_replica(1, 3)
    decoded = Failure.decode(failure.encode())
    assert decoded == failure
    assert decoded.message == "replica 1 of 3: KeyError: 'k'"
    with pytest.raises(ValueError):
        RemoteFailure.decode(b"not a failure at all")


def test_job_failed_is_also_the_users_class_and_keeps_builtin_fields():
    err = job_failed("j1", "OSError: gone", capture(FileNotFoundError(2, "gone")))
    assert isinstance(err, JobFailed) and isinstance(err, FileNotFoundError)
    assert err.errno == 2 and str(err) == "job 'j1' failed: OSError: gone"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and again.errno == 2


def test_unpicklable_exception_arrives_as_remote_error_naming_it():
    failure = capture(Unpicklable("held a lock"))
    assert failure.pickled == b""
    err = remote_error(failure)
    # The class is importable here, so the caller can still catch it by type.
    assert isinstance(err, RemoteError) and isinstance(err, Unpicklable)
    assert str(err) == "Unpicklable: held a lock"
    unknown = remote_error(RemoteFailure("some.remote.module.Gone", "away", "Traceback ...\n"))
    assert type(unknown) is RemoteError and unknown.type_name == "some.remote.module.Gone"
    assert str(unknown) == "Gone: away"


def test_user_traceback_drops_fray_frames_above_user_code():
    from fray.core.inside._eventloop import ActorLoop

    class Thing:
        async def method(self) -> None:
            raise ValueError("inside")

    loop = ActorLoop("t")
    try:
        exc = loop.submit(Thing().method()).exception(timeout=10)
    finally:
        loop.close()
    assert isinstance(exc, ValueError)
    text = user_traceback(exc)
    assert "in method" in text and "_eventloop.py" not in text


def test_run_attempts_retries_a_failed_attempt_and_logs_both_steps():
    lifecycle = JobLifecycle("j", max_retries_failure=1)
    outcomes = iter([Failure("boom"), None])
    log: list[str] = []
    lifecycle.run_attempts(lambda attempt: next(outcomes), log.append)
    assert lifecycle.status == JobStatus.SUCCEEDED
    assert lifecycle.attempt == 1
    assert log[0] == "[fray] attempt 1 failed: boom\n"
    assert len(log) == 2 and log[1].startswith("[fray] ")


def test_run_attempts_gives_back_what_admit_took_when_the_job_was_stopped_meanwhile():
    lifecycle = JobLifecycle("j")
    released: list[bool] = []

    def admit() -> bool:
        lifecycle.stop()  # terminated right after it was let in
        return True

    ran: list[int] = []
    lifecycle.run_attempts(
        lambda attempt: ran.append(attempt), print, admit=admit, release=lambda: released.append(True)
    )
    assert (ran, released, lifecycle.status) == ([], [True], JobStatus.STOPPED)


def test_run_attempts_ends_a_job_failed_on_an_error_of_frays_own():
    lifecycle = JobLifecycle("j")

    def broken(attempt: int) -> None:
        raise RuntimeError("a bug")

    lifecycle.run_attempts(broken, print)
    assert lifecycle.status == JobStatus.FAILED
    assert lifecycle.failure is not None and "internal error" in lifecycle.failure.message


def test_a_finished_lifecycle_lets_go_of_its_timeout_action() -> None:
    # The action is usually the handle's own terminate: kept after the end, handle and lifecycle
    # would form a cycle that only the cyclic collector frees (off here: only references count).
    class Handle:
        def __init__(self) -> None:
            self.lifecycle = JobLifecycle("j", timeout=600)
            self.lifecycle.on_timeout = self.terminate

        def terminate(self) -> None:
            self.lifecycle.stop()

    gc.disable()
    try:
        handle = Handle()
        assert handle.lifecycle.start() and handle.lifecycle.succeed()
        gone = weakref.ref(handle)
        del handle
        assert gone() is None
    finally:
        gc.enable()
