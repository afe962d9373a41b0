"""A sharded data pipeline on an actor group, with data in shared storage (seed 003, "ActorBackend").

The driver creates a group of worker actors, plans shards, writes the input records to
shard files in shared storage, and hands each worker shard *paths* (never the data).
Workers read a shard, transform it, write the output next to it and return the output
path. Two stages:

* ``map``: per input shard, map each record to ``(key, amount)``, filter, and reduce
  it by key into partial ``(count, sum)`` per key (a combiner);
* ``reduce``: per key partition, read every map output, keep the keys of the
  partition (a stable CRC32 of the key, never Python's salted ``hash``), and reduce
  the partials to the final ``(count, sum)`` per key.

A worker that dies is detected by its calls failing with :class:`fray.ActorDiedError`;
the driver hands that worker's unfinished shards to the surviving workers. The fault is
explicit: ``kill_worker_on_shard=N`` makes the worker that starts map shard ``N`` hold
there (it writes a marker file first), and the driver kills it with
:func:`fray.testing.kill_actor` as a crash would, then reassigns its shards.

Storage goes through ``fsspec`` (``pip install "fray[examples]"``): a local directory by
default, and a ``gs://``, ``s3://`` or ``memory://`` URL unchanged (``memory://`` only on
the local backend, whose workers share the driver's process). Run it::

    python examples/data_pipeline.py                                   # local backend
    FRAY_CLIENT_SPEC=ray python examples/data_pipeline.py              # Ray
    FRAY_CLIENT_SPEC=fray://HOST:PORT python examples/data_pipeline.py # a Fray cluster (fray cluster up)
    python examples/data_pipeline.py --kill-worker-on-shard 5          # the fault case
    python examples/data_pipeline.py --storage gs://bucket/prefix      # any fsspec URL the workers can reach
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import posixpath
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

try:
    import fsspec
except ImportError:
    # Run as a script without the extra: one line naming it, not a traceback (a broken install still raises).
    from _extras import require

    require("fsspec", "examples")
    raise

import fray
from fray import ActorDiedError
from fray.testing import kill_actor

#: How long a held worker waits to be killed before it gives up (a fault that never came is a bug).
HOLD_DEADLINE = 300.0


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One unit of work a worker receives: a stage, the paths it reads, the path it writes."""

    stage: str  # "map" or "reduce"
    shard: int
    inputs: tuple[str, ...]
    output: str
    partitions: int = 1
    #: Fault injection: write ``hold_marker`` and wait there (to be killed) instead of working.
    hold_marker: str | None = None


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """What a run produced: per key ``(key, count, sum)`` sorted by key, and what it took."""

    totals: tuple[tuple[str, int, int], ...]
    records: int
    shards: int
    partitions: int
    workers: int
    outputs: tuple[str, ...]
    #: Map shards that were handed to another worker because theirs died.
    reassigned: tuple[int, ...]
    #: Member indexes of the workers that died.
    dead_workers: tuple[int, ...]


# ----- storage (fsspec: any URL the workers can reach) ---------------------------------------------


def write_jsonl(url: str, rows: Iterable[dict[str, Any]]) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)  # fsspec paths are '/'-separated everywhere
    with fs.open(path, "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def read_jsonl(url: str) -> list[dict[str, Any]]:
    with fsspec.open(url, "r") as source:
        return [json.loads(line) for line in source]


def exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.exists(path))


# ----- the transform --------------------------------------------------------------------------------


def make_records(count: int) -> list[dict[str, Any]]:
    """The input: ``count`` records ``{"id", "key", "value"}``, the same every run."""
    return [{"id": i, "key": f"user-{i % 10}", "value": (i * 37) % 101} for i in range(count)]


