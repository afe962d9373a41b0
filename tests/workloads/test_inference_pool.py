"""examples/inference_pool.py: a pool of model servers on a leased queue, scaling, and servers killed mid-request."""

from __future__ import annotations

import pytest
from example_modules import load_example, run_script

inference = load_example("inference_pool")


def expected_output(request_id: int) -> str:
    prompt = f"prompt number {request_id}"
    return f"{prompt[::-1].upper()}:{sum(map(ord, prompt)) % 997}"


def test_the_pool_scales_from_one_to_four_and_back_and_answers_every_request_once(client, uid):
    result = inference.run(client, name=f"inf-{uid}", requests=100)
    assert result.missing == () and result.duplicates == ()
    assert result.results_per_id == tuple((i, 1) for i in range(100))
    assert result.outputs == tuple((i, expected_output(i)) for i in range(100))
    assert result.peak_workers == 4  # the backlog of 100 grew the pool to max_workers
    assert result.final_workers == 1  # and it shrank back to min_workers once the backlog was gone
    assert result.redelivered == () and result.killed == ""


def test_a_server_killed_mid_request_has_it_redelivered_and_answered_exactly_once(client, uid):
    # A fixed pool of two: no scale-down, so the kill is the only fault. The server holding
    # request 7 is killed before it pushed a result; its lease runs out and another server
    # (or its replacement) answers it. Counted per id, not deduplicated: exactly one each.
    result = inference.run(
        client, name=f"inf-{uid}", requests=20, min_workers=2, max_workers=2, fault=inference.Fault(7)
    )
    assert result.killed.startswith("terminate()" if client.__class__.__name__ == "LocalClient" else "kill -9")
    assert result.missing == ()
    assert result.results_per_id == tuple((i, 1) for i in range(20))
    assert result.duplicates == ()
    assert result.redelivered == (7,)
    assert dict(result.outputs)[7] == expected_output(7)


def test_a_server_killed_between_push_and_done_gives_a_duplicate_that_is_counted(client, uid):
    # The at-least-once window: the result of request 3 was pushed, its lease not yet acknowledged.
    # The request is served again, so its id has two results, and the run says so.
    result = inference.run(
        client,
        name=f"inf-{uid}",
        requests=10,
        min_workers=2,
        max_workers=2,
        fault=inference.Fault(3, after_push=True),
    )
    assert result.missing == ()
    assert result.duplicates == (3,)
    assert result.results_per_id == tuple((i, 2 if i == 3 else 1) for i in range(10))
    assert result.redelivered == ()  # the first result of 3 came from its first delivery


@pytest.mark.slow
def test_the_example_runs_as_a_script_on_the_local_backend():
    out = run_script("inference_pool", "--requests", "40", "--kill-during-request", "7")
    assert out.returncode == 0, out.stderr
    assert "backend: LocalClient" in out.stdout
    assert "40 of 40 requests answered; missing: []" in out.stdout
    assert "duplicate results: []; redelivered: [7]" in out.stdout
    assert "pool: peak 4 servers, 1 after the backlog" in out.stdout
    assert "fault: terminate() of server job" in out.stdout
    assert f"request 0: {expected_output(0)}" in out.stdout
