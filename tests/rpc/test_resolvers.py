"""Resolvers: the endpoint registry, fixed maps, and GCE metadata (against a local stand-in)."""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from fray.cluster.rpc import (
    ActorClient,
    ActorServer,
    EndpointRegistry,
    FixedResolver,
    GceResolver,
    parse_actor_url,
)
from fray.errors import ConfigError
from rpc.actors import Counter


def test_registry_replaces_and_only_unregisters_its_own_url() -> None:
    registry = EndpointRegistry()
    registry.register("ns", "a", "actor://h1:1/a")
    registry.register("ns", "a", "actor://h2:2/a")  # restarted elsewhere
    registry.unregister("ns", "a", "actor://h1:1/a")  # the late goodbye of the old one
    assert registry.resolve("ns", "a") == ["actor://h2:2/a"]
    assert registry.resolve("other", "a") == []
    assert registry.list("ns") == {"a": "actor://h2:2/a"}
    registry.unregister("ns", "a", "actor://h2:2/a")
    assert registry.resolve("ns", "a") == []


def test_fixed_resolver_and_urls() -> None:
    resolver = FixedResolver({"a": "actor://h:1/a", "b": ["actor://h:2/b", "actor://h:3/b"]})
    assert resolver.resolve("a") == ["actor://h:1/a"]
    assert resolver.resolve("b") == ["actor://h:2/b", "actor://h:3/b"]
    assert resolver.resolve("c") == []
    assert parse_actor_url("actor://10.0.0.1:8080/trainer") == ("10.0.0.1", 8080, "trainer")
    for bad in ("grpc://h:1/a", "actor://h/a", "actor://h:1/", "actor://h:x/a"):
        with pytest.raises(ConfigError):
            parse_actor_url(bad)


class _GceStandIn(BaseHTTPRequestHandler):
    """Answers like the GCE metadata server and the Compute API's aggregated instance list."""

    instances: list[dict[str, Any]] = []
    requests: list[str] = []

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        type(self).requests.append(parts.path)
        if parts.path.startswith("/computeMetadata/v1/"):
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, "text/plain", b"missing Metadata-Flavor header")
            if parts.path.endswith("/project/project-id"):
                return self._send(200, "application/text", b"test-project")
            if parts.path.endswith("/service-accounts/default/token"):
                return self._send(200, "application/json", json.dumps({"access_token": "tok"}).encode())
        if parts.path == "/compute/v1/projects/test-project/aggregated/instances":
            if self.headers.get("Authorization") != "Bearer tok":
                return self._send(401, "application/json", b"{}")
            page = parse_qs(parts.query).get("pageToken", ["0"])[0]
            index = int(page)
            body: dict[str, Any] = {"items": {"zones/us-a": {"instances": [self.instances[index]]}}}
            if index + 1 < len(self.instances):
                body["nextPageToken"] = str(index + 1)
            return self._send(200, "application/json", json.dumps(body).encode())
        return self._send(404, "text/plain", b"not found")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gce() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _GceStandIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _instance(ip: str, endpoints: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": f"vm-{ip}",
        "networkInterfaces": [{"networkIP": ip}],
        "metadata": {"items": [{"key": "fray-endpoints", "value": json.dumps(endpoints)}]},
    }


def test_gce_resolver_reads_endpoints_from_instance_metadata(gce: str) -> None:
    with ActorServer() as server:
        server.register("counter", Counter(), namespace="run-a")
        _GceStandIn.instances = [
            _instance("127.0.0.1", {"run-a/counter": int(server.address.rsplit(":", 1)[1])}),
            _instance("10.0.0.9", {"run-b/counter": "actor://10.0.0.9:7/counter", "run-a/other": 99}),
        ]
        resolver = GceResolver(
            namespace="run-a", metadata_url=f"{gce}/computeMetadata/v1", compute_url=f"{gce}/compute/v1"
        )
        assert resolver.resolve("counter") == [server.url("counter")]
        assert resolver.resolve("other") == ["actor://10.0.0.9:99/other"]
        assert GceResolver(
            namespace="run-b", metadata_url=f"{gce}/computeMetadata/v1", compute_url=f"{gce}/compute/v1"
        ).resolve("counter") == ["actor://10.0.0.9:7/counter"]
        assert ActorClient(resolver, "counter").incr() == 1
        assert pickle.loads(pickle.dumps(ActorClient(resolver, "counter"))).incr() == 2
        calls = len(_GceStandIn.requests)
        resolver.resolve("counter")
        assert len(_GceStandIn.requests) == calls  # answered from the cache


def test_gce_resolver_honours_gce_metadata_host(gce: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", gce.removeprefix("http://"))
    _GceStandIn.instances = [_instance("10.1.1.1", {"default/x": 5})]
    resolver = GceResolver(compute_url=f"{gce}/compute/v1")
    assert resolver.resolve("x") == ["actor://10.1.1.1:5/x"]
