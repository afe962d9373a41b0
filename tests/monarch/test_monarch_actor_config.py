"""What the Monarch backend refuses of ActorConfig and fray.testing, by name."""

from __future__ import annotations

import pytest

from fray import ActorConfig, ConfigError
from fray.testing import kill_actor


class Plain:
    def ping(self) -> str:
        return "pong"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ActorConfig(max_restarts=1), "max_restarts=1"),
        (ActorConfig(max_restarts=1, max_task_retries=1), "max_task_retries=1"),
        (ActorConfig(lifetime="detached"), "lifetime='detached'"),
    ],
)
def test_unsupported_actor_config_is_refused_by_name(monarch_client, config, field):
    with pytest.raises(ConfigError, match=field):
        monarch_client.create_actor(Plain, name="refused", actor_config=config)
    with pytest.raises(ConfigError, match=field):
        monarch_client.create_actor_group(Plain, name="refused-group", count=2, actor_config=config)


def test_kill_actor_is_refused_with_the_reason(monarch_client):
    actor = monarch_client.create_actor(Plain, name="unkillable", actor_config=ActorConfig(max_concurrency=2))
    assert actor.ping() == "pong"
    with pytest.raises(ConfigError, match=r"Monarch 0\.7\.0"):
        kill_actor(actor)
    assert actor.ping() == "pong"
