"""How an actor runs: :class:`ActorConfig`, and the check backends make of it.

``ActorConfig`` is a frozen value validated where it is written, passed as
``client.create_actor(..., actor_config=ActorConfig(...))`` (or to
``create_actor_group``). Every backend honours every field it can and refuses the
others with a :class:`~fray.errors.ConfigError` naming the field
(:func:`check_actor_config_supported`): a setting is never silently ignored.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields

from fray.errors import ConfigError
from fray.priority import check_band

__all__ = ["ACTOR_CONFIG_FIELDS", "LIFETIMES", "ActorConfig", "check_actor_config_supported"]

LIFETIMES = ("owned", "detached")
"""``owned``: the actor ends with the client that created it (its ``shutdown()`` or its
process's exit). ``detached``: it keeps running until it is terminated, ends itself, or
its cluster goes away."""


def _whole(name: str, value: object, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"ActorConfig({name}={value!r}) must be a whole number >= {minimum}; {hint}")
    if value < minimum:
        raise ConfigError(f"ActorConfig({name}={value!r}) must be >= {minimum}; {hint}")


@dataclass(frozen=True)
class ActorConfig:
    """How an actor serves calls and survives failures.

    * ``max_concurrency`` (default 1): how many calls run at once. Calls of plain
      methods run in up to that many threads; ``async def`` methods run on the actor's
      one event loop with up to that many in flight. With 1, calls run one at a time and
      the calls of one caller run in the order they were made.
    * ``max_restarts`` (default 0): how many times a dead actor process is started again,
      its constructor run anew. Calls in flight when it died fail with
      :class:`~fray.errors.ActorDiedError`; later calls reach the new instance. Once the
      restarts are used up, every call fails at once with ``ActorDiedError``. An actor whose
      constructor raises, that ended itself (``current_actor().exit()`` / ``fail()``) or
      that was terminated is never restarted.
    * ``max_task_retries`` (default 0): how many times a call that failed because the
      actor died is sent again to the restarted actor (so a retried method may run more
      than once: give it only to idempotent methods). Needs ``max_restarts >= 1``.
    * ``lifetime``: ``"owned"`` (default) ends the actor with the client that created it;
      ``"detached"`` keeps it running after that client shuts down or its script exits,
      until it is terminated (``fray job stop``) or ends itself.
    * ``priority`` (default 0): the actor's :class:`~fray.job.PriorityBand`, as a job's
      (1 production, 2 interactive, 3 batch; 0 inherits the creating job's band).

    As in marin, ``max_restarts=None`` and ``max_task_retries=None`` mean "the default"
    (0); ``max_restarts=None`` with ``max_task_retries=N`` allows N restarts, so the
    retried calls have an actor to reach.
    """

    max_concurrency: int = 1
    max_restarts: int = None  # type: ignore[assignment]  # None: 0, or max_task_retries; an int once built
    max_task_retries: int = 0
    priority: int = 0
    lifetime: str = "owned"

    def __post_init__(self) -> None:
        retries = 0 if self.max_task_retries is None else self.max_task_retries
        object.__setattr__(self, "max_task_retries", retries)
        if self.max_restarts is None:
            # A bad max_task_retries is named by its own check below, not as a bad max_restarts.
            restarts = retries if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0 else 0
            object.__setattr__(self, "max_restarts", restarts)
        check_band(self.priority, "ActorConfig")
        _whole("max_concurrency", self.max_concurrency, 1, "1 runs one call at a time")
        _whole("max_restarts", self.max_restarts, 0, "0 means a dead actor stays dead")
        _whole("max_task_retries", self.max_task_retries, 0, "0 means calls to a dead actor fail")
        if self.max_task_retries > 0 and self.max_restarts == 0:
            raise ConfigError(
                f"ActorConfig(max_task_retries={self.max_task_retries}) retries calls on a restarted actor, but "
                "max_restarts=0 never restarts it; set max_restarts >= 1 as well, or leave max_task_retries at 0"
            )
        if self.lifetime not in LIFETIMES:
            raise ConfigError(
                f"ActorConfig(lifetime={self.lifetime!r}) must be one of {', '.join(map(repr, LIFETIMES))}"
            )

    @property
    def detached(self) -> bool:
        """True for ``lifetime="detached"``."""
        return self.lifetime == "detached"


ACTOR_CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ActorConfig))
_DEFAULT = ActorConfig()


def check_actor_config(actor_config: object) -> ActorConfig:
    """``actor_config`` itself, or the default for None; ConfigError for anything else."""
    if actor_config is None:
        return _DEFAULT
    if not isinstance(actor_config, ActorConfig):
        raise ConfigError(
            f"create_actor(actor_config={actor_config!r}) must be a fray.ActorConfig, e.g. ActorConfig(max_concurrency=4)"
        )
    return actor_config


def check_actor_config_supported(backend: str, config: ActorConfig, supported: Collection[str]) -> None:
    """Refuse, naming it, every field of ``config`` set away from its default that ``backend`` cannot honour.

    ``supported`` names the fields the backend honours; a field left at its default is
    always accepted (the default is what every backend does anyway).
    """
    unknown = set(supported) - set(ACTOR_CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"check_actor_config_supported: no ActorConfig fields {sorted(unknown)}")
    refused = [
        name
        for name in ACTOR_CONFIG_FIELDS
        if name not in supported and getattr(config, name) != getattr(_DEFAULT, name)
    ]
    if refused:
        settings = ", ".join(f"{name}={getattr(config, name)!r}" for name in refused)
        honoured = ", ".join(sorted(supported)) or "none"
        raise ConfigError(
            f"the {backend} backend cannot honour ActorConfig({settings}); leave "
            f"{'it' if len(refused) == 1 else 'them'} at the default or use another backend "
            f"(fields it honours: {honoured})"
        )
