"""Join tokens, per-worker credentials and revocation (issue 23), on one machine.

Workers join as they would from another host: ``fray worker --join TOKEN`` and nothing else
(no shared worker credential). The multi-host version, with TLS and the CA pin, is
``tests/faults/test_hosts.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import AuthenticationError, Entrypoint, JobRequest, PermissionDenied
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.protocol.credentials import Credential
from fray.cluster.protocol.records import WorkerState
from fray.cluster.server.launcher import LocalCluster
from support import FrayCli, fray_cli_in, wait_until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", worker_timeout=3.0) as c:
        c.start_controller()
        yield c


@pytest.fixture
def admin_cli(cluster: LocalCluster) -> FrayCli:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    return fray_cli_in({**env, **cluster.env})


def _worker_env() -> dict[str, str]:
    """What a worker on another machine has: none of this cluster's secrets."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}


def _states(cluster: LocalCluster) -> dict[str, WorkerState]:
    client = controller_client(cluster.address, cluster.token)
    try:
        return {w.info.worker_id: w.state for w in client.list_workers()}
    finally:
        client.close()


def _join_refused(cluster: LocalCluster, tmp_path: Path, token: str, worker_id: str) -> str:
    """Run ``fray worker --join token``: it must exit 2 with one error line; return that line."""
    argv = ["worker", "--controller", cluster.address, "--join", token, "--id", worker_id]
    out = subprocess.run(
        [sys.executable, "-m", "fray.cli", *argv, "--workdir", str(tmp_path / worker_id)],
        env=_worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def test_a_worker_joins_with_a_token_and_keeps_its_own_credential(
    cluster: LocalCluster, admin_cli: FrayCli, tmp_path: Path
) -> None:
    made = admin_cli("token", "create", "--role", "worker", "--ttl", "600")
    token = made.stdout.strip()
    assert len(made.stdout.splitlines()) == 1 and token.startswith("fray-credential-v1 join:")
    proc = cluster.add_worker("w1", "--cpu", "1", join=token)
    cluster.wait_for_workers(1)
    stored = (cluster.directory / "w1" / "credential").read_text().splitlines()
    assert (cluster.directory / "w1" / "credential").stat().st_mode & 0o777 == 0o600
    credential = Credential.decode(stored[0])
    assert credential.principal.startswith("worker:w1#")

    # Its own credential speaks for w1 only, and calls nothing but a worker's methods.
    as_w1 = controller_client(cluster.address, credential)
    try:
        other = WorkerInfo(worker_id="w2", cpu_millis=1000, ram_bytes=1 << 30, disk_bytes=1 << 30)
        with pytest.raises(PermissionDenied, match="may not act as worker 'w2'"):
            as_w1.register_worker(other, "elsewhere:1", [], [])
        with pytest.raises(PermissionDenied):
            as_w1.poll("w2", 1, 0.0)
        with pytest.raises(PermissionDenied):
            as_w1.list_jobs()
    finally:
        as_w1.close()
    # The join token only joins.
    as_token = controller_client(cluster.address, Credential.decode(token))
    try:
        with pytest.raises(PermissionDenied, match="may only join"):
            as_token.list_workers()
    finally:
        as_token.close()

    # Started again (the token revoked meanwhile: it may expire once its workers joined), it reuses its credential.
    token_id = json.loads(admin_cli("token", "list", "--json").stdout)[0]["id"]
    admin_cli("token", "revoke", token_id)
    cluster.kill_worker("w1")
    assert proc.returncode is not None
    cluster.add_worker("w1", "--cpu", "1", join=token)
    wait_until(lambda: _states(cluster).get("w1") == WorkerState.ALIVE, timeout=30, what="w1 back")
    assert (cluster.directory / "w1" / "credential").read_text().splitlines() == stored
    rows = {row["id"]: row for row in json.loads(admin_cli("token", "list", "--json").stdout)}
    assert rows[token_id]["state"] == "revoked"
    assert [r["subject"] for r in rows.values() if r["via"] == token_id] == ["worker:w1"]


def test_bad_expired_and_other_clusters_tokens_are_refused_and_register_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert "not one" in _join_refused(cluster, tmp_path, "garbage", "w-garbage")
    expiring = cluster.create_token("worker", ttl=0.2)
    time.sleep(0.5)
    assert "expired, revoked or another cluster's" in _join_refused(cluster, tmp_path, expiring, "w-expired")
    with LocalCluster(tmp_path / "other", worker_timeout=3.0) as other:
        other.start_controller()
        foreign = other.create_token("worker")
    assert "expired, revoked or another cluster's" in _join_refused(cluster, tmp_path, foreign, "w-foreign")
    assert _states(cluster) == {}


@pytest.mark.slow
def test_a_revoked_worker_is_lost_at_once_its_job_runs_elsewhere_and_it_needs_a_new_token(
    cluster: LocalCluster, admin_cli: FrayCli, tmp_path: Path
) -> None:
    token = cluster.create_token("worker")
    first = cluster.add_worker("w1", "--cpu", "1", join=token)
    cluster.wait_for_workers(1)
    client = ClusterClient(cluster.address, token=cluster.token)
    marker = tmp_path / "ran"
    job = client.submit(
        JobRequest(
            name="sleeper",
            entrypoint=Entrypoint.from_binary("sh", ["-c", f"echo x >> {marker}; sleep 600"]),
            max_retries_preemption=2,
        )
    )
    wait_until(marker.exists, timeout=30, what="the job to start on w1")
    cluster.add_worker("w2", "--cpu", "1", join=token)
    cluster.wait_for_workers(2)

    admin_cli("worker", "revoke", "w1")
    assert _states(cluster)["w1"] == WorkerState.REVOKED  # at once, not after the worker timeout
    listed = {row["worker_id"]: row for row in json.loads(admin_cli("worker", "list", "--json").stdout)}
    assert listed["w1"]["state"] == "revoked" and listed["w2"]["state"] == "alive"
    assert listed["w2"]["last_contact"] > time.time() - 10
    assert "last contact" in admin_cli("worker", "list").stdout
    assert first.wait(timeout=30) == 2, "the revoked worker gives up, saying why"
    log = (cluster.directory / "w1.log").read_text()
    assert "refused its credential (revoked" in log
    wait_until(lambda: marker.read_text().count("x") == 2, timeout=30, what="the job's new attempt on w2")
    assert job.view().attempt == 1

    # The token it joined with does not bring it back, nor joins anyone under a new id (it was revoked with
    # the worker: whoever holds w1's machine holds it); w2, which joined with it, keeps its own credential.
    cluster.add_worker("w1", "--cpu", "1", join=token)
    assert cluster.workers["w1"].wait(timeout=30) == 2
    cluster.add_worker("w3", "--cpu", "1", join=token)
    assert cluster.workers["w3"].wait(timeout=30) == 2
    assert "was revoked" in (cluster.directory / "w3.log").read_text().strip().splitlines()[-1]
    assert "w3" not in _states(cluster) and _states(cluster)["w2"] == WorkerState.ALIVE
    tokens = {row["subject"]: row for row in json.loads(admin_cli("token", "list", "--json").stdout)}
    assert tokens["join"]["state"] == "revoked"
    cluster.add_worker("w1", "--cpu", "1", join=cluster.create_token("worker"))
    wait_until(lambda: _states(cluster)["w1"] == WorkerState.ALIVE, timeout=30, what="w1 to rejoin")
    job.terminate()
    client.shutdown()


def test_user_credentials_work_until_revoked_or_expired(cluster: LocalCluster, admin_cli: FrayCli) -> None:
    line = admin_cli("token", "create", "--role", "user:alice").stdout.strip()
    credential = Credential.decode(line)
    assert credential.principal.startswith("user:alice#")
    alice = ClusterClient(cluster.address, token=credential)
    job = alice.submit(JobRequest(name="mine", entrypoint=Entrypoint.from_binary("true")))
    assert job.view().user == "alice"
    credential_id = credential.principal.rpartition("#")[2]
    admin_cli("token", "revoke", credential_id)
    with pytest.raises(AuthenticationError, match="revoked"):
        job.view()  # on the connection it opened before: refused at once
    expiring = Credential.decode(cluster.create_token("user:bob", ttl=0.5))
    bob = controller_client(cluster.address, expiring)
    try:
        assert bob.list_jobs() == []
        time.sleep(0.7)
        with pytest.raises(AuthenticationError):
            bob.list_jobs()
    finally:
        bob.close()
    refused = admin_cli("token", "create", "--role", "admin", check=False)
    assert refused.returncode == 2 and "user:NAME" in refused.stderr
    carol = cluster.create_token("user:carol")
    as_carol = fray_cli_in({**_worker_env(), "FRAY_CREDENTIAL": carol, "FRAY_CLIENT_SPEC": f"fray://{cluster.address}"})
    denied = as_carol("token", "create", "--role", "worker", check=False)
    assert denied.returncode == 2 and "cluster token" in denied.stderr
    # Revoking a worker is the administrator's too: the hint says so (not "the job's owner").
    denied = as_carol("worker", "revoke", "w-any", check=False)
    error, hint = denied.stderr.strip().splitlines()
    assert denied.returncode == 2 and "revoke_worker needs the cluster token" in error
    assert hint.startswith("hint: only the cluster's administrator may") and "owner" not in hint
    # A revoked user credential's refusal says "revoked", on a new connection too (the CLI's).
    as_alice = fray_cli_in({**_worker_env(), "FRAY_CREDENTIAL": line, "FRAY_CLIENT_SPEC": f"fray://{cluster.address}"})
    refused = as_alice("job", "list", check=False)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[0] == (
        f"error: the controller at {cluster.address} (from FRAY_CLIENT_SPEC) refused this credential: it was revoked"
    )
