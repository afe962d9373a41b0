"""The operator API on the controller's data-only RPC: ``ops.*`` methods, their arguments, and who may call them.

The controller serves :class:`~fray.cluster.server.ops.OpsService` through the same
:class:`~fray.cluster.rpc.datarpc.DataServer` as its own API (:mod:`fray.cluster.server.controller._api` routes
every method named ``ops.NAME`` here), so it is reached with the same credentials and
nothing is unpickled. Arguments and results are plain data; a workspace blob is an
opaque byte string.

Who sees what (also in ``docs/security.md``):

* the administrator (the cluster token) sees every job and may make dashboard log-in links;
* a user (or a job, which acts for its user) sees only that user's jobs: ``jobs``,
  ``find_jobs`` and ``status`` leave the others out and ``job_detail`` of another user's
  job is :class:`~fray.errors.NotFound` (so is its ``timeline``, which otherwise holds only the
  user's jobs); workers, capacity (also over time, ``utilisation``,
  without the cluster-wide job counts) and controller health are visible to every user. Users and jobs may store workspace blobs;
* a worker may only fetch workspace blobs (to run the jobs placed on it);
* on a cluster with a VM provider (``docs/autoscaling.md``) every user sees the VMs and the
  autoscaler's status, as they see the workers; only the administrator injects faults or
  deletes every VM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fray.cluster.server.controller._api import Caller
from fray.cluster.server.ops import OpsService
from fray.errors import NotFound, PermissionDenied, ProtocolError

__all__ = ["OPS_PREFIX", "OpsAPI"]

#: The prefix of the operator API's method names on the controller's RPC.
OPS_PREFIX = "ops."


def _str_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError("expected a list of strings or nil")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _opt_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"expected a string or nil, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"expected a whole number, got {type(value).__name__}")
    return value


class OpsAPI:
    """Dispatches ``ops.*`` calls of plain data to an :class:`~fray.cluster.server.ops.OpsService`, per caller."""

    def __init__(self, ops: OpsService) -> None:
        self._ops = ops
        self._methods: dict[str, Callable[..., Any]] = {
            "jobs": self._jobs,
            "find_jobs": self._find_jobs,
            "job_detail": self._job_detail,
            "status": self._status,
            "timeline": self._timeline,
            "health": lambda caller: ops.health(),
            # Everybody sees capacity over time, as the workers; the cluster-wide job counts, only the administrator.
            "utilisation": lambda caller, since=0.0: ops.utilisation(_float(since), jobs=caller.admin),
            "has_blob": self._has_blob,
            "put_blob": self._put_blob,
            "get_blob": self._get_blob,
            "dashboard_login": self._dashboard_login,
            # Autoscaling: everybody sees the VMs (as the workers); only the administrator changes them.
            "vms": lambda caller, include_deleted=False: ops.vms(bool(include_deleted)),
            "autoscaler_status": lambda caller: ops.autoscaler_status(),
            "vm_preempt": lambda caller, vm_id: ops.vm_preempt(str(self._admin(caller, vm_id))),
            "vm_quota": lambda caller, group, exhausted: ops.vm_quota(str(self._admin(caller, group)), bool(exhausted)),
            "vm_fail_boot": lambda caller, group, count=1: ops.vm_fail_boot(
                str(self._admin(caller, group)), _int(count)
            ),
            "delete_all_vms": lambda caller: ops.delete_all_vms() if self._admin(caller, True) else 0,
        }

    def __call__(self, caller: Caller, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        function = self._methods.get(method)
        if function is None:
            raise ProtocolError(f"the controller's operator API has no method {method!r}")
        if caller.worker and method != "get_blob":
            raise PermissionDenied(f"a worker credential may not call ops.{method}")
        return function(caller, *args, **kwargs)

    @staticmethod
    def _only(caller: Caller) -> str | None:
        """Whose jobs the caller may see: None for everybody's (the administrator)."""
        if caller.admin:
            return None
        if caller.user is None:
            raise PermissionDenied("this credential may not read the cluster's jobs")
        return caller.user

    @staticmethod
    def _admin(caller: Caller, value: Any) -> Any:
        """``value``, if the caller is the administrator (the cluster token); else PermissionDenied."""
        if not caller.admin:
            raise PermissionDenied("changing the cluster's VMs needs the cluster token")
        return value

    def _jobs(
        self, caller: Caller, states: Any = None, limit: Any = 50, namespace: Any = None, name: Any = None
    ) -> list[dict[str, Any]]:
        return self._ops.jobs(
            _str_list(states), _int(limit), _opt_str(namespace), _opt_str(name), user=self._only(caller)
        )

    def _find_jobs(self, caller: Caller, ref: Any) -> list[str]:
        return self._ops.find_jobs(str(ref), user=self._only(caller))

    def _job_detail(self, caller: Caller, job_id: Any) -> dict[str, Any]:
        only = self._only(caller)
        detail = self._ops.job_detail(str(job_id))
        if only is not None and detail["user"] != only:
            raise NotFound(f"no job {str(job_id)!r} of user {only!r}")
        return detail

    def _timeline(self, caller: Caller, job_id: Any = None, since: Any = None) -> dict[str, Any]:
        only = self._only(caller)
        if job_id is not None and only is not None:
            self._job_detail(caller, job_id)  # NotFound for another user's job, as its detail is
        return self._ops.timeline(_opt_str(job_id), None if since is None else _float(since), user=only)

    def _status(self, caller: Caller) -> dict[str, Any]:
        return self._ops.status(user=self._only(caller))

    def _has_blob(self, caller: Caller, digest: Any) -> bool:
        self._only(caller)
        return self._ops.has_blob(str(digest))

    def _put_blob(self, caller: Caller, digest: Any, data: Any) -> bool:
        self._only(caller)
        if not isinstance(data, bytes):
            raise ProtocolError(f"a blob is a byte string, got {type(data).__name__}")
        return self._ops.put_blob(str(digest), data)

    def _get_blob(self, caller: Caller, digest: Any) -> bytes:
        if not (caller.admin or caller.worker):
            raise PermissionDenied("only workers (and the cluster's administrator) fetch workspace blobs")
        return self._ops.get_blob(str(digest))

    def _dashboard_login(self, caller: Caller) -> str:
        if not caller.admin:
            raise PermissionDenied("a dashboard log-in link gives the administrator's view: it needs the cluster token")
        return self._ops.dashboard_login()
