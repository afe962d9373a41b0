"""Finding the job context, and what is specific to the threads and processes implementations."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

import fray
from fray import ConfigError, Entrypoint, JobRequest, LocalJobContext, ProcessJobContext, TaskLostError
from fray.context import clear_job_context, get_job_context, set_job_context
from support import alive, wait_until


def context_kind() -> str:
    return type(get_job_context()).__name__


def same_context_as(expected_id: str) -> bool:
    return get_job_context().context_id == expected_id  # type: ignore[attr-defined]


def meet(mine: str, other: str) -> int:
    """Both tasks must run at the same time: each waits for the other's mark."""
    Path(mine).write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not Path(other).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the other task never ran alongside this one")
        time.sleep(0.01)
    return os.getpid()


def sleep_long() -> None:
    time.sleep(600)


def length(blob: bytes) -> int:
    return len(blob)


def test_default_context_is_the_clients_threaded_one():
    context = get_job_context()
    assert isinstance(context, LocalJobContext)
    assert get_job_context() is context


def test_set_and_clear():
    mine = LocalJobContext(2)
    token = set_job_context(mine)
    try:
        assert get_job_context() is mine
        inner = ProcessJobContext(1)
        inner_token = set_job_context(inner)
        assert get_job_context() is inner
        clear_job_context(inner_token)
        assert get_job_context() is mine
        inner.shutdown()
    finally:
        clear_job_context(token)
    assert get_job_context() is not mine
    with pytest.raises(ConfigError, match="needs a JobContext"):
        set_job_context("threads")  # type: ignore[arg-type]
    mine.shutdown()


def test_inside_a_task_the_context_is_the_one_running_it():
    context = LocalJobContext(2)
    assert context.get(context.create_task(same_context_as, context.context_id))
    context.shutdown()


def job_sees_its_clients_context(marker: str) -> None:
    client = fray.current_client()
    assert get_job_context() is client._fray_job_context()  # type: ignore[attr-defined]
    Path(marker).write_text(context_kind())


def test_inside_a_local_job_the_context_is_its_clients(local_client, tmp_path):
    marker = tmp_path / "kind"
    job = local_client.submit(
        JobRequest(name="ctx", entrypoint=Entrypoint.from_callable(job_sees_its_clients_context, args=(str(marker),)))
    )
    job.wait(timeout=60)
    assert marker.read_text() == "LocalJobContext"


def test_threads_context_shutdown_drops_queued_tasks():
    context = LocalJobContext(1)
    context.create_task(time.sleep, 0.5)
    queued = context.create_task(length, b"abc")
    context.shutdown()
    with pytest.raises(TaskLostError, match="shut down"):
        context.get(queued, timeout=60)


def test_processes_run_cpu_work_in_parallel(tmp_path):
    with ProcessJobContext(2) as context:
        a, b = str(tmp_path / "a"), str(tmp_path / "b")
        pids = context.get([context.create_task(meet, a, b), context.create_task(meet, b, a)], timeout=180)
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert context_kind() != "WorkerContext"
        assert context.get(context.create_task(context_kind)) == "WorkerContext"


def test_a_put_object_crosses_to_each_worker_once():
    with ProcessJobContext(2) as context:
        blob = context.put(b"y" * 1_000_000)
        assert context.get([context.create_task(length, blob) for _ in range(20)]) == [1_000_000] * 20
        record = context._objects[blob.ref_id]
        # Sent at most once to each worker that ran one of the tasks, whatever the number of tasks.
        assert 1 <= len(record.holders) <= len(context._workers) <= 2


def test_objects_are_freed_when_their_refs_are_dropped():
    with ProcessJobContext(1) as context:
        refs = [context.create_task(length, b"abc") for _ in range(50)]
        assert context.get(refs) == [3] * 50
        kept = context.put("kept")
        escaped = context.put("escaped")
        context.get(context.create_task(length, [[escaped]]))  # pickled into data: kept until shutdown
        del refs, escaped
        gc.collect()
        context.get(context.create_task(length, "x"))  # frees happen at the next call
        # Left: kept, escaped, and the last task's result (its ref was dropped after that call).
        assert kept.ref_id in context._objects and len(context._objects) == 3


def test_shutdown_fails_pending_work_and_ends_the_processes(tmp_path):
    context = ProcessJobContext(1)
    running = context.create_task(sleep_long)
    wait_until(lambda: context._workers and next(iter(context._workers.values())).task, what="the task to start")
    pid = next(iter(context._workers.values())).pid
    server = context._server
    assert server is not None
    context.shutdown()
    with pytest.raises(TaskLostError, match="shut down"):
        context.get(running, timeout=60)
    wait_until(lambda: not alive(pid), timeout=60, what="the worker to exit")
    assert server.poll() is not None
    with pytest.raises(ConfigError, match="shut down"):
        context.create_task(length, b"")
