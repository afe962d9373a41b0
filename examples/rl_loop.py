"""An RL loop on Fray: a curriculum and a weight coordinator shared by a trainer and rollout workers.

Seed 003, "RL Migration": the controller (here, :func:`run`) creates the shared actors --
a curriculum that hands out lessons and collects rewards, and a weight coordinator through
which the trainer publishes new weight versions -- on hosts that are never preempted
(``ResourceConfig(preemptible=False)``), and passes their handles to the jobs it submits as
arguments: one trainer and N rollout workers. It then waits for all of them with
``wait_all``, which fails fast: the first job that fails ends the run with that job's own
exception.

The loop runs in lock-step so its outcome is exact: rollout step ``s`` uses weight version
``s // steps_per_version``, and the trainer publishes version ``v`` once every rollout has
reported every step before ``v * steps_per_version`` (its weights are computed from those
rewards). A rollout resumes from the steps the curriculum already holds, so one that is
preempted and retried (``max_retries_preemption``) reports each step exactly once, and the
statistics add up exactly as :func:`expected_stats` computes them without Fray.

Run it on the local backend (no setup), or on any backend with ``FRAY_CLIENT_SPEC``:

    python examples/rl_loop.py
    FRAY_CLIENT_SPEC=ray python examples/rl_loop.py
    FRAY_CLIENT_SPEC=fray://127.0.0.1:PORT FRAY_TOKEN=... python examples/rl_loop.py
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import fray
from fray import ActorConfig, Entrypoint, JobRequest, ResourceConfig, current_job, wait_all
from fray.testing import preempt

LESSONS = ("add", "sort", "reverse", "count")
#: How long an actor call waits for the rest of the loop before it gives up (a bug, not a slow machine).
WAIT_SECONDS = 300.0


def lesson_for(rollout: int, step: int) -> str:
    """The lesson the curriculum hands rollout ``rollout`` at ``step``."""
    return LESSONS[(rollout * 3 + step) % len(LESSONS)]


def reward_for(lesson: str, weights: tuple[int, int]) -> int:
    """What a rollout scores on ``lesson`` with ``weights`` (better weights, higher reward)."""
    return (LESSONS.index(lesson) + 1) * (1 + weights[0]) + weights[1] % 3


def weights_after(version: int, total_reward: int) -> tuple[int, int]:
    """The weights the trainer publishes as ``version``, trained on rewards summing to ``total_reward``."""
    return (version, total_reward % 97)


class Curriculum:
    """Hands out lessons and records each rollout step's reward once (a retried step overwrites itself)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._samples: dict[tuple[int, int], tuple[str, int, int]] = {}  # (rollout, step) -> (lesson, reward, version)
        self._attempts: dict[int, int] = {}

    def start(self, rollout: int, attempt: int) -> int:
        """A rollout's attempt begins: the step it resumes from (every step before it is recorded)."""
        with self._cond:
            self._attempts[rollout] = max(self._attempts.get(rollout, 0), attempt + 1)
            step = 0
            while (rollout, step) in self._samples:
                step += 1
            return step

    def sample_lesson(self, rollout: int, step: int) -> str:
        return lesson_for(rollout, step)

    def report(self, rollout: int, step: int, lesson: str, reward: int, version: int) -> None:
        with self._cond:
            self._samples[(rollout, step)] = (lesson, reward, version)
            self._cond.notify_all()

    def wait_samples(self, count: int, timeout: float = WAIT_SECONDS) -> int:
        """Block until ``count`` steps are recorded; their total reward."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._samples) >= count, timeout):
                raise TimeoutError(f"curriculum: {len(self._samples)} of {count} samples after {timeout}s")
            return sum(reward for _, reward, _ in self._samples.values())

    def wait_step(self, rollout: int, step: int, timeout: float = WAIT_SECONDS) -> None:
        """Block until ``rollout`` recorded ``step``."""
        with self._cond:
            if not self._cond.wait_for(lambda: (rollout, step) in self._samples, timeout):
                raise TimeoutError(f"curriculum: rollout {rollout} did not report step {step} within {timeout}s")

    def stats(self) -> tuple[tuple[str, int, int], ...]:
        """Per lesson: (lesson, samples, total reward)."""
        with self._cond:
            samples = list(self._samples.values())
        return tuple(
            (lesson, sum(1 for s in samples if s[0] == lesson), sum(s[1] for s in samples if s[0] == lesson))
            for lesson in LESSONS
        )

    def versions_used(self) -> tuple[int, ...]:
        with self._cond:
            return tuple(sorted({version for _, _, version in self._samples.values()}))

    def attempts(self, rollouts: int) -> tuple[int, ...]:
        with self._cond:
            return tuple(self._attempts.get(r, 0) for r in range(rollouts))


class WeightCoordinator:
    """Holds the latest weights; rollouts wait for the version they need, the trainer publishes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._weights = weights_after(0, 0)
        self._hold: int | None = None

    def publish(self, version: int, weights: tuple[int, int]) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._hold is None or version < self._hold, WAIT_SECONDS):
                raise TimeoutError(f"weight coordinator: version {version} held for more than {WAIT_SECONDS}s")
            self._version, self._weights = version, weights
            self._cond.notify_all()

    def weights_at_least(self, version: int, timeout: float = WAIT_SECONDS) -> tuple[int, tuple[int, int]]:
        """Block until ``version`` (or a later one) is published; the latest version and its weights."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._version >= version, timeout):
                raise TimeoutError(f"weight coordinator: still at version {self._version} after {timeout}s")
            return self._version, self._weights

    def hold_from(self, version: int | None) -> None:
        """Keep versions from ``version`` on unpublished until called with None (to inject a fault at a known step)."""
        with self._cond:
            self._hold = version
            self._cond.notify_all()


def train(curriculum: Curriculum, coordinator: WeightCoordinator, rollouts: int, steps: int, per_version: int) -> None:
    """The trainer job: publish weight version ``v`` once every rollout reported its steps before ``v * per_version``."""
    versions = steps // per_version
    for version in range(1, versions + 1):
        total = curriculum.wait_samples(rollouts * version * per_version)
        coordinator.publish(version, weights_after(version, total))
        print(f"trainer: published weights version {version}")


def rollout(
    curriculum: Curriculum,
    coordinator: WeightCoordinator,
    index: int,
    steps: int,
    per_version: int,
    fail_at_step: int | None = None,
) -> None:
    """A rollout job: sample a lesson, act with the current weights, report the reward; resume where it left off."""
    info = current_job()
    attempt = info.attempt if info is not None else 0
    first = curriculum.start(index, attempt)
    for step in range(first, steps):
        version, weights = coordinator.weights_at_least(step // per_version)
        lesson = curriculum.sample_lesson(index, step)
        if step == fail_at_step:
            raise ValueError(f"rollout {index} failed at step {step} on lesson {lesson!r}")
        curriculum.report(index, step, lesson, reward_for(lesson, weights), version)
    print(f"rollout {index}: steps {first}..{steps - 1} done (attempt {attempt})")


@dataclass(frozen=True)
class RLResult:
    """What a run did: per-lesson statistics, samples, weight versions, and each rollout's attempts."""

    lesson_stats: tuple[tuple[str, int, int], ...]  #: (lesson, samples, total reward) per lesson
    samples: int
    final_version: int
    versions_used: tuple[int, ...]  #: the weight versions rollouts acted with
    rollout_attempts: tuple[int, ...]  #: attempts each rollout made (2 for one preempted once)


