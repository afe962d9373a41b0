"""The controller's data-only API: each RPC method, its plain-data arguments and result.

:class:`ControllerAPI` is the handler a :class:`~fray.cluster.rpc.datarpc.DataServer` calls:
it decodes the arguments (:mod:`fray.cluster.protocol._codec`, which refuses malformed ones with
a :class:`~fray.errors.ProtocolError`), calls the :class:`ControllerService`, and
encodes the answer. Nothing here, or anywhere in the controller, unpickles anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol.credentials import ADMIN, WORKER, Issued, issued_id
from fray.errors import AuthenticationError, PermissionDenied, ProtocolError, StorageError

__all__ = ["ControllerAPI"]

_Method = Callable[..., Any]
#: Serves the ``ops.*`` methods: ``(caller, method without the prefix, args, kwargs)`` (see :mod:`._ops_api`).
OpsHandler = Callable[["Caller", str, list[Any], dict[str, Any]], Any]
_OPS_PREFIX = "ops."


def _opt_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"expected a string or nil, got {type(value).__name__}")
    return value


# Only workers (and the administrator) drive tasks.
_WORKER_METHODS = frozenset({"register_worker", "poll", "report", "leave", "stacks_answer"})
# What a worker credential may call: its own protocol and nothing that changes jobs.
_WORKER_MAY = _WORKER_METHODS | {"health", "job", "tasks", "list_workers"}
# The administrator's alone: issuing and revoking credentials.
_ADMIN_METHODS = frozenset({"create_token", "list_credentials", "revoke_credential", "revoke_worker"})


def _issued_data(record: Issued, now: float) -> dict[str, Any]:
    return {
        "id": record.credential_id,
        "subject": record.subject,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "revoked_at": record.revoked_at,
        "via": record.via,
        "state": record.state(now),
    }


class Caller:
    """Who is calling, from the principal their connection proved (see :mod:`fray.cluster.protocol.credentials`)."""

    def __init__(self, principal: str, service: Any) -> None:
        if not service.principal_valid(principal):
            # Checked on every call, so a revoked (or expired) credential stops working at once, even on a
            # connection it opened before; the refusal says which.
            state = service.credential_state(principal)
            why = {"revoked": "was revoked", "expired": "has expired"}.get(state, "is not known to this controller")
            raise AuthenticationError(f"the credential {principal!r} {why}")
        self.principal = principal
        self.admin = principal == ADMIN
        issued = issued_id(principal) is not None
        kind, _, name = principal.partition(":")
        if issued:
            name = name.rpartition("#")[0]  # WORKER#ID or NAME#ID: the credential's own id is not the name
        #: A join token: it may only exchange itself for a worker's credential.
        self.joining = issued and kind == "join"
        #: The one worker an issued worker credential speaks for (None: the shared worker credential, or no worker).
        self.worker_id = name if issued and kind == "worker" else None
        self.worker = principal == WORKER or self.worker_id is not None
        self.job_id = name if kind == "job" else None
        if kind == "user":
            self.user: str | None = name
        elif self.job_id is not None:
            self.user = service.job(self.job_id).user  # a job acts for its user
        else:
            self.user = None

    def may_act_for(self, user: str) -> bool:
        return self.admin or (self.user is not None and self.user == user)


class ControllerAPI:
    """Dispatches ``(principal, method, args, kwargs)`` of plain data to a :class:`ControllerService`.

    It also decides what each principal may do: workers drive tasks and nothing else;
    users and jobs submit and stop their own user's jobs (a job only submits its own
    children) in namespaces that are theirs; the administrator (the cluster token) may do
    everything, including acting for a named user. A user sees the output and the listing
    of its own jobs only. Methods named ``ops.NAME`` go to ``ops``, the operator API.
    """

    def __init__(self, service: Any, ops: OpsHandler | None = None) -> None:  # service: a ControllerService
        self._service = service
        self._ops = ops
        s = service
        self._methods: dict[str, _Method] = {
            # jobs (submitting and driving tasks need the caller: see _personal)
            "job": lambda job_id: codec.view_data(s.job(str(job_id))),
            "wait": lambda job_ids, timeout=10.0, any_finished=True: [
                codec.view_data(v)
                for v in s.wait([str(j) for j in job_ids], float(timeout), any_finished=bool(any_finished))
            ],
            "wait_status": lambda job_ids, timeout=10.0: [
                [state, settled] for state, settled in s.wait_status([str(j) for j in job_ids], float(timeout))
            ],
            "tasks": lambda job_id: [codec.task_data(t) for t in s.tasks(str(job_id))],
            "list_workers": lambda: [codec.worker_record_data(w) for w in s.list_workers()],
            "health": lambda: s.health(),
            # endpoints
            "list_endpoints": lambda namespace=None: [
                codec.endpoint_data(e) for e in s.list_endpoints(_opt_str(namespace))
            ],
            "wait_actor": self._wait_actor,
            "resolve": lambda namespace, name: s.resolve(str(namespace), str(name)),
            "register": lambda namespace, name, url: s.register(str(namespace), str(name), str(url)),
            "unregister": lambda namespace, name, url: s.unregister(str(namespace), str(name), str(url)),
            "list": lambda namespace: s.list(str(namespace)),
        }
        self._personal: dict[str, _Method] = {
            "submit": self._submit,
            "submit_many": self._submit_many,
            "terminate": self._terminate,
            "preempt": self._preempt,
            "lend_cpu": self._lend_cpu,
            "register_endpoint": self._register_endpoint,
            "namespace_token": self._namespace_token,
            "logs": self._logs,
            "job_stacks": self._job_stacks,
            "stacks_answer": self._stacks_answer,
            "list_jobs": self._list_jobs,
            "join": self._join,
            "register_worker": self._register_worker,
            "poll": self._poll,
            "report": self._report,
            "leave": self._leave,
        }

    # -- workers: an issued worker credential speaks for its own worker only ------------------------

    def _own_worker(self, caller: Caller, worker_id: Any) -> str:
        worker_id = str(worker_id)
        if caller.worker_id is not None and caller.worker_id != worker_id:
            raise PermissionDenied(f"the credential of worker {caller.worker_id!r} may not act as worker {worker_id!r}")
        return worker_id

    def _register_worker(self, caller: Caller, info: Any, address: Any, running: Any, exited: Any = ()) -> Any:
        worker_info = codec.worker_info_from(info)
        self._own_worker(caller, worker_info.worker_id)
        commands = self._service.register_worker(
            worker_info,
            str(address),
            [codec.key_from(k) for k in running],
            [codec.exit_from(e) for e in exited],
            principal=caller.principal,
        )
        return codec.commands_data(commands)

    def _poll(self, caller: Caller, worker_id: Any, epoch: Any, wait: Any = 1.0) -> Any:
        return codec.commands_data(self._service.poll(self._own_worker(caller, worker_id), int(epoch), float(wait)))

    def _report(self, caller: Caller, worker_id: Any, epoch: Any, report: Any) -> Any:
        return self._service.report(self._own_worker(caller, worker_id), int(epoch), codec.report_from(report))

    def _leave(self, caller: Caller, worker_id: Any, reason: Any, exited: Any = ()) -> Any:
        exits = [codec.exit_from(e) for e in exited]
        return codec.worker_record_data(
            self._service.stop_worker(self._own_worker(caller, worker_id), str(reason), exits)
        )

    def _join(self, caller: Caller, worker_id: Any) -> str:
        if not caller.joining:
            raise PermissionDenied("join needs a join token (fray token create --role worker)")
        return str(self._service.join(caller.principal, str(worker_id)))

    # -- credentials: the administrator's -------------------------------------------------------------

    def _admin(self, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        s = self._service

        def create_token(role: Any, ttl: Any = None) -> dict[str, Any]:
            record, line = s.create_token(str(role), None if ttl is None else float(ttl))
            return {**_issued_data(record, record.created_at), "line": line}

        def revoke_worker(worker_id: Any) -> dict[str, Any]:
            return codec.worker_record_data(s.revoke_worker(str(worker_id)))

        now = time.time()
        methods: dict[str, _Method] = {
            "create_token": create_token,
            "list_credentials": lambda: [_issued_data(r, now) for r in s.list_credentials()],
            "revoke_credential": lambda credential_id: bool(s.revoke_credential(str(credential_id))),
            "revoke_worker": revoke_worker,
        }
        return methods[method](*args, **kwargs)

    # -- methods that depend on who calls ----------------------------------------------------------

    def _submit(
        self, caller: Caller, spec: Any, user: Any, parent_id: Any = None, namespace: Any = None
    ) -> dict[str, Any]:
        return self._submit_many(caller, [spec], user, parent_id, namespace)[0]

    def _may_submit(
        self, caller: Caller, user: Any, parent_id: Any, namespace: Any
    ) -> tuple[str, str | None, str | None]:
        """Who the jobs belong to, their parent and namespace; PermissionDenied if the caller may not submit them."""
        parent, ns = _opt_str(parent_id), _opt_str(namespace)
        if caller.admin:
            owner = str(user)
        elif caller.user is None:
            raise PermissionDenied("a worker credential cannot submit jobs")
        else:
            owner = caller.user  # identified by the credential, whatever the request says
        if caller.job_id is not None and parent != caller.job_id:
            raise PermissionDenied(
                f"job {caller.job_id!r} may only submit its own children (parent_id={parent!r} was given)"
            )
        if ns is not None and not caller.admin:
            holder = self._service.namespace_owner(ns)
            if holder is not None and holder != owner:
                raise PermissionDenied(f"namespace {ns!r} belongs to user {holder!r}; pick another namespace")
        return owner, parent, ns

    def _submit_many(
        self, caller: Caller, specs: Any, user: Any, parent_id: Any = None, namespace: Any = None
    ) -> list[dict[str, Any]]:
        owner, parent, ns = self._may_submit(caller, user, parent_id, namespace)
        specs = list(specs)
        views = self._service.submit_many(
            [codec.decode_spec(s) for s in specs], user=owner, parent_id=parent, namespace=ns, encoded=specs
        )
        return [codec.view_data(v) for v in views]

    def _terminate(self, caller: Caller, job_id: Any, reason: Any = "terminated") -> dict[str, Any]:
        job = self._service.job(str(job_id))
        if not caller.may_act_for(job.user):
            raise PermissionDenied(
                f"job {job.job_id!r} belongs to user {job.user!r}; only they or the cluster's administrator may stop it"
            )
        return codec.view_data(self._service.terminate(str(job_id), str(reason)))

    def _preempt(self, caller: Caller, job_id: Any, replica: Any = None) -> dict[str, Any]:
        # Fault injection for tests (fray.testing.preempt): allowed to whoever may stop the job.
        job = self._service.job(str(job_id))
        if not caller.may_act_for(job.user):
            raise PermissionDenied(
                f"job {job.job_id!r} belongs to user {job.user!r}; only they or the cluster's administrator may "
                "preempt it"
            )
        if replica is not None and (isinstance(replica, bool) or not isinstance(replica, int)):
            raise ProtocolError(f"preempt: replica must be a whole number or nil, got {type(replica).__name__}")
        return codec.view_data(self._service.preempt(job.job_id, replica))

    def _lend_cpu(self, caller: Caller, key: Any, lent: Any) -> bool:
        # A task lends its own CPU: only its job's credential (or its user's, or the administrator) may.
        task = codec.key_from(key)
        job = self._service.job(task.job_id)
        if caller.job_id != task.job_id and not caller.may_act_for(job.user):
            raise PermissionDenied(f"only job {task.job_id!r} itself may lend its tasks' CPU")
        return bool(self._service.lend_cpu(task, bool(lent)))

    def _logs(self, caller: Caller, job_id: Any, last: Any = None, after_id: Any = 0) -> list[list[Any]]:
        job = self._service.job(str(job_id))
        if not caller.may_act_for(job.user):
            raise PermissionDenied(f"job {job.job_id!r} belongs to user {job.user!r}; only they may read its output")
        lines = self._service.logs(job.job_id, None if last is None else int(last), int(after_id))
        return [[i, line] for i, line in lines]

    def _job_stacks(self, caller: Caller, job_id: Any, timeout: Any = 10.0, locals: Any = False) -> list[Any]:
        # Stacks show what a job's code holds (with locals, its variables): its owner's, like its output.
        job = self._service.job(str(job_id))
        if not caller.may_act_for(job.user):
            raise PermissionDenied(f"job {job.job_id!r} belongs to user {job.user!r}; only they may read its stacks")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ProtocolError(f"job_stacks: timeout must be a number of seconds, got {type(timeout).__name__}")
        return [p.to_json() for p in self._service.job_stacks(job.job_id, float(timeout), bool(locals))]

    def _stacks_answer(self, caller: Caller, worker_id: Any, epoch: Any, request_id: Any, stacks: Any) -> bool:
        worker = self._own_worker(caller, worker_id)
        if not isinstance(stacks, list):
            raise ProtocolError(f"stacks_answer: stacks must be a list, got {type(stacks).__name__}")
        return bool(self._service.stacks_answer(worker, int(epoch), int(request_id), stacks))

    def _list_jobs(self, caller: Caller, states: Any = None) -> list[dict[str, Any]]:
        views = self._service.list_jobs(None if states is None else [str(x) for x in states])
        return [codec.view_data(v) for v in views if caller.admin or v.user == caller.user]

    def _register_endpoint(self, caller: Caller, namespace: Any, name: Any, url: Any, task: Any) -> bool:
        key = codec.key_from(task)
        if not caller.admin and caller.job_id != key.job_id:
            raise PermissionDenied(f"only the task's own job may register an endpoint for {key}")
        return bool(self._service.register_endpoint(str(namespace), str(name), str(url), key))

    def _namespace_token(self, caller: Caller, namespace: Any) -> str:
        ns = str(namespace)
        holder = self._service.namespace_owner(ns)
        if not caller.admin and (caller.user is None or (holder is not None and holder != caller.user)):
            raise PermissionDenied(f"namespace {ns!r} belongs to user {holder!r}")
        return str(self._service.namespace_token(ns))

    def _wait_actor(self, namespace: Any, name: Any, job_id: Any, timeout: Any = 10.0) -> list[Any]:
        state, detail, view = self._service.wait_actor(str(namespace), str(name), str(job_id), float(timeout))
        return [state, detail, codec.view_data(view)]

    def __call__(self, principal: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        caller = Caller(principal, self._service)
        try:
            return codec.checked(f"arguments of {method}", lambda: self._dispatch(caller, method, args, kwargs))
        except StorageError as exc:
            self._service.storage_failed(exc)
            raise

    def _dispatch(self, caller: Caller, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if caller.joining and method != "join":
            raise PermissionDenied(f"a join token may only join a worker, not call {method}")
        if method in _ADMIN_METHODS:
            if not caller.admin:
                raise PermissionDenied(f"{method} needs the cluster token (the administrator's)")
            return self._admin(method, args, kwargs)
        if method.startswith(_OPS_PREFIX) and self._ops is not None:
            return self._ops(caller, method.removeprefix(_OPS_PREFIX), args, kwargs)
        if method in _WORKER_METHODS and not (caller.admin or caller.worker):
            raise PermissionDenied(f"{method} needs the worker credential")
        if caller.worker and method not in _WORKER_MAY:
            raise PermissionDenied(f"a worker credential may not call {method}")
        personal = self._personal.get(method)
        if personal is not None:
            return personal(caller, *args, **kwargs)
        function = self._methods.get(method)
        if function is None:
            raise ProtocolError(f"the controller has no method {method!r}")
        return function(*args, **kwargs)
