"""Fray on PyTorch Monarch: ``FRAY_CLIENT_SPEC=monarch`` (or ``monarch?procs=N``).

Needs ``torchmonarch`` (``pip install "fray[monarch]"``); see ``docs/monarch.md``.
"""

from __future__ import annotations

try:
    import monarch.actor  # noqa: F401 - fail here, with the fix, rather than deep inside
except ImportError as _exc:  # pragma: no cover - exercised only where torchmonarch is missing
    raise ImportError(
        f"the Monarch backend (and any Monarch actor handle) needs torchmonarch, which cannot be imported here "
        f'({_exc}): pip install "fray[monarch]"'
    ) from _exc

from fray.monarch.actors import MonarchActorHandle, MonarchActorMethod
from fray.monarch.client import MonarchClient
from fray.monarch.jobs import MonarchJobHandle
from fray.monarch.mesh import actor_mesh, broadcast

__all__ = [
    "MonarchActorHandle",
    "MonarchActorMethod",
    "MonarchClient",
    "MonarchJobHandle",
    "actor_mesh",
    "broadcast",
]
