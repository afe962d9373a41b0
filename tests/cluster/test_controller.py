"""The controller service on its own (no network, no processes): what it keeps in memory and what it hands out."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.credentials import WORKER, Credential
from fray.cluster.protocol.messages import JobSpec, TaskAssignment, TaskExit, WorkerReport
from fray.cluster.protocol.records import WorkerState
from fray.cluster.server.controller import ControllerService
from fray.cluster.server.store import ClusterStore
from fray.errors import AuthenticationError, ConfigError, PermissionDenied
from fray.job import Entrypoint, JobRequest
from fray.resources import ResourceConfig
from support import wait_until


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClusterStore]:
    with ClusterStore(tmp_path / "cluster.db") as s:
        yield s


def test_the_spec_cache_is_bounded_and_a_dropped_spec_is_read_back(store: ClusterStore) -> None:
    service = ControllerService(store, spec_cache_size=2)
    specs = [
        JobSpec.from_request(JobRequest(name=f"job{i}", entrypoint=Entrypoint.from_binary("true", [str(i)])))
        for i in range(3)
    ]
    for spec in specs:
        service.submit(spec, user="alice")
    assert len(service._specs) == 2, "only the most recently used specs stay in memory"
    epoch = service.register_worker(WorkerInfo("w-1", 8000, 32 << 30, 100 << 30), "10.0.0.1:1", []).epoch
    assert len(service.schedule_once()) == 3
    started = service.poll("w-1", epoch, 0.0).start
    assert sorted(a.spec.argv for a in started if a.spec.argv) == [("true", "0"), ("true", "1"), ("true", "2")]
    assert len(service._specs) == 2


def test_submit_many_is_one_transaction_all_or_none(store: ClusterStore) -> None:
    service = ControllerService(store)
    specs = [
        JobSpec.from_request(JobRequest(name=f"ok{i}", entrypoint=Entrypoint.from_binary("true"))) for i in range(3)
    ]
    views = service.submit_many(specs, user="alice")
    assert [v.name for v in views] == ["ok0", "ok1", "ok2"]
    bad = JobSpec.from_request(JobRequest(name="fine", entrypoint=Entrypoint.from_binary("true")))
    bad = dataclasses.replace(bad, name="not a valid name!")
    with pytest.raises(ConfigError):
        service.submit_many([specs[0], bad], user="alice")
    assert len(store.list_jobs()) == 3, "nothing of a refused batch was recorded"


def _told_to_start(service: ControllerService, worker_id: str, epoch: int) -> list[TaskAssignment]:
    """What the worker is told to start: placed by a pass run here or by the service's own loop, whichever ran first."""
    service.schedule_once()
    return list(service.poll(worker_id, epoch, 0.0).start)


def test_the_pending_set_lives_in_memory_follows_retries_and_survives_a_restart(store: ClusterStore) -> None:
    service = ControllerService(store)
    service.start()
    try:
        flaky = JobSpec.from_request(
            JobRequest(name="flaky", entrypoint=Entrypoint.from_binary("false"), max_retries_failure=1)
        )
        waiting = JobSpec.from_request(
            JobRequest(name="waiting", entrypoint=Entrypoint.from_binary("true"), resources=ResourceConfig(cpu=4))
        )
        first, second = service.submit_many([flaky, waiting], user="alice")
        registered = service.register_worker(WorkerInfo("w-1", 1000, 32 << 30, 100 << 30), "10.0.0.1:1", [])
        epoch = registered.epoch
        # A pass that placed it while the worker registered has it sent with the registration's answer.
        assigned = list(registered.start) or wait_until(
            lambda: _told_to_start(service, "w-1", epoch), what="a placement"
        )
        assert [t.key.job_id for t in assigned] == [first.job_id]
        assert service._queue.job_ids() == {second.job_id}
        reason = wait_until(lambda: store.get_job(second.job_id).pending_reason, what="a stored reason")
        assert "can never be scheduled" in reason
        # The task fails: the job is retried, back in the pending set, and placed again.
        report = WorkerReport(exited=[TaskExit(assigned[0].key, 1)])
        assert service.report("w-1", epoch, report)
        assert first.job_id in service._queue
        again = wait_until(lambda: _told_to_start(service, "w-1", epoch), what="the retry's placement")
        assert again[0].key.attempt == 1
    finally:
        service.stop()
    restarted = ControllerService(store)
    restarted.start()
    try:
        assert restarted._queue.job_ids() == {second.job_id}
        assert restarted._queue.reason(second.job_id) == reason
    finally:
        restarted.stop()


def test_a_registration_under_way_when_its_worker_is_revoked_leaves_it_revoked(store: ClusterStore) -> None:
    # The credential check at a call's start passed; the revocation landed before the registration was
    # recorded. The registration checks again, atomically with revocations, and is refused.
    service = ControllerService(store, master=b"k" * 32)
    token, _ = service.create_token("worker")
    worker = Credential.decode(service.join(token.principal, "w-1")).principal
    info = WorkerInfo("w-1", 1000, 1 << 30, 1 << 30)
    service.register_worker(info, "10.0.0.1:1", [], principal=worker)
    assert service.revoke_worker("w-1").state == WorkerState.REVOKED
    with pytest.raises(AuthenticationError, match="revoked"):
        service.register_worker(info, "10.0.0.1:1", [], principal=worker)
    with pytest.raises(PermissionDenied, match="new join token"):
        service.register_worker(info, "10.0.0.1:1", [], principal=WORKER)
    assert store.get_worker("w-1").state == WorkerState.REVOKED
    # A credential from a join made after the revocation brings it back.
    fresh_token, _ = service.create_token("worker")
    fresh = Credential.decode(service.join(fresh_token.principal, "w-1")).principal
    service.register_worker(info, "10.0.0.1:1", [], principal=fresh)
    assert store.get_worker("w-1").state == WorkerState.ALIVE


def test_revoking_a_worker_revokes_its_join_token_and_says_so_to_whoever_replaces_it(store: ClusterStore) -> None:
    service = ControllerService(store, master=b"k" * 32)
    told: list[set[str]] = []
    service.tokens_revoked = told.append  # the autoscaler's host gives its VMs a new token then
    token, _ = service.create_token("worker")
    other, _ = service.create_token("worker")
    w1 = Credential.decode(service.join(token.principal, "w-1")).principal
    service.join(token.principal, "w-2")  # the same token joined another worker before the revocation
    service.register_worker(WorkerInfo("w-1", 1000, 1 << 30, 1 << 30), "10.0.0.1:1", [], principal=w1)
    service.revoke_worker("w-1")
    assert told == [{token.credential_id}]
    assert service.credential_state(token.principal) == "revoked"
    assert service.credential_state(other.principal) == "valid"
    with pytest.raises(PermissionDenied, match="not valid"):
        service.join(token.principal, "w-3")  # never under a new id
    w2 = [r for r in service.list_credentials() if r.subject == "worker:w-2"]
    assert [r.revoked_at for r in w2] == [None], "a worker that joined with it earlier keeps its own credential"
    # A revoked credential still proves itself at the handshake, so that its calls can say why they are refused.
    assert service.key_for(token.principal) is not None
    assert service.key_for("user:nobody#0123456789ab") is None
