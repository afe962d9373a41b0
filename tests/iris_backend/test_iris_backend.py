"""What the Iris backend does beyond the conformance suite: spec, in-task detection, Iris's own budgets."""

from __future__ import annotations

import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from iris.client import IrisClient as IrisLib
from iris.cluster.types import Entrypoint as IrisEntrypoint
from iris.cluster.types import EnvironmentSpec, JobName, ResourceSpec

import fray
from fray import (
    ActorDiedError,
    ConfigError,
    Entrypoint,
    JobAlreadyExists,
    JobFailed,
    JobRequest,
    JobStatus,
    ResourceConfig,
)
from fray.core._lifecycle import Failure, RetryBudget
from fray.iris._task import END_TAG, FAILURE_TAG
from fray.iris.client import IrisClient
from support import wait_until


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def add(self, amount: int) -> int:
        self.value += amount
        return self.value


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    print("about to fail")
    raise ValueError(message)


def probe_from_a_plain_iris_task(out: str) -> None:
    """Runs in a task Iris started on its own: no FRAY_CLIENT_SPEC, yet current_client() is Iris-backed."""
    import os

    import fray as fray_in_task

    client = fray_in_task.current_client()
    child = client.submit(
        fray_in_task.JobRequest(name="child", entrypoint=fray_in_task.Entrypoint.from_callable(add, args=(1, 2)))
    )
    status = child.wait(timeout=120)
    Path(out).write_text(f"{type(client).__name__} {os.environ.get('FRAY_CLIENT_SPEC')} {child.job_id} {status.value}")


def test_spec_builds_an_iris_client_and_iris_alone_needs_a_task(iris_cluster):
    client = fray.client_from_spec(iris_cluster.spec)
    assert isinstance(client, IrisClient) and client.address == iris_cluster.address
    with pytest.raises(ConfigError, match="iris://HOST:PORT"):
        fray.client_from_spec("iris")
    with pytest.raises(ConfigError, match="unknown option"):
        fray.client_from_spec(f"{iris_cluster.spec}?ws=/tmp")


def test_code_in_a_plain_iris_task_gets_an_iris_client(iris_cluster, tmp_path: Path, uid):
    iris = IrisLib.remote(iris_cluster.url)
    out = tmp_path / "probe"
    job = iris.submit(
        IrisEntrypoint.from_callable(probe_from_a_plain_iris_task, str(out)),
        f"plain-{uid}",
        ResourceSpec(cpu=0.5, memory="256m"),
        environment=EnvironmentSpec(setup_scripts=[]),
    )
    job.wait(timeout=180, poll_interval=0.5)
    kind, spec, child_id, status = out.read_text().split()
    assert (kind, spec, status) == ("IrisClient", "None", "succeeded")
    assert child_id == f"{job.job_id.to_wire()}/child"  # a child of the task's job, in its namespace


def test_handles_pickle_and_work_where_they_are_unpickled(iris_client, uid):
    counter = iris_client.create_actor(Counter, 1, name=f"ctr-{uid}")
    again = pickle.loads(pickle.dumps(counter))
    assert again.add(2) == 3 and counter.add(0) == 3
    job = iris_client.submit(JobRequest(name=f"add-{uid}", entrypoint=Entrypoint.from_callable(add, args=(1, 2))))
    copy = pickle.loads(pickle.dumps(job))
    assert copy.job_id == job.job_id and copy.wait(timeout=120) == JobStatus.SUCCEEDED


def test_preemptions_count_against_the_preemption_budget(iris_client, uid):
    job = iris_client.submit(
        JobRequest(
            name=f"preempt-{uid}",
            entrypoint=Entrypoint.from_binary("sleep", ["300"]),
            max_retries_preemption=1,
        )
    )
    task = iris_client.iris.job(JobName.from_wire(job.job_id)).task(0)
    for attempt in (0, 1):
        wait_until(
            lambda a=attempt: task.status().current_attempt_number == a and job.status() == JobStatus.RUNNING,
            timeout=120,
            what=f"attempt {attempt} to run",
        )
        assert task.preempt(reason="test preemption").accepted
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=120)
    budget = RetryBudget(0, 1, preemptions=1)
    expected = budget.exhausted_message(Failure.lost("x"))
    assert str(info.value).endswith(expected[expected.index(" (gave up") :])


