"""The controller's RPC API, declared once: each method's name, who may call it, whether a retry is harmless,
and how its arguments and result cross the wire.

Everything else is derived from :data:`CONTROLLER_API`:

* the client, :class:`~fray.cluster.protocol.controller_client.ControllerProxy`, encodes a call's
  arguments with the table's codecs, sends it and decodes the answer (``_invoke``); its retrying
  handle retries after a possible run only the methods declared ``idempotent``; a name not in the
  table is refused before anything is sent;
* the server, :class:`~fray.cluster.server.controller._api.ControllerAPI`, refuses a caller the
  method's :class:`Access` does not admit, decodes the arguments (a malformed one is a
  :class:`~fray.errors.ProtocolError`), calls its handler for the name and encodes the result; it
  refuses to start unless its handlers are exactly the table's names.

How to add a method: declare it below (a :class:`Method` constant, in :data:`CONTROLLER_API`); write
the ``ControllerService`` method and its handler in ``ControllerAPI`` (the service method itself when it
needs no check of the caller); add the one-line typed ``ControllerProxy`` method over ``_invoke``.

Outside the table, as prefixed families with their own dispatch: ``queue.*`` (durable queues,
``ControllerProxy.queue``, :mod:`fray.cluster.server.controller._queues`) and ``ops.*`` (the operator
API, :class:`~fray.cluster.protocol.controller_client.OpsProxy`, :mod:`fray.cluster.server.controller._ops_api`).

A job's spec crosses as the bytes of :func:`~fray.cluster.protocol._codec.encode_spec`, made once by the
client; the server decodes them once and keeps them (:class:`EncodedSpec`), since the controller stores
and forwards those bytes as they came (see the top of :mod:`fray.cluster.protocol.messages`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.credentials import Credential
from fray.cluster.protocol.messages import JobSpec, JobView, TaskExit, WorkerCommands, WorkerReport
from fray.cluster.protocol.records import Endpoint, TaskKey, TaskRecord, WorkerRecord
from fray.errors import ProtocolError
from fray.stacks import ProcessStacks

__all__ = [
    "CONTROLLER_API",
    "REQUIRED",
    "Access",
    "Codec",
    "EncodedSpec",
    "Method",
    "Param",
]

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")


class Access(enum.Enum):
    """Who may call a method (checked by the server for every call; see ``Caller`` in ``_api.py``).

    A join token may call JOIN methods and nothing else, whatever the method's access.
    """

    #: Anyone with a credential, a worker's included: reading jobs, tasks, workers and health.
    READ = "read"
    #: Users, jobs and the administrator, not workers (the handler checks whose the job or namespace is).
    USER = "user"
    #: The worker protocol: a worker's credential (its own worker only) or the administrator.
    WORKER = "worker"
    #: The administrator (the cluster token) only: issuing and revoking credentials.
    ADMIN = "admin"
    #: Only a join token, which it exchanges for a worker's own credential.
    JOIN = "join"


@dataclass(frozen=True)
class Codec(Generic[T]):
    """How one value crosses the wire: ``to_data`` makes plain data of it; ``from_data`` checks that data
    (raising TypeError, ValueError, ... or ProtocolError for anything malformed) and rebuilds the value."""

    to_data: Callable[[T], Any]
    from_data: Callable[[Any], T]


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return list(value)


def _map(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a map, got {type(value).__name__}")
    return dict(value)


def LIST_OF(item: Codec[T]) -> Codec[list[T]]:
    """A list (any iterable on the way out) of ``item``."""
    return Codec(
        lambda values: [item.to_data(v) for v in values], lambda data: [item.from_data(v) for v in _list(data)]
    )


def OPT(inner: Codec[T]) -> Codec[T | None]:
    """``inner``, or None (nil)."""
    return Codec(
        lambda value: None if value is None else inner.to_data(value),
        lambda data: None if data is None else inner.from_data(data),
    )


def _fixed(data: Any, size: int) -> list[Any]:
    items = _list(data)
    if len(items) != size:
        raise ValueError(f"expected {size} items, got {len(items)}")
    return items


def PAIR(first: Codec[A], second: Codec[B]) -> Codec[tuple[A, B]]:
    """A 2-tuple, as a list of two."""

    def from_data(data: Any) -> tuple[A, B]:
        a, b = _fixed(data, 2)
        return first.from_data(a), second.from_data(b)

    return Codec(lambda value: [first.to_data(value[0]), second.to_data(value[1])], from_data)


def TRIPLE(first: Codec[A], second: Codec[B], third: Codec[C]) -> Codec[tuple[A, B, C]]:
    """A 3-tuple, as a list of three."""

    def from_data(data: Any) -> tuple[A, B, C]:
        a, b, c = _fixed(data, 3)
        return first.from_data(a), second.from_data(b), third.from_data(c)

    return Codec(lambda value: [first.to_data(value[0]), second.to_data(value[1]), third.to_data(value[2])], from_data)


@dataclass(frozen=True)
class EncodedSpec:
    """A job's spec as the server receives it: decoded once, with the client's bytes it came in."""

    spec: JobSpec
    data: bytes


def _spec_to_data(spec: JobSpec | EncodedSpec) -> bytes:
    return spec.data if isinstance(spec, EncodedSpec) else codec.encode_spec(spec)


def _spec_from_data(data: Any) -> EncodedSpec:
    return EncodedSpec(codec.decode_spec(data), data)


# Scalars: a client's value is converted (an int timeout is sent as a float), the server's checked strictly.
STR: Codec[str] = Codec(codec.as_str, codec.as_str)
INT: Codec[int] = Codec(int, codec.as_int)
FLOAT: Codec[float] = Codec(float, _float)
BOOL: Codec[bool] = Codec(bool, _bool)
OPT_STR = OPT(STR)
OPT_INT = OPT(INT)
OPT_FLOAT = OPT(FLOAT)
NONE: Codec[None] = Codec(lambda _: None, lambda _: None)
#: A map of plain data (health, a credential's record), as it is.
DATA: Codec[dict[str, Any]] = Codec(_map, _map)
STR_MAP: Codec[dict[str, str]] = Codec(
    lambda value: dict(value), lambda data: {codec.as_str(k): codec.as_str(v) for k, v in _map(data).items()}
)
#: A secret token: bytes to the client, a string on the wire.
TOKEN: Codec[bytes] = Codec(lambda value: value.decode(), lambda data: codec.as_str(data).encode())
CREDENTIAL: Codec[Credential] = Codec(Credential.encode, lambda data: Credential.decode(codec.as_str(data)))
# The cluster's messages (fray.cluster.protocol._codec).
SPEC: Codec[EncodedSpec] = Codec(_spec_to_data, _spec_from_data)
VIEW: Codec[JobView] = Codec(codec.view_data, codec.view_from)
TASK: Codec[TaskRecord] = Codec(codec.task_data, codec.task_from)
KEY: Codec[TaskKey] = Codec(codec.key_data, codec.key_from)
EXIT: Codec[TaskExit] = Codec(codec.exit_data, codec.exit_from)
WORKER_INFO: Codec[WorkerInfo] = Codec(codec.worker_info_data, codec.worker_info_from)
WORKER_RECORD: Codec[WorkerRecord] = Codec(codec.worker_record_data, codec.worker_record_from)
COMMANDS: Codec[WorkerCommands] = Codec(codec.commands_data, codec.commands_from)
REPORT: Codec[WorkerReport] = Codec(codec.report_data, codec.report_from)
ENDPOINT: Codec[Endpoint] = Codec(codec.endpoint_data, codec.endpoint_from)
STACKS: Codec[ProcessStacks] = Codec(ProcessStacks.to_json, ProcessStacks.from_json)
#: A worker's stacks answer: the client's ProcessStacks as JSON, which the server's relay parses itself.
STACKS_JSON: Codec[list[Any]] = Codec(lambda stacks: [p.to_json() for p in stacks], _list)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a parameter that has none.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One argument: its name, codec and default (:data:`REQUIRED`: none); ``keyword``: keyword-only."""

    name: str
    codec: Codec[Any]
    default: Any = REQUIRED
    keyword: bool = False


