"""The controller's data-only API: the server side of the table in :mod:`fray.cluster.protocol.controller_api`.

:class:`ControllerAPI` is the handler a :class:`~fray.cluster.rpc.datarpc.DataServer` calls: it
checks the caller against the method's declared :class:`~fray.cluster.protocol.controller_api.Access`,
decodes the arguments with the table's codecs (a malformed one is a :class:`~fray.errors.ProtocolError`),
calls its handler for the name -- the :class:`ControllerService` method itself, or a check of who calls
around it -- and encodes the result. Its handlers must be exactly the table's names. Nothing here, or
anywhere in the controller, unpickles anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.controller_api import CONTROLLER_API, Access, EncodedSpec, Method
from fray.cluster.protocol.credentials import ADMIN, WORKER, Credential, Issued, issued_id
from fray.cluster.protocol.messages import JobView, TaskExit, WorkerCommands, WorkerReport
from fray.cluster.protocol.records import TaskKey, WorkerRecord
from fray.errors import AuthenticationError, PermissionDenied, ProtocolError, StorageError
from fray.stacks import ProcessStacks

__all__ = ["ControllerAPI"]

#: A method's handler: ``(caller, *typed arguments, **typed keyword-only arguments)``, its typed result.
Handler = Callable[..., Any]
#: Serves the ``ops.*`` methods: ``(caller, method without the prefix, args, kwargs)`` (see :mod:`._ops_api`).
OpsHandler = Callable[["Caller", str, list[Any], dict[str, Any]], Any]
_OPS_PREFIX = "ops."


def _anyone(function: Callable[..., Any]) -> Handler:
    """The handler of a service method that needs no check of who calls (beyond its access)."""
    return lambda caller, *args, **kwargs: function(*args, **kwargs)


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

    It also decides what each principal may do (each method's
    :class:`~fray.cluster.protocol.controller_api.Access`, then its handler's checks): workers drive tasks
    and nothing else; users and jobs submit and stop their own user's jobs (a job only submits its own
    children) in namespaces that are theirs; the administrator (the cluster token) may do everything,
    including acting for a named user. A user sees the output and the listing of its own jobs only.
    Methods named ``ops.NAME`` go to ``ops``, the operator API.
    """

    def __init__(self, service: Any, ops: OpsHandler | None = None) -> None:  # service: a ControllerService
        self._service = service
        self._ops = ops
        s = service
        self._handlers: dict[str, Handler] = {
            # the worker protocol: an issued worker credential speaks for its own worker only
            "register_worker": self._register_worker,
            "poll": self._poll,
            "report": self._report,
            "leave": self._leave,
            "stacks_answer": self._stacks_answer,
            "join": self._join,
            # credentials: the administrator's
            "create_token": self._create_token,
            "list_credentials": self._list_credentials,
            "revoke_credential": _anyone(s.revoke_credential),
            "revoke_worker": _anyone(s.revoke_worker),
            # jobs
            "submit": self._submit,
            "submit_many": self._submit_many,
            "job": _anyone(s.job),
            "wait": _anyone(s.wait),
            "wait_status": _anyone(s.wait_status),
            "terminate": self._terminate,
            "preempt": self._preempt,
            "lend_cpu": self._lend_cpu,
            "logs": self._logs,
            "job_stacks": self._job_stacks,
            "list_jobs": self._list_jobs,
            "tasks": _anyone(s.tasks),
            "list_workers": _anyone(s.list_workers),
            "health": _anyone(s.health),
            # endpoints
            "register_endpoint": self._register_endpoint,
            "list_endpoints": _anyone(s.list_endpoints),
            "wait_actor": _anyone(s.wait_actor),
            "resolve": _anyone(s.resolve),
            "namespace_token": self._namespace_token,
            "register": _anyone(s.register),
            "unregister": _anyone(s.unregister),
            "list": _anyone(s.list),
        }
        missing, extra = set(CONTROLLER_API) - set(self._handlers), set(self._handlers) - set(CONTROLLER_API)
        if missing or extra:
            raise RuntimeError(
                "the controller's handlers do not match its API (fray.cluster.protocol.controller_api): "
                f"declared without a handler {sorted(missing)}, handled but not declared {sorted(extra)}"
            )

    # -- the worker protocol ------------------------------------------------------------------------

    def _own_worker(self, caller: Caller, worker_id: str) -> str:
        if caller.worker_id is not None and caller.worker_id != worker_id:
            raise PermissionDenied(f"the credential of worker {caller.worker_id!r} may not act as worker {worker_id!r}")
        return worker_id

    def _register_worker(
        self, caller: Caller, info: WorkerInfo, address: str, running: list[TaskKey], exited: Sequence[TaskExit]
    ) -> WorkerCommands:
        self._own_worker(caller, info.worker_id)
        commands: WorkerCommands = self._service.register_worker(
            info, address, running, list(exited), principal=caller.principal
        )
        return commands

    def _poll(self, caller: Caller, worker_id: str, epoch: int, wait: float) -> WorkerCommands:
        commands: WorkerCommands = self._service.poll(self._own_worker(caller, worker_id), epoch, wait)
        return commands

    def _report(self, caller: Caller, worker_id: str, epoch: int, report: WorkerReport) -> bool:
        return bool(self._service.report(self._own_worker(caller, worker_id), epoch, report))

    def _leave(self, caller: Caller, worker_id: str, reason: str, exited: Sequence[TaskExit]) -> WorkerRecord:
        record: WorkerRecord = self._service.stop_worker(self._own_worker(caller, worker_id), reason, list(exited))
        return record

    def _stacks_answer(self, caller: Caller, worker_id: str, epoch: int, request_id: int, stacks: list[Any]) -> bool:
        worker = self._own_worker(caller, worker_id)
        return bool(self._service.stacks_answer(worker, epoch, request_id, stacks))

    def _join(self, caller: Caller, worker_id: str) -> Credential:
        # Only a join token gets here (Access.JOIN).
        return Credential.decode(str(self._service.join(caller.principal, worker_id)))

    # -- credentials: the administrator's (Access.ADMIN) ------------------------------------------------

    def _create_token(self, caller: Caller, role: str, ttl: float | None) -> dict[str, Any]:
        record, line = self._service.create_token(role, ttl)
        return {**_issued_data(record, record.created_at), "line": line}

    def _list_credentials(self, caller: Caller) -> list[dict[str, Any]]:
        now = time.time()
        return [_issued_data(r, now) for r in self._service.list_credentials()]

    # -- methods that depend on who calls ----------------------------------------------------------

    def _submit(
        self, caller: Caller, spec: EncodedSpec, *, user: str, parent_id: str | None, namespace: str | None
    ) -> JobView:
        return self._submit_many(caller, [spec], user=user, parent_id=parent_id, namespace=namespace)[0]

    def _may_submit(
        self, caller: Caller, user: str, parent: str | None, ns: str | None
    ) -> tuple[str, str | None, str | None]:
        """Who the jobs belong to, their parent and namespace; PermissionDenied if the caller may not submit them."""
        if caller.admin:
            owner = user
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
        self,
        caller: Caller,
        specs: list[EncodedSpec],
        *,
        user: str,
        parent_id: str | None,
        namespace: str | None,
    ) -> list[JobView]:
        owner, parent, ns = self._may_submit(caller, user, parent_id, namespace)
        views: list[JobView] = self._service.submit_many(
            [s.spec for s in specs], user=owner, parent_id=parent, namespace=ns, encoded=[s.data for s in specs]
        )
        return views

    def _job_of(self, caller: Caller, job_id: str, may_not: str) -> JobView:
        """The job, if the caller may act for its user; PermissionDenied ``... only they may_not`` else."""
        job: JobView = self._service.job(job_id)
        if not caller.may_act_for(job.user):
            raise PermissionDenied(f"job {job.job_id!r} belongs to user {job.user!r}; only they {may_not}")
        return job

    def _terminate(self, caller: Caller, job_id: str, reason: str) -> JobView:
        self._job_of(caller, job_id, "or the cluster's administrator may stop it")
        view: JobView = self._service.terminate(job_id, reason)
        return view

    def _preempt(self, caller: Caller, job_id: str, replica: int | None) -> JobView:
        # Fault injection for tests (fray.testing.preempt): allowed to whoever may stop the job.
        job = self._job_of(caller, job_id, "or the cluster's administrator may preempt it")
        view: JobView = self._service.preempt(job.job_id, replica)
        return view

    def _lend_cpu(self, caller: Caller, key: TaskKey, lent: bool) -> bool:
        # A task lends its own CPU: only its job's credential (or its user's, or the administrator) may.
        job = self._service.job(key.job_id)
        if caller.job_id != key.job_id and not caller.may_act_for(job.user):
            raise PermissionDenied(f"only job {key.job_id!r} itself may lend its tasks' CPU")
        return bool(self._service.lend_cpu(key, lent))

    def _logs(self, caller: Caller, job_id: str, last: int | None, after_id: int) -> list[tuple[int, str]]:
        job = self._job_of(caller, job_id, "may read its output")
        lines: list[tuple[int, str]] = self._service.logs(job.job_id, last, after_id)
        return lines

    def _job_stacks(self, caller: Caller, job_id: str, timeout: float, locals: bool) -> list[ProcessStacks]:
        # Stacks show what a job's code holds (with locals, its variables): its owner's, like its output.
        job = self._job_of(caller, job_id, "may read its stacks")
        stacks: list[ProcessStacks] = self._service.job_stacks(job.job_id, timeout, locals)
        return stacks

    def _list_jobs(self, caller: Caller, states: list[str] | None) -> list[JobView]:
        views: list[JobView] = self._service.list_jobs(states)
        return [v for v in views if caller.admin or v.user == caller.user]

    def _register_endpoint(self, caller: Caller, namespace: str, name: str, url: str, task: TaskKey) -> bool:
        if not caller.admin and caller.job_id != task.job_id:
            raise PermissionDenied(f"only the task's own job may register an endpoint for {task}")
        return bool(self._service.register_endpoint(namespace, name, url, task))

    def _namespace_token(self, caller: Caller, namespace: str) -> bytes:
        holder = self._service.namespace_owner(namespace)
        if not caller.admin and (caller.user is None or (holder is not None and holder != caller.user)):
            raise PermissionDenied(f"namespace {namespace!r} belongs to user {holder!r}")
        return str(self._service.namespace_token(namespace)).encode()

    # -- dispatch ------------------------------------------------------------------------------------

    def __call__(self, principal: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        caller = Caller(principal, self._service)
        try:
            return codec.checked(f"arguments of {method}", lambda: self._dispatch(caller, method, args, kwargs))
        except StorageError as exc:
            self._service.storage_failed(exc)
            raise

    def _dispatch(self, caller: Caller, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        method = CONTROLLER_API.get(name)
        if caller.joining and (method is None or method.access is not Access.JOIN):
            raise PermissionDenied(f"a join token may only join a worker, not call {name}")
        if method is None:
            if name.startswith(_OPS_PREFIX) and self._ops is not None:
                return self._ops(caller, name.removeprefix(_OPS_PREFIX), args, kwargs)
            if caller.worker:
                raise PermissionDenied(f"a worker credential may not call {name}")
            raise ProtocolError(f"the controller has no method {name!r}")
        _check_access(caller, method)
        typed_args, typed_kwargs = method.decode(args, kwargs)
        return method.result.to_data(self._handlers[name](caller, *typed_args, **typed_kwargs))


def _check_access(caller: Caller, method: Method[Any]) -> None:
    """PermissionDenied unless ``method``'s access admits ``caller`` (a join token was refused before)."""
    name, access = method.name, method.access
    if access is Access.ADMIN and not caller.admin:
        raise PermissionDenied(f"{name} needs the cluster token (the administrator's)")
    if access is Access.WORKER and not (caller.admin or caller.worker):
        raise PermissionDenied(f"{name} needs the worker credential")
    # What a worker credential may call: its own protocol and reading, nothing that changes jobs.
    if caller.worker and access not in (Access.WORKER, Access.READ):
        raise PermissionDenied(f"a worker credential may not call {name}")
    if access is Access.JOIN and not caller.joining:
        raise PermissionDenied(f"{name} needs a join token (fray token create --role worker)")
