"""Training launch on TPU slices: one gang-scheduled job over two slices, retried as a whole.

Seeds 002/003 ("TPU jobs", "multislice training"): a ``JobRequest`` with
``ResourceConfig(device=TpuConfig("v4-16"))`` and ``replicas=2`` asks for two whole
slices at once. Each replica is a slice and runs one process per host of the slice
(a v4-16 slice has 2 hosts, so 4 processes in all), started together or not at all.
Every process sees where it is: ``FRAY_TPU_SLICE_NAME``, ``FRAY_TPU_HOST_INDEX`` /
``FRAY_TPU_HOST_COUNT``, its slice index (``current_job().replica_index``) and, because
there is more than one slice, the ``MEGASCALE_*`` variables JAX's multislice runtime
uses to find slice 0's coordinator. A preempted slice fails the attempt as a preemption:
the *whole gang* is restarted (every slice, every host) within ``max_retries_preemption``;
a bug in the training code fails it after ``max_retries_failure`` more attempts, with the
user's own exception.

Run it:

    python examples/train_on_slices.py                       # local backend (see below)
    FRAY_CLIENT_SPEC=fray://HOST:PORT python examples/train_on_slices.py   # workers with TPU slices
    FRAY_CLIENT_SPEC=ray python examples/train_on_slices.py  # a Ray cluster with TPU VMs

The cluster needs two v4-16 slices: on ``fray://``, four workers started with
``--device tpu:v4-16:4 --attr tpu-name=SLICE --attr tpu-worker-id=0|1``, or a cluster
whose autoscaler makes them (``fray cluster up --config examples/cluster.yaml``: its
``v4-16`` group's slices are simulated VMs on this machine); on Ray, TPU VMs
(Ray labels them itself). The local backend places nothing: it runs each replica once,
in this process, with no slice, host or ``MEGASCALE_*`` variables -- a dry run of the
training code, not a simulation of slices (the example says so when it runs there).
The tests run this on simulated slices on ``fray://`` and Ray.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fray
from fray import Entrypoint, JobHandle, JobRequest, ResourceConfig, TpuConfig

#: ``preempt(job, replica)``: take slice ``replica`` of a running ``job`` away, as a TPU
#: preemption would (``fray.testing.preempt`` has this signature).
Preempter = Callable[[JobHandle, int], None]

_HOLD_SECONDS = 600.0  # how long attempt 0 waits to be preempted when asked to (never reached in practice)


@dataclass(frozen=True)
class HostReport:
    """What one host process of one attempt saw of its place in the job."""

    attempt: int
    slice_index: int  # the replica: which slice of the job
    slices: int
    slice_name: str | None  # None where the backend places no slices (local)
    host: int | None
    hosts: int | None
    megascale: tuple[tuple[str, str], ...]  # the MEGASCALE_* variables, sorted
    device: str


@dataclass(frozen=True)
class TrainResult:
    """How the launch went: the attempts it took and every host of the attempt that finished."""

    attempts: int
    hosts: tuple[HostReport, ...]  # of the last attempt, by (slice, host)
    local_dry_run: bool


def train(workdir: str, learning_rate: float, hold_first_attempt: bool) -> None:
    """One host's training process: report where it runs, then 'train' (or fail on a bad setting)."""
    info = fray.current_job()
    assert info is not None
    host = os.environ.get("FRAY_TPU_HOST_INDEX")
    hosts = os.environ.get("FRAY_TPU_HOST_COUNT")
    report = HostReport(
        attempt=info.attempt,
        slice_index=info.replica_index,
        slices=info.replica_count,
        slice_name=os.environ.get("FRAY_TPU_SLICE_NAME"),
        host=None if host is None else int(host),
        hosts=None if hosts is None else int(hosts),
        megascale=tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("MEGASCALE_"))),
        device=info.device,
    )
    name = f"attempt-{report.attempt}-slice-{report.slice_index}-host-{report.host or 0}.json"
    _write_atomically(Path(workdir) / name, json.dumps(report.__dict__))
    if learning_rate <= 0:
        raise ValueError(f"learning_rate must be positive, got {learning_rate}")
    if hold_first_attempt and info.attempt == 0:
        # Stand-in for a long training run: this attempt ends when its slice is preempted.
        deadline = time.monotonic() + _HOLD_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.1)
    print(f"slice {report.slice_index} host {report.host or 0}: trained (attempt {report.attempt})")


def read_reports(workdir: str | Path) -> list[HostReport]:
    """Every host report written so far, by (attempt, slice, host)."""
    reports = []
    for path in Path(workdir).glob("attempt-*.json"):
        data = json.loads(path.read_text())
        data["megascale"] = tuple(tuple(pair) for pair in data["megascale"])
        reports.append(HostReport(**data))
    return sorted(reports, key=lambda r: (r.attempt, r.slice_index, r.host or 0))


