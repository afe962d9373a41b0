"""A worker the controller refuses exits at once with one line (issue 23); one that finds no controller waits for it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.protocol.credentials import WORKER, Credential, user_principal
from fray.cluster.server.launcher import LocalCluster
from support import wait_until

from .helpers import refusal_of, start_worker


@pytest.mark.parametrize("which", ["another cluster's worker credential", "a user's credential"])
def test_a_worker_whose_credential_is_refused_exits_with_one_line(
    cluster: LocalCluster, tmp_path: Path, which: str
) -> None:
    if which == "a user's credential":
        credential = Credential.mint(cluster.token.encode(), user_principal("alice"))
    else:
        credential = Credential.mint(b"the token of another cluster", WORKER)
    worker = start_worker(cluster.address, tmp_path / "w", {"FRAY_CREDENTIAL": credential.encode()})
    line = refusal_of(worker)
    assert f"cannot join the controller at {cluster.address}" in line
    if which == "a user's credential":
        assert "worker credential" in line
    else:
        assert "refused the credential of 'worker'" in line
    assert "FRAY_CREDENTIAL" in line, "the line says how to fix it"
    assert "w-x" not in cluster_workers(cluster)


def cluster_workers(cluster: LocalCluster) -> list[str]:
    return [w.info.worker_id for w in controller_client(cluster.address, cluster.token).list_workers()]


def test_a_worker_started_before_its_controller_waits_for_it(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on, for the controller to take later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with LocalCluster(tmp_path / "cluster", port=port, worker_timeout=2.0) as cluster:
        worker = start_worker(
            f"127.0.0.1:{port}", tmp_path / "w", {"FRAY_CREDENTIAL": cluster.worker_credential.encode()}
        )
        try:
            said: list[str] = []
            stderr = worker.stderr
            assert stderr is not None
            threading.Thread(target=lambda: said.extend(stderr), daemon=True).start()
            # A refused connection is retried, not fatal.
            wait_until(lambda: any("retrying" in line for line in said), what="the worker to retry")
            assert worker.poll() is None, said
            cluster.start_controller()
            cluster.wait_for_workers(1)
            assert cluster_workers(cluster) == ["w-x"]
        finally:
            worker.terminate()
            worker.communicate(timeout=30)
