"""A client that has never reached its controller fails in seconds, saying where it looked and what to do.

Before issue 25, ``FRAY_CLIENT_SPEC=fray://127.0.0.1:PORT`` with nothing there made
``submit()`` retry for the 60 s a controller restart is given, then end in a bare
``CallNotSentError``. Now the first contact has a budget of its own
(``FIRST_CONTACT_SECONDS``); once a client has reached its controller, an outage
(a restart) keeps the long budget.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import FIRST_CONTACT_SECONDS, connect_controller
from fray.cluster.server.launcher import LocalCluster
from fray.errors import CallNotSentError, ControllerUnreachable

# "Fails within ~3 s" is checked as "fails instead of hanging": a generous bound for a loaded machine.
_FAILS_WITHIN = 15.0


def _nothing_listens() -> str:
    """A 127.0.0.1 address where nothing listens (a port the kernel just handed out and took back)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _assert_says_where_and_what_to_do(message: str, address: str) -> None:
    assert address in message, message
    assert "fray cluster up" in message and "FRAY_CLIENT_SPEC" in message, message


def test_submit_to_a_controller_that_is_not_there_fails_in_seconds() -> None:
    address = _nothing_listens()
    client = ClusterClient(address, token="t" * 32)
    started = time.monotonic()
    with pytest.raises(ControllerUnreachable) as raised:
        client.submit(JobRequest(name="first", entrypoint=Entrypoint.from_callable(print)))
    assert time.monotonic() - started < _FAILS_WITHIN
    assert isinstance(raised.value, CallNotSentError)  # nothing was sent: code catching that still works
    _assert_says_where_and_what_to_do(str(raised.value), address)


_SCRIPT = """
import time
from fray import Entrypoint, JobRequest, current_client
started = time.monotonic()
try:
    current_client().submit(JobRequest(name="first", entrypoint=Entrypoint.from_callable(print)))
finally:
    print(f"gave up after {time.monotonic() - started:.1f}s", flush=True)
"""


def test_a_script_with_a_client_spec_that_points_nowhere_fails_in_seconds(tmp_path: Path) -> None:
    address = _nothing_listens()
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "FRAY_CLIENT_SPEC": f"fray://{address}", "FRAY_TOKEN": "t" * 32}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    waited = float(out.stdout.rsplit("gave up after ", 1)[1].split("s")[0])
    assert waited < _FAILS_WITHIN, out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("fray.errors.ControllerUnreachable: "), out.stderr
    _assert_says_where_and_what_to_do(last, address)


def test_the_cli_says_where_it_looked_and_what_to_do(tmp_path: Path) -> None:
    address = _nothing_listens()
    env = {**os.environ, "FRAY_CLIENT_SPEC": f"fray://{address}", "FRAY_TOKEN": "t" * 32, "HOME": str(tmp_path)}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "fray.cli", "job", "submit", "--", sys.executable, "-c", "print(1)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - started < _FAILS_WITHIN + 10  # includes the interpreter's start
    assert out.returncode == 2, out.stdout + out.stderr
    error, hint = out.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: ") and address in error, out.stderr
    assert hint.startswith("hint: ") and "fray cluster up" in hint and "FRAY_CLIENT_SPEC" in hint, out.stderr


def test_an_outage_after_first_contact_keeps_the_retry_budget(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.start_controller()
        controller = connect_controller(cluster.address, cluster.token, retry_seconds=120.0)
        controller.list_jobs([])  # first contact
        cluster.kill_controller()
        outcome: list[object] = []
        call = threading.Thread(target=lambda: outcome.append(_try(controller.list_jobs, [])), daemon=True)
        call.start()
        # Past the first-contact budget the call is still retrying, not failed ...
        past = time.monotonic() + FIRST_CONTACT_SECONDS + 2.0
        while time.monotonic() < past:
            assert not outcome, f"the call gave up during an outage after first contact: {outcome}"
            call.join(0.1)
        # ... and it completes once the controller is back.
        cluster.start_controller()
        call.join(60)
        assert outcome and isinstance(outcome[0], list), outcome


def _try(function, *args):  # type: ignore[no-untyped-def]
    try:
        return function(*args)
    except Exception as exc:
        return exc
