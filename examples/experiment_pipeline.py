"""An experiment as a pipeline of jobs, driven by a controller job that does no work itself.

Seed 001, "Walking through a typical experiment": a controller job -- ``cpu=0`` so it can
always be placed, ``preemptible=False`` so it is never preempted -- submits the steps
download -> filter (4 replicas, a gang) -> tokenize -> train -> evaluate as jobs of their
own, each once the files it reads exist (in a shared directory standing in for object
storage). If a step fails, the controller submits nothing more, writes a report of which
step failed and why (the step's own exception, replica included) and which never ran, and
fails with that summary.

Run it on the local backend (no setup), or on any backend with ``FRAY_CLIENT_SPEC`` (the
directory must be visible to every worker, e.g. a shared file system):

    python examples/experiment_pipeline.py
    FRAY_CLIENT_SPEC=ray python examples/experiment_pipeline.py
    FRAY_CLIENT_SPEC=fray://127.0.0.1:PORT FRAY_TOKEN=... python examples/experiment_pipeline.py
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fray
from fray import Entrypoint, JobFailed, JobRequest, JobStatus, ResourceConfig, current_job

FILTER_REPLICAS = 4
#: How long the controller waits for one step (a bug, not a slow machine, makes a step take this long).
STEP_SECONDS = 600.0
STEPS = ("download", "filter", "tokenize", "train", "evaluate")


def _write_json(path: Path, value: Any) -> None:
    """Write ``value`` so that readers see the whole file or none of it (written aside, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, sort_keys=True))
    os.replace(partial, path)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def document(index: int) -> str:
    """Document ``index`` of the downloaded dataset; every 7th is spam that the filter drops."""
    words = [f"w{(index * 7 + k) % 23}" for k in range(3 + index % 4)]
    return " ".join(["SPAM", *words] if index % 7 == 0 else words)


# ----- the steps (each runs as a job of its own) --------------------------------------------------


def download(root: str, documents: int, fail: bool) -> None:
    if fail:
        raise ConnectionError("download: the dataset server refused the connection")
    _write_json(Path(root) / "raw" / "docs.json", [document(i) for i in range(documents)])
    print(f"download: {documents} documents")


def filter_bad_data(root: str, fail: bool) -> None:
    info = current_job()
    assert info is not None
    shard, shards = info.replica_index, info.replica_count
    if fail and shard == 2:
        raise ValueError(f"filter: shard {shard} hit a record it cannot parse")
    docs = _read_json(Path(root) / "raw" / "docs.json")
    kept = [(i, doc) for i, doc in enumerate(docs) if i % shards == shard and "SPAM" not in doc]
    _write_json(Path(root) / "filtered" / f"part-{shard}.json", kept)
    print(f"filter: shard {shard} kept {len(kept)} documents")


def tokenize(root: str, fail: bool) -> None:
    if fail:
        raise ValueError("tokenize: vocabulary overflow")
    base = Path(root)
    kept = sorted(
        pair for shard in range(FILTER_REPLICAS) for pair in _read_json(base / "filtered" / f"part-{shard}.json")
    )
    vocab = {word: token for token, word in enumerate(sorted({w for _, doc in kept for w in doc.split()}))}
    encoded = [(i, [vocab[w] for w in doc.split()]) for i, doc in kept]
    _write_json(base / "tokens" / "validation.json", [ids for i, ids in encoded if i % 10 == 1])
    _write_json(base / "tokens" / "train.json", [ids for i, ids in encoded if i % 10 != 1])
    _write_json(base / "tokens" / "vocab.json", vocab)
    print(f"tokenize: {len(encoded)} documents, vocabulary of {len(vocab)}")


def train(root: str, fail: bool) -> None:
    if fail:
        raise FloatingPointError("train: loss is NaN at step 3")
    base = Path(root)
    counts = Counter(token for ids in _read_json(base / "tokens" / "train.json") for token in ids)
    _write_json(base / "model" / "unigram.json", {str(token): count for token, count in counts.items()})
    print(f"train: {sum(counts.values())} tokens")


def evaluate(root: str, fail: bool) -> None:
    if fail:
        raise RuntimeError("evaluate: the validation set is empty")
    base = Path(root)
    model = {int(token): count for token, count in _read_json(base / "model" / "unigram.json").items()}
    vocab_size = len(_read_json(base / "tokens" / "vocab.json"))
    total = sum(model.values())
    tokens = [token for ids in _read_json(base / "tokens" / "validation.json") for token in ids]
    # Add-one smoothing, so a token never seen in training has a probability too.
    logprob = sum(math.log((model.get(token, 0) + 1) / (total + vocab_size)) for token in tokens)
    metrics = {
        "validation_tokens": len(tokens),
        "unseen_tokens": sum(1 for token in tokens if token not in model),
        "millinats_per_token": round(-1000 * logprob / max(1, len(tokens))),
    }
    _write_json(base / "eval" / "metrics.json", metrics)
    print(f"evaluate: {metrics}")


@dataclass(frozen=True)
class _Step:
    name: str
    fn: Callable[..., None]
    inputs: tuple[str, ...]  #: files (relative to the root) that must exist before the step is submitted
    replicas: int = 1


