"""Fray quickstart: a miniature RL loop and data pipeline on whatever backend is configured.

Runs on the embedded local backend with no setup:

    python examples/quickstart.py

and unchanged on another engine, e.g. ``FRAY_CLIENT_SPEC=ray python examples/quickstart.py``.
It shows jobs, a replicated (gang) job, a shared actor passed into jobs, an actor
group, ``wait_all``, and a failure surfacing as a precise exception.
"""

from __future__ import annotations

import concurrent.futures
import random

import fray
from fray import Entrypoint, JobFailed, JobRequest, ResourceConfig, wait_all


class Curriculum:
    """Shared state for rollout workers: hands out lessons, collects scores."""

    def __init__(self, lessons: list[str]) -> None:
        self.lessons = lessons
        self.scores: dict[str, list[float]] = {lesson: [] for lesson in lessons}

    def next_lesson(self, seed: int) -> str:
        # Prefer the lesson with the fewest scores so far; calls arrive one at a time,
        # so this needs no lock.
        return min(self.lessons, key=lambda lesson: (len(self.scores[lesson]), (hash(lesson) + seed) % 7))

    def report(self, lesson: str, score: float) -> None:
        self.scores[lesson].append(score)

    def summary(self) -> dict[str, float]:
        return {lesson: sum(s) / len(s) for lesson, s in self.scores.items() if s}


class Scorer:
    """A stateless worker in an actor group."""

    def __init__(self, bias: float) -> None:
        self.bias = bias

    def score(self, text: str) -> float:
        return round(len(text) * 0.1 + self.bias, 3)


def rollout(worker: int, curriculum, steps: int) -> None:
    """One rollout worker: asks the shared curriculum for lessons and reports scores."""
    rng = random.Random(worker)
    for step in range(steps):
        lesson = curriculum.next_lesson(worker * 100 + step)
        curriculum.report.remote(lesson, rng.random())  # fire and forget: calls stay in order
    print(f"rollout worker {worker} finished {steps} steps")


def tokenize_shard(num_shards: int) -> None:
    """A gang-scheduled job: each replica processes its own shard."""
    info = fray.current_job()
    assert info is not None
    shard = range(info.replica_index, 1000, info.replica_count)
    print(f"replica {info.replica_index}/{info.replica_count}: {len(shard)} documents, sum={sum(shard)}")


def flaky() -> None:
    raise ValueError("shard 17 has a corrupt header")


def main(client: fray.Client | None = None, tokenize_replicas: int = 4) -> None:
    client = client or fray.current_client()
    print(f"backend: {client!r}\n")

    # 1. A shared actor, created by the driver and passed to jobs as an argument.
    curriculum = client.create_actor(
        Curriculum,
        ["addition", "algebra", "geometry"],
        name="curriculum",
        resources=ResourceConfig(cpu=0, preemptible=False),
    )

    # 2. Jobs: rollout workers plus a replicated tokenizer; wait for all of them at once.
    jobs = [
        client.submit(
            JobRequest(name=f"rollout-{i}", entrypoint=Entrypoint.from_callable(rollout, args=(i, curriculum, 20)))
        )
        for i in range(3)
    ]
    jobs.append(
        client.submit(
            JobRequest(
                name="tokenize",
                entrypoint=Entrypoint.from_callable(tokenize_shard, args=(tokenize_replicas,)),
                replicas=tokenize_replicas,
                # Half a core each: the gang of 4 fits the 2 cores of a small machine, which
                # `fray cluster up` divides among its workers.
                resources=ResourceConfig(cpu=0.5),
            )
        )
    )
    statuses = wait_all(jobs, timeout=120)
    print("\njobs:", ", ".join(f"{job.job_id}={status}" for job, status in zip(jobs, statuses, strict=True)))
    # A job's output is kept by every backend: job.logs() (the local backend also echoes it live, above).
    print(f"tokenize: job.logs() holds {len(jobs[-1].logs())} lines, one per replica")
    print("curriculum:", curriculum.summary())

    # 3. An actor group: members come up independently; spread work over the ready ones.
    group = client.create_actor_group(Scorer, 0.5, name="scorer", count=3)
    scorers = group.wait_ready(timeout=60)
    texts = ["a short one", "a somewhat longer text", "mid-sized", "x"]
    futures = [scorers[i % len(scorers)].score.remote(text) for i, text in enumerate(texts)]
    concurrent.futures.wait(futures, timeout=60)
    print("\nscores:", [f.result() for f in futures], "from", group.ready_count, "scorers")
    group.shutdown()
    print("scorer statuses after shutdown:", [str(s) for s in group.statuses()])

    # 4. Failures are loud and precise: the original exception, with its traceback.
    print("\na job that fails on purpose (every attempt raises), to show what a failure looks like:")
    bad = client.submit(JobRequest(name="flaky", entrypoint=Entrypoint.from_callable(flaky), max_retries_failure=1))
    try:
        bad.wait(timeout=60)
    except JobFailed as err:
        print(f"  {type(err).__name__}: {err.args[0]}")
        print(f"  cause: {err.cause!r}  (intended: the demo ends here)")


if __name__ == "__main__":
    from _extras import answer_help, cannot_run, capacity, require_pinned

    answer_help(__doc__)
    client = fray.current_client()
    # On a Fray cluster: fit the gang to it, or say at once why the demo cannot run there.
    cap = capacity(client)
    replicas = 4
    if cap is not None:
        require_pinned(cap, "the shared curriculum actor (preemptible=False)")
        if cap.largest < 1:
            cannot_run(f"the rollout jobs need a worker with 1 core; it has {cap.describe()}")
        replicas = min(4, cap.slots(0.5))
        if replicas < 4:
            print(f"(the cluster has room for {replicas} half-core replicas at once: the gang gets {replicas})")
    main(client, replicas)