@dataclass(frozen=True)
class Method(Generic[T]):
    """One RPC of the controller: its name, who may call it, whether a retry after a possible run is
    harmless, its parameters and how its result (``T`` to the client) crosses the wire."""

    name: str
    access: Access
    params: tuple[Param, ...]
    result: Codec[T]
    idempotent: bool = True

    def _bind(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], error: Callable[[str], Exception], server: bool
    ) -> dict[str, Any]:
        """The arguments given, by parameter name, bound as Python binds a call (no defaults filled in).

        On the server (``server``) positional values may fill keyword-only parameters too.
        """
        slots = [p for p in self.params if server or not p.keyword]
        if len(args) > len(slots):
            raise error(f"{self.name}() takes {len(slots)} positional arguments but {len(args)} were given")
        given: dict[str, Any] = {p.name: value for p, value in zip(slots, args, strict=False)}
        names = {p.name for p in self.params}
        for name, value in kwargs.items():
            if name not in names:
                raise error(f"{self.name}() got an unexpected keyword argument {name!r}")
            if name in given:
                raise error(f"{self.name}() got multiple values for argument {name!r}")
            given[name] = value
        for p in self.params:
            if p.default is REQUIRED and p.name not in given:
                raise error(f"{self.name}() missing required argument {p.name!r}")
        return given

    def _split(self, values: Iterable[Any]) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for p, value in zip(self.params, values, strict=True):
            if p.keyword:
                kwargs[p.name] = value
            else:
                args.append(value)
        return args, kwargs

    def encode(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The client's call as plain data, every parameter sent: positional, and keyword-only ones by name.

        TypeError (nothing sent) for a call that does not fit the parameters.
        """
        given = self._bind(args, kwargs, TypeError, server=False)
        return self._split(p.codec.to_data(given.get(p.name, p.default)) for p in self.params)

    def decode(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The server's side of :meth:`encode`: the typed arguments (defaults for those not sent), positional
        and keyword-only ones by name; ProtocolError for a malformed call or argument."""
        given = self._bind(args, kwargs, ProtocolError, server=True)

        def typed(p: Param) -> Any:
            if p.name not in given:
                return p.default
            return codec.checked(f"argument {p.name!r} of {self.name}", lambda: p.codec.from_data(given[p.name]))

        return self._split(typed(p) for p in self.params)


def _p(name: str, c: Codec[Any], default: Any = REQUIRED) -> Param:
    return Param(name, c, default)


def _kw(name: str, c: Codec[Any], default: Any = REQUIRED) -> Param:
    return Param(name, c, default, keyword=True)


_JOB_ID = _p("job_id", STR)
_WORKER_ID = _p("worker_id", STR)
_EPOCH = _p("epoch", INT)
_NAMESPACE = _p("namespace", STR)
_NAME = _p("name", STR)
_URL = _p("url", STR)
_SUBMITTED = (_kw("user", STR), _kw("parent_id", OPT_STR, None), _kw("namespace", OPT_STR, None))

# -- the worker protocol --------------------------------------------------------------------------

REGISTER_WORKER: Method[WorkerCommands] = Method(
    "register_worker",
    Access.WORKER,
    (_p("info", WORKER_INFO), _p("address", STR), _p("running", LIST_OF(KEY)), _p("exited", LIST_OF(EXIT), ())),
    COMMANDS,
)
POLL: Method[WorkerCommands] = Method("poll", Access.WORKER, (_WORKER_ID, _EPOCH, _p("wait", FLOAT, 1.0)), COMMANDS)
REPORT_: Method[bool] = Method("report", Access.WORKER, (_WORKER_ID, _EPOCH, _p("report", REPORT)), BOOL)
LEAVE: Method[WorkerRecord] = Method(
    "leave", Access.WORKER, (_WORKER_ID, _p("reason", STR), _p("exited", LIST_OF(EXIT), ())), WORKER_RECORD
)
STACKS_ANSWER: Method[bool] = Method(
    "stacks_answer",
    Access.WORKER,
    (_WORKER_ID, _EPOCH, _p("request_id", INT), _p("stacks", STACKS_JSON)),
    BOOL,
)
JOIN: Method[Credential] = Method("join", Access.JOIN, (_WORKER_ID,), CREDENTIAL, idempotent=False)

# -- credentials: the administrator's -------------------------------------------------------------

CREATE_TOKEN: Method[dict[str, Any]] = Method(
    "create_token", Access.ADMIN, (_p("role", STR), _p("ttl", OPT_FLOAT, None)), DATA, idempotent=False
)
LIST_CREDENTIALS: Method[list[dict[str, Any]]] = Method("list_credentials", Access.ADMIN, (), LIST_OF(DATA))
REVOKE_CREDENTIAL: Method[bool] = Method("revoke_credential", Access.ADMIN, (_p("credential_id", STR),), BOOL)
REVOKE_WORKER: Method[WorkerRecord] = Method("revoke_worker", Access.ADMIN, (_WORKER_ID,), WORKER_RECORD)

# -- jobs ------------------------------------------------------------------------------------------

SUBMIT: Method[JobView] = Method("submit", Access.USER, (_p("spec", SPEC), *_SUBMITTED), VIEW, idempotent=False)
SUBMIT_MANY: Method[list[JobView]] = Method(
    "submit_many", Access.USER, (_p("specs", LIST_OF(SPEC)), *_SUBMITTED), LIST_OF(VIEW), idempotent=False
)
JOB: Method[JobView] = Method("job", Access.READ, (_JOB_ID,), VIEW)
WAIT: Method[list[JobView]] = Method(
    "wait",
    Access.USER,
    (_p("job_ids", LIST_OF(STR)), _p("timeout", FLOAT, 10.0), _kw("any_finished", BOOL, True)),
    LIST_OF(VIEW),
)
WAIT_STATUS: Method[list[tuple[str, bool]]] = Method(
    "wait_status", Access.USER, (_p("job_ids", LIST_OF(STR)), _p("timeout", FLOAT, 10.0)), LIST_OF(PAIR(STR, BOOL))
)
TERMINATE: Method[JobView] = Method("terminate", Access.USER, (_JOB_ID, _p("reason", STR, "terminated")), VIEW)
PREEMPT: Method[JobView] = Method(
    "preempt", Access.USER, (_JOB_ID, _p("replica", OPT_INT, None)), VIEW, idempotent=False
)
LEND_CPU: Method[bool] = Method("lend_cpu", Access.USER, (_p("key", KEY), _p("lent", BOOL)), BOOL)
LOGS: Method[list[tuple[int, str]]] = Method(
    "logs", Access.USER, (_JOB_ID, _p("last", OPT_INT, None), _p("after_id", INT, 0)), LIST_OF(PAIR(INT, STR))
)
JOB_STACKS: Method[list[ProcessStacks]] = Method(
    "job_stacks",
    Access.USER,
    (_JOB_ID, _p("timeout", FLOAT, 10.0), _p("locals", BOOL, False)),
    LIST_OF(STACKS),
)
LIST_JOBS: Method[list[JobView]] = Method(
    "list_jobs", Access.USER, (_p("states", OPT(LIST_OF(STR)), None),), LIST_OF(VIEW)
)
TASKS: Method[list[TaskRecord]] = Method("tasks", Access.READ, (_JOB_ID,), LIST_OF(TASK))
LIST_WORKERS: Method[list[WorkerRecord]] = Method("list_workers", Access.READ, (), LIST_OF(WORKER_RECORD))
HEALTH: Method[dict[str, Any]] = Method("health", Access.READ, (), DATA)

# -- endpoints and actors --------------------------------------------------------------------------

REGISTER_ENDPOINT: Method[bool] = Method(
    "register_endpoint", Access.USER, (_NAMESPACE, _NAME, _URL, _p("task", KEY)), BOOL
)
LIST_ENDPOINTS: Method[list[Endpoint]] = Method(
    "list_endpoints", Access.USER, (_p("namespace", OPT_STR, None),), LIST_OF(ENDPOINT)
)
WAIT_ACTOR: Method[tuple[str, str, JobView]] = Method(
    "wait_actor", Access.USER, (_NAMESPACE, _NAME, _JOB_ID, _p("timeout", FLOAT, 10.0)), TRIPLE(STR, STR, VIEW)
)
RESOLVE: Method[list[str]] = Method("resolve", Access.USER, (_NAMESPACE, _NAME), LIST_OF(STR))
NAMESPACE_TOKEN: Method[bytes] = Method("namespace_token", Access.USER, (_NAMESPACE,), TOKEN)
# Servers that are not Fray tasks (the endpoint registry's API; forgotten when the controller restarts).
REGISTER: Method[None] = Method("register", Access.USER, (_NAMESPACE, _NAME, _URL), NONE)
UNREGISTER: Method[None] = Method("unregister", Access.USER, (_NAMESPACE, _NAME, _URL), NONE)
LIST: Method[dict[str, str]] = Method("list", Access.USER, (_NAMESPACE,), STR_MAP)

_ALL: tuple[Method[Any], ...] = (
    REGISTER_WORKER,
    POLL,
    REPORT_,
    LEAVE,
    STACKS_ANSWER,
    JOIN,
    CREATE_TOKEN,
    LIST_CREDENTIALS,
    REVOKE_CREDENTIAL,
    REVOKE_WORKER,
    SUBMIT,
    SUBMIT_MANY,
    JOB,
    WAIT,
    WAIT_STATUS,
    TERMINATE,
    PREEMPT,
    LEND_CPU,
    LOGS,
    JOB_STACKS,
    LIST_JOBS,
    TASKS,
    LIST_WORKERS,
    HEALTH,
    REGISTER_ENDPOINT,
    LIST_ENDPOINTS,
    WAIT_ACTOR,
    RESOLVE,
    NAMESPACE_TOKEN,
    REGISTER,
    UNREGISTER,
    LIST,
)

#: Every method of the controller's API by name (the ``queue.*`` and ``ops.*`` families are served apart).
CONTROLLER_API: Mapping[str, Method[Any]] = MappingProxyType({m.name: m for m in _ALL})
if len(CONTROLLER_API) != len(_ALL):
    raise RuntimeError("two methods of the controller's API have one name")
