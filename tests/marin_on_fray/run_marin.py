"""marin's own code on one Fray backend: run inside the marin venv (``marin_venv.py``) by ``test_marin_on_fray.py``.

``python run_marin.py BACKEND OUT`` with BACKEND ``local``, ``cluster`` (a real ``fray://``
cluster from ``LocalCluster``), ``ray`` (a local Ray) or ``iris`` (a local Iris cluster). It uses
marin's code only as marin's users do, through its public API, and unchanged:

* ``marin.execution``: a ``StepRunner`` runs an inline step and an ``@remote`` step that
  depends on it; the ``@remote`` step is a Fray job which itself runs a zephyr pipeline on
  the job's current client (marin's usual shape: a step that processes data with zephyr).
  The same steps run a second time (they must be skipped: their outputs exist), and a
  failing ``@remote`` step runs in a runner of its own;
* zephyr: a ``Dataset`` map/filter/write_jsonl over 300 records in 3 shards, then the
  pipelines zephyr's README publishes -- its Quick Start (``from_files`` of a glob,
  ``flat_map(load_jsonl)``, ``filter``, ``map``, gzipped ``write_jsonl``) and its
  ``group_by`` example (a shuffle) -- on gzipped JSONL files, executed from the driver by a
  ``ZephyrContext`` given the client (its coordinator and workers are Fray actors).

Every step and pipeline writes what it did under OUT; the test reads those files. The
last line printed is a JSON summary of what was raised and how long each part took.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marin.execution.remote import remote
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from zephyr.context import ZephyrContext
from zephyr.dataset import Dataset
from zephyr.readers import load_jsonl

import fray
from fray.current_client import set_current_client
from fray.types import ResourceConfig

RECORDS = 300


def _record_call(out: Path, what: str) -> None:
    with (out / "calls.log").open("a") as log:
        log.write(json.dumps({"step": what, "pid": os.getpid()}) + "\n")


def _pipeline(out_dir: str) -> Dataset:
    """300 records in 3 shards: squared, every third kept, written as JSONL."""
    return (
        Dataset.from_list([{"i": i} for i in range(RECORDS)])
        .reshard(3)
        .map(lambda r: {"i": r["i"], "square": r["i"] ** 2})
        .filter(lambda r: r["i"] % 3 == 0)
        .write_jsonl(out_dir + "/part-{shard:05d}.jsonl")
    )


def _write_inputs(directory: Path) -> None:
    """Three gzipped JSONL files in nested folders: 90 scored documents in all."""
    for part in range(3):
        folder = directory / f"crawl-{part}" / "docs"
        folder.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / f"part-{part}.jsonl.gz", "wt") as f:
            for n in range(30):
                doc = part * 30 + n
                f.write(json.dumps({"id": doc, "score": (doc % 10) / 10, "text": f"doc {doc} from {part}"}) + "\n")


def _quick_start(input_dir: str, out_dir: str) -> Dataset:
    """zephyr's README Quick Start, on local files: glob, load_jsonl, filter, map, gzipped JSONL.

    (The README writes ``from_files(dir, "**/*.jsonl.gz")``; the published ``from_files`` takes one
    glob pattern, its second parameter being ``empty_glob_ok``.)
    """
    return (
        Dataset.from_files(input_dir + "/**/*.jsonl.gz")
        .flat_map(load_jsonl)
        .filter(lambda x: x["score"] > 0.5)
        .map(lambda x: {"id": x["id"], "words": len(x["text"].split())})
        .write_jsonl(out_dir + "/data-{shard:05d}-of-{total:05d}.jsonl.gz")
    )


def _counts_by_score(input_dir: str) -> Dataset:
    """zephyr's group_by example (a shuffle between workers): documents counted per score."""
    return (
        Dataset.from_files(input_dir + "/**/*.jsonl.gz")
        .flat_map(load_jsonl)
        .group_by(key=lambda x: x["score"], reducer=lambda key, items: {"score": key, "count": sum(1 for _ in items)})
    )


def make_numbers(output_path: str, out: Path) -> dict[str, Any]:
    """An inline step: runs in the runner's own thread."""
    _record_call(out, "numbers")
    os.makedirs(output_path, exist_ok=True)
    Path(output_path, "numbers.json").write_text(json.dumps(list(range(10))))
    return {"count": 10}


