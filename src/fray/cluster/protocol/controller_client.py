"""Reaching a Fray cluster's controller: the cluster token, and typed handles that ride out restarts.

Clients, workers, the launcher and the CLI all talk to the controller through
:func:`controller_client` (one :class:`ControllerProxy`, no retries) or
:func:`connect_controller` (one shared :class:`ControllerHandle` per address, credential
and retry budget, which retries); the CLI, the launcher and workers reach its operator
API (:mod:`fray.cluster.server.ops`) through :func:`ops_client`. Calls travel over the
data-only RPC (:mod:`fray.cluster.rpc.datarpc`): the typed values are turned into plain data
and back by the codecs the API's table declares (:mod:`fray.cluster.protocol.controller_api`).
Nothing here imports the controller's store or the worker daemon.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol import controller_api as api
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.credentials import Credential, load_credential
from fray.cluster.protocol.messages import JobSpec, JobView, TaskExit, WorkerCommands, WorkerReport
from fray.cluster.protocol.records import Endpoint, TaskKey, TaskRecord, WorkerRecord
from fray.cluster.rpc.datarpc import DataClient
from fray.errors import ActorUnavailableError, CallNotSentError, ControllerUnreachable, ProtocolError
from fray.stacks import ProcessStacks

__all__ = [
    "CONTROLLER_RETRY_SECONDS",
    "FIRST_CONTACT_SECONDS",
    "ControllerHandle",
    "ControllerProxy",
    "CredentialLike",
    "OpsProxy",
    "connect_controller",
    "controller_client",
    "load_token",
    "ops_client",
    "resolve_credential",
]

T = TypeVar("T")

_TOKEN_FILE = Path.home() / ".config" / "fray" / "token"

#: How long calls keep retrying while the controller is unreachable (e.g. restarting).
CONTROLLER_RETRY_SECONDS = 60.0

#: How long a client that has never reached its controller keeps trying: a wrong address or a
#: cluster that is not up should fail at once, not after a restart's budget.
FIRST_CONTACT_SECONDS = 3.0


def load_token(token: str | bytes | None = None) -> bytes | None:
    """The cluster token: the argument, else ``FRAY_TOKEN``, else ``~/.config/fray/token``."""
    if token is not None:
        return token.encode() if isinstance(token, str) else token
    if os.environ.get("FRAY_TOKEN"):
        return os.environ["FRAY_TOKEN"].encode()
    try:
        return _TOKEN_FILE.read_text().strip().encode() or None
    except OSError:
        return None


CredentialLike = Credential | str | bytes | None
"""A :class:`Credential`; a ``str``/``bytes`` cluster token; or None: :func:`load_credential` decides."""


def resolve_credential(credential: CredentialLike) -> Credential | None:
    """The credential meant by ``credential`` (see :data:`CredentialLike`)."""
    if isinstance(credential, Credential):
        return credential
    return load_credential(credential)


def _data_client(
    address: str, credential: Credential | None, timeout: float = 30.0, ca: Path | None = None
) -> DataClient:
    if credential is None:
        return DataClient(address, None, timeout=timeout, ca=ca)
    return DataClient(
        address, credential.key, principal=credential.principal, timeout=timeout, ca=ca, pin=credential.pin
    )


class ControllerProxy:
    """The controller's API (:mod:`fray.cluster.protocol.controller_api`) as typed methods over one
    :class:`DataClient` (no retries of its own).

    Each method is one :meth:`_invoke` of its table entry, which encodes the arguments, calls and decodes the answer.
    """

    def __init__(self, rpc: DataClient, timeout: float | None = None) -> None:
        self._rpc = rpc
        self._timeout = timeout

    @property
    def address(self) -> str:
        return self._rpc.address

    def with_timeout(self, timeout: float) -> ControllerProxy:
        """The same controller (sharing connections) with calls limited to ``timeout`` seconds, no retries."""
        return ControllerProxy(self._rpc, timeout)

    def close(self) -> None:
        """Close idle connections."""
        self._rpc.close()

    def _invoke(self, method: api.Method[T], *args: Any, **kwargs: Any) -> T:
        """Call ``method`` of the controller's API with typed arguments; its typed result.

        A method not in :data:`~fray.cluster.protocol.controller_api.CONTROLLER_API` (ProtocolError) or
        arguments that do not fit it (TypeError) are refused before anything is sent.
        """
        if api.CONTROLLER_API.get(method.name) is not method:  # identity: the table holds the constants
            raise ProtocolError(f"{method.name!r} is not a method of the controller's API (controller_api.py)")
        data_args, data_kwargs = method.encode(args, kwargs)
        data = self._send(method.name, data_args, data_kwargs, method.idempotent)
        return codec.checked(f"answer to {method.name} from {self.address}", lambda: method.result.from_data(data))

    def _send(self, name: str, args: list[Any], kwargs: dict[str, Any], idempotent: bool) -> Any:
        """One call of plain data; ``idempotent``: repeating it after it may have run is harmless."""
        return self._rpc.call(name, args, kwargs, self._timeout)

    # -- workers --------------------------------------------------------------------------------

    def register_worker(
        self, info: WorkerInfo, address: str, running: list[TaskKey], exited: list[TaskExit]
    ) -> WorkerCommands:
        return self._invoke(api.REGISTER_WORKER, info, address, running, exited)

    def poll(self, worker_id: str, epoch: int, wait: float) -> WorkerCommands:
        return self._invoke(api.POLL, worker_id, epoch, wait)

    def report(self, worker_id: str, epoch: int, report: WorkerReport) -> bool:
        return self._invoke(api.REPORT_, worker_id, epoch, report)

    def leave(self, worker_id: str, reason: str, exited: list[TaskExit]) -> WorkerRecord:
        """Tell the controller ``worker_id`` leaves (drained): it is STOPPED, ``exited`` recorded first."""
        return self._invoke(api.LEAVE, worker_id, reason, exited)

    def join(self, worker_id: str) -> Credential:
        """Exchange the join token this proxy authenticates with for ``worker_id``'s own credential."""
        return self._invoke(api.JOIN, worker_id)

    def stacks_answer(self, worker_id: str, epoch: int, request_id: int, stacks: list[ProcessStacks]) -> bool:
        return self._invoke(api.STACKS_ANSWER, worker_id, epoch, request_id, stacks)

    # -- credentials (the administrator's) --------------------------------------------------------

    def create_token(self, role: str, ttl: float | None = None) -> dict[str, Any]:
        """Issue a join token (``"worker"``) or a user credential (``"user:NAME"``): its record, and ``line``."""
        return self._invoke(api.CREATE_TOKEN, role, ttl)

    def list_credentials(self) -> list[dict[str, Any]]:
        """Every issued credential and join token: id, subject, times, state (never a key)."""
        return self._invoke(api.LIST_CREDENTIALS)

    def revoke_credential(self, credential_id: str) -> bool:
        return self._invoke(api.REVOKE_CREDENTIAL, credential_id)

    def revoke_worker(self, worker_id: str) -> WorkerRecord:
        """Revoke the worker's credentials: it is lost at once (its tasks rescheduled) and must join again."""
        return self._invoke(api.REVOKE_WORKER, worker_id)

    # -- jobs -----------------------------------------------------------------------------------

    def submit(
        self, spec: JobSpec, *, user: str, parent_id: str | None = None, namespace: str | None = None
    ) -> JobView:
        return self._invoke(api.SUBMIT, spec, user=user, parent_id=parent_id, namespace=namespace)

    def submit_many(
        self, specs: list[JobSpec], *, user: str, parent_id: str | None = None, namespace: str | None = None
    ) -> list[JobView]:
        return self._invoke(api.SUBMIT_MANY, specs, user=user, parent_id=parent_id, namespace=namespace)

    def job(self, job_id: str) -> JobView:
        return self._invoke(api.JOB, job_id)

    def wait(self, job_ids: list[str], timeout: float = 10.0, *, any_finished: bool = True) -> list[JobView]:
        return self._invoke(api.WAIT, job_ids, timeout, any_finished=any_finished)

    def wait_status(self, job_ids: list[str], timeout: float = 10.0) -> list[tuple[str, bool]]:
        """``(state, settled)`` per job once any is finished (see ``ControllerService.wait_status``)."""
        return self._invoke(api.WAIT_STATUS, job_ids, timeout)

    def terminate(self, job_id: str, reason: str = "terminated") -> JobView:
        return self._invoke(api.TERMINATE, job_id, reason)

    def preempt(self, job_id: str, replica: int | None = None) -> JobView:
        return self._invoke(api.PREEMPT, job_id, replica)

    def lend_cpu(self, key: TaskKey, lent: bool) -> bool:
        """Task ``key`` is blocked on its own work and lends its CPU (``lent``), or takes it back."""
        return self._invoke(api.LEND_CPU, key, lent)

    def logs(self, job_id: str, last: int | None = None, after_id: int = 0) -> list[tuple[int, str]]:
        return self._invoke(api.LOGS, job_id, last, after_id)

    def job_stacks(self, job_id: str, timeout: float = 10.0, locals: bool = False) -> list[ProcessStacks]:
        """The live stacks of the job's running tasks (and its descendants'): see ``JobHandle.stacks``."""
        # The controller answers within the timeout plus its relay's slack: the call may take that long.
        proxy = self if self._timeout is not None else self.with_timeout(timeout + 30.0)
        return proxy._invoke(api.JOB_STACKS, job_id, timeout, locals)

    def list_jobs(self, states: list[str] | None = None) -> list[JobView]:
        return self._invoke(api.LIST_JOBS, states)

    def tasks(self, job_id: str) -> list[TaskRecord]:
        return self._invoke(api.TASKS, job_id)

    def list_workers(self) -> list[WorkerRecord]:
        return self._invoke(api.LIST_WORKERS)

    def health(self) -> dict[str, Any]:
        """Whether the controller is read-only (and why), its state file and the free space there."""
        return self._invoke(api.HEALTH)

    # -- endpoints ------------------------------------------------------------------------------

    def register_endpoint(self, namespace: str, name: str, url: str, task: TaskKey) -> bool:
        return self._invoke(api.REGISTER_ENDPOINT, namespace, name, url, task)

    def list_endpoints(self, namespace: str | None = None) -> list[Endpoint]:
        return self._invoke(api.LIST_ENDPOINTS, namespace)

    def wait_actor(self, namespace: str, name: str, job_id: str, timeout: float = 10.0) -> tuple[str, str, JobView]:
        return self._invoke(api.WAIT_ACTOR, namespace, name, job_id, timeout)

    def resolve(self, namespace: str, name: str) -> list[str]:
        return self._invoke(api.RESOLVE, namespace, name)

    def namespace_token(self, namespace: str) -> bytes:
        """The token of ``namespace``'s actor servers, as their tasks have it in ``FRAY_TOKEN``.

        Refused unless the namespace is the caller's user's (or the caller is the administrator).
        """
        return self._invoke(api.NAMESPACE_TOKEN, namespace)

    def register(self, namespace: str, name: str, url: str) -> None:
        """Register a server that is not a Fray task under ``name`` (forgotten when the controller restarts)."""
        self._invoke(api.REGISTER, namespace, name, url)

    def unregister(self, namespace: str, name: str, url: str) -> None:
        """Forget a server :meth:`register` registered."""
        self._invoke(api.UNREGISTER, namespace, name, url)

    def list_registered(self, namespace: str) -> dict[str, str]:
        """``name -> url`` of every endpoint in ``namespace``, tasks' and registered servers' (the RPC ``list``)."""
        return self._invoke(api.LIST, namespace)

    # -- durable queues: a prefixed family outside the table ------------------------------------

    def queue(self, method: str, *args: Any) -> Any:
        """Call ``queue.METHOD`` (durable queues, :mod:`fray.cluster.client.queue`): plain data in and out.

        Outside :mod:`~fray.cluster.protocol.controller_api`; a retrying handle repeats these calls as it
        repeats idempotent methods.
        """
        return self._send(f"queue.{method}", list(args), {}, True)