def test_placement_iris_cannot_satisfy_is_refused_at_submit(iris_client, uid):
    with pytest.raises(ConfigError, match="us-east1"):
        iris_client.submit(
            JobRequest(
                name=f"nowhere-{uid}",
                entrypoint=Entrypoint.from_callable(add, args=(1, 2)),
                resources=ResourceConfig(regions=["us-east1"]),
            )
        )


def test_a_live_jobs_name_is_taken(iris_client, uid):
    job = iris_client.submit(JobRequest(name=f"busy-{uid}", entrypoint=Entrypoint.from_binary("sleep", ["300"])))
    try:
        with pytest.raises(JobAlreadyExists):
            iris_client.submit(JobRequest(name=f"busy-{uid}", entrypoint=Entrypoint.from_binary("true")))
    finally:
        job.terminate()


def test_logs_show_the_traceback_but_not_frays_own_lines(iris_client, uid):
    job = iris_client.submit(JobRequest(name=f"fail-{uid}", entrypoint=Entrypoint.from_callable(fail, args=("x",))))
    with pytest.raises(ValueError):
        job.wait(timeout=120)
    lines = job.logs()
    assert "about to fail" in lines and "ValueError: x" in lines
    assert not [line for line in lines if FAILURE_TAG.strip() in line or END_TAG in line]
    assert job.logs(max_lines=1) == ("ValueError: x",)


def test_a_binary_that_exits_non_zero_quotes_its_last_output(iris_client, uid):
    script = "import sys; print('line one'); print('line two', file=sys.stderr); sys.exit(4)"
    job = iris_client.submit(
        JobRequest(name=f"exit-{uid}", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", script]))
    )
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=120)
    assert info.value.exit_code == 4
    assert info.value.message.endswith("exit code 4; last output:\nline one\nline two")


