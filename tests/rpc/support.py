"""Helpers for the RPC tests: actor servers running in their own (spawned) processes."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from typing import Any

TOKEN = "test-cluster-token"


def _serve(
    ready: Any, actors: dict[str, tuple[str, int]], token: str | None, namespace: str | None, registry: str | None
) -> None:
    from fray.cluster.rpc import ActorServer, RegistryClient, serve_registry
    from rpc.actors import ACTOR_CLASSES

    mapping = RegistryClient(registry, token=token) if registry else None
    server = ActorServer(token=token, namespace=namespace, registry=mapping)
    if registry is None and "__registry__" in actors:
        serve_registry(server)
    for name, (class_name, max_concurrency) in actors.items():
        if name != "__registry__":
            server.register(name, ACTOR_CLASSES[class_name](), max_concurrency=max_concurrency)
    ready.put(server.address)
    server.serve()


@dataclass
class ServerProcess:
    """An ActorServer in another process."""

    address: str
    process: Any

    def url(self, name: str) -> str:
        return f"actor://{self.address}/{name}"

    def kill(self) -> None:
        """SIGKILL: the kernel closes its sockets, nothing is flushed."""
        self.process.kill()
        self.process.join(timeout=30)


def start_server(
    actors: dict[str, tuple[str, int]],
    *,
    token: str | None = TOKEN,
    namespace: str | None = None,
    registry: str | None = None,
) -> ServerProcess:
    """Start a server process serving ``actors`` (name -> (class name, max_concurrency))."""
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    process = ctx.Process(target=_serve, args=(ready, actors, token, namespace, registry), daemon=True)
    process.start()
    address = ready.get(timeout=60)
    return ServerProcess(address, process)
