"""The operator API on the data-only protocol: who sees which jobs, who may fetch workspaces, what is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, JobRequest, NotFound, PermissionDenied, ProtocolError
from fray.cluster.client import ClusterClient
from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol.controller_client import controller_client, ops_client
from fray.cluster.protocol.credentials import WORKER, Credential, user_principal
from fray.cluster.protocol.messages import JobSpec
from fray.cluster.rpc.datarpc import pack, unpack
from fray.cluster.server.envs._workspace import digest_of
from fray.cluster.server.launcher import LocalCluster


def _pending(client: ClusterClient, name: str) -> str:
    """A job that stays pending (the cluster has no workers): its id."""
    return client.submit(JobRequest(name=name, entrypoint=Entrypoint.from_binary("true"))).job_id


@pytest.fixture
def jobs(cluster: LocalCluster) -> dict[str, str]:
    """One pending job of alice's and one of bob's, by user."""
    master = cluster.token.encode()
    alice = ClusterClient(cluster.address, token=Credential.mint(master, user_principal("alice")))
    bob = ClusterClient(cluster.address, token=Credential.mint(master, user_principal("bob")))
    return {"alice": _pending(alice, "alices"), "bob": _pending(bob, "bobs")}


def test_users_see_their_own_jobs_and_the_administrator_sees_all(cluster: LocalCluster, jobs: dict[str, str]) -> None:
    alice = ops_client(cluster.address, Credential.mint(cluster.token.encode(), user_principal("alice")))
    admin = ops_client(cluster.address, cluster.token)
    try:
        assert [row["job_id"] for row in alice.jobs(limit=0)] == [jobs["alice"]]
        assert {row["job_id"] for row in admin.jobs(limit=0)} == set(jobs.values())
        assert alice.find_jobs(jobs["bob"]) == [] and alice.find_jobs("bobs") == []
        assert alice.find_jobs("alices") == [jobs["alice"]]
        assert admin.find_jobs("bobs") == [jobs["bob"]]
        assert alice.job_detail(jobs["alice"])["user"] == "alice"
        with pytest.raises(NotFound):
            alice.job_detail(jobs["bob"])
        assert admin.job_detail(jobs["bob"])["user"] == "bob"
        assert alice.status()["jobs"]["pending"] == 1
        assert admin.status()["jobs"]["pending"] == 2
        assert alice.health()["read_only"] is False  # the controller's own state is everybody's
        with pytest.raises(PermissionDenied, match="cluster token"):
            alice.dashboard_login()
        with pytest.raises(ProtocolError, match="whole number"):
            alice.jobs(limit="all")  # type: ignore[arg-type]
    finally:
        alice.close()
        admin.close()


def test_output_and_listings_of_the_controller_api_follow_the_same_rule(
    cluster: LocalCluster, jobs: dict[str, str]
) -> None:
    alice = controller_client(cluster.address, Credential.mint(cluster.token.encode(), user_principal("alice")))
    admin = controller_client(cluster.address, cluster.token)
    try:
        assert [v.job_id for v in alice.list_jobs()] == [jobs["alice"]]
        assert {v.job_id for v in admin.list_jobs()} == set(jobs.values())
        assert alice.logs(jobs["alice"]) == []
        with pytest.raises(PermissionDenied, match="belongs to user 'bob'"):
            alice.logs(jobs["bob"])
        assert admin.logs(jobs["bob"]) == []
    finally:
        alice.close()
        admin.close()


def test_workspace_blobs_are_stored_by_users_and_fetched_by_workers(cluster: LocalCluster) -> None:
    master = cluster.token.encode()
    alice = ops_client(cluster.address, Credential.mint(master, user_principal("alice")))
    worker = ops_client(cluster.address, Credential.mint(master, WORKER))
    try:
        data = b"a packed workspace"
        digest = digest_of(data)
        assert alice.has_blob(digest) is False
        assert alice.put_blob(digest, data) is True
        assert alice.has_blob(digest) is True
        assert worker.get_blob(digest) == data
        with pytest.raises(PermissionDenied, match="only workers"):
            alice.get_blob(digest)
        with pytest.raises(PermissionDenied, match="worker credential may not"):
            worker.jobs()
        with pytest.raises(NotFound):
            worker.get_blob(digest_of(b"never uploaded"))
        with pytest.raises(ConfigError, match="does not have that sha256 digest"):
            alice.put_blob(digest, b"other bytes")  # the digest is checked
    finally:
        alice.close()
        worker.close()


def test_the_cli_shows_a_user_only_their_jobs(cluster: LocalCluster, jobs: dict[str, str], tmp_path: Path) -> None:
    alice = Credential.mint(cluster.token.encode(), user_principal("alice"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(tmp_path), FRAY_CREDENTIAL=alice.encode(), FRAY_CLIENT_SPEC=f"fray://{cluster.address}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True, timeout=120
        )

    listed = run("job", "list", "--json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    assert [row["job_id"] for row in json.loads(listed.stdout)] == [jobs["alice"]]
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["jobs"]["pending"] == 1
    stop = run("job", "stop", jobs["bob"])
    assert stop.returncode == 2 and f"no job {jobs['bob']!r}" in stop.stderr
    login = run("dashboard")
    assert login.returncode == 2 and "cluster token" in login.stderr


def test_a_spec_carries_its_command_and_workspace_as_plain_data(cluster: LocalCluster) -> None:
    request = JobRequest(name="ws", entrypoint=Entrypoint.from_binary("echo", ["a b"]))
    spec = dataclasses.replace(JobSpec.from_request(request), workspace_digest=digest_of(b"packed"))
    assert spec.command == "echo 'a b'"
    assert codec.spec_from(unpack(pack(codec.spec_data(spec)))) == spec
    admin = controller_client(cluster.address, cluster.token)
    try:
        # Workers make a directory name of the digest: anything but sha256:<hex> is refused at submit.
        bad = dataclasses.replace(spec, workspace_digest="sha256:../../../tmp")
        with pytest.raises(ProtocolError, match="workspace_digest"):
            admin.submit(bad, user="alice")
        job_id = admin.submit(spec, user="alice").job_id
    finally:
        admin.close()
    ops = ops_client(cluster.address, cluster.token)
    try:
        assert ops.job_detail(job_id)["command"] == "echo 'a b'"
    finally:
        ops.close()
