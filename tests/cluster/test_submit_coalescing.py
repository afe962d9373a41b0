"""A plain ``submit`` loop on fray:// is coalesced into ``submit_many`` round trips behind the caller's back.

A client's first submit waits for the controller's answer (so a wrong credential or address
fails there: tests/cluster/test_faults.py, test_first_contact.py); every later ``submit``
returns its handle at once and still refuses a bad request at once;
the jobs are recorded in submit order, each exactly once, and a script that submits and
exits at once still has every job recorded.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, JobRequest, JobStatus, wait_all
from fray.cluster.client import ClusterClient
from fray.cluster.client._submit_batch import SubmitBatcher
from fray.cluster.protocol.capacity import TaskResources
from fray.cluster.protocol.messages import JobSpec, JobView
from fray.cluster.server.launcher import LocalCluster
from fray.errors import ActorUnavailableError, StoreError
from fray.job import EnvironmentConfig
from support import wait_until


def noop() -> None:
    pass


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of its own: the test holds its database's write lock (a slow disk) for a moment."""
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.startswith(tests_dir))}
    with LocalCluster(tmp_path / "cluster", env=env) as cluster:
        cluster.start(1, "--cpu", "4")
        yield cluster


def recorded(db: Path, prefix: str) -> list[tuple[str, float]]:
    """(name, submitted_at) of the jobs named ``prefix*``, in the order the controller recorded them."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name, submitted_at FROM jobs WHERE name LIKE ? ORDER BY seq", (f"{prefix}%",))
        return [(str(name), float(at)) for name, at in rows]


def test_a_submit_loop_returns_at_once_and_is_recorded_in_order_in_few_round_trips(own_cluster, tmp_path):
    db = tmp_path / "cluster" / "controller.db"
    client = ClusterClient(own_cluster.address, token=own_cluster.token)
    # A client's first submit waits for its answer (a wrong token or address fails right there); the rest are coalesced.
    client.submit(JobRequest(name="first", entrypoint=Entrypoint.from_callable(noop))).wait(timeout=60)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # a slow disk: the controller can record nothing for now
    try:
        names = [f"loop-{i:02d}" for i in range(30)]
        # Each submit returns although nothing can be recorded yet (a synchronous submit would block here).
        handles = [client.submit(JobRequest(name=name, entrypoint=Entrypoint.from_callable(noop))) for name in names]
        with pytest.raises(ConfigError):  # a bad request is still refused at once, by the submit itself
            client.submit(JobRequest(name="bad name!", entrypoint=Entrypoint.from_callable(noop)))
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    assert wait_all(handles, timeout=120) == [JobStatus.SUCCEEDED] * len(names)
    rows = recorded(db, "loop-")
    assert [name for name, _ in rows] == names  # in submit order, each once
    # One submit_many per round trip: at most the one in flight when the disk stalled, and the rest.
    assert len({at for _, at in rows}) <= 2
    assert all(handle.view().attempt == 0 for handle in handles)
    client.shutdown()


EXITING_SCRIPT = textwrap.dedent(
    """
    import fray
    from fray import Entrypoint, JobRequest

    client = fray.current_client()
    for i in range(25):  # the handles are never used: nothing waits for the controller's answers
        client.submit(JobRequest(name=f"gone-{i:02d}", entrypoint=Entrypoint.from_binary("true")))
    """
)


def test_a_script_that_submits_and_exits_at_once_has_every_job_recorded(own_cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    namespace = "exits-at-once"
    env.update(
        HOME=str(tmp_path),
        FRAY_TOKEN=own_cluster.token,
        FRAY_CLIENT_SPEC=f"fray://{own_cluster.address}?namespace={namespace}",
    )
    out = subprocess.run([sys.executable, "-c", EXITING_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [name for name, _ in recorded(tmp_path / "cluster" / "controller.db", "gone-")] == [
        f"gone-{i:02d}" for i in range(25)
    ]
    client = ClusterClient(own_cluster.address, token=own_cluster.token, namespace=namespace)
    views = [v for v in client._controller.list_jobs(None) if v.namespace == namespace]
    wait_until(
        lambda: all(client._controller.job(v.job_id).state == JobStatus.SUCCEEDED for v in views),
        timeout=120,
        what="the exited script's jobs to succeed",
    )
    client.shutdown()


# ----- the batcher's rules, with a stand-in for the controller's submit_many ----------------------


def spec(name: str) -> JobSpec:
    return JobSpec(
        name=name,
        resources=TaskResources(cpu_millis=1000, ram_bytes=1, disk_bytes=1),
        environment=EnvironmentConfig(),
        replicas=1,
        max_retries_failure=0,
        max_retries_preemption=0,
        argv=("true",),
    )


class Controller:
    """Records each submit_many call; refuses any batch holding a job named ``refuse``; can stall."""

    def __init__(self, lost: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lost = lost

    def submit_many(self, specs: list[JobSpec]) -> list[JobView]:
        self.gate.wait(30)
        self.calls.append([s.name for s in specs])
        if self.lost:
            raise ActorUnavailableError("the connection broke during controller call submit_many")
        if any(s.name == "refuse" for s in specs):
            raise StoreError("cannot submit 'refuse' as a child of job 'parent': it has already succeeded")
        return [recorded_view(s.name) for s in specs]


def recorded_view(name: str) -> JobView:
    return JobView(
        job_id=f"{name}-id", name=name, namespace="ns", state=JobStatus.PENDING, attempt=0, pending_reason="",
        error="", failure=None, settled=True, parent_id=None, user="u", submitted_at=0.0, finished_at=None, replicas=1,
    )  # fmt: skip


def batcher_for(controller: Controller) -> tuple[SubmitBatcher, list[tuple[int, list[bool]]]]:
    owned: list[tuple[int, list[bool]]] = []
    return SubmitBatcher(controller.submit_many, lambda views, detached: owned.append((len(views), detached))), owned


def test_submits_made_while_a_call_is_in_flight_go_in_the_next_call_in_order():
    controller = Controller()
    controller.gate.clear()
    batcher, owned = batcher_for(controller)
    first = batcher.add(spec("a"), True)
    wait_until(lambda: batcher._sending, what="the first call to be on its way")
    rest = [batcher.add(spec(name), name != "c") for name in "bcd"]
    controller.gate.set()
    assert [f.result(30) for f in [first, *rest]] == ["a-id", "b-id", "c-id", "d-id"]
    assert batcher.flush(30)
    assert controller.calls in ([["a"], ["b", "c", "d"]], [["a", "b", "c", "d"]])
    assert owned[-1][1][-3:] == [True, False, True]  # detached travels with each job


def test_a_refused_batch_is_sent_again_job_by_job_so_only_the_refused_job_fails():
    controller = Controller()
    controller.gate.clear()
    batcher, _ = batcher_for(controller)
    futures = [batcher.add(spec(name), True) for name in ("x", "refuse", "y")]
    controller.gate.set()
    assert futures[0].result(30) == "x-id" and futures[2].result(30) == "y-id"
    with pytest.raises(StoreError, match="already succeeded"):
        futures[1].result(30)
    recorded_calls = [call for call in controller.calls if "refuse" not in call]
    assert sorted(name for call in recorded_calls for name in call) == ["x", "y"]  # each recorded once
    assert ["refuse"] in controller.calls  # the refusal was pinned on the job it is about


def test_a_call_lost_in_transit_is_not_sent_again_and_every_job_of_it_says_so():
    controller = Controller(lost=True)
    controller.gate.clear()
    batcher, owned = batcher_for(controller)
    futures = [batcher.add(spec(name), True) for name in ("p", "q")]
    controller.gate.set()
    for future in futures:
        with pytest.raises(ActorUnavailableError):
            future.result(30)
    assert batcher.flush(30)
    assert sum(len(call) for call in controller.calls) == 2  # never resent: a job must not run twice
    assert owned == []


def submit_children_and_return(count: int) -> None:
    """A job that submits child jobs and returns at once, never touching their handles."""
    import fray

    client = fray.current_client()
    for i in range(count):
        client.submit(JobRequest(name=f"child-{i:02d}", entrypoint=Entrypoint.from_binary("true")))


def test_a_job_that_submits_children_and_returns_at_once_has_every_child_recorded(cluster_client):
    # A callable task is a fork that ends with os._exit: its queued submits are sent before that.
    parent = cluster_client.submit(
        JobRequest(name="parent", entrypoint=Entrypoint.from_callable(submit_children_and_return, args=(12,)))
    )
    assert parent.wait(timeout=120) == JobStatus.SUCCEEDED
    children = [v for v in cluster_client._controller.list_jobs(None) if v.parent_id == parent.job_id]
    assert sorted(v.name for v in children) == [f"child-{i:02d}" for i in range(12)]


def test_submit_many_after_plain_submits_records_them_in_order_and_owns_its_jobs(cluster_client):
    first = cluster_client.submit(JobRequest(name="before-0", entrypoint=Entrypoint.from_binary("true")))
    queued = cluster_client.submit(JobRequest(name="before-1", entrypoint=Entrypoint.from_binary("true")))
    many = cluster_client.submit_many(
        [JobRequest(name=f"many-{i}", entrypoint=Entrypoint.from_binary("sleep", ["300"])) for i in range(3)],
        detached=False,
    )
    ids = [h.job_id for h in (first, queued, *many)]
    order = [v.job_id for v in cluster_client._controller.list_jobs(None) if v.job_id in ids]
    assert order == ids  # the plain submits queued before submit_many are recorded before its jobs
    assert [h.job_id.rsplit("-", 1)[0] for h in many] == ["many-0", "many-1", "many-2"]
    cluster_client.shutdown(wait=False)  # the client owns them: detached=False jobs are stopped
    for handle in many:
        assert handle.wait(timeout=60, raise_on_failure=False) == JobStatus.STOPPED