_PLAN = (
    _Step("download", download, ()),
    _Step("filter", filter_bad_data, ("raw/docs.json",), FILTER_REPLICAS),
    _Step("tokenize", tokenize, tuple(f"filtered/part-{shard}.json" for shard in range(FILTER_REPLICAS))),
    _Step("train", train, ("tokens/train.json",)),
    _Step("evaluate", evaluate, ("model/unigram.json", "tokens/validation.json", "tokens/vocab.json")),
)


def controller(root: str, prefix: str, documents: int, fail_step: str | None) -> None:
    """The controller job: submit each step once its inputs exist; stop at the first failure and report it."""
    client = fray.current_client()
    base = Path(root)
    report: list[dict[str, str]] = []
    failed = ""
    try:
        for step in _PLAN:
            missing = [name for name in step.inputs if not (base / name).exists()]
            if failed or missing:
                if not failed:
                    failed = f"step {step.name!r} cannot start: its inputs {missing} do not exist"
                    report.append({"step": step.name, "status": "failed", "detail": failed})
                else:
                    report.append({"step": step.name, "status": "not run", "detail": ""})
                continue
            args = (
                (root, documents, step.name == fail_step) if step.name == "download" else (root, step.name == fail_step)
            )
            job = client.submit(
                JobRequest(
                    name=f"{prefix}-{step.name}",
                    entrypoint=Entrypoint.from_callable(step.fn, args=args),
                    resources=ResourceConfig(cpu=0.5),
                    replicas=step.replicas,
                )
            )
            try:
                job.wait(timeout=STEP_SECONDS)
            except JobFailed as exc:
                failed = f"step {step.name!r} failed: {exc}"
                report.append({"step": step.name, "status": "failed", "detail": str(exc)})
                continue
            report.append({"step": step.name, "status": JobStatus.SUCCEEDED.value, "detail": ""})
            print(f"controller: step {step.name!r} succeeded")
    finally:
        _write_json(base / "report.json", report)
    if failed:
        not_run = [entry["step"] for entry in report if entry["status"] == "not run"]
        raise RuntimeError(f"{failed}; not run: {', '.join(not_run) or 'none'}")


@dataclass(frozen=True)
class StepReport:
    """One step of a run: ``succeeded``, ``failed`` (``detail`` says why) or ``not run``."""

    name: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class PipelineResult:
    """What a run did: every step's outcome, the evaluation's metrics, and the controller's error if it failed."""

    steps: tuple[StepReport, ...]
    metrics: tuple[tuple[str, int], ...]  #: sorted (name, value); empty unless evaluate succeeded
    error: str  #: the controller job's failure ("" if the pipeline succeeded)

    @property
    def succeeded(self) -> bool:
        """True if every step succeeded."""
        return not self.error


def run(
    client: fray.Client,
    root: str,
    *,
    documents: int = 200,
    prefix: str = "experiment",
    fail_step: str | None = None,
    on_event: Callable[[str], None] = print,
) -> PipelineResult:
    """Run the pipeline under a controller job on ``client``, in the directory ``root``.

    ``fail_step`` (one of :data:`STEPS`) makes that step raise (for ``filter``, only its
    replica 2), to see the rest stopped and the failure reported.
    """
    if fail_step is not None and fail_step not in STEPS:
        raise ValueError(f"fail_step={fail_step!r} must be one of {STEPS}")
    job = client.submit(
        JobRequest(
            name=f"{prefix}-controller",
            entrypoint=Entrypoint.from_callable(controller, args=(root, prefix, documents, fail_step)),
            resources=ResourceConfig(cpu=0, preemptible=False),  # always placeable, never preempted
        )
    )
    error = ""
    try:
        job.wait(timeout=len(STEPS) * STEP_SECONDS)
    except JobFailed as exc:
        error = str(exc)
    base = Path(root)
    report = base / "report.json"  # missing only if the controller itself could not run
    entries = _read_json(report) if report.exists() else []
    steps = tuple(StepReport(e["step"], e["status"], e["detail"]) for e in entries)
    metrics_path = base / "eval" / "metrics.json"
    metrics = tuple(sorted(_read_json(metrics_path).items())) if metrics_path.exists() else ()
    for step in steps:
        on_event(f"{step.name}: {step.status}" + (f" -- {step.detail.splitlines()[0]}" if step.detail else ""))
    on_event(f"metrics: {dict(metrics)}" if metrics else f"pipeline failed: {error.splitlines()[0]}")
    return PipelineResult(steps, metrics, error)


if __name__ == "__main__":
    from _extras import answer_help, cannot_run, capacity, require_pinned

    answer_help(__doc__)
    client = fray.current_client()
    cap = capacity(client)
    if cap is not None:
        require_pinned(cap, "the controller job (preemptible=False)")
        if cap.slots(0.5) < FILTER_REPLICAS:
            cannot_run(f"the filter step is a gang of {FILTER_REPLICAS} half-core replicas; it has {cap.describe()}")
    with tempfile.TemporaryDirectory(prefix="fray-experiment-") as directory:
        outcome = run(client, directory)
    print("pipeline succeeded" if outcome.succeeded else "pipeline failed")