@remote(resources=ResourceConfig.with_cpu(cpu=1, ram="512m"))
def squares_with_zephyr(output_path: str, numbers_path: str, out: Path) -> None:
    """A remote step (a Fray job) that runs a zephyr pipeline on the job's own current client."""
    _record_call(out, "squares")
    numbers = json.loads(Path(numbers_path, "numbers.json").read_text())
    os.makedirs(output_path, exist_ok=True)
    Path(output_path, "squares.json").write_text(json.dumps([n * n for n in numbers]))
    ctx = ZephyrContext(max_workers=2, chunk_storage_prefix=str(out / "chunks-in-step"), name="in-step")
    result = ctx.execute(_pipeline(output_path + "/zephyr"))
    Path(output_path, "zephyr-results.json").write_text(
        json.dumps({"results": list(result.results), "client": type(fray.current_client()).__name__})
    )


@remote
def fails(output_path: str, out: Path) -> None:
    """A remote step whose code raises."""
    _record_call(out, "fails")
    raise ValueError("bad record 17")


def run_steps(out: Path) -> dict[str, Any]:
    numbers = StepSpec(name="numbers", output_path_prefix=str(out / "steps"), fn=lambda path: make_numbers(path, out))
    squares = StepSpec(
        name="squares",
        output_path_prefix=str(out / "steps"),
        deps=[numbers],
        fn=lambda path: squares_with_zephyr(path, numbers.output_path, out),
    )
    started = time.monotonic()
    StepRunner().run([squares])
    first = time.monotonic() - started
    StepRunner().run([squares])  # everything is done: nothing runs
    failing = StepSpec(name="fails", output_path_prefix=str(out / "steps"), fn=lambda path: fails(path, out))
    raised = None
    try:
        StepRunner().run([failing])
    except Exception as exc:
        raised = {"type": type(exc).__name__, "message": str(exc)}
    return {
        "numbers_path": numbers.output_path,
        "squares_path": squares.output_path,
        "fails_path": failing.output_path,
        "failure_raised": raised,
        "steps_seconds": round(first, 1),
    }


def run_zephyr(client: Any, out: Path) -> dict[str, Any]:
    started = time.monotonic()
    ctx = ZephyrContext(client=client, max_workers=2, chunk_storage_prefix=str(out / "chunks"), name="driver")
    result = ctx.execute(_pipeline(str(out / "zephyr")))
    inputs = out / "inputs"
    _write_inputs(inputs)
    quick = ctx.execute(_quick_start(str(inputs), str(out / "quick-start")))
    counts = ctx.execute(_counts_by_score(str(inputs)))
    return {
        "zephyr_results": list(result.results),
        "quick_start_results": list(quick.results),
        "counts_by_score": sorted(counts.results, key=lambda row: row["score"]),
        "zephyr_seconds": round(time.monotonic() - started, 1),
    }


@contextlib.contextmanager
def client_for(backend: str, out: Path) -> Iterator[Any]:
    """A client of ``backend``, and whatever it runs on, stopped at the end."""
    if backend == "local":
        from fray.local_backend import LocalClient

        with LocalClient() as client:
            yield client
    elif backend == "cluster":
        from fray.cluster.client import ClusterClient
        from fray.cluster.server.launcher import LocalCluster

        cluster = LocalCluster(tempfile.mkdtemp(prefix="marin-cluster-"))
        try:
            cluster.start_controller()
            # zephyr's coordinator asks for a non-preemptible host, as marin's clusters have.
            cluster.add_worker("worker-0", "--cpu", "8", "--attr", "preemptible=false")
            cluster.wait_for_workers(1)
            with ClusterClient(cluster.address, token=cluster.token) as client:
                yield client
        finally:
            cluster.stop()
    elif backend == "iris":
        from fray.iris.client import IrisClient
        from fray.iris.localcluster import LocalIrisCluster

        iris = LocalIrisCluster(Path(tempfile.mkdtemp(prefix="marin-iris-")), workers=2)
        iris.start()
        try:
            with IrisClient(iris.address) as client:
                yield client
        finally:
            iris.stop()
    elif backend == "ray":
        import ray
        from fray.ray import RayClient

        ray.init(
            address="local",
            num_cpus=6,
            object_store_memory=200 * 1024**2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        try:
            with RayClient() as client:
                yield client
        finally:
            ray.shutdown()
    else:
        raise SystemExit(f"unknown backend {backend!r}: local, cluster, ray or iris")


def main() -> None:
    backend, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"fray": fray.__file__, "runner_pid": os.getpid()}
    with client_for(backend, out) as client, set_current_client(client):
        summary["client"] = type(client).__name__
        summary.update(run_steps(out))
        summary.update(run_zephyr(client, out))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
