"""examples/data_pipeline.py: exact output on 1,000 records x 16 shards, and with a worker killed mid-stage."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from example_modules import load_example, run_script

pipeline = load_example("data_pipeline")
# Ray pickles actor classes and call arguments with its own copy of cloudpickle, whose by-value
# registry is separate from the one load_example fills (a script's __main__ goes by value anyway).
with contextlib.suppress(ImportError):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(pipeline)


def expected_totals(records: int) -> tuple[tuple[str, int, int], ...]:
    """The transform, written out independently: amount = 2 * value, keep amount % 3 != 0, count/sum by key."""
    totals: dict[str, tuple[int, int]] = {}
    for i in range(records):
        key, amount = f"user-{i % 10}", ((i * 37) % 101) * 2
        if amount % 3:
            count, total = totals.get(key, (0, 0))
            totals[key] = (count + 1, total + amount)
    return tuple((key, count, total) for key, (count, total) in sorted(totals.items()))


def test_the_expected_figures_are_not_trivial():
    totals = expected_totals(1000)
    assert len(totals) == 10 and sum(count for _, count, _ in totals) == 663  # about a third filtered out
    assert totals[0] == ("user-0", 66, 6666)


def test_the_pipeline_gives_the_exact_output(client, uid, tmp_path):
    result = pipeline.run(client, str(tmp_path), name=f"pipe-{uid}")
    assert result.totals == expected_totals(1000)
    assert (result.records, result.shards, result.partitions, result.workers) == (1000, 16, 4, 4)
    assert result.dead_workers == () and result.reassigned == ()
    # Workers wrote their outputs to shared storage and returned the paths.
    assert [Path(p).name for p in result.outputs] == [f"part-0000{p}.jsonl" for p in range(4)]
    assert len(list((tmp_path / f"pipe-{uid}" / "map").iterdir())) == 16


def test_a_worker_killed_mid_stage_has_its_shards_reassigned(client, uid, tmp_path):
    # Worker 1 receives map shards 1, 5, 9, 13 (round-robin) and runs them in order; it is killed
    # while it holds shard 5, so 5, 9 and 13 fail with ActorDiedError and go to the other workers.
    result = pipeline.run(client, str(tmp_path), name=f"pipe-{uid}", kill_worker_on_shard=5)
    assert result.dead_workers == (1,)
    assert result.reassigned == (5, 9, 13)
    assert (tmp_path / f"pipe-{uid}" / "_faults" / "map-5.started").exists()
    assert result.totals == expected_totals(1000)


def test_an_fsspec_url_works_unchanged(local_client, uid):
    # memory:// lives in this process, so only the local backend's workers (threads) share it.
    result = pipeline.run(local_client, f"memory://fray-{uid}", name="pipe", records=200, shards=5)
    assert result.totals == expected_totals(200)
    assert all(path.startswith(f"memory://fray-{uid}/pipe/reduce/") for path in result.outputs)


@pytest.mark.slow
def test_the_example_runs_as_a_script_on_the_local_backend():
    out = run_script("data_pipeline", "--kill-worker-on-shard", "5")
    assert out.returncode == 0, out.stderr
    assert "backend: LocalClient" in out.stdout
    assert "1000 records in 16 shards -> 4 partitions on 4 workers" in out.stdout
    assert "dead workers: [1], reassigned shards: [5, 9, 13]" in out.stdout
    assert "user-0: count=66 sum=6666" in out.stdout
