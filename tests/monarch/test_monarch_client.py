"""Monarch-specific behaviour of the client: specs, refused settings, logs, meshes, where handles work."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

import fray
from fray import (
    ActorUnavailableError,
    ConfigError,
    Entrypoint,
    EnvironmentConfig,
    GpuConfig,
    JobRequest,
    JobStatus,
    RemoteError,
    ResourceConfig,
    current_client,
)
from support import wait_until

pytest.importorskip("monarch.actor", reason='needs torchmonarch: pip install "fray[monarch]"')


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def add(self, amount: int = 1) -> int:
        self.value += amount
        return self.value

    def shout(self, text: str) -> str:
        print(f"shouting {text}", flush=True)
        return text.upper()

    def fail(self) -> None:
        raise ValueError("counter broke")


class Relay:
    """Calls another actor through a handle it was given, or creates one of its own."""

    def call_through(self, other, amount: int) -> int:
        return other.add(amount)

    def spawn_and_call(self, name: str) -> tuple[int, str]:
        child = current_client().create_actor(Counter, 40, name=name)
        return child.add(2), type(current_client()).__name__


def read_job_status(job) -> None:
    job.status()


def test_specs_parse_and_bad_ones_are_refused(monarch_env):
    client = fray.client_from_spec("monarch?procs=3")
    try:
        assert client.procs == 3 and client.spec == "monarch?procs=3"
    finally:
        client.shutdown()
    for bad in ("monarch?procs=0", "monarch?procs=x", "monarch?threads=2", "monarch://host:1"):
        with pytest.raises(ConfigError, match="monarch"):
            fray.client_from_spec(bad)


def test_settings_monarch_cannot_honour_are_refused_by_name(monarch_client, uid):
    with pytest.raises(ConfigError, match="regions"):
        monarch_client.create_actor(Counter, name=f"c-{uid}", resources=ResourceConfig(regions=["us-east1"]))
    with pytest.raises(ConfigError, match="device"):
        monarch_client.create_actor_group(
            Counter, name=f"g-{uid}", count=2, resources=ResourceConfig(device=GpuConfig("H100", 1))
        )
    entry = Entrypoint.from_binary("true")
    with pytest.raises(ConfigError, match="docker_image"):
        monarch_client.submit(
            JobRequest(name=f"j-{uid}", entrypoint=entry, environment=EnvironmentConfig(docker_image="img:1"))
        )
    with pytest.raises(ConfigError, match="not installed"):
        monarch_client.submit(
            JobRequest(
                name=f"p-{uid}", entrypoint=entry, environment=EnvironmentConfig(pip_packages=["no-such-pkg-xyz"])
            )
        )


def test_actor_output_is_in_its_jobs_logs(monarch_client, uid):
    group = monarch_client.create_actor_group(Counter, name=f"loud-{uid}", count=1)
    actor = group.wait_ready(timeout=120)[0]
    assert actor.shout("hello") == "HELLO"
    wait_until(lambda: "shouting hello" in group.jobs[0].logs(), what="the actor's print in its logs")
    assert group.jobs[0].logs(max_lines=1)  # the last line; max_lines=0 means every line, as in marin


def test_group_mesh_is_reachable_for_broadcast(monarch_client, uid):
    group = monarch_client.create_actor_group(Counter, 5, name=f"mesh-{uid}", count=3)
    handles = group.wait_ready(timeout=120)
    handles[0].add(1)
    assert fray.monarch.broadcast(group, "add", 10) == [16, 15, 15]
    mesh = fray.monarch.actor_mesh(group)
    replies = mesh.invoke.call("add", (0,), {}).get(timeout=60)
    assert [reply for reply in replies.values()] == [("ok", 16), ("ok", 15), ("ok", 15)]
    with pytest.raises(ValueError, match="counter broke") as info:
        fray.monarch.broadcast(group, "fail")
    assert isinstance(info.value, RemoteError)
    with pytest.raises(ConfigError, match="MonarchClient"):
        fray.monarch.actor_mesh(fray.ActorGroup([], []))


def test_handle_passed_to_another_actor_works_there(monarch_client, uid):
    counter = monarch_client.create_actor(Counter, 1, name=f"target-{uid}")
    relay = monarch_client.create_actor(Relay, name=f"relay-{uid}")
    assert relay.call_through(counter, 2) == 3
    assert counter.add(0) == 3


def test_actor_creates_actors_through_its_current_client(monarch_client, uid):
    relay = monarch_client.create_actor(Relay, name=f"parent-{uid}")
    assert relay.spawn_and_call(f"child-{uid}") == (42, "MonarchClient")


def test_job_handles_work_only_in_the_submitting_process(monarch_client, uid):
    sleeper = monarch_client.submit(
        JobRequest(name=f"sleep-{uid}", entrypoint=Entrypoint.from_binary("sleep", ["300"]))
    )
    try:
        again = pickle.loads(pickle.dumps(sleeper))
        assert again.status() == JobStatus.RUNNING or again.status() == JobStatus.PENDING
        reader = monarch_client.submit(
            JobRequest(name=f"read-{uid}", entrypoint=Entrypoint.from_callable(read_job_status, args=(sleeper,)))
        )
        with pytest.raises(ActorUnavailableError, match="another process"):
            reader.wait(timeout=120)
    finally:
        sleeper.terminate()
    assert sleeper.wait(timeout=60) == JobStatus.STOPPED


def test_actor_handle_refuses_another_host_clearly(monarch_client, uid):
    counter = monarch_client.create_actor(Counter, name=f"local-{uid}")
    rebuild, args = counter.__reduce__()
    elsewhere = rebuild(*args[:4], "some-other-host", "")
    with pytest.raises(ActorUnavailableError, match="only on the host"):
        elsewhere.add(1)
    assert counter.add(1) == 1


def test_fray_info_says_monarch_is_usable():
    from fray.cli import main

    data = json.loads(CliRunner().invoke(main, ["info", "--json"]).output)
    assert data["engines"]["monarch"] is True
    assert data["engine_status"]["monarch"].startswith("usable")


def test_remote_futures_complete_however_they_are_waited_on(monarch_client, uid):
    counter = monarch_client.create_actor(Counter, name=f"fut-{uid}")
    futures = [counter.add.remote(1) for _ in range(64)]
    done, not_done = concurrent.futures.wait(futures, timeout=60)
    assert not not_done and sorted(f.result() for f in done) == list(range(1, 65))
    more = [counter.add.remote(1) for _ in range(16)]
    assert sorted(f.result() for f in concurrent.futures.as_completed(more, timeout=60)) == list(range(65, 81))
    called = threading.Event()
    counter.add.remote(1).add_done_callback(lambda _: called.set())
    assert called.wait(60)
    polled = counter.add.remote(1)
    wait_until(polled.done, what="done() to see the answer")
    assert polled.result(timeout=0) == 82
    failing = counter.fail.remote()
    assert isinstance(failing.exception(timeout=60), ValueError)


def test_the_quickstart_runs_unchanged_on_monarch(monarch_env):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "FRAY_CLIENT_SPEC": "monarch"}
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "quickstart.py")], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "backend: MonarchClient" in out.stdout
    assert "job.logs() holds 4 lines" in out.stdout and "from 3 scorers" in out.stdout
    assert "scorer statuses after shutdown: ['stopped', 'stopped', 'stopped']" in out.stdout
    assert "cause: ValueError('shard 17 has a corrupt header')" in out.stdout
