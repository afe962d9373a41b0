"""Fray-on-Monarch vs raw Monarch, in one run: what the Fray layer costs, and how fast death is seen.

Run by hand (it starts Monarch processes of its own and stops them; nothing else is touched)::

    python benchmarks/monarch.py            # default sizes, ~1-2 minutes on 2 cores
    python benchmarks/monarch.py --quick    # smaller sizes, a smoke test

Machines like ours are noisy, so both sides are measured in one process, in
alternating rounds, and each row reports the median over rounds; the ratio column
is what matters. Raw Monarch is a plain ``monarch.actor.Actor`` with ``@endpoint``
methods; Fray is a plain class behind ``MonarchClient.create_actor``. Both run with
the supervision settings Fray sets (``fray.monarch.supervision``), and one extra
line measures raw Monarch with Monarch's default settings, in a child process.

Goals: Fray adds <= 10 % to call latency and loses <= 10 % of throughput; a killed
actor process shows as an error in <= 2 s.

A second table justifies the layout of actor groups (one mesh of N processes vs N
meshes of one), measured on raw Monarch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# This file has the name of the package it measures: keep its own folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

from monarch.actor import Actor, endpoint, this_host  # noqa: E402

MB = 1 << 20


class RawEcho(Actor):
    """The raw Monarch actor."""

    @endpoint
    def ping(self, value: Any = 0) -> Any:
        return value

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class Echo:
    """The Fray actor: the same methods, no Monarch decorators."""

    def ping(self, value: Any = 0) -> Any:
        return value

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def row(what: str, raw: float, fray: float, unit: str, higher_is_better: bool = False) -> str:
    ratio = fray / raw if raw else float("nan")
    verdict = "(higher is better)" if higher_is_better else ""
    return f"| {what} | {raw:.3f} {unit} | {fray:.3f} {unit} | {ratio:.2f} {verdict} |"


def spawn_raw() -> tuple[Any, Any]:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    actor = procs.spawn("rawecho", RawEcho)
    actor.ping.call_one().get()
    return procs, actor


def death_raw() -> float:
    """Seconds from SIGKILL of a raw actor's process to the in-flight call's error."""
    procs, actor = spawn_raw()
    pid = actor.pid.call_one().get()
    in_flight = actor.sleep.call_one(120)
    time.sleep(0.2)  # the call is running in the actor
    start = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):  # Monarch's SupervisionError: the call failed, as it must
        in_flight.get(timeout=60)
    took = time.perf_counter() - start
    with contextlib.suppress(Exception):
        procs.stop().get(timeout=30)
    return took


def death_fray(client: Any, index: int) -> float:
    """Seconds from SIGKILL of a Fray actor's process to the caller's ActorDiedError."""
    from fray.errors import ActorDiedError

    actor = client.create_actor(Echo, name=f"victim-{index}")
    pid = actor.pid()
    in_flight = actor.sleep.remote(120)
    time.sleep(0.2)
    start = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ActorDiedError):
        in_flight.result(timeout=60)
    return time.perf_counter() - start


_DEFAULT_POLL_CHILD = """
import os, signal, time, monarch.actor
from monarch.actor import Actor, endpoint, this_host
monarch.actor.unhandled_fault_hook = lambda failure: None
class A(Actor):
    @endpoint
    def pid(self): return os.getpid()
    @endpoint
    def sleep(self, s): time.sleep(s)
procs = this_host().spawn_procs(per_host={"procs": 1}); a = procs.spawn("a", A)
pid = a.pid.call_one().get(); f = a.sleep.call_one(120); time.sleep(0.2)
t = time.perf_counter(); os.kill(pid, signal.SIGKILL)
try: f.get(timeout=60)
except Exception: pass
print(time.perf_counter() - t)
"""


def death_raw_default() -> float:
    """The same in a child process with Monarch's default poll interval (the variable unset)."""
    env = {k: v for k, v in os.environ.items() if k != "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"}
    script = os.path.join(tempfile.mkdtemp(prefix="fray-bench-monarch-"), "default_poll.py")
    with open(script, "w") as f:  # Monarch ships __main__'s classes by source: it needs a file
        f.write(_DEFAULT_POLL_CHILD)
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=120)
    return float(out.stdout.strip().splitlines()[-1])


