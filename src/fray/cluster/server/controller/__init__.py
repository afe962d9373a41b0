"""The cluster controller: durable state, scheduling, and the API workers and clients call.

:class:`ControllerService` (:mod:`fray.cluster.server.controller._service`) is the controller's state
machine and API; :class:`Controller` (:mod:`fray.cluster.server.controller._controller`) serves it, the
operator API and the durable queues behind one port. The other modules of the package are its parts.
"""

from fray.cluster.server.controller._controller import Controller
from fray.cluster.server.controller._service import CONTROLLER_ACTOR, DEFAULT_JOIN_TTL, ControllerService

__all__ = ["CONTROLLER_ACTOR", "DEFAULT_JOIN_TTL", "Controller", "ControllerService"]