@pytest.fixture
def under_tmp() -> Iterator[Path]:
    """A directory under ``/tmp``: one of the container mount paths Iris's process runtime rewrites."""
    directory = Path(tempfile.mkdtemp(prefix="fray-iris-binary-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_binary_under_tmp_runs_as_written(iris_client, uid, under_tmp):
    # The driver's own interpreter in a venv under /tmp, and a script beside it: Iris's process runtime
    # rewrote both to a per-task directory where neither exists (exit 127, "fray-iris: line 1: ...").
    python = under_tmp / "venv-python"
    python.symlink_to(sys.executable)
    script = under_tmp / "job.py"
    script.write_text("import sys\nprint('ran', sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    ok = iris_client.submit(
        JobRequest(name=f"tmp-ok-{uid}", entrypoint=Entrypoint.from_binary(str(python), [str(script), "0", "/tmp/x"]))
    )
    assert ok.wait(timeout=120) == JobStatus.SUCCEEDED
    assert ok.logs() == ("ran ['0', '/tmp/x']",)
    bad = iris_client.submit(
        JobRequest(name=f"tmp-bad-{uid}", entrypoint=Entrypoint.from_binary(str(python), [str(script), "3"]))
    )
    with pytest.raises(JobFailed) as failed:
        bad.wait(timeout=120)
    assert failed.value.exit_code == 3
    slow = iris_client.submit(
        JobRequest(
            name=f"tmp-slow-{uid}",
            entrypoint=Entrypoint.from_binary(str(python), ["-c", "import time; time.sleep(300)"]),
        )
    )
    wait_until(lambda: slow.status() == JobStatus.RUNNING, timeout=120, what="the job to run")
    slow.terminate()
    assert slow.wait(timeout=120, raise_on_failure=False) == JobStatus.STOPPED


def test_an_idle_handle_lets_its_sender_thread_go_and_starts_another(iris_client, uid, monkeypatch):
    from fray.iris import actor as iris_actor

    monkeypatch.setattr(iris_actor, "SENDER_IDLE", 0.2)
    counter = iris_client.create_actor(Counter, name=f"idle-{uid}")
    assert counter.add(1) == 1
    wait_until(lambda: counter._senders == 0, timeout=30, what="the idle sender to end")
    assert counter.add(1) == 2


def test_a_job_iris_does_not_know_is_not_found(iris_client, uid):
    from fray import NotFound
    from fray.iris.job import IrisJobHandle, JobMeta

    meta = JobMeta(f"gone-{uid}", "gone", False, 1, 1, 0, 0)
    job = IrisJobHandle(iris_client.iris.job(JobName.from_wire(f"/nobody/gone-{uid}")), meta)
    with pytest.raises(NotFound, match=f"gone-{uid}"):
        job.status()


# ----- actor groups are one Iris job; marin's fields --------------------------------------------


def test_an_actor_group_is_one_iris_job_with_a_task_per_member(iris_client, uid):
    from fray.iris.group import IrisActorGroup

    group = iris_client.create_actor_group(Counter, 5, name=f"one-{uid}", count=3)
    assert isinstance(group, IrisActorGroup)
    handles = group.wait_ready(timeout=120)
    assert [h.add(i) for i, h in enumerate(handles)] == [5, 6, 7]
    job_id = group.job.job_id
    assert len(iris_client.iris.list_tasks(JobName.from_wire(job_id))) == 3
    members = [f"{job_id}/one-{uid}-{i}" for i in range(3)]
    assert [job.job_id for job in group.jobs] == members
    assert {e.name for e in iris_client.iris.list_endpoints(f"{job_id}/")} == set(members)
    assert handles[0].add.submit(10).result(timeout=60) == 15  # .submit(): one of Iris's long-running operations
    # marin's constructor finds the same members from the job's id; a pickled group works where it is unpickled.
    for again in (
        IrisActorGroup(f"one-{uid}", 3, JobName.from_wire(job_id), iris_client.iris),
        pickle.loads(pickle.dumps(group)),
    ):
        assert sorted(h.add(0) for h in again.wait_ready(timeout=60)) == [6, 7, 15]
    group.jobs[1].terminate()  # one member alone
    assert group.jobs[1].status() == JobStatus.STOPPED
    with pytest.raises(ActorDiedError):
        handles[1].add(1)
    assert handles[2].add(1) == 8 and group.jobs[2].status() == JobStatus.RUNNING
    group.shutdown()
    wait_until(group.is_done, timeout=120, what="the group's job to end")
    assert group.statuses()[0] == JobStatus.STOPPED


def report_env(out: str) -> None:
    import os

    Path(out).write_text(os.environ.get("JAX_PLATFORMS", "unset"))


def test_a_cpu_job_gets_the_device_defaults(iris_client, uid, tmp_path: Path):
    out = tmp_path / "env"
    job = iris_client.submit(
        JobRequest(name=f"env-{uid}", entrypoint=Entrypoint.from_callable(report_env, args=(str(out),)))
    )
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    assert out.read_text() == "cpu"


def test_a_timeout_ends_the_job(iris_client, uid):
    job = iris_client.submit(
        JobRequest(name=f"late-{uid}", entrypoint=Entrypoint.from_binary("sleep", ["300"]), timeout=2)
    )
    assert job.wait(timeout=120, raise_on_failure=False) == JobStatus.FAILED


def test_a_wrapped_iris_client_runs_jobs(iris_client, uid):
    wrapped = IrisClient.from_iris_client(iris_client.iris)
    job = wrapped.submit(JobRequest(name=f"wrapped-{uid}", entrypoint=Entrypoint.from_callable(add, args=(1, 2))))
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    wrapped.shutdown()
