"""Namespaces: defaults from the environment, isolation, and the opt-in global namespace."""

from __future__ import annotations

import multiprocessing as mp
import pickle
from typing import Any

import pytest

from fray.cluster.rpc import (
    GLOBAL_NAMESPACE,
    ActorClient,
    ActorServer,
    ClusterResolver,
    FixedResolver,
    RegistryClient,
    default_namespace,
)
from fray.errors import ActorUnavailableError, ConfigError
from rpc.actors import Counter


def test_namespace_defaults_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_namespace() == "default"
    monkeypatch.setenv("FRAY_JOB_ID", "root-abc123/child-def456")
    assert default_namespace() == "root-abc123"
    monkeypatch.setenv("FRAY_NAMESPACE", "explicit")
    assert default_namespace() == "explicit"
    assert ActorServer().namespace == "explicit"
    assert ClusterResolver("127.0.0.1:1").namespace == "explicit"
    assert ActorClient(FixedResolver({}), "x").namespace == "explicit"
    with pytest.raises(ConfigError):
        ActorClient(FixedResolver({}), "x", namespace="a/b")


def test_two_namespaces_never_see_each_others_actors(server_factory) -> None:
    registry = server_factory({"__registry__": ("", 0)})
    run_a = server_factory({"counter": ("Counter", 1)}, namespace="run-a", registry=registry.address)
    run_b = server_factory({"counter": ("Counter", 1)}, namespace="run-b", registry=registry.address)
    in_a = ActorClient(ClusterResolver(registry.address, namespace="run-a"), "counter")
    in_b = ActorClient(ClusterResolver(registry.address, namespace="run-b"), "counter")
    in_c = ActorClient(ClusterResolver(registry.address, namespace="run-c"), "counter")
    assert in_a.incr(10) == 10 and in_b.incr(1) == 1  # same name, two actors
    assert in_a.pid() == run_a.process.pid and in_b.pid() == run_b.process.pid
    with pytest.raises(ActorUnavailableError, match="no endpoint"):
        in_c.incr()
    assert set(RegistryClient(registry.address).list("run-a")) == {"counter"}
    # Even a URL carried across namespaces does not reach the actor: the server checks.
    leaked = ActorClient(FixedResolver({"counter": run_a.url("counter")}), "counter", namespace="run-b")
    with pytest.raises(ActorUnavailableError, match="no actor named 'counter' in namespace 'run-b'"):
        leaked.incr()


def test_global_namespace_is_shared_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAY_NAMESPACE", "run-a")
    with ActorServer() as server:
        server.register("shared", Counter(), namespace=GLOBAL_NAMESPACE)
        server.register("private", Counter())
        url = {"shared": server.url("shared"), "private": server.url("private")}
        monkeypatch.setenv("FRAY_NAMESPACE", "run-b")
        assert ActorClient(FixedResolver(url, namespace=GLOBAL_NAMESPACE), "shared").incr() == 1
        with pytest.raises(ActorUnavailableError):
            ActorClient(FixedResolver(url), "private").incr()
        assert ActorClient(FixedResolver(url, namespace="run-a"), "private").incr() == 1


def _call_in_child(data: bytes, out: Any) -> None:
    handle = pickle.loads(data)
    out.put((handle.namespace, handle.incr()))


def test_pickled_handle_resolves_again_in_another_process(server_factory, monkeypatch) -> None:
    registry = server_factory({"__registry__": ("", 0)})
    server_factory({"counter": ("Counter", 1)}, namespace="run-a", registry=registry.address)
    handle = ActorClient(ClusterResolver(registry.address, namespace="run-a"), "counter", cls=Counter)
    assert handle.incr() == 1
    data = pickle.dumps(handle)
    monkeypatch.setenv("FRAY_NAMESPACE", "something-else")  # the handle keeps its own namespace
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_call_in_child, args=(data, out))
    child.start()
    assert out.get(timeout=60) == ("run-a", 2)
    child.join(timeout=30)
