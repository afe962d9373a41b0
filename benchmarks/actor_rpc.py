"""Benchmark of Fray's actor RPC against a raw-socket echo floor and a Ray actor, in one run.

Usage: ``python benchmarks/actor_rpc.py [--calls 5000] [--no-ray]``

Every server runs in its own process; the client is this process. Printed:
sync-call latency p50/p99, pipelined throughput (64 calls in flight on one
connection, median of rounds), and 1 MB / 64 MB argument round trips (the method returns its
argument, so the bytes cross twice; GB/s is payload size over round-trip time).
Ratios compare Fray with the peers measured in this same run, since absolute
numbers on shared machines drift between runs. The raw socket and Fray take turns
round by round; Ray is measured after them, so that the daemons of its local
cluster do not load the machine while the others run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

WINDOW = 64
SMALL = b"x" * 30
_LEN = struct.Struct("!Q")


# ---------------------------------------------------------------------------------------------
# Raw-socket floor: length-prefixed frames over one blocking TCP socket, no serialisation.


def _raw_server(ready: Any) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    ready.put(listener.getsockname()[1])
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        header = _recv_exact(sock, 8)
        if header is None:
            return
        (n,) = _LEN.unpack(header)
        body = bytearray(n)
        if _recv_into(sock, memoryview(body)) is None:
            return
        sock.sendmsg([header, body])


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    return bytes(buf) if _recv_into(sock, memoryview(buf)) is not None else None


def _recv_into(sock: socket.socket, view: memoryview) -> int | None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return got


class RawPeer:
    """The floor: what a blocking socket costs with no protocol at all."""

    name = "raw socket echo"

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        self.proc = ctx.Process(target=_raw_server, args=(ready,), daemon=True)
        self.proc.start()
        self.sock = socket.create_connection(("127.0.0.1", ready.get(timeout=60)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, payload: Any) -> None:
        self.sock.sendmsg([_LEN.pack(memoryview(payload).nbytes), payload])

    def _recv(self) -> bytearray:
        header = _recv_exact(self.sock, 8)
        assert header is not None
        body = bytearray(_LEN.unpack(header)[0])
        _recv_into(self.sock, memoryview(body))
        return body

    def call(self, payload: Any) -> Any:
        self._send(payload)
        return self._recv()

    def pipelined(self, n: int) -> None:
        in_flight = 0
        for _ in range(n):
            self._send(SMALL)
            in_flight += 1
            if in_flight >= WINDOW:
                self._recv()
                in_flight -= 1
        for _ in range(in_flight):
            self._recv()

    def close(self) -> None:
        self.sock.close()
        self.proc.kill()


# ---------------------------------------------------------------------------------------------
# Fray


class Echo:
    """The benchmark actor."""

    def echo(self, value: Any) -> Any:
        return value


def _fray_server(ready: Any, token: str) -> None:
    from fray.rpc import ActorServer

    server = ActorServer(token=token)
    server.register("echo", Echo())
    ready.put(server.address)
    server.serve()


class FrayPeer:
    """Fray's ActorClient calling an ActorServer in another process."""

    name = "fray"

    def __init__(self) -> None:
        from fray.rpc import ActorClient, FixedResolver

        token = os.urandom(16).hex()
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        self.proc = ctx.Process(target=_fray_server, args=(ready, token), daemon=True)
        self.proc.start()
        address = ready.get(timeout=60)
        self.client = ActorClient(FixedResolver({"echo": f"actor://{address}/echo"}), "echo", token=token)

    def call(self, payload: Any) -> Any:
        return self.client.echo(payload)

    def pipelined(self, n: int) -> None:
        window: list[Any] = []
        remote = self.client.echo.remote
        for i in range(n):
            window.append(remote(i))
            if len(window) >= WINDOW:
                window.pop(0).result()
        for future in window:
            future.result()

    def close(self) -> None:
        self.client.close()
        self.proc.kill()


# ---------------------------------------------------------------------------------------------
# Ray


class RayPeer:
    """A Ray actor (local cluster started by this script)."""

    name = "ray actor"

    def __init__(self) -> None:
        import ray

        # A cluster of this process's own (ray.shutdown() stops exactly it), in its own temp dir.
        self.temp_dir = tempfile.mkdtemp(prefix="fray-bench-ray-", dir="/tmp")
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            _temp_dir=self.temp_dir,
        )

        @ray.remote
        class RayEcho:
            def echo(self, value: Any) -> Any:
                return value

        self.ray = ray
        self.actor = RayEcho.remote()  # type: ignore[attr-defined]
        ray.get(self.actor.echo.remote(0))

    def call(self, payload: Any) -> Any:
        return self.ray.get(self.actor.echo.remote(payload))

    def pipelined(self, n: int) -> None:
        window: list[Any] = []
        for i in range(n):
            window.append(self.actor.echo.remote(i))
            if len(window) >= WINDOW:
                self.ray.get(window.pop(0))
        self.ray.get(window)

    def close(self) -> None:
        self.ray.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------


