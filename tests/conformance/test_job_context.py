"""The job level (JobContext: tasks, objects, wait), specified once for every implementation.

Its own fixture list (``job_context`` below): threads, processes, Ray, the Fray
cluster. Task functions live at module level so that worker processes import them.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest

import fray
from fray import ConfigError, RemoteError, ResourceConfig, SerializationError, TaskLostError
from fray.context import get_job_context
from support import TYPED_VALUES, typed, wait_until

CONTEXT_FIXTURES = {
    "threads": "threads_context",
    "processes": "process_context",
    "ray": "ray_context",
    "fray": "cluster_context",
    "monarch": "monarch_context",
}

# Tests that cannot apply to an implementation, each with its reason (skipped for it only).
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "threads": {
        "test_unpicklable_function_is_refused_naming_it": "threads share memory: nothing is pickled",
        "test_unpicklable_result_fails_at_get": "threads share memory: nothing is pickled",
        "test_killed_worker_fails_the_task_at_get": "a thread cannot be killed from outside",
        "test_put_is_refused_where_there_is_no_object_store": "it stores objects",
    },
    "processes": {"test_put_is_refused_where_there_is_no_object_store": "it stores objects"},
    "ray": {"test_put_is_refused_where_there_is_no_object_store": "it stores objects"},
    "fray": {"test_put_is_refused_where_there_is_no_object_store": "it stores objects"},
    "monarch": {
        "test_put_once_many_tasks": "Monarch has no object store: put is refused",
        "test_put_values_keep_their_type": "Monarch has no object store: put is refused",
        "test_put_inside_a_task": "Monarch has no object store: put is refused",
        "test_a_ref_passed_deeper_can_be_fetched_inside_the_task": (
            "Monarch has no object store: a ref's value is known only in the process that made it"
        ),
        "test_deep_nesting_does_not_deadlock": (
            "a task waiting on nested tasks holds its pool process; nesting deeper than the pool waits forever"
        ),
    },
}


@pytest.fixture(params=sorted(CONTEXT_FIXTURES))
def ctx(request: pytest.FixtureRequest):
    """A job context of each implementation in turn."""
    reason = NOT_APPLICABLE.get(request.param, {}).get(request.node.originalname)
    if reason:
        pytest.skip(f"not applicable on {request.param}: {reason}")
    return request.getfixturevalue(CONTEXT_FIXTURES[request.param])


# ----- task functions ----------------------------------------------------------------------------


class QuotaExceeded(Exception):
    def __init__(self, message: str, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit

    def __reduce__(self):
        return (QuotaExceeded, (self.args[0], self.limit))


def add(a, b=0):
    return a + b


def total(values):
    return sum(values)


def describe(value):
    return type(value).__name__


def keys_and_values(mapping):
    return sorted(mapping.items())


def raise_quota(limit):
    raise QuotaExceeded(f"over quota {limit}", limit)


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def wait_for_file(path, value):
    deadline = time.monotonic() + 120
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)
    return value


def fan_out(n):
    context = get_job_context()
    return sum(context.get([context.create_task(add, i, i) for i in range(n)]))


def depth(n):
    if n == 0:
        return 0
    context = get_job_context()
    return 1 + context.get(context.create_task(depth, n - 1))


def wait_inside(n):
    context = get_job_context()
    refs = [context.create_task(add, i) for i in range(n)]
    ready, not_ready = context.wait(refs, num_returns=n, timeout=120)
    return len(ready), len(not_ready), context.get(ready)


def put_inside(value):
    context = get_job_context()
    ref = context.put(value)
    return context.get(context.create_task(add, ref, 1))


def get_inner(refs):
    # refs nested two levels deep arrive as refs: the task gets them itself
    return get_job_context().get(refs[0])


def pid_and_mark(path):
    Path(path).write_text(str(os.getpid()))
    time.sleep(600)


def return_lock():
    return threading.Lock()


def length(blob):
    return len(blob)


class Counter:
    def __init__(self, start=0):
        self.value = start

    def add(self, n):
        self.value += n
        return self.value


# ----- tasks and results -------------------------------------------------------------------------


def test_task_result_and_list_in_order(ctx):
    assert ctx.get(ctx.create_task(add, 1, b=2)) == 3
    refs = [ctx.create_task(add, i, i) for i in range(20)]
    assert ctx.get(refs) == [2 * i for i in range(20)]
    assert ctx.get(tuple(refs[:3])) == [0, 2, 4]


def test_refs_as_arguments_are_resolved_at_top_level_and_one_level_in(ctx):
    one, two = ctx.create_task(add, 1), ctx.create_task(add, 1, 1)
    assert ctx.get(ctx.create_task(add, one, b=two)) == 3
    assert ctx.get(ctx.create_task(total, [one, two, 3])) == 6
    assert ctx.get(ctx.create_task(total, (one, two))) == 3
    assert ctx.get(ctx.create_task(keys_and_values, {"a": one, "b": two})) == [("a", 1), ("b", 2)]
    # Two levels in: the task receives the ref itself.
    assert ctx.get(ctx.create_task(describe, [[one]])) == "list"


def test_a_ref_passed_deeper_can_be_fetched_inside_the_task(ctx):
    two = ctx.create_task(add, 1, 1)
    assert ctx.get(ctx.create_task(get_inner, [[two]])) == [2]


def test_put_once_many_tasks(ctx):
    blob = ctx.put(b"x" * 5_000_000)
    assert ctx.get([ctx.create_task(length, blob) for _ in range(6)]) == [5_000_000] * 6
    assert ctx.get(blob) == b"x" * 5_000_000


def test_wait_returns_the_first_ready_in_input_order(ctx, tmp_path):
    gate = tmp_path / "gate"
    slow = ctx.create_task(wait_for_file, str(gate), "slow")
    fast = [ctx.create_task(add, i) for i in range(3)]
    ready, not_ready = ctx.wait([slow, *fast], num_returns=3, timeout=120)
    assert ready == fast and not_ready == [slow]
    ready, not_ready = ctx.wait([slow], num_returns=1, timeout=0.2)
    assert ready == [] and not_ready == [slow]
    assert ctx.wait([slow, fast[0]], num_returns=0) == ([], [slow, fast[0]])
    gate.write_text("go")
    ready, _ = ctx.wait([slow], timeout=120)
    assert ready == [slow] and ctx.get(slow) == "slow"


def test_get_timeout_raises_timeout_error(ctx, tmp_path):
    ref = ctx.create_task(wait_for_file, str(tmp_path / "never-before-timeout"), 1)
    with pytest.raises(TimeoutError, match="not ready after"):
        ctx.get(ref, timeout=0.2)
    (tmp_path / "never-before-timeout").write_text("go")
    assert ctx.get(ref, timeout=120) == 1


def test_many_tasks_gather(ctx):
    refs = [ctx.create_task(add, i, 1) for i in range(500)]
    assert sum(ctx.get(refs, timeout=300)) == sum(range(1, 501))


# ----- errors ------------------------------------------------------------------------------------


def test_task_exception_reraises_in_the_shared_form(ctx):
    ref = ctx.create_task(raise_quota, 7)
    with pytest.raises(QuotaExceeded) as info:
        ctx.get(ref)
    err = info.value
    assert isinstance(err, RemoteError) and err.limit == 7
    assert str(err) == "QuotaExceeded: over quota 7"
    assert "raise_quota" in err.traceback_text
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, QuotaExceeded) and again.limit == 7
    # The same error again at the next get, and for a task that took the failed result.
    with pytest.raises(QuotaExceeded):
        ctx.get([ctx.create_task(add, 1), ref])
    with pytest.raises(QuotaExceeded):
        ctx.get(ctx.create_task(add, ref, 1))


def test_bad_input_is_refused_with_the_fix(ctx):
    with pytest.raises(ConfigError, match="must be an ObjectRef returned by create_task or put"):
        ctx.get(5)
    one, two = ctx.create_task(add, 1), ctx.create_task(add, 2)
    with pytest.raises(ConfigError, match="item 1"):
        ctx.get([one, "not a ref"])
    with pytest.raises(ConfigError, match=r"num_returns=3\) asks for more refs than the 2 given"):
        ctx.wait([one, two], num_returns=3)
    with pytest.raises(ConfigError, match="needs a function"):
        ctx.create_task(42)
    with pytest.raises(ConfigError, match=r"must be a fray\.ResourceConfig"):
        ctx.create_task(add, 1, resources={"cpu": 1})
    with pytest.raises(ConfigError, match="timeout"):
        ctx.get(one, timeout=-1)
    other = fray.LocalJobContext()
    with pytest.raises(ConfigError, match="another"):
        ctx.get(other.put(1))
    other.shutdown()


def test_resources_are_accepted(ctx):
    assert ctx.get(ctx.create_task(add, 2, resources=ResourceConfig(cpu=1))) == 2


def test_unpicklable_function_is_refused_naming_it(ctx):
    lock = threading.Lock()
    with pytest.raises(SerializationError, match="argument 0 cannot be pickled"):
        ctx.create_task(describe, lock)


def test_unpicklable_result_fails_at_get(ctx):
    with pytest.raises(SerializationError, match="return value"):
        ctx.get(ctx.create_task(return_lock))


def test_killed_worker_fails_the_task_at_get(ctx, tmp_path):
    mark = tmp_path / "pid"
    ref = ctx.create_task(pid_and_mark, str(mark))
    pid = int(wait_until(lambda: mark.exists() and mark.read_text(), timeout=120, what="the task to start"))
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(TaskLostError):
        ctx.get(ref, timeout=120)
    with pytest.raises(TaskLostError):  # a task that took the lost result fails too, unrun
        ctx.get(ctx.create_task(add, ref, 1), timeout=120)
    assert ctx.get(ctx.create_task(add, 1, 1), timeout=120) == 2  # the context carries on


# ----- inside tasks --------------------------------------------------------------------------------


def test_nested_tasks_see_a_context_of_the_same_backend(ctx):
    assert ctx.get(ctx.create_task(fan_out, 5)) == 20
    assert ctx.get(ctx.create_task(wait_inside, 3)) == (3, 0, [0, 1, 2])


def test_put_inside_a_task(ctx):
    assert ctx.get(ctx.create_task(put_inside, 41)) == 42


def test_put_is_refused_where_there_is_no_object_store(ctx):
    with pytest.raises(ConfigError, match="no object store; pass the value to create_task"):
        ctx.put(1)


def test_deep_nesting_does_not_deadlock(ctx):
    assert ctx.get(ctx.create_task(depth, 12), timeout=300) == 12


def test_refs_pickle_within_their_context(ctx):
    ref = ctx.create_task(add, 20, 1)
    again = pickle.loads(pickle.dumps(ref))
    assert again.ref_id == ref.ref_id and ctx.get(again) == 21


def test_create_actor_through_the_context(ctx, uid):
    counter = ctx.create_actor(Counter, 5, name=f"ctr-{uid}")
    assert counter.add(2) == 7
    anonymous = ctx.create_actor(Counter)
    assert anonymous.add(1) == 1


# ----- a job gets its backend's context ------------------------------------------------------------

EXPECTED_CONTEXT = {
    "LocalClient": "LocalJobContext",
    "RayClient": "RayJobContext",
    "ClusterClient": "ClusterJobContext",
    "MonarchClient": "MonarchJobContext",
    "IrisClient": "LocalJobContext",
}


def write_context_kind(path: str) -> None:
    context = get_job_context()
    Path(path).write_text(f"{type(context).__name__} {context.get(context.create_task(add, 20, 22))}")


def test_a_job_gets_its_backends_context(client, uid, tmp_path):
    out = tmp_path / "kind"
    job = client.submit(
        fray.JobRequest(
            name=f"kind-{uid}", entrypoint=fray.Entrypoint.from_callable(write_context_kind, args=(str(out),))
        )
    )
    job.wait(timeout=300)
    assert out.read_text() == f"{EXPECTED_CONTEXT[type(client).__name__]} 42"


def same_value(value):
    return value


def test_task_arguments_and_results_keep_their_type(ctx):
    for value in TYPED_VALUES:
        assert typed(ctx.get(ctx.create_task(same_value, value))) == typed(value)


def test_put_values_keep_their_type(ctx):
    for value in TYPED_VALUES:
        assert typed(ctx.get(ctx.put(value))) == typed(value)