def partition_of(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def map_shard(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """map -> filter -> group by key -> partial reduce (count, sum) of one shard."""
    mapped = ({"key": r["key"], "amount": r["value"] * 2} for r in rows)
    kept = (r for r in mapped if r["amount"] % 3 != 0)
    partial: dict[str, list[int]] = {}
    for r in kept:
        count_sum = partial.setdefault(r["key"], [0, 0])
        count_sum[0] += 1
        count_sum[1] += r["amount"]
    return [{"key": k, "count": c, "sum": s} for k, (c, s) in sorted(partial.items())]


def reduce_partition(partials: Iterable[dict[str, Any]], partition: int, partitions: int) -> list[dict[str, Any]]:
    """Group the partials of one key partition by key and add them up."""
    totals: dict[str, list[int]] = {}
    for p in partials:
        if partition_of(p["key"], partitions) == partition:
            count_sum = totals.setdefault(p["key"], [0, 0])
            count_sum[0] += p["count"]
            count_sum[1] += p["sum"]
    return [{"key": k, "count": c, "sum": s} for k, (c, s) in sorted(totals.items())]


class PipelineWorker:
    """An actor that runs shard tasks: reads its inputs from storage, writes its output, returns its path."""

    def run_shard(self, task: ShardTask) -> str:
        if task.hold_marker is not None:
            _hold(task.hold_marker)
        rows = [row for path in task.inputs for row in read_jsonl(path)]
        out = map_shard(rows) if task.stage == "map" else reduce_partition(rows, task.shard, task.partitions)
        write_jsonl(task.output, out)
        return task.output


def _hold(marker: str) -> None:
    """Fault injection: say "I started this shard", then wait to be killed (never do the work)."""
    write_jsonl(marker, [{"started": True}])
    deadline = time.monotonic() + HOLD_DEADLINE
    while time.monotonic() < deadline:
        time.sleep(0.05)  # short sleeps: the local backend's kill stops this thread between them
    raise TimeoutError(f"held at {marker} for {HOLD_DEADLINE}s and nobody killed this worker")


# ----- the driver -----------------------------------------------------------------------------------


class _Driver:
    def __init__(self, handles: Sequence[Any], kill_worker_on_shard: int | None) -> None:
        self.handles = list(handles)
        self.dead: list[int] = []
        self.reassigned: list[int] = []
        self.kill_on_shard = kill_worker_on_shard

    def execute_stage(self, tasks: list[ShardTask], timeout: float) -> list[str]:
        """Run every task on the live workers, round-robin; reassign those of a worker that died."""
        outputs: dict[int, str] = {}
        pending = tasks
        while pending:
            alive = [i for i in range(len(self.handles)) if i not in self.dead]
            if not alive:
                raise RuntimeError(f"every worker died; shards {[t.shard for t in pending]} were not done")
            futures: dict[concurrent.futures.Future[Any], tuple[int, ShardTask]] = {}
            for n, task in enumerate(pending):
                worker = alive[n % len(alive)]
                futures[self.handles[worker].run_shard.remote(task)] = (worker, task)
            self._inject_fault(futures.values())
            pending = []
            for future in concurrent.futures.as_completed(futures, timeout=timeout):
                worker, task = futures[future]
                try:
                    outputs[task.shard] = future.result()
                except ActorDiedError:
                    if worker not in self.dead:
                        self.dead.append(worker)
                    self.reassigned.append(task.shard)
                    pending.append(dataclasses.replace(task, hold_marker=None))
        return [outputs[shard] for shard in sorted(outputs)]

    def _inject_fault(self, sent: Iterable[tuple[int, ShardTask]]) -> None:
        for worker, task in sent:
            if task.hold_marker is not None:
                deadline = time.monotonic() + HOLD_DEADLINE
                while not exists(task.hold_marker):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"worker {worker} never started shard {task.shard}")
                    time.sleep(0.02)
                kill_actor(self.handles[worker])


def run(
    client: Any,
    storage: str,
    *,
    name: str = "pipeline",
    records: int = 1000,
    shards: int = 16,
    partitions: int = 4,
    workers: int = 4,
    kill_worker_on_shard: int | None = None,
    timeout: float = 600.0,
) -> PipelineResult:
    """Run the pipeline on ``client`` with its files under ``storage`` (a path or fsspec URL)."""
    root = f"{storage.rstrip('/')}/{name}"
    # The plan: contiguous ranges of record ids, one input file per shard.
    bounds = [records * s // shards for s in range(shards + 1)]
    data = make_records(records)
    inputs = [f"{root}/input/shard-{s:05d}.jsonl" for s in range(shards)]
    for s, path in enumerate(inputs):
        write_jsonl(path, data[bounds[s] : bounds[s + 1]])

    group = client.create_actor_group(PipelineWorker, name=name, count=workers)
    try:
        driver = _Driver(group.wait_ready(timeout=timeout), kill_worker_on_shard)
        map_tasks = [
            ShardTask(
                "map",
                s,
                (inputs[s],),
                f"{root}/map/shard-{s:05d}.jsonl",
                hold_marker=f"{root}/_faults/map-{s}.started" if s == kill_worker_on_shard else None,
            )
            for s in range(shards)
        ]
        map_outputs = driver.execute_stage(map_tasks, timeout)
        reduce_tasks = [
            ShardTask("reduce", p, tuple(map_outputs), f"{root}/reduce/part-{p:05d}.jsonl", partitions)
            for p in range(partitions)
        ]
        outputs = driver.execute_stage(reduce_tasks, timeout)
    finally:
        group.shutdown()
    totals = sorted((row["key"], row["count"], row["sum"]) for path in outputs for row in read_jsonl(path))
    return PipelineResult(
        totals=tuple(totals),
        records=records,
        shards=shards,
        partitions=partitions,
        workers=workers,
        outputs=tuple(outputs),
        reassigned=tuple(sorted(driver.reassigned)),
        dead_workers=tuple(driver.dead),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", help="a directory or fsspec URL (default: a new temporary directory)")
    parser.add_argument("--kill-worker-on-shard", type=int, help="kill the worker that starts this map shard")
    args = parser.parse_args()
    client = fray.current_client()
    from _extras import capacity

    capacity(
        client
    )  # on a Fray cluster: exits at once, saying so, when no worker is alive (its actors reserve no cores)
    with tempfile.TemporaryDirectory(prefix="fray-pipeline-") as scratch:
        # A fresh name per run: actor names and storage prefixes of earlier runs stay taken.
        name = f"pipeline-{uuid.uuid4().hex[:6]}"
        result = run(client, args.storage or scratch, name=name, kill_worker_on_shard=args.kill_worker_on_shard)
        print(f"backend: {client!r}")
        print(
            f"{result.records} records in {result.shards} shards -> {result.partitions} partitions "
            f"on {result.workers} workers"
        )
        print(f"dead workers: {list(result.dead_workers)}, reassigned shards: {list(result.reassigned)}")
        print("outputs:", *result.outputs, sep="\n  ")
        for key, count, total in result.totals:
            print(f"{key}: count={count} sum={total}")


if __name__ == "__main__":
    main()
