"""Fray on Iris, the marin project's cluster manager (``pip install "fray[iris]"``, Python >= 3.12).

``FRAY_CLIENT_SPEC=iris://HOST:PORT[?workspace=PATH]`` (or :class:`IrisClient` directly);
inside an Iris task, ``fray.current_client()`` finds the cluster by itself. See
``docs/iris.md`` for how each Fray field maps onto Iris.
"""

from fray.iris.actor import IrisActorHandle
from fray.iris.client import IrisClient
from fray.iris.job import IrisJobHandle

__all__ = ["IrisActorHandle", "IrisClient", "IrisJobHandle"]