def run(
    client: Any,
    workdir: str | Path,
    *,
    name: str = "train-on-slices",
    tpu_type: str = "v4-16",
    slices: int = 2,
    learning_rate: float = 0.1,
    max_retries_preemption: int = 1,
    max_retries_failure: int = 0,
    preempt: Preempter | None = None,
    preempt_slice: int = 1,
    timeout: float = 300.0,
) -> TrainResult:
    """Launch the training job on ``slices`` slices of ``tpu_type`` and wait for it.

    With ``preempt``, once every host of the first attempt runs, slice ``preempt_slice``
    is preempted through it and the gang must come back whole. A failed job raises
    :class:`fray.JobFailed` (also an instance of the training code's exception).
    """
    device = TpuConfig(tpu_type)
    request = JobRequest(
        name=name,
        entrypoint=Entrypoint.from_callable(train, args=(str(workdir), learning_rate, preempt is not None)),
        resources=ResourceConfig(cpu=0.5, device=device),
        replicas=slices,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
    )
    job = client.submit(request)
    if preempt is not None:
        hosts = slices * device.slice.hosts
        _wait_for(lambda: len([r for r in read_reports(workdir) if r.attempt == 0]) >= hosts, timeout, job)
        preempt(job, preempt_slice)
    _wait_placeable(job, timeout)
    reports = read_reports(workdir)
    last = max(r.attempt for r in reports)
    local = all(r.slice_name is None for r in reports)
    return TrainResult(last + 1, tuple(r for r in reports if r.attempt == last), local)


class NeverScheduled(RuntimeError):
    """The cluster says the job can never be scheduled there (no such slices, and no autoscaler to make them)."""


#: How long "can never be scheduled" must last before the job is given up: an autoscaler replaces the
#: scheduler's first verdict on a new job ("with the current workers") with its own within a tick.
_NEVER_SECONDS = 3.0


def _wait_placeable(job: JobHandle, timeout: float) -> None:
    """``job.wait(timeout)``, but a job the backend keeps saying can never be scheduled is stopped and raised."""
    deadline = time.monotonic() + timeout
    never_since: float | None = None
    while True:
        try:
            job.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            return
        except TimeoutError:
            reason = job.info().pending_reason
            now = time.monotonic()
            if not reason.startswith("can never be scheduled"):
                never_since = None
            elif never_since is None:
                never_since = now
            elif now - never_since >= _NEVER_SECONDS:
                job.terminate()
                raise NeverScheduled(f"job {job.job_id} {reason}") from None
            if now >= deadline:
                raise


def _wait_for(done: Callable[[], bool], timeout: float, job: JobHandle) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if job.status().finished:
            job.wait(timeout=0)  # raises the job's failure; a success here means nothing was held
            raise RuntimeError(f"job {job.job_id} ended before all its hosts were running")
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job.job_id}: not every host of its first attempt ran within {timeout}s")
        time.sleep(0.05)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


if __name__ == "__main__":
    from _extras import answer_help, cannot_run, capacity

    answer_help(__doc__)
    client = fray.current_client()
    # Whole v4-16 slices (2 hosts each) or nothing: one slice if that is all there is; none, and it says so.
    cap = capacity(client)
    slices = 2
    if cap is not None:
        slices = min(2, cap.tpu_slices("v4-16", TpuConfig("v4-16").slice.hosts))
        if slices == 0:
            cannot_run(
                f"it needs v4-16 TPU slices and none of its {cap.describe()} is a TPU host (start workers with "
                "--device tpu:v4-16:4 --attr tpu-name=SLICE --attr tpu-worker-id=0|1, or "
                "`fray cluster up --config examples/cluster.yaml`, whose autoscaler makes them)"
            )
        if slices == 1:
            print("(the cluster has one complete v4-16 slice: the job runs on one)")
    with tempfile.TemporaryDirectory(prefix="fray-train-") as tmp:
        try:
            result = run(client, tmp, slices=slices)
        except NeverScheduled as exc:  # e.g. a cluster file without a v4-16 group
            cannot_run(str(exc))
    if result.local_dry_run:
        print("local backend: no TPU slices here; each replica ran once, as a dry run of the training code")
    print(f"training job finished after {result.attempts} attempt(s) on {len(result.hosts)} host process(es)")
    for r in result.hosts:
        where = f"slice {r.slice_index} ({r.slice_name or 'no slice'}) host {r.host if r.host is not None else '-'}"
        coordinator = dict(r.megascale).get("MEGASCALE_COORDINATOR_ADDRESS", "none")
        print(f"  {where}: device {r.device}, megascale coordinator {coordinator}")