def group_layout(n: int, rounds: int) -> list[str]:
    """One mesh of n processes vs n meshes of one: create -> all answer, a call to all, stop all."""

    def one_mesh() -> tuple[float, float, float]:
        start = time.perf_counter()
        procs = this_host().spawn_procs(per_host={"procs": n})
        mesh = procs.spawn("layout", RawEcho)
        mesh.ping.call().get()
        create = time.perf_counter() - start
        call = statistics.median(timed(lambda: mesh.ping.call().get()) for _ in range(30))
        stop = timed(lambda: procs.stop().get())
        return create, call, stop

    def singletons() -> tuple[float, float, float]:
        start = time.perf_counter()
        meshes = []
        for _ in range(n):
            procs = this_host().spawn_procs(per_host={"procs": 1})
            meshes.append((procs, procs.spawn("layout", RawEcho)))
        for future in [actor.ping.call_one() for _, actor in meshes]:
            future.get()
        create = time.perf_counter() - start
        call = statistics.median(
            timed(lambda: [f.get() for f in [a.ping.call_one() for _, a in meshes]]) for _ in range(30)
        )
        stop = timed(lambda: [f.get() for f in [p.stop() for p, _ in meshes]])
        return create, call, stop

    results: dict[str, list[tuple[float, float, float]]] = {"one": [], "many": []}
    for _ in range(rounds):
        results["one"].append(one_mesh())
        results["many"].append(singletons())
    lines = [f"| group of {n} (raw Monarch) | one mesh of {n} | {n} meshes of 1 | ratio |", "| --- | --- | --- | --- |"]
    for i, what in enumerate(("create -> all answer (s)", "call to every member (ms)", "stop all (s)")):
        scale = 1000.0 if i == 1 else 1.0
        one = statistics.median(r[i] for r in results["one"]) * scale
        many = statistics.median(r[i] for r in results["many"]) * scale
        lines.append(f"| {what} | {one:.3f} | {many:.3f} | {many / one:.2f} |")
    return lines


_IDLE_CHILD = """
import sys, threading, time
from fray.monarch import MonarchClient
class Echo:
    def ping(self): return 1
client = MonarchClient()
count, layout = int(sys.argv[1]), sys.argv[2]
if layout == "group":
    handles = client.create_actor_group(Echo, name="idle", count=count).wait_ready(timeout=120)
else:
    handles = [client.create_actor(Echo, name=f"idle-{i}") for i in range(count if layout == "lone" else 0)]
for handle in handles:
    handle.ping()
threading.Event().wait(1.0)
cpu, wall = time.process_time(), time.perf_counter()
threading.Event().wait(float(sys.argv[3]))
print((time.process_time() - cpu) / (time.perf_counter() - wall))
client.shutdown()
"""


