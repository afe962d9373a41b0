"""Ray 2.60 token authentication, as a user meets it, needs no setup with Fray.

Ray 2.60 turns token auth on for new clusters and keeps the token in
``~/.ray/auth_token``. ``ray.init`` sends it when it starts a cluster or finds one by
itself, but not for an explicit address (``RAY_ADDRESS`` or an argument), and
``JobSubmissionClient`` needs ``RAY_AUTH_MODE=token``. Fray must make all of these work.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')

from fray.ray._connection import is_local_address, prepare_token_auth


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"port {port} did not open within {timeout}s")


USER_SCRIPT = """
import json, os, sys
from fray import Entrypoint, JobRequest, current_client
client = current_client()  # from FRAY_CLIENT_SPEC=ray, cluster from RAY_ADDRESS
callable_job = client.submit(JobRequest(name="hello", entrypoint=Entrypoint.from_callable(print, args=("hi",))))
binary_job = client.submit(JobRequest(name="echo", entrypoint=Entrypoint.from_binary("echo", ["binary-ok"])))
result = {
    "callable": str(callable_job.wait(timeout=90)),
    "binary": str(binary_job.wait(timeout=90)),
    "binary_logs": binary_job.logs(),
    "auth_mode": os.environ.get("RAY_AUTH_MODE"),
}
client.shutdown()
print("RESULT " + json.dumps(result))
"""


@pytest.mark.slow
def test_ray_start_cluster_with_explicit_address_just_works(tmp_path: Path) -> None:
    """``ray start --head`` then a Fray program with ``RAY_ADDRESS`` set: what users do."""
    gcs_port, dashboard_port = free_port(), free_port()
    user_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # nothing Ray-related set
    log = (tmp_path / "head.log").open("w")
    # Ray's socket paths live under the temp dir and must fit in 107 bytes: keep it short.
    ray_tmp = tempfile.mkdtemp(prefix="fray-", dir="/tmp")
    head = subprocess.Popen(
        [
            "ray",
            "start",
            "--head",
            "--block",
            f"--port={gcs_port}",
            f"--dashboard-port={dashboard_port}",
            "--num-cpus=1",
            f"--temp-dir={ray_tmp}",
            "--disable-usage-stats",
            # Ray's agents have fixed default ports; the test session's own cluster holds them.
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ],
        env=user_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the test stops exactly this cluster
    )
    try:
        wait_for_port(gcs_port, 90)
        wait_for_port(dashboard_port, 90)
        env = {**user_env, "FRAY_CLIENT_SPEC": "ray", "RAY_ADDRESS": f"127.0.0.1:{gcs_port}"}
        proc = subprocess.run(
            [sys.executable, "-c", USER_SCRIPT], env=env, capture_output=True, text=True, timeout=240, check=False
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"the user program failed:\n{proc.stderr[-3000:]}"
        result = json.loads(lines[-1][len("RESULT ") :])
        assert result["callable"] == "succeeded"
        assert result["binary"] == "succeeded"
        assert "binary-ok" in result["binary_logs"]
        assert result["auth_mode"] == "token"
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the whole cluster: ray start, GCS, raylet, workers
        head.wait(timeout=30)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_local_token_is_never_sent_to_a_remote_address_by_fray(monkeypatch, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    prepare_token_auth("10.1.2.3:6379")
    assert "RAY_AUTH_MODE" not in os.environ


def test_local_addresses_are_recognised() -> None:
    assert is_local_address(None)
    assert is_local_address("auto")
    assert is_local_address("127.0.0.1:6379")
    assert is_local_address(f"{socket.gethostname()}:6379")
    assert not is_local_address("10.255.1.2:6379")
