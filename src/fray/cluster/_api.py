"""The controller's data-only API: each RPC method, its plain-data arguments and result.

:class:`ControllerAPI` is the handler a :class:`~fray.rpc.datarpc.DataServer` calls:
it decodes the arguments (:mod:`fray.cluster._codec`, which refuses malformed ones with
a :class:`~fray.errors.ProtocolError`), calls the :class:`ControllerService`, and
encodes the answer. Nothing here, or anywhere in the controller, unpickles anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fray.cluster import _codec as codec
from fray.errors import ProtocolError, StorageError

__all__ = ["ControllerAPI"]

_Method = Callable[..., Any]


def _opt_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"expected a string or nil, got {type(value).__name__}")
    return value


class ControllerAPI:
    """Dispatches ``(method, args, kwargs)`` of plain data to a :class:`ControllerService`."""

    def __init__(self, service: Any) -> None:  # a ControllerService (which composes this API)
        self._service = service
        s = service
        self._methods: dict[str, _Method] = {
            # workers
            "register_worker": lambda info, address, running, exited=(): codec.commands_data(
                s.register_worker(
                    codec.worker_info_from(info),
                    str(address),
                    [codec.key_from(k) for k in running],
                    [codec.exit_from(e) for e in exited],
                )
            ),
            "poll": lambda worker_id, epoch, wait=1.0: codec.commands_data(
                s.poll(str(worker_id), int(epoch), float(wait))
            ),
            "report": lambda worker_id, epoch, report: s.report(str(worker_id), int(epoch), codec.report_from(report)),
            # jobs
            "submit": lambda spec, user, parent_id=None, namespace=None: codec.view_data(
                s.submit(
                    codec.spec_from(spec), user=str(user), parent_id=_opt_str(parent_id), namespace=_opt_str(namespace)
                )
            ),
            "job": lambda job_id: codec.view_data(s.job(str(job_id))),
            "wait": lambda job_ids, timeout=10.0, any_finished=True: [
                codec.view_data(v)
                for v in s.wait([str(j) for j in job_ids], float(timeout), any_finished=bool(any_finished))
            ],
            "terminate": lambda job_id, reason="terminated": codec.view_data(s.terminate(str(job_id), str(reason))),
            "logs": lambda job_id, last=None, after_id=0: [
                [i, line] for i, line in s.logs(str(job_id), None if last is None else int(last), int(after_id))
            ],
            "list_jobs": lambda states=None: [
                codec.view_data(v) for v in s.list_jobs(None if states is None else [str(x) for x in states])
            ],
            "tasks": lambda job_id: [codec.task_data(t) for t in s.tasks(str(job_id))],
            "list_workers": lambda: [codec.worker_record_data(w) for w in s.list_workers()],
            "health": lambda: s.health(),
            # endpoints
            "register_endpoint": lambda namespace, name, url, task: s.register_endpoint(
                str(namespace), str(name), str(url), codec.key_from(task)
            ),
            "list_endpoints": lambda namespace=None: [
                codec.endpoint_data(e) for e in s.list_endpoints(_opt_str(namespace))
            ],
            "wait_actor": self._wait_actor,
            "resolve": lambda namespace, name: s.resolve(str(namespace), str(name)),
            "register": lambda namespace, name, url: s.register(str(namespace), str(name), str(url)),
            "unregister": lambda namespace, name, url: s.unregister(str(namespace), str(name), str(url)),
            "list": lambda namespace: s.list(str(namespace)),
        }

    def _wait_actor(self, namespace: Any, name: Any, job_id: Any, timeout: Any = 10.0) -> list[Any]:
        state, detail, view = self._service.wait_actor(str(namespace), str(name), str(job_id), float(timeout))
        return [state, detail, codec.view_data(view)]

    def __call__(self, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        function = self._methods.get(method)
        if function is None:
            raise ProtocolError(f"the controller has no method {method!r}")
        try:
            return codec.checked(f"arguments of {method}", lambda: function(*args, **kwargs))
        except StorageError as exc:
            self._service.storage_failed(exc)
            raise