def poll_cost(actors: int, seconds: float, layout: str) -> float:
    """Share of one core a fresh client process spends with ``actors`` idle actors: Monarch's supervision polls.

    ``layout``: "group" (one mesh, polled once for all members), "lone" (a mesh, and a poll, each), "none".
    """
    script = os.path.join(tempfile.mkdtemp(prefix="fray-bench-monarch-"), "idle.py")
    with open(script, "w") as f:
        f.write(_IDLE_CHILD)
    out = subprocess.run(
        [sys.executable, script, str(actors), layout, str(seconds)], capture_output=True, text=True, timeout=300
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--rounds", type=int, default=5, help="alternating raw/Fray rounds per measurement")
    args = parser.parse_args()
    sync_calls, batches, payload_calls, creates, deaths = (200, 10, 20, 2, 3) if args.quick else (1000, 30, 100, 5, 10)
    rounds = 2 if args.quick else args.rounds

    import monarch.actor

    from fray.monarch import MonarchClient, supervision

    os.chdir(tempfile.mkdtemp(prefix="fray-bench-monarch-"))
    # Raw Monarch users handle their meshes' failures themselves (the default hook exits the process);
    # Fray's own hook passes failures of meshes that are not Fray's to this one.
    monarch.actor.unhandled_fault_hook = lambda failure: None
    client = MonarchClient()  # applies Fray's supervision settings to this process (raw Monarch too)
    raw_procs, raw = spawn_raw()
    fray_actor = client.create_actor(Echo, name="echo")
    fray_actor._fray_ready().result(timeout=60)
    payload = os.urandom(MB)
    try:
        for _ in range(200):  # warm both paths
            raw.ping.call_one(1).get()
            fray_actor.ping(1)
            fray_actor.ping.remote(1).result()

        raw_lat: list[float] = []
        fray_lat: list[float] = []
        raw_tp: list[float] = []
        fray_tp: list[float] = []
        fray_tp_wait: list[float] = []
        raw_mb: list[float] = []
        fray_mb: list[float] = []
        for _ in range(rounds):
            for _ in range(sync_calls):  # one by one, alternating
                raw_lat.append(timed(lambda: raw.ping.call_one(1).get()))
                fray_lat.append(timed(lambda: fray_actor.ping(1)))
            for _ in range(batches):
                raw_tp.append(64 / timed(lambda: [f.get() for f in [raw.ping.call_one(i) for i in range(64)]]))
                fray_tp.append(64 / timed(lambda: [f.result() for f in [fray_actor.ping.remote(i) for i in range(64)]]))
                fray_tp_wait.append(
                    64 / timed(lambda: concurrent.futures.wait([fray_actor.ping.remote(i) for i in range(64)]))
                )
            for _ in range(payload_calls):
                raw_mb.append(timed(lambda: raw.ping.call_one(payload).get()))
                fray_mb.append(timed(lambda: fray_actor.ping(payload)))

        raw_create, fray_create = [], []
        for i in range(creates):
            start = time.perf_counter()
            procs, _ = spawn_raw()
            raw_create.append(time.perf_counter() - start)
            procs.stop().get()
            start = time.perf_counter()
            client.create_actor(Echo, name=f"c{i}").ping(1)
            fray_create.append(time.perf_counter() - start)
        raw_death = [death_raw() for _ in range(deaths)]
        fray_death = [death_fray(client, i) for i in range(deaths)]
        default_death = death_raw_default()
        idle_seconds = 3.0 if args.quick else 10.0
        idle = {layout: poll_cost(8, idle_seconds, layout) for layout in ("none", "group", "lone")}
    finally:
        client.shutdown(wait=False)
        raw_procs.stop().get()

    us = 1e6
    settings = ", ".join(f"{name}={os.environ[name]}" for name in supervision.SETTINGS)
    print(f"\nFray-on-Monarch vs raw Monarch ({settings}); medians over rounds\n")
    print("| what | raw Monarch | Fray on Monarch | Fray / raw |")
    print("| --- | --- | --- | --- |")
    print(row("sync call p50", statistics.median(raw_lat) * us, statistics.median(fray_lat) * us, "us"))
    print(row("sync call p99", percentile(raw_lat, 0.99) * us, percentile(fray_lat, 0.99) * us, "us"))
    print(row("64 calls in flight", statistics.median(raw_tp), statistics.median(fray_tp), "calls/s", True))
    print(
        row(
            "64 in flight, waited with concurrent.futures.wait",
            statistics.median(raw_tp),
            statistics.median(fray_tp_wait),
            "calls/s",
            True,
        )
    )
    print(row("1 MB argument and result, p50", statistics.median(raw_mb) * 1e3, statistics.median(fray_mb) * 1e3, "ms"))
    print(row("actor create -> first answer", statistics.median(raw_create), statistics.median(fray_create), "s"))
    print(
        row(
            "kill -9 of the actor process -> error, median",
            statistics.median(raw_death),
            statistics.median(fray_death),
            "s",
        )
    )
    print(row("kill -9 of the actor process -> error, worst", max(raw_death), max(fray_death), "s"))
    print(f"\nkill -9 -> error with Monarch's default poll interval (raw, child process): {default_death:.2f} s")
    print(
        f"idle client process, share of one core (Monarch's supervision polls): no actors {idle['none']:.1%}, "
        f"a group of 8 {idle['group']:.1%}, 8 lone actors {idle['lone']:.1%}\n"
    )
    for line in group_layout(8, 2 if args.quick else 3):
        print(line)


if __name__ == "__main__":
    main()
