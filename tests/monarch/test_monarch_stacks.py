"""Live stacks on Monarch (``fray.monarch._stacks``): what the conformance suite does not pin down.

A replica of several processes per task is its ranks, each asked on its own; a handle unpickled
in another process (here: this one, with the record out of reach) asks the actor for its pid.
"""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import pytest

import fray
from fray import ActorConfig, Entrypoint, JobRequest
from fray.monarch.actors import MonarchActorHandle
from support import wait_until

pytest.importorskip("monarch.actor", reason='needs torchmonarch: pip install "fray[monarch]"')


def ranked_sleep(stop: str) -> None:
    deadline = time.monotonic() + 120
    while not Path(stop).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()

    def wait_here(self) -> None:
        self.event.wait(60)

    def release(self) -> None:
        self.event.set()


def _functions(process: fray.ProcessStacks) -> set[str]:
    return {frame.function for thread in process.threads for frame in thread.frames}


def test_each_rank_of_a_replica_is_asked_on_its_own(monarch_client, uid, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    job = monarch_client.submit(
        JobRequest(
            name=f"ranks-{uid}",
            entrypoint=Entrypoint.from_callable(ranked_sleep, args=(str(stop),)),
            processes_per_task=2,
        )
    )
    try:

        def ranks() -> list[fray.ProcessStacks]:
            return [p for p in job.stacks(timeout=5) if "ranked_sleep" in _functions(p)]

        found = wait_until(ranks, timeout=60, what="ranked_sleep in both ranks")
        found = found if len(found) == 2 else wait_until(lambda: len(ranks()) == 2 and ranks(), timeout=30)
        assert sorted(p.label for p in found) == ["replica 0 process 0", "replica 0 process 1"]
    finally:
        stop.touch()
        job.terminate()


def test_a_handle_without_the_record_asks_the_actor_for_its_pid(monarch_client, uid) -> None:
    actor = monarch_client.create_actor(Waiter, name=f"waiter-{uid}", actor_config=ActorConfig(max_concurrency=2))
    call = actor.wait_here.remote()
    elsewhere = pickle.loads(pickle.dumps(actor))
    elsewhere._record = None  # as in a process that did not create the actor
    try:
        found = wait_until(lambda: [p for p in elsewhere.stacks(timeout=5) if "wait_here" in _functions(p)], timeout=30)
        assert found[0].pid is not None and found[0].label == f"actor 'waiter-{uid}'"
        assert isinstance(elsewhere, MonarchActorHandle)
    finally:
        actor.release()
    call.result(timeout=30)
