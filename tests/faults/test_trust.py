"""The trust model (issue 10, case 5): nothing unpickled by the controller, credentials that say who calls."""

from __future__ import annotations

import os
import pickle
import socket
import threading
from pathlib import Path

import pytest

from fray import AuthenticationError, Entrypoint, JobRequest, JobStatus, PermissionDenied
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.protocol.credentials import WORKER, Credential, user_principal
from fray.cluster.rpc import wire
from fray.cluster.rpc.datarpc import _Integrity, pack, unpack
from fray.cluster.server.launcher import LocalCluster

from .helpers import with_workers


class WritesAFile:
    """Unpickling this runs code: it creates the file named in its state."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (self.path, "w"))


def test_the_controller_never_unpickles_even_from_the_administrator(cluster: LocalCluster, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    host, port = cluster.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        session = wire.client_handshake(sock, cluster.token.encode(), cluster.address)
        integrity = _Integrity(session, b"C", b"S")  # a correctly authenticated frame...
        evil = pickle.dumps(WritesAFile(str(target)))  # ...carrying a pickle
        wire.send_frame(sock, wire.FrameKind.CALL, 1, [integrity.seal(wire.FrameKind.CALL, 1, evil)])
        frame = wire.FrameReader(sock).read_frame()
    assert frame is not None and frame.kind is wire.FrameKind.ERROR
    assert unpack(integrity.open(frame))["type"] == "ProtocolError"
    assert not target.exists()
    # The controller is still up and serving.
    assert controller_client(cluster.address, cluster.token).health()["read_only"] is False


def report_environment(path: str) -> None:
    Path(path).write_text(f"{os.environ.get('FRAY_TOKEN', '')}\n{os.environ.get('FRAY_CREDENTIAL', '')}")


def test_tasks_get_their_jobs_credential_not_the_cluster_token(cluster: LocalCluster, tmp_path: Path) -> None:
    client = with_workers(cluster, 2)
    out = tmp_path / "env"
    job = client.submit(
        JobRequest(name="env", entrypoint=Entrypoint.from_callable(report_environment, args=(str(out),)))
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    token, credential = out.read_text().split("\n")
    assert cluster.token not in out.read_text()
    assert token, "actors in the task still authenticate, with their namespace's key"
    assert Credential.decode(credential).principal == f"job:{job.job_id}"
    # That credential died with the job.
    with pytest.raises(AuthenticationError):
        controller_client(cluster.address, Credential.decode(credential)).health()
    # Nor does the worker's log or process environment hold the cluster token.
    worker_env = Path(f"/proc/{cluster.workers['w-a'].pid}/environ").read_bytes()
    assert cluster.token.encode() not in worker_env


def test_users_are_who_their_credential_says_and_stop_only_their_jobs(cluster: LocalCluster) -> None:
    with_workers(cluster, 1)
    master = cluster.token.encode()
    alice = ClusterClient(cluster.address, token=Credential.mint(master, user_principal("alice")), user="bob")
    bob = ClusterClient(cluster.address, token=Credential.mint(master, user_principal("bob")))
    admin = ClusterClient(cluster.address, token=cluster.token)
    bobs = bob.submit(JobRequest(name="bobs", entrypoint=Entrypoint.from_binary("sleep", ["300"])))
    alices = alice.submit(JobRequest(name="alices", entrypoint=Entrypoint.from_binary("true")))
    assert alices.view().user == "alice", "the declared user 'bob' is ignored: the credential says alice"
    with pytest.raises(PermissionDenied, match="belongs to user 'bob'"):
        alice._controller.terminate(bobs.job_id)
    assert bobs.status() in (JobStatus.PENDING, JobStatus.RUNNING)
    with pytest.raises(PermissionDenied, match="namespace"):
        ClusterClient(
            cluster.address, token=Credential.mint(master, user_principal("alice")), namespace=bob.namespace
        ).submit(JobRequest(name="squat", entrypoint=Entrypoint.from_binary("true")))
    admin._controller.terminate(bobs.job_id)  # the administrator may
    assert bobs.wait(timeout=60) == JobStatus.STOPPED


def test_only_the_worker_credential_registers_workers(cluster: LocalCluster) -> None:
    master = cluster.token.encode()
    fake = controller_client(cluster.address, Credential.mint(master, user_principal("mallory")))
    with pytest.raises(PermissionDenied, match="worker credential"):
        fake.register_worker(WorkerInfo("fake", 64000, 1 << 40, 1 << 40), "evil:1", [], [])
    with pytest.raises(PermissionDenied):
        fake.poll("fake", 1, 0.0)
    real = controller_client(cluster.address, Credential.mint(master, WORKER))
    assert real.register_worker(WorkerInfo("real", 1000, 1 << 30, 1 << 30), "host:1", [], []).epoch == 1
    with pytest.raises(PermissionDenied):  # and a worker credential submits nothing
        ClusterClient(cluster.address, token=Credential.mint(master, WORKER)).submit(
            JobRequest(name="x", entrypoint=Entrypoint.from_binary("true"))
        )
    with pytest.raises(AuthenticationError):  # a credential not derived from the cluster token
        controller_client(cluster.address, Credential(WORKER, b"guessed" * 4)).health()


def test_relaying_a_handshake_gains_nothing(cluster: LocalCluster) -> None:
    """A man-in-the-middle passes a token holder's handshake through, then sends its own frame."""
    host, port = cluster.address.rsplit(":", 1)
    victim_side, attacker_side = socket.socketpair()
    with socket.create_connection((host, int(port)), timeout=30) as upstream:
        # The relay: the victim's handshake bytes go through unchanged, both ways.
        hello = upstream.recv(38, socket.MSG_WAITALL)
        attacker_side.sendall(hello)
        relay_done = []

        def victim() -> None:
            relay_done.append(wire.client_handshake(victim_side, cluster.token.encode(), "victim"))

        thread = threading.Thread(target=victim)
        thread.start()
        upstream.sendall(attacker_side.recv(70, socket.MSG_WAITALL))
        attacker_side.sendall(upstream.recv(38, socket.MSG_WAITALL))
        thread.join(30)
        assert relay_done, "the relayed handshake succeeded for the victim"
        # Now the relay injects its own call; it cannot tag it without the session key.
        forged = b"\0" * 32 + pack(["terminate", ["any-job"], {}])
        wire.send_frame(upstream, wire.FrameKind.CALL, 1, [forged])
        frame = wire.FrameReader(upstream).read_frame()
    victim_side.close()
    attacker_side.close()
    assert frame is not None and frame.kind is wire.FrameKind.PROTOCOL_ERROR
    assert b"integrity" in bytes(frame.segments[0])