ROUNDS = 5


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(peers: dict[str, Any], calls: int) -> dict[str, dict[str, float]]:
    """Latency, throughput and large round trips of every peer.

    The peers take turns, round by round, so that load from other processes on a
    shared machine hits all of them alike; each figure is over all rounds.
    """
    names = list(peers)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    big: dict[str, dict[str, list[float]]] = {name: {"1mb_ms": [], "64mb_ms": []} for name in names}
    payloads = {
        "1mb_ms": np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8),
        "64mb_ms": np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8),
    }
    for name in names:  # warm up: connections, code paths, allocator
        for _ in range(300):
            peers[name].call(SMALL)
        peers[name].pipelined(1000)
        for payload in payloads.values():
            peers[name].call(payload)
    per_round = max(calls // ROUNDS, 1)
    for _ in range(ROUNDS):
        for name in names:
            peer = peers[name]
            for _ in range(per_round):
                start = time.perf_counter()
                peer.call(SMALL)
                latencies[name].append(time.perf_counter() - start)
            n = per_round * 4
            start = time.perf_counter()
            peer.pipelined(n)
            rates[name].append(n / (time.perf_counter() - start))
            for _ in range(10):
                big[name]["1mb_ms"].append(_timed(lambda p=payloads["1mb_ms"], peer=peer: peer.call(p)))
            for _ in range(3):
                big[name]["64mb_ms"].append(_timed(lambda p=payloads["64mb_ms"], peer=peer: peer.call(p)))
    results = {}
    for name in names:
        samples = sorted(latencies[name])
        row = {
            "p50_us": samples[len(samples) // 2] * 1e6,
            "p99_us": samples[int(len(samples) * 0.99)] * 1e6,
            "calls_per_s": statistics.median(rates[name]),
            "1mb_ms": statistics.median(big[name]["1mb_ms"]) * 1e3,
            "64mb_ms": statistics.median(big[name]["64mb_ms"]) * 1e3,
        }
        row["64mb_gbps"] = (64 << 20) / (row["64mb_ms"] / 1e3) / 1e9
        results[name] = row
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="sequential calls for the latency figures")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray peer")
    args = parser.parse_args()

    peers: list[tuple[str, Callable[[], Any]]] = [("raw socket echo", RawPeer), ("fray", FrayPeer)]
    if not args.no_ray:
        try:
            import ray  # noqa: F401

            peers.append(("ray actor", RayPeer))
        except ImportError:
            print("(ray not installed: skipping the Ray peer)")
    # Raw socket and Fray take turns round by round. Ray runs afterwards: its daemons
    # keep both cores busy while a Ray cluster is up, which would slow the others too.
    results: dict[str, dict[str, float]] = {}
    for group in ([p for p in peers if p[0] != "ray actor"], [p for p in peers if p[0] == "ray actor"]):
        if not group:
            continue
        started: dict[str, Any] = {}
        try:
            for name, factory in group:
                started[name] = factory()
            results.update(measure(started, args.calls))
        finally:
            for peer in started.values():
                peer.close()

    columns = [
        ("p50_us", "sync p50 µs"),
        ("p99_us", "sync p99 µs"),
        ("calls_per_s", f"calls/s ({WINDOW} in flight)"),
        ("1mb_ms", "1 MB round trip ms"),
        ("64mb_ms", "64 MB round trip ms"),
        ("64mb_gbps", "64 MB GB/s"),
    ]
    print(
        f"\nFray actor RPC benchmark ({os.cpu_count()} CPUs, {args.calls} sequential calls per peer, {ROUNDS} interleaved rounds)\n"
    )
    print("| peer | " + " | ".join(title for _, title in columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(_fmt(row[key]) for key, _ in columns) + " |")
    fray = results["fray"]
    floor = results["raw socket echo"]
    print("\nRatios (measured in this run):")
    print(f"  fray p50 / raw-socket p50            = {fray['p50_us'] / floor['p50_us']:.2f}x   (target <= 2x)")
    print(f"  fray calls/s / raw-socket calls/s    = {fray['calls_per_s'] / floor['calls_per_s']:.2f}x")
    print(f"  fray 64 MB round trip                = {fray['64mb_gbps']:.2f} GB/s   (target >= 1 GB/s)")
    if "ray actor" in results:
        ray_row = results["ray actor"]
        print(f"  ray p50 / fray p50                   = {ray_row['p50_us'] / fray['p50_us']:.1f}x   (target >= 5x)")
        print(
            f"  fray calls/s / ray calls/s           = {fray['calls_per_s'] / ray_row['calls_per_s']:.1f}x"
            "   (target >= 10x)"
        )
        print(f"  ray 64 MB ms / fray 64 MB ms         = {ray_row['64mb_ms'] / fray['64mb_ms']:.1f}x")


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


if __name__ == "__main__":
    main()