def controller_client(
    address: str, token: CredentialLike = None, timeout: float = 30.0, *, ca: Path | None = None
) -> ControllerProxy:
    """A typed handle on the controller at ``address`` (``host:port``): no retries beyond the connection's.

    ``token``: a :class:`Credential`, the cluster token, or None for :func:`load_credential`'s choice;
    ``ca``: the cluster CA for a controller beyond this machine (default ``FRAY_TLS_CA``).
    """
    return ControllerProxy(_data_client(address, resolve_credential(token), timeout, ca))


class OpsProxy:
    """The controller's operator API (:mod:`fray.cluster.server.ops`) as typed methods; no retries of its own.

    What a caller sees depends on its credential (see :mod:`fray.cluster.server.controller._ops_api`): the
    administrator sees every job, a user only its own.
    """

    def __init__(self, rpc: DataClient) -> None:
        self._rpc = rpc

    @property
    def address(self) -> str:
        return self._rpc.address

    def close(self) -> None:
        """Close idle connections."""
        self._rpc.close()

    def _call(self, method: str, *args: Any) -> Any:
        return self._rpc.call(f"ops.{method}", list(args), {})

    def jobs(
        self, states: list[str] | None = None, limit: int = 50, namespace: str | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        """Jobs newest first: at most ``limit`` (0: all), only ``states`` / ``namespace`` / ``name`` if given."""
        return list(self._call("jobs", states, limit, namespace, name))

    def find_jobs(self, ref: str) -> list[str]:
        """The ids ``ref`` names: ``[ref]`` for a job id, else the jobs named ``ref``, newest first."""
        return [str(job_id) for job_id in self._call("find_jobs", ref)]

    def job_detail(self, job_id: str) -> dict[str, Any]:
        """One job with every attempt's tasks and its state history; raises NotFound."""
        return dict(self._call("job_detail", job_id))

    def timeline(self, job_id: str | None = None, since: float | None = None) -> dict[str, Any]:
        """The jobs (all, or ``job_id``; those running at or after ``since``, Unix seconds) as a Chrome trace."""
        return dict(self._call("timeline", job_id, since))

    def status(self) -> dict[str, Any]:
        """The cluster at a glance: workers and resources, jobs by state, actors, queues, controller health."""
        return dict(self._call("status"))

    def utilisation(self, since: float = 0.0) -> dict[str, Any]:
        """The controller's samples of cores, memory and jobs by state taken after ``since`` (the last hour)."""
        return dict(self._call("utilisation", since))

    def health(self) -> dict[str, Any]:
        """The controller's own state: address, dashboard, uptime, database, retention, read-only or not."""
        return dict(self._call("health"))

    def has_blob(self, digest: str) -> bool:
        """True if the controller holds the workspace blob ``digest`` (``sha256:<hex>``)."""
        return bool(self._call("has_blob", digest))

    def put_blob(self, digest: str, data: bytes) -> bool:
        """Store a workspace blob (opaque bytes) under its digest, which the controller checks."""
        return bool(self._call("put_blob", digest, data))

    def get_blob(self, digest: str) -> bytes:
        """The workspace blob ``digest``; raises NotFound."""
        data = self._call("get_blob", digest)
        if not isinstance(data, bytes):
            raise ProtocolError(f"{self.address} answered get_blob with {type(data).__name__}, not bytes")
        return data

    def dashboard_login(self) -> str:
        """A one-time URL that logs a browser in to the dashboard ("" when none runs); administrator only."""
        return str(self._call("dashboard_login"))

    # Autoscaling (docs/autoscaling.md); on a cluster without a VM provider each raises ConfigError.

    def vms(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        """Every VM: ``id``, ``group``, ``slice``, ``state``, ``worker_id``, ``created_at``, ``ready_at``, ``reason``."""
        return list(self._call("vms", include_deleted))

    def vm_preempt(self, vm_id: str) -> None:
        """The provider reclaims the VM now (simulated provider; administrator only)."""
        self._call("vm_preempt", vm_id)

    def vm_quota(self, group: str, exhausted: bool) -> None:
        """The provider answers creates in ``group`` with a quota error, or stops doing so (simulated provider)."""
        self._call("vm_quota", group, exhausted)

    def vm_fail_boot(self, group: str, count: int = 1) -> None:
        """The next ``count`` VMs created in ``group`` never finish booting (simulated provider)."""
        self._call("vm_fail_boot", group, count)

    def autoscaler_status(self) -> dict[str, Any]:
        """Per scale group its state, target and VMs by state; unmet demand with machine-readable codes."""
        return dict(self._call("autoscaler_status"))

    def delete_all_vms(self) -> int:
        """Stop creating VMs and delete every one (``fray cluster down``); how many were deleted."""
        return int(self._call("delete_all_vms"))


def ops_client(
    address: str, token: CredentialLike = None, timeout: float = 30.0, *, ca: Path | None = None
) -> OpsProxy:
    """A handle on the operator API of the controller at ``address`` (``token`` and ``ca`` as for :func:`controller_client`)."""
    return OpsProxy(_data_client(address, resolve_credential(token), timeout, ca))


class ControllerHandle(ControllerProxy):
    """Calls the controller, riding out its restarts.

    A call that provably was not sent is retried until ``retry_seconds`` (default
    :data:`CONTROLLER_RETRY_SECONDS`) pass; one that may have run is retried only if
    repeating it is harmless (its method is declared ``idempotent`` in
    :mod:`~fray.cluster.protocol.controller_api`). Jobs and scripts keep the patient default, so a
    controller restart does not fail them; the CLI passes a short budget, so a
    controller that is not there is reported at once.
    """

    def __init__(
        self, address: str, credential: Credential | None, retry_seconds: float = CONTROLLER_RETRY_SECONDS
    ) -> None:
        super().__init__(_data_client(address, credential))
        self.retry_seconds = retry_seconds
        # A process started by a cluster job runs on a cluster its worker reached: a restart, not a typo.
        self._reached = bool(os.environ.get("FRAY_JOB_ID"))

    def bounded(self, timeout: float) -> ControllerProxy:
        """The controller with a call timeout and no retries (for shutdown paths)."""
        return self.with_timeout(timeout)

    def _send(self, name: str, args: list[Any], kwargs: dict[str, Any], idempotent: bool) -> Any:
        started = time.monotonic()
        delay = 0.02
        while True:
            try:
                result = super()._send(name, args, kwargs, idempotent)
                self._reached = True
                return result
            except CallNotSentError as exc:
                budget = self.retry_seconds if self._reached else min(self.retry_seconds, FIRST_CONTACT_SECONDS)
                if time.monotonic() - started > budget:
                    if self._reached:
                        raise
                    raise _unreachable(self.address, time.monotonic() - started, exc) from None
            except ActorUnavailableError:
                self._reached = True  # it was sent: something answered there once
                if not idempotent or time.monotonic() - started > self.retry_seconds:
                    raise
            except Exception:
                self._reached = True  # the controller answered (with an error)
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _unreachable(address: str, waited: float, exc: CallNotSentError) -> ControllerUnreachable:
    detail = str(exc).rsplit(": ", 1)[-1]
    return ControllerUnreachable(
        f"no Fray controller answers at {address} (tried for {waited:.1f}s: {detail}); start a cluster with "
        "`fray cluster up`, or check FRAY_CLIENT_SPEC (fray://HOST:PORT of a running controller)"
    )


# One controller connection pool per (address, credential, retry budget) per process, shared by every handle.
_handles: dict[tuple[str, Credential | None, float], ControllerHandle] = {}
_handles_lock = threading.Lock()


def connect_controller(
    address: str, token: CredentialLike = None, *, retry_seconds: float = CONTROLLER_RETRY_SECONDS
) -> ControllerHandle:
    """The process's shared, retrying handle on the controller at ``address`` (``token``: see :data:`CredentialLike`).

    ``retry_seconds`` is how long a call keeps retrying while the controller is unreachable.
    """
    resolved = resolve_credential(token)
    key = (address, resolved, retry_seconds)
    with _handles_lock:
        handle = _handles.get(key)
        if handle is None:
            handle = _handles[key] = ControllerHandle(address, resolved, retry_seconds)
        return handle
