"""Fray's actor RPC against raw-socket floors and a Ray actor, in one run.

Usage::

    python benchmarks/actor_rpc.py            # ~2-3 minutes: floors, Fray on both transports, Ray
    python benchmarks/actor_rpc.py --no-ray   # without Ray (~1 minute)
    python benchmarks/actor_rpc.py --quick    # fewer calls, a smoke test

Every server runs in its own process; the client is this process. Peers:

* ``raw tcp`` / ``raw unix`` -- the floors: a blocking socket echoing length-prefixed frames, no
  serialisation, over TCP loopback and over a Unix socket;
* ``fray tcp`` -- an ``ActorClient`` kept on TCP (``FRAY_RPC_LOCAL=0`` while it connects);
* ``fray local`` -- an ``ActorClient`` on the local transport it picks by itself on one host (a
  Unix socket; segments of 1 MiB or more as memfds);
* ``ray actor`` -- a Ray actor on a local cluster of this run's own, measured after the others
  (its daemons keep both cores busy while it is up).

Small calls are measured at two CPU placements, because where the kernel runs the server decides
the floor: ``one CPU`` pins client and server to CPU 0, ``two CPUs`` pins the client to CPU 0 and
the server to CPU 1. Each Fray figure is compared with the floor of its own transport at the same
placement; peers take turns round by round. Large payloads (64 MiB, numpy / bytes / bytearray; the
method returns its argument, so the bytes cross twice; GB/s is payload size over round-trip time)
are measured at the two-CPU placement, five round trips each, with their spread ((max-min)/median).
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
ROUNDS = 5
_LEN = struct.Struct("!Q")
MIB = 1 << 20


def pin(pid: int, cpu: int) -> None:
    """Run process ``pid`` (all its threads) on CPU ``cpu`` only, where the machine has it."""
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(pid, {cpu})
        for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
            os.sched_setaffinity(int(tid), {cpu})


# ---------------------------------------------------------------------------------------------
# Raw-socket floors: length-prefixed frames over one blocking socket, no serialisation.


def _recv_into(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True


def _raw_server(ready: Any, family: int, path: str) -> None:
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind(path if family == socket.AF_UNIX else ("127.0.0.1", 0))
    listener.listen()
    ready.put(listener.getsockname())
    sock, _ = listener.accept()
    if family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(8)
    while _recv_into(sock, memoryview(header)):
        body = bytearray(_LEN.unpack(header)[0])
        if not _recv_into(sock, memoryview(body)):
            return
        sock.sendmsg([header, body])


class RawPeer:
    """A floor: what a blocking socket costs with no protocol at all."""

    def __init__(self, family: int) -> None:
        self.family = family
        self.dir = tempfile.mkdtemp(prefix="fray-bench-")
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        self.proc = ctx.Process(target=_raw_server, args=(ready, family, f"{self.dir}/echo.sock"), daemon=True)
        self.proc.start()
        address = ready.get(timeout=60)
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.connect(address)
        if family != socket.AF_UNIX:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pid = self.proc.pid

    def _send(self, payload: Any) -> None:
        self.sock.sendmsg([_LEN.pack(memoryview(payload).nbytes), payload])

    def _recv(self) -> bytearray:
        header = bytearray(8)
        _recv_into(self.sock, memoryview(header))
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
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Fray


class Echo:
    """The benchmark actor."""

    def echo(self, value: Any) -> Any:
        return value


def _fray_server(ready: Any, token: str) -> None:
    from fray.cluster.rpc import ActorServer

    server = ActorServer(token=token)
    server.register("echo", Echo())
    ready.put(server.address)
    server.serve()


class FrayPeer:
    """Fray's ActorClient calling an ActorServer in another process, on one transport."""

    def __init__(self, local: bool) -> None:
        from fray.cluster.rpc import ActorClient, FixedResolver

        token = os.urandom(16).hex()
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        self.proc = ctx.Process(target=_fray_server, args=(ready, token), daemon=True)
        self.proc.start()
        self.pid = self.proc.pid
        address = ready.get(timeout=60)
        self.client = ActorClient(FixedResolver({"echo": f"actor://{address}/echo"}), "echo", token=token)
        # The client picks its transport when it connects (its first call), and keeps it.
        saved = os.environ.get("FRAY_RPC_LOCAL")
        os.environ["FRAY_RPC_LOCAL"] = "1" if local else "0"
        try:
            self.client.echo(0)
        finally:
            if saved is None:
                os.environ.pop("FRAY_RPC_LOCAL", None)
            else:
                os.environ["FRAY_RPC_LOCAL"] = saved
        conn = self.client._channel._conn
        assert conn is not None and conn.is_local == local, "the client is not on the transport asked for"

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
    """A Ray actor (on a local cluster started by this script, in its own temp dir)."""

    pid = 0

    def __init__(self) -> None:
        import ray

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


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def small_calls(peers: dict[str, Any], calls: int) -> dict[str, dict[str, float]]:
    """Sync latency and pipelined throughput; peers take turns round by round."""
    latencies: dict[str, list[float]] = {name: [] for name in peers}
    rates: dict[str, list[float]] = {name: [] for name in peers}
    for peer in peers.values():  # warm up: code paths, allocator
        for _ in range(300):
            peer.call(SMALL)
        peer.pipelined(1000)
    per_round = max(calls // ROUNDS, 1)
    for _ in range(ROUNDS):
        for name, peer in peers.items():
            for _ in range(per_round):
                start = time.perf_counter()
                peer.call(SMALL)
                latencies[name].append(time.perf_counter() - start)
            n = per_round * 4
            start = time.perf_counter()
            peer.pipelined(n)
            rates[name].append(n / (time.perf_counter() - start))
    return {
        name: {
            "p50_us": _percentile(latencies[name], 0.5) * 1e6,
            "p99_us": _percentile(latencies[name], 0.99) * 1e6,
            "calls_per_s": statistics.median(rates[name]),
        }
        for name in peers
    }


def payloads() -> dict[str, Any]:
    data = np.random.default_rng(0).integers(0, 255, 64 * MIB, dtype=np.uint8)
    return {"numpy": data, "bytes": data.tobytes(), "bytearray": bytearray(data.tobytes())}


def large_calls(peers: dict[str, Any], runs: int) -> dict[str, dict[str, float]]:
    """64 MiB round trips of each payload kind, ``runs`` each (after one warm-up), peers in turns."""
    kinds = payloads()
    one_mib = np.ones(MIB, dtype=np.uint8)
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in peers for k in [*kinds, "1mib"]}
    for peer in peers.values():
        for value in kinds.values():
            peer.call(value)
    for _ in range(runs):
        for name, peer in peers.items():
            for kind, value in kinds.items():
                start = time.perf_counter()
                peer.call(value)
                times[(name, kind)].append(time.perf_counter() - start)
            for _ in range(5):
                start = time.perf_counter()
                peer.call(one_mib)
                times[(name, "1mib")].append(time.perf_counter() - start)
    out: dict[str, dict[str, float]] = {}
    for (name, kind), samples in times.items():
        median = statistics.median(samples)
        row = out.setdefault(name, {})
        row[f"{kind}_ms"] = median * 1e3
        if kind != "1mib":
            row[f"{kind}_gbps"] = 64 * MIB / median / 1e9
            row[f"{kind}_spread"] = (max(samples) - min(samples)) / median
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="sequential calls per peer and placement")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray peer")
    parser.add_argument("--quick", action="store_true", help="fewer calls and round trips (a smoke test)")
    args = parser.parse_args()
    calls, runs = (1000, 3) if args.quick else (args.calls, 5)

    factories: dict[str, Callable[[], Any]] = {
        "raw tcp": lambda: RawPeer(socket.AF_INET),
        "raw unix": lambda: RawPeer(socket.AF_UNIX),
        "fray tcp": lambda: FrayPeer(local=False),
        "fray local": lambda: FrayPeer(local=True),
    }
    small: dict[str, dict[str, dict[str, float]]] = {}
    large: dict[str, dict[str, float]] = {}
    peers: dict[str, Any] = {}
    own_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    try:
        for name, factory in factories.items():
            peers[name] = factory()
        for placement, server_cpu in (("one CPU", 0), ("two CPUs", 1)):
            pin(os.getpid(), 0)
            for peer in peers.values():
                pin(peer.pid, server_cpu)
            small[placement] = small_calls(peers, calls)
        large = large_calls({n: p for n, p in peers.items() if n.startswith("fray")}, runs)
    finally:
        for peer in peers.values():
            peer.close()
        if own_cpus:
            os.sched_setaffinity(0, own_cpus)
    ray_small: dict[str, float] = {}
    if not args.no_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("(ray not installed: skipping the Ray peer)")
        else:
            ray_peer = RayPeer()
            try:
                ray_small = small_calls({"ray actor": ray_peer}, calls // 2)["ray actor"]
                large.update(large_calls({"ray actor": ray_peer}, runs))
            finally:
                ray_peer.close()
    report(small, large, ray_small, calls)


def report(
    small: dict[str, dict[str, dict[str, float]]],
    large: dict[str, dict[str, float]],
    ray_small: dict[str, float],
    calls: int,
) -> None:
    print(f"\nFray actor RPC ({os.cpu_count()} CPUs, {calls} sequential calls per peer and placement, {ROUNDS} rounds)")
    print("\nSmall calls (30-byte echo)\n")
    print("| placement | peer | sync p50 µs | sync p99 µs | calls/s, 64 in flight | p50 / floor | calls/s / floor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for placement, rows in small.items():
        for name, row in rows.items():
            floor = rows["raw unix" if name == "fray local" else "raw tcp"]
            ratio = "" if name.startswith("raw") else f"{row['p50_us'] / floor['p50_us']:.2f}x"
            rate = "" if name.startswith("raw") else f"{row['calls_per_s'] / floor['calls_per_s']:.2f}x"
            print(
                f"| {placement} | {name} | {row['p50_us']:.1f} | {row['p99_us']:.1f} | {row['calls_per_s']:,.0f} "
                f"| {ratio} | {rate} |"
            )
    if ray_small:
        print(
            f"| unpinned | ray actor | {ray_small['p50_us']:.1f} | {ray_small['p99_us']:.1f} "
            f"| {ray_small['calls_per_s']:,.0f} | | |"
        )
    print("\nLarge payloads, round trip (two CPUs; spread = (max - min) / median)\n")
    print(
        "| peer | 1 MiB ms | 64 MiB numpy GB/s | spread | 64 MiB bytearray GB/s | spread | 64 MiB bytes GB/s | spread |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in large.items():
        print(
            f"| {name} | {row['1mib_ms']:.2f} | {row['numpy_gbps']:.2f} | {row['numpy_spread']:.0%} "
            f"| {row['bytearray_gbps']:.2f} | {row['bytearray_spread']:.0%} | {row['bytes_gbps']:.2f} "
            f"| {row['bytes_spread']:.0%} |"
        )
    print("\nGoals: sync p50 <= 1.5x the floor of the same transport and placement; pipelined >= 0.5x;")
    print("64 MiB >= 2 GB/s (numpy, bytearray) and >= 0.9 GB/s (bytes), spread <= 20 %", end="")
    if "ray actor" in large:
        ray_numpy = large["ray actor"]["numpy_gbps"]
        fray_numpy = large["fray local"]["numpy_gbps"]
        print(f"; numpy >= 0.6x Ray's: fray local / ray = {fray_numpy / ray_numpy:.2f}x", end="")
    print(".")


if __name__ == "__main__":
    main()
