"""``fray timeline`` and ``ClusterClient.timeline``: the jobs as a Chrome trace (issue 35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fray
from fray import Entrypoint, JobRequest, JobStatus
from fray.cluster.client import ClusterClient
from fray.cluster.protocol.capacity import TaskResources
from fray.cluster.protocol.records import JobRecord, TaskRecord, TaskState
from fray.cluster.server.launcher import LocalCluster
from fray.cluster.server.trace import NOT_PLACED, TraceJob, chrome_trace
from fray.errors import ConfigError, JobFailed
from fray.local import LocalClient


def succeed() -> int:
    return 1


def fail() -> None:
    raise ValueError("no luck")


def fail_on_first_attempt() -> None:
    if fray.current_job().attempt == 0:
        raise RuntimeError("first attempt fails")


def _cli(cluster: LocalCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(home), FRAY_TOKEN=cluster.token, FRAY_CLIENT_SPEC=f"fray://{cluster.address}")
    return subprocess.run([sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True)


def _spans(trace: dict, job_id: str, cat: str = "running") -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == cat and e["args"]["job_id"] == job_id]


def test_timeline_has_a_span_per_attempt_with_names_and_outcomes(
    cluster_client: ClusterClient, fray_cluster: LocalCluster, tmp_path: Path
):
    ok = cluster_client.submit(JobRequest(name="tl-ok", entrypoint=Entrypoint.from_callable(succeed)))
    bad = cluster_client.submit(JobRequest(name="tl-bad", entrypoint=Entrypoint.from_callable(fail)))
    retried = cluster_client.submit(
        JobRequest(name="tl-retried", entrypoint=Entrypoint.from_callable(fail_on_first_attempt), max_retries_failure=1)
    )
    assert ok.wait(timeout=60) == JobStatus.SUCCEEDED
    with pytest.raises(JobFailed):
        bad.wait(timeout=60)
    assert retried.wait(timeout=60) == JobStatus.SUCCEEDED

    out = tmp_path / "t.json"
    run = _cli(fray_cluster, tmp_path, "timeline", "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert "open it in https://ui.perfetto.dev" in run.stderr
    trace = json.loads(out.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names & {"worker-0", "worker-1"}

    [ok_span] = _spans(trace, ok.job_id)
    assert ok_span["name"] == "tl-ok" and ok_span["args"]["outcome"] == "succeeded" and ok_span["args"]["attempt"] == 0
    assert ok_span["dur"] >= 0 and isinstance(ok_span["ts"], (int, float))
    assert len(_spans(trace, ok.job_id, "pending")) == 1
    [bad_span] = _spans(trace, bad.job_id)
    assert bad_span["name"] == "tl-bad" and bad_span["args"]["outcome"] == "failed"
    assert "no luck" in bad_span["args"]["error"]
    spans = sorted(_spans(trace, retried.job_id), key=lambda e: e["args"]["attempt"])
    assert [(s["args"]["attempt"], s["args"]["outcome"]) for s in spans] == [(0, "failed"), (1, "succeeded")]
    retries = [e for e in events if e["ph"] == "i" and e["name"] == "retry" and e["args"]["job_id"] == retried.job_id]
    assert [r["args"]["attempt"] for r in retries] == [1]

    # --job keeps one job (by id or name); stdout without -o; the Python API gives the same.
    only = json.loads(_cli(fray_cluster, tmp_path, "timeline", "--job", "tl-retried").stdout)
    assert {e["args"]["job_id"] for e in only["traceEvents"] if e["ph"] == "X"} == {retried.job_id}
    mine = cluster_client.timeline(job=bad, since=600)
    assert {e["args"]["job_id"] for e in mine["traceEvents"] if e["ph"] == "X"} == {bad.job_id}


def test_timeline_mistakes_are_one_line(fray_cluster: LocalCluster, tmp_path: Path):
    run = _cli(fray_cluster, tmp_path, "timeline", "--since", "soon")
    assert run.returncode == 2 and "error: --since 'soon' is not a duration" in run.stderr
    run = _cli(fray_cluster, tmp_path, "timeline", "--job", "no-such-job-xyz")
    assert run.returncode == 2 and "no job 'no-such-job-xyz'" in run.stderr


def test_backends_without_records_say_so(tmp_path: Path):
    with LocalClient() as client, pytest.raises(ConfigError, match="keeps no timeline"):
        client.timeline()


def _job(job_id: str, name: str, attempt: int) -> JobRecord:
    return JobRecord(
        job_id, None, name, "alice", "ns", JobStatus.RUNNING, TaskResources(), 1, 0, 1, 0, attempt, attempt, "", "",
        100.0, 101.0, None,
    )  # fmt: skip


def _task(job_id: str, attempt: int, state: TaskState, worker: str | None, at: float) -> TaskRecord:
    placed = at + 1 if worker else None
    done = at + 3 if state.finished else None
    return TaskRecord(job_id, 0, attempt, 0, 0, state, worker, None, "worker lost" if state == TaskState.LOST else "",
                      at, placed, placed, done)  # fmt: skip


def test_losses_actor_restarts_and_unplaced_tasks_in_the_trace():
    actor = _job("actor-1", "svc", 1)
    waiting = _job("wait-1", "waits", 0)
    trace = chrome_trace(
        [
            TraceJob(actor, "svc", (_task("actor-1", 0, TaskState.LOST, "w0", 100.0),
                                    _task("actor-1", 1, TaskState.RUNNING, "w1", 104.0))),
            TraceJob(waiting, "", (_task("wait-1", 0, TaskState.PENDING, None, 102.0),)),
        ],
        now=110.0,
    )  # fmt: skip
    events = trace["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {"w0", "w1", NOT_PLACED}
    [lost] = [e for e in events if e["name"] == "lost"]
    assert lost["ts"] == 3e6 and lost["args"]["reason"] == "worker lost"
    [restart] = [e for e in events if e["name"] == "actor restart"]
    assert restart["ts"] == 4e6 and restart["args"]["attempt"] == 1
    running = [e for e in events if e["ph"] == "X" and e["cat"] == "running" and e["args"]["attempt"] == 1]
    assert running[0]["dur"] == 5e6  # still running: to now
    [pending] = [e for e in events if e["ph"] == "X" and e["args"]["job_id"] == "wait-1"]
    assert pending["cat"] == "pending" and pending["dur"] == 8e6 and pending["args"]["outcome"] == "pending"
    assert json.loads(json.dumps(trace)) == trace
