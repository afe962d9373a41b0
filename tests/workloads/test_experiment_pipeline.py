"""``examples/experiment_pipeline.py`` (seed 001 walk-through) on local, fray:// and Ray, with a failing step."""

from __future__ import annotations

from example_modules import load_example, run_script

pipeline = load_example("experiment_pipeline")
try:  # Ray pickles with its own copy of cloudpickle: send the module by value there too (as for __main__)
    import ray.cloudpickle as ray_cloudpickle

    ray_cloudpickle.register_pickle_by_value(pipeline)
except ImportError:  # no Ray here: its tests skip
    pass

STEPS = ["download", "filter", "tokenize", "train", "evaluate"]


def _expected_validation_tokens(documents: int) -> int:
    # Spam (every 7th document) is dropped; every 10th kept document from index 1 is validation;
    # document i has 3 + i % 4 words.
    return sum(3 + i % 4 for i in range(documents) if i % 7 != 0 and i % 10 == 1)


def test_every_step_runs_once_its_inputs_exist(client, tmp_path, uid):
    events: list[str] = []
    result = pipeline.run(client, str(tmp_path), documents=200, prefix=f"exp-{uid}", on_event=events.append)
    assert result.succeeded, result.error
    assert [(s.name, s.status) for s in result.steps] == [(name, "succeeded") for name in STEPS]
    assert dict(result.metrics) == {
        "millinats_per_token": 3141,
        "unseen_tokens": 0,
        "validation_tokens": _expected_validation_tokens(200),
    }
    filtered = [pipeline._read_json(tmp_path / "filtered" / f"part-{shard}.json") for shard in range(4)]
    assert sum(len(part) for part in filtered) == 200 - len(range(0, 200, 7))  # four replicas, spam dropped
    assert events[-1] == "metrics: {'millinats_per_token': 3141, 'unseen_tokens': 0, 'validation_tokens': 86}"


def test_a_failing_step_stops_the_rest_and_is_reported(client, tmp_path, uid):
    events: list[str] = []
    result = pipeline.run(client, str(tmp_path), prefix=f"exp-{uid}", fail_step="tokenize", on_event=events.append)
    assert not result.succeeded
    assert [(s.name, s.status) for s in result.steps] == [
        ("download", "succeeded"),
        ("filter", "succeeded"),
        ("tokenize", "failed"),
        ("train", "not run"),
        ("evaluate", "not run"),
    ]
    assert "ValueError: tokenize: vocabulary overflow" in result.steps[2].detail
    assert f"exp-{uid}-tokenize" in result.steps[2].detail  # which job
    assert "step 'tokenize' failed" in result.error
    assert "not run: train, evaluate" in result.error
    assert not (tmp_path / "model").exists()  # nothing after the failed step was submitted
    assert result.metrics == ()
    assert events[2] == f"tokenize: failed -- {result.steps[2].detail.splitlines()[0]}"


def test_a_failing_replica_of_the_gang_step_is_named(client, tmp_path, uid):
    result = pipeline.run(client, str(tmp_path), prefix=f"exp-{uid}", fail_step="filter")
    assert [(s.name, s.status) for s in result.steps] == [
        ("download", "succeeded"),
        ("filter", "failed"),
        ("tokenize", "not run"),
        ("train", "not run"),
        ("evaluate", "not run"),
    ]
    detail = result.steps[1].detail
    assert "replica 2 of 4" in detail
    assert "ValueError: filter: shard 2 hit a record it cannot parse" in detail
    assert "not run: tokenize, train, evaluate" in result.error
    assert not (tmp_path / "tokens").exists()


def test_runs_as_a_script_on_the_local_backend(tmp_path):
    done = run_script("experiment_pipeline", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    reported = {f"{name}: succeeded" for name in STEPS}
    assert [line for line in lines if line in reported] == [f"{name}: succeeded" for name in STEPS]
    assert "metrics: {'millinats_per_token': 3141, 'unseen_tokens': 0, 'validation_tokens': 86}" in lines
    assert lines[-1] == "pipeline succeeded"
