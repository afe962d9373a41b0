"""An inference pool: model-server jobs that scale with a queue of requests (seed 001).

The driver pushes requests onto a leased queue (``client.create_queue``); a
:class:`fray.WorkerPool` runs "model server" jobs that pop a request with a lease, run
the model, push the result onto a result queue, and only then acknowledge the lease
(``done``). The pool grows from ``min_workers`` to ``max_workers`` while there is a
backlog and shrinks back once it is gone. The driver collects the results and counts
them per request id.

**Delivery contract (at-least-once, measured).** A request is acknowledged only after
its result was pushed, so a server that dies mid-request loses nothing: its lease runs
out and the request is delivered again to another server. A server killed *before* it
pushed (the usual case: a crash during the model's forward pass) therefore yields
exactly one result per request. But the push to the result queue and the ``done`` on
the request queue are two separate operations -- Fray's queues have no transaction
spanning both -- so a server that dies *between* them (or a request whose lease runs
out while a slow server is still working on it, or a server the pool stops while it
scales down, at that instant) has its request served twice, and the result queue then
holds two results for that id. This example does not hide that: ``run`` counts the
results of every id and reports the ids with more than one in ``duplicates``. Where a
consumer needs exactly-once *effects*, it makes them idempotent by request id (write
the result to storage keyed by the id, or skip an id already recorded).

Faults are explicit: ``fault=Fault(request_id, after_push=False)`` makes the server
that takes that request (first delivery) write its PID and job id to a file and hold
there; the driver then kills it -- ``kill -9`` of its process where servers are
processes (Ray, ``fray://``), and on the local backend, whose jobs are threads of the
driver's process, ``terminate()`` of that server's job (its thread is stopped).
``after_push=True`` holds after the result was pushed and before ``done``: the window
above, where a duplicate appears and is counted.

Run it::

    python examples/inference_pool.py                                    # local backend
    FRAY_CLIENT_SPEC=ray python examples/inference_pool.py               # Ray
    FRAY_CLIENT_SPEC=fray://HOST:PORT python examples/inference_pool.py  # a Fray cluster
    python examples/inference_pool.py --kill-during-request 7            # the fault case
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import fray
from fray import Entrypoint, JobRequest, LeaseExpired, ResourceConfig
from fray.pool import WorkerPool

#: How long a held server waits to be killed before it gives up (a fault that never came is a bug).
HOLD_DEADLINE = 300.0


@dataclasses.dataclass(frozen=True)
class Fault:
    """Kill the server that takes ``request_id`` (its first delivery), before or after it pushed the result."""

    request_id: int
    after_push: bool = False


@dataclasses.dataclass(frozen=True)
class InferenceResult:
    """What a run saw: the accepted output per request id, result counts, and the pool's size over time."""

    outputs: tuple[tuple[int, str], ...]  # (request id, output), by id; the first result of each id
    results_per_id: tuple[tuple[int, int], ...]  # (request id, number of results received)
    duplicates: tuple[int, ...]  # ids with more than one result
    missing: tuple[int, ...]  # ids with no result
    redelivered: tuple[int, ...]  # ids whose first result came from a second (or later) delivery
    peak_workers: int
    final_workers: int
    killed: str  # what the fault did, "" without one


def model(prompt: str) -> str:
    """The "model": deterministic, so the test can check every output."""
    return f"{prompt[::-1].upper()}:{sum(map(ord, prompt)) % 997}"


def serve(
    requests: Any, results: Any, service_time: float, lease_timeout: float, marks: str, fault: Fault | None
) -> None:
    """One model server (a pool worker job): pop, infer, push the result, then acknowledge."""
    while True:
        # A short wait: a stopped local server (a thread) notices at its next Fray call.
        lease = requests.pop(lease_timeout=lease_timeout, timeout=0.25)
        if lease is None:
            continue
        request = lease.item
        held = fault is not None and request["id"] == fault.request_id and lease.deliveries == 1
        if held and not fault.after_push:
            _hold(marks, request["id"])
        time.sleep(service_time)  # stands in for the forward pass
        results.push({"id": request["id"], "output": model(request["prompt"]), "deliveries": lease.deliveries})
        if held and fault.after_push:
            _hold(marks, request["id"])
        try:
            requests.done(lease)
        except LeaseExpired:
            # The request will be (or was) served again: its result is now on the queue twice.
            print(f"lease of request {request['id']} ran out before done: a duplicate result", file=sys.stderr)


def _hold(marks: str, request_id: int) -> None:
    """Fault injection: say who holds the request, then wait to be killed."""
    job = fray.current_job()
    info = {"pid": os.getpid(), "job_id": job.job_id if job else ""}
    Path(marks, f"held-{request_id}.json.tmp").write_text(json.dumps(info))
    os.replace(Path(marks, f"held-{request_id}.json.tmp"), Path(marks, f"held-{request_id}.json"))
    deadline = time.monotonic() + HOLD_DEADLINE
    while time.monotonic() < deadline:
        time.sleep(0.05)  # short sleeps: the local backend stops a terminated job's thread between them
    raise TimeoutError(f"held request {request_id} for {HOLD_DEADLINE}s and nobody killed this server")


