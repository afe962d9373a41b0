"""A replica killed by a signal says which, with its last output, on every backend (issue 35)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from fray import Entrypoint, JobRequest
from fray.errors import JobFailed

_SIGKILL_SELF = (
    "import os, signal, sys; print('MARKER last words', file=sys.stderr, flush=True); "
    "os.kill(os.getpid(), signal.SIGKILL)"
)


def kill_my_process() -> None:
    print("MARKER last words", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_program_that_sigkills_itself_fails_naming_sigkill_with_its_last_output(client, uid):
    job = client.submit(
        JobRequest(name=f"sigkill-{uid}", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", _SIGKILL_SELF]))
    )
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=120)
    message = info.value.message
    assert "killed by SIGKILL" in message, message
    assert "MARKER last words" in message, message


def test_a_callable_job_that_sigkills_its_process_fails_naming_sigkill(client, uid):
    job = client.submit(JobRequest(name=f"sigkill-fn-{uid}", entrypoint=Entrypoint.from_callable(kill_my_process)))
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=120)
    message = info.value.message
    assert "killed by SIGKILL" in message, message
    assert "MARKER last words" in message, message
