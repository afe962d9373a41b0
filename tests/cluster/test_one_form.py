"""One form of a job on the ``fray://`` path: the client encodes a spec once; what the controller stores
and every worker receives are those bytes; each process that handles it decodes it at most once.

A real controller on 127.0.0.1, called over its data-only RPC by a client and by a worker credential.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.controller_client import ControllerProxy, controller_client
from fray.cluster.protocol.credentials import WORKER, Credential
from fray.cluster.protocol.messages import JobSpec, TaskAssignment
from fray.cluster.server.controller import Controller
from fray.job import Entrypoint, JobRequest
from fray.resources import ResourceConfig
from support import wait_until


def _work(x: int) -> int:
    return x + 1


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[Controller, str]]:
    token = secrets.token_hex(16)
    ctl = Controller(str(tmp_path / "controller.db"), token=token).start()
    try:
        yield ctl, token
    finally:
        ctl.stop()


@pytest.fixture
def codings(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times a job spec was encoded and decoded, in this process (client, controller and worker here)."""
    counts: Counter[str] = Counter()
    encode, decode = codec.spec_data, codec.spec_from

    def counted_encode(spec: JobSpec) -> dict[str, Any]:
        counts["encode"] += 1
        return encode(spec)

    def counted_decode(data: Any) -> JobSpec:
        counts["decode"] += 1
        return decode(data)

    monkeypatch.setattr(codec, "spec_data", counted_encode)
    monkeypatch.setattr(codec, "spec_from", counted_decode)
    return counts


def _poll_until(worker: ControllerProxy, epoch: int, count: int) -> list[tuple[TaskAssignment, ...]]:
    """The worker's poll answers that started tasks, until ``count`` tasks were started."""
    answers: list[tuple[TaskAssignment, ...]] = []

    def more() -> bool:
        start = worker.poll("w-1", epoch, 0.2).start
        if start:
            answers.append(start)
        return sum(map(len, answers)) >= count

    wait_until(more, timeout=30, what=f"{count} tasks to be assigned to the worker")
    return answers


def test_the_client_encodes_the_spec_once_and_the_worker_receives_those_bytes(
    controller: tuple[Controller, str], codings: Counter[str]
) -> None:
    ctl, token = controller
    request = JobRequest(
        name="one-form",
        entrypoint=Entrypoint.from_callable(_work, args=(41,)),
        resources=ResourceConfig(cpu=1, ram="64m"),
        replicas=2,
    )
    spec = JobSpec.from_request(request)
    client = controller_client(ctl.address, token)
    worker = controller_client(ctl.address, Credential.mint(token.encode(), WORKER))
    try:
        view = client.submit(spec, user="alice")
        assert codings == {"encode": 1, "decode": 1}, "the client encoded once, the controller decoded once"
        sent = codec.encode_spec(spec)  # what the client sent (encoding is deterministic)
        codings.clear()
        assert ctl.store.job_request(view.job_id) == sent, "the controller stores the client's bytes as they came"

        info = WorkerInfo("w-1", 4000, 8 << 30, 10 << 30)
        epoch = worker.register_worker(info, "127.0.0.1:1", [], []).epoch
        answers = _poll_until(worker, epoch, 2)
        started = [a for answer in answers for a in answer]
        assert [a.encoded_spec for a in started] == [sent, sent], "each assignment carries the client's bytes"
        assert all(a.spec == spec for a in started)
        assert codings["encode"] == 0, "the controller never encoded the spec again"
        assert codings["decode"] == len(answers), "the worker decoded it once per answer, the replicas sharing it"
    finally:
        client.close()
        worker.close()


def test_a_spec_dropped_from_the_controllers_cache_is_forwarded_as_stored(
    controller: tuple[Controller, str], codings: Counter[str]
) -> None:
    ctl, token = controller
    specs = [
        JobSpec.from_request(JobRequest(name=f"job{i}", entrypoint=Entrypoint.from_binary("true", [str(i)])))
        for i in range(3)
    ]
    client = controller_client(ctl.address, token)
    worker = controller_client(ctl.address, Credential.mint(token.encode(), WORKER))
    try:
        views = client.submit_many(specs, user="alice")
        for view in views:
            ctl.service._specs._specs.pop(view.job_id)  # as the LRU drops a spec under memory pressure
        sent = {codec.encode_spec(s) for s in specs}
        codings.clear()
        epoch = worker.register_worker(WorkerInfo("w-1", 8000, 8 << 30, 10 << 30), "127.0.0.1:1", [], []).epoch
        started = [a for answer in _poll_until(worker, epoch, 3) for a in answer]
        assert {a.encoded_spec for a in started} == sent, "the stored bytes are forwarded as they are"
        assert codings["encode"] == 0
        assert codings["decode"] == 6, "once in the controller (a cache miss) and once in the worker, per job"
    finally:
        client.close()
        worker.close()