def _kill(pool: WorkerPool, mark: Path) -> str:
    held = json.loads(mark.read_text())
    if held["pid"] != os.getpid():
        os.kill(held["pid"], signal.SIGKILL)
        return f"kill -9 of server process {held['pid']}"
    # The server is a thread of this process (the local backend): stop its job instead.
    for job in pool.workers:
        if job.job_id == held["job_id"]:
            job.terminate()
            return f"terminate() of server job {job.job_id} (local servers are threads)"
    raise RuntimeError(f"no live server job {held['job_id']!r} to kill")


def run(
    client: Any,
    *,
    name: str = "infer",
    requests: int = 100,
    min_workers: int = 1,
    max_workers: int = 4,
    service_time: float = 0.05,
    lease_timeout: float = 5.0,
    scale_down_after: float = 2.0,
    resources: ResourceConfig | None = None,
    fault: Fault | None = None,
    timeout: float = 600.0,
) -> InferenceResult:
    """Serve ``requests`` prompts through a pool of ``min_workers``..``max_workers`` servers on ``client``."""
    request_queue = client.create_queue(f"{name}-requests")
    result_queue = client.create_queue(f"{name}-results")
    counts: dict[int, int] = {}
    first: dict[int, dict[str, Any]] = {}
    killed = ""
    with tempfile.TemporaryDirectory(prefix="fray-infer-") as marks:
        mark = Path(marks, f"held-{fault.request_id}.json") if fault else None
        template = JobRequest(
            name=f"{name}-server",
            entrypoint=Entrypoint.from_callable(
                serve, args=(request_queue, result_queue, service_time, lease_timeout, marks, fault)
            ),
            resources=resources or ResourceConfig(),
            # The pool replaces a dead server itself; the backend must not also retry it.
            max_retries_failure=0,
            max_retries_preemption=0,
        )
        pool = WorkerPool(
            client,
            template,
            request_queue,
            min_workers,
            max_workers,
            scale_down_after=scale_down_after,
            interval=0.2,
        )
        try:
            peak = len(pool.workers)
            for i in range(requests):
                request_queue.push({"id": i, "prompt": f"prompt number {i}"})
            deadline = time.monotonic() + timeout

            def take(wait: float) -> bool:
                lease = result_queue.pop(lease_timeout=60, timeout=wait)
                if lease is None:
                    return False
                item = lease.item
                counts[item["id"]] = counts.get(item["id"], 0) + 1
                first.setdefault(item["id"], item)
                result_queue.done(lease)
                return True

            # Until every request has a result and none is queued or leased (a held one is leased).
            # One read of both counts: read apart, a lease running out in between is missed.
            while len(counts) < requests or request_queue.counts().unfinished > 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{requests - len(counts)} of {requests} requests have no result")
                take(0.2)
                peak = max(peak, len(pool.workers))
                if mark is not None and not killed and mark.exists():
                    killed = _kill(pool, mark)
            # The backlog is gone: the pool stops its surplus servers, one per scale_down_after.
            while len(pool.workers) > min_workers and time.monotonic() < deadline:
                take(0.2)
            final = len(pool.workers)
        finally:
            pool.shutdown()
        while take(0):  # anything pushed late (a duplicate) is counted too
            pass
    ids = range(requests)
    return InferenceResult(
        outputs=tuple((i, first[i]["output"]) for i in ids if i in first),
        results_per_id=tuple((i, counts.get(i, 0)) for i in ids),
        duplicates=tuple(i for i in ids if counts.get(i, 0) > 1),
        missing=tuple(i for i in ids if i not in counts),
        redelivered=tuple(i for i in ids if i in first and first[i]["deliveries"] > 1),
        peak_workers=peak,
        final_workers=final,
        killed=killed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--kill-during-request", type=int, help="kill the server that takes this request")
    args = parser.parse_args()
    client = fray.current_client()
    from _extras import cannot_run, capacity

    # A server takes one core: on a Fray cluster the pool grows only as far as the cluster has room.
    cap = capacity(client)
    max_workers = 4
    if cap is not None:
        max_workers = min(4, cap.slots(1.0))
        if max_workers < 1:
            cannot_run(f"a model server needs a worker with 1 core; it has {cap.describe()}")
        if max_workers < 4:
            print(f"(the cluster has room for {max_workers} one-core servers: the pool grows to {max_workers})")
    fault = Fault(args.kill_during_request) if args.kill_during_request is not None else None
    # Queues outlive a run on a Fray cluster (they are durable there): a fresh name each run.
    result = run(
        client, name=f"infer-{uuid.uuid4().hex[:6]}", requests=args.requests, max_workers=max_workers, fault=fault
    )
    print(f"backend: {client!r}")
    print(f"{len(result.outputs)} of {args.requests} requests answered; missing: {list(result.missing)}")
    print(f"duplicate results: {list(result.duplicates)}; redelivered: {list(result.redelivered)}")
    print(f"pool: peak {result.peak_workers} servers, {result.final_workers} after the backlog")
    if result.killed:
        print(f"fault: {result.killed}")
    for request_id, output in result.outputs[:3]:
        print(f"request {request_id}: {output}")


if __name__ == "__main__":
    main()