def expected_stats(rollouts: int, steps: int, per_version: int) -> tuple[tuple[str, int, int], ...]:
    """The statistics a run must produce, computed without Fray (the same lock-step, sequentially)."""
    samples: list[tuple[str, int]] = []
    weights = weights_after(0, 0)
    for version in range(steps // per_version):
        if version > 0:
            weights = weights_after(version, sum(reward for _, reward in samples))
        for index in range(rollouts):
            for step in range(version * per_version, (version + 1) * per_version):
                lesson = lesson_for(index, step)
                samples.append((lesson, reward_for(lesson, weights)))
    return tuple(
        (lesson, sum(1 for s in samples if s[0] == lesson), sum(s[1] for s in samples if s[0] == lesson))
        for lesson in LESSONS
    )


def run(
    client: fray.Client,
    *,
    rollouts: int = 3,
    steps: int = 12,
    steps_per_version: int = 3,
    prefix: str = "rl",
    fail_rollout: int | None = None,
    fail_at_step: int = 4,
    preempt_rollout: int | None = None,
    on_event: Callable[[str], None] = print,
) -> RLResult:
    """Run the loop on ``client``; the actors live as long as the client.

    ``fail_rollout``: that rollout raises ``ValueError`` at ``fail_at_step``, and the run
    fails fast with it (``JobFailed`` that is also a ``ValueError``); the other jobs are
    stopped. ``preempt_rollout``: that rollout is preempted (``fray.testing.preempt``)
    while it waits for weight version 1, retried within its preemption budget, resumes,
    and the run completes with the same statistics.
    """
    if steps % steps_per_version:
        raise ValueError(f"steps={steps} must be a multiple of steps_per_version={steps_per_version}")
    pinned = ResourceConfig(cpu=0, preemptible=False)  # shared state lives on hosts that are never preempted
    waiting = ActorConfig(max_concurrency=2 * rollouts + 4)  # every job may block in a call, retries too
    curriculum = client.create_actor(Curriculum, name=f"{prefix}-curriculum", resources=pinned, actor_config=waiting)
    coordinator = client.create_actor(
        WeightCoordinator, name=f"{prefix}-weights", resources=pinned, actor_config=waiting
    )
    if preempt_rollout is not None:
        coordinator.hold_from(1)  # every rollout stops before step `steps_per_version` until released
    work = ResourceConfig(cpu=0.5)
    trainer = client.submit(
        JobRequest(
            name=f"{prefix}-trainer",
            entrypoint=Entrypoint.from_callable(
                train, args=(curriculum, coordinator, rollouts, steps, steps_per_version)
            ),
            resources=work,
        )
    )
    jobs = [trainer]
    try:
        for index in range(rollouts):
            fail = fail_at_step if index == fail_rollout else None
            jobs.append(
                client.submit(
                    JobRequest(
                        name=f"{prefix}-rollout-{index}",
                        entrypoint=Entrypoint.from_callable(
                            rollout, args=(curriculum, coordinator, index, steps, steps_per_version, fail)
                        ),
                        resources=work,
                        max_retries_failure=0,
                        max_retries_preemption=2,
                    )
                )
            )
        if preempt_rollout is not None:
            # The rollout has reported every step before version 1 and is now blocked waiting for it.
            curriculum.wait_step(preempt_rollout, steps_per_version - 1)
            preempt(jobs[1 + preempt_rollout])
            on_event(f"preempted rollout {preempt_rollout} while it waited for weights version 1")
            coordinator.hold_from(None)
        wait_all(jobs, timeout=WAIT_SECONDS)
    finally:
        for job in jobs:  # fail-fast: whatever still runs after a failure is stopped
            job.terminate()
    stats = curriculum.stats()
    result = RLResult(
        lesson_stats=stats,
        samples=sum(count for _, count, _ in stats),
        final_version=coordinator.weights_at_least(0)[0],
        versions_used=curriculum.versions_used(),
        rollout_attempts=curriculum.attempts(rollouts),
    )
    on_event(
        f"{rollouts} rollouts x {steps} steps: {result.samples} samples, weights up to version "
        f"{result.final_version}, rollout attempts {list(result.rollout_attempts)}"
    )
    for lesson, count, total in stats:
        on_event(f"  lesson {lesson!r}: {count} samples, total reward {total}")
    return result


if __name__ == "__main__":
    from _extras import answer_help, cannot_run, capacity, require_pinned

    answer_help(__doc__)
    client = fray.current_client()
    # The loop is lock-step: the trainer and every rollout (half a core each) must run at once.
    cap = capacity(client)
    rollouts = 3
    if cap is not None:
        require_pinned(cap, "the curriculum and the weight coordinator (preemptible=False)")
        rollouts = min(3, cap.slots(0.5) - 1)
        if rollouts < 1:
            cannot_run(f"the trainer and a rollout need half a core each, at once; it has {cap.describe()}")
        if rollouts < 3:
            print(f"(the cluster runs {rollouts + 1} half-core jobs at once: {rollouts} rollouts and the trainer)")
    result = run(client, rollouts=rollouts)
    assert result.lesson_stats == expected_stats(rollouts, 12, 3), "the statistics do not add up"
    print("statistics add up exactly")
