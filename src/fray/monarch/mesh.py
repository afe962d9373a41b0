"""Reaching Monarch's own mesh API from a Fray actor group (broadcast, slicing, mesh-wide calls).

A group created by :class:`~fray.monarch.MonarchClient` is one Monarch process mesh
with one :class:`~fray.monarch.host.FrayHost` actor per member, rank ``i`` hosting
member ``i``. :func:`actor_mesh` returns that Monarch ``ActorMesh``; its one endpoint
is ``invoke(method, args, kwargs)``, which replies with tagged tuples that
:func:`broadcast` (or :func:`fray.monarch.actors.unwrap_reply`) turns into values or
Fray errors::

    group = client.create_actor_group(Worker, name="w", count=8)
    mesh = fray.monarch.actor_mesh(group)           # monarch.actor.ActorMesh, 8 ranks
    replies = mesh.invoke.call("step", (batch,), {}).get()   # Monarch's own broadcast
    losses = fray.monarch.broadcast(group, "step", batch)     # the same, unwrapped, in rank order
"""

from __future__ import annotations

from typing import Any

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

from fray.actor import ActorGroup
from fray.errors import ActorDiedError, ConfigError
from fray.monarch import supervision
from fray.monarch.actors import ActorRecord, HostMesh, unwrap_reply

__all__ = ["actor_mesh", "broadcast"]


def _host_mesh(group: ActorGroup) -> HostMesh:
    records = [r for r in (getattr(job, "_tracked", None) for job in group.jobs) if isinstance(r, ActorRecord)]
    if not records or len(records) != len(group.jobs) or len({id(r.mesh) for r in records}) != 1:
        raise ConfigError(
            "actor_mesh() needs an actor group created by a MonarchClient in this process (its mesh lives "
            "here); the Monarch ActorMesh it returns can then be passed anywhere on this host"
        )
    return records[0].mesh


def actor_mesh(group: ActorGroup) -> Any:
    """The Monarch ``ActorMesh`` hosting ``group``'s members (rank ``i`` = member ``i``), for mesh-wide calls."""
    return _host_mesh(group).hosts


def broadcast(group: ActorGroup, method: str, *args: Any, **kwargs: Any) -> list[Any]:
    """Call ``method(*args, **kwargs)`` on every member with one Monarch mesh call; the results in member order.

    Raises the first member's error (a :class:`~fray.errors.RemoteError` of the user's
    class, or :class:`~fray.errors.ActorDiedError` if a member is dead).
    """
    mesh = _host_mesh(group)
    dead = [m for m in mesh.members if m.dead]
    if dead:
        raise dead[0].death_error()
    try:
        replies = mesh.hosts.invoke.call(method, args, kwargs).get()
    except SupervisionError as exc:
        for member in mesh.members:
            member.probe(supervision.reason_of(exc))
        raise ActorDiedError(
            f"actor group: a member died during broadcast of {method!r}: {supervision.reason_of(exc)}"
        ) from exc
    return [
        unwrap_reply(member.name, method, reply, member)
        for member, reply in zip(mesh.members, replies.values(), strict=True)
    ]
