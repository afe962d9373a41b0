"""``examples/rl_loop.py`` (seed 003, RL Migration) on local, fray:// and Ray, with a failure and a preemption."""

from __future__ import annotations

import pytest
from example_modules import load_example, run_script

from fray import JobFailed

rl = load_example("rl_loop")
# Ray pickles actor classes with its own copy of cloudpickle: send this module by value there too, as
# Ray does for a script's __main__ (load_example registers it with cloudpickle only).
try:
    import ray.cloudpickle as ray_cloudpickle

    ray_cloudpickle.register_pickle_by_value(rl)
except ImportError:  # no Ray here: its tests skip
    pass


def test_statistics_add_up_exactly(client, uid):
    events: list[str] = []
    result = rl.run(client, rollouts=3, steps=12, steps_per_version=3, prefix=f"rl-{uid}", on_event=events.append)
    assert result.lesson_stats == rl.expected_stats(3, 12, 3)
    assert result.samples == 36
    assert result.final_version == 4
    assert result.versions_used == (0, 1, 2, 3)  # every rollout picked up each version the trainer published
    assert result.rollout_attempts == (1, 1, 1)
    assert events[0] == "3 rollouts x 12 steps: 36 samples, weights up to version 4, rollout attempts [1, 1, 1]"


def test_a_failing_rollout_fails_the_run_fast_with_its_exception(client, uid):
    with pytest.raises(JobFailed) as caught:
        rl.run(client, rollouts=3, steps=12, steps_per_version=3, prefix=f"rl-{uid}", fail_rollout=1, fail_at_step=4)
    error = caught.value
    assert isinstance(error, ValueError)  # the rollout's own exception class
    assert "rollout 1 failed at step 4 on lesson" in str(error)
    assert f"rl-{uid}-rollout-1" in str(error)


def test_a_preempted_rollout_is_retried_and_the_run_completes(client, uid):
    events: list[str] = []
    result = rl.run(
        client, rollouts=3, steps=12, steps_per_version=3, prefix=f"rl-{uid}", preempt_rollout=2, on_event=events.append
    )
    assert events[0] == "preempted rollout 2 while it waited for weights version 1"
    assert result.rollout_attempts == (1, 1, 2)  # retried once, within its preemption budget
    assert result.lesson_stats == rl.expected_stats(3, 12, 3)  # every step reported exactly once
    assert result.samples == 36


def test_runs_as_a_script_on_the_local_backend(tmp_path):
    done = run_script("rl_loop", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "3 rollouts x 12 steps: 36 samples, weights up to version 4, rollout attempts [1, 1, 1]" in lines
    assert "statistics add up exactly" in lines
    assert sum(1 for line in lines if line.startswith("  lesson ")) == 4
