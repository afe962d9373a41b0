"""TLS beyond this machine (issue 10, case 5): a controller bound to a non-loopback address speaks only TLS there.

The controller runs on a simulated host (a network namespace of ``tests/netns.py``), bound to
that host's address; the workers and the test reach it over the host's link. No test here
contacts this machine's own non-loopback address.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import AuthenticationError, ConfigError, Entrypoint, JobRequest, JobStatus
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.rpc.tls import ensure_cluster_tls
from fray.cluster.server.launcher import LocalCluster
from netns import Hosts

from .helpers import refusal_of, start_worker


@pytest.fixture
def exposed(tmp_path: Path, hosts: Hosts) -> Iterator[LocalCluster]:
    """A controller on a simulated host, bound to its (non-loopback) address; workers run here."""
    host = hosts.add()
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.startswith(tests_dir))}
    with LocalCluster(
        tmp_path / "cluster", worker_timeout=2.0, env=env, host=host.address, controller_prefix=host.prefix
    ) as cluster:
        cluster.start_controller()
        assert cluster.address.rsplit(":", 1)[0] == host.address
        yield cluster
        assert cluster.controller is not None and cluster.controller.pid in host.pids(), "the controller ran there"


def test_a_controller_beyond_loopback_requires_tls_with_the_cluster_ca(
    exposed: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not exposed.address.startswith("127.")
    assert exposed.ca_file is not None and exposed.ca_file.exists()
    assert oct(os.stat(exposed.ca_file.parent / "server.key").st_mode & 0o777) == "0o600"
    exposed.add_worker("w-a", "--cpu", "2")
    exposed.wait_for_workers(1)  # the worker reached it over TLS
    monkeypatch.setenv("FRAY_TLS_CA", str(exposed.ca_file))
    job = ClusterClient(exposed.address, token=exposed.token).submit(
        JobRequest(name="over-tls", entrypoint=Entrypoint.from_binary("true"))
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED

    # A plaintext peer never even sees the Fray handshake.
    host, port = exposed.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"FRAY" * 32)
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(4096):
                received += chunk
    assert b"FRAY" not in received

    monkeypatch.delenv("FRAY_TLS_CA")
    with pytest.raises(ConfigError, match="must use TLS"):
        controller_client(exposed.address, exposed.token, ca=None).health()
    other = ensure_cluster_tls(tmp_path / "other-ca", ["127.0.0.1"])
    with pytest.raises(AuthenticationError, match="CA"):
        controller_client(exposed.address, exposed.token, ca=other.ca_cert).health()


def check_argument(data: bytes) -> None:
    """A job body: its argument arrived whole."""
    assert data == bytes(range(256)) * 117 + bytes(48), len(data)


def test_a_job_with_a_30_kb_argument_runs_over_tls(exposed: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 23: every message of 16 KiB or more broke TLS connections, so the assignment of
    # this job never reached the worker (the job stayed RUNNING) and the submission failed.
    exposed.add_worker("w-a", "--cpu", "1")
    exposed.wait_for_workers(1)
    assert exposed.ca_file is not None
    monkeypatch.setenv("FRAY_TLS_CA", str(exposed.ca_file))
    data = bytes(range(256)) * 117 + bytes(48)
    assert len(data) == 30_000
    job = ClusterClient(exposed.address, token=exposed.token).submit(
        JobRequest(name="big-argument", entrypoint=Entrypoint.from_callable(check_argument, args=(data,)))
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED


def test_a_worker_that_does_not_trust_the_controllers_certificate_exits_with_one_line(
    exposed: LocalCluster, tmp_path: Path
) -> None:
    # To the worker, a controller whose certificate another CA signed is an impostor.
    other = ensure_cluster_tls(tmp_path / "other-ca", ["127.0.0.1"])
    worker = start_worker(
        exposed.address,
        tmp_path / "w",
        {"FRAY_CREDENTIAL": exposed.worker_credential.encode(), "FRAY_TLS_CA": str(other.ca_cert)},
    )
    line = refusal_of(worker)
    assert f"cannot join the controller at {exposed.address}" in line
    assert "certificate" in line and str(other.ca_cert) in line
    assert "set FRAY_TLS_CA" in line, "the line says how to fix it"
