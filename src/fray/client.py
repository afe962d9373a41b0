"""The :class:`Client` protocol and how code finds its client (:func:`current_client`)."""

from __future__ import annotations

import contextvars
import importlib
import os
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlsplit

from fray.actor import ActorGroup, ActorHandle, HostedActor
from fray.actor_config import ActorConfig
from fray.core.inside._runtime import check_terminated
from fray.errors import ConfigError, JobAlreadyExists, JobFailed
from fray.job import EnvironmentConfig as EnvironmentConfig  # marin's fray.client offers it too
from fray.job import JobHandle, JobRequest, JobStatus, wait_all
from fray.queue import Queue
from fray.resources import ResourceConfig

__all__ = [
    "Client",
    "ClientSpec",
    "HostedActor",
    "JobAlreadyExists",
    "JobFailed",
    "JobHandle",
    "JobStatus",
    "client_from_spec",
    "current_client",
    "detect_spec",
    "parse_client_spec",
    "set_current_client",
    "wait_all",
]


@runtime_checkable
class Client(Protocol):
    """Submits jobs and creates actors on one backend. Use it as a context manager to shut it down."""

    def submit(self, request: JobRequest, adopt_existing: bool | None = None, *, detached: bool = True) -> JobHandle:
        """Submit a job; returns at once with its handle.

        ``adopt_existing`` (marin's): ``True`` returns the handle of a live job of the same
        name instead of submitting, ``False`` raises :class:`~fray.errors.JobAlreadyExists`
        (with ``.handle``) if there is one, ``None`` (default) submits regardless. See
        :mod:`fray.core._adopt`.

        ``detached`` (default) lets the job outlive the script where the backend runs it
        outside the script; ``detached=False`` stops it when the script exits or the
        client shuts down. See :mod:`fray.core._driver_exit` for the rule on every backend.
        """
        ...

    def submit_many(self, requests: Sequence[JobRequest], *, detached: bool = True) -> Sequence[JobHandle]:
        """Submit many jobs at once; their handles, in the order of ``requests``, at once.

        Every request is checked as :meth:`submit` checks it before any job starts, so a
        bad one refuses the whole call. A backend that can sends them together (``fray://``:
        a few round trips, one transaction each). ``detached`` as for :meth:`submit`.
        """
        ...

    def create_actor(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        resources: ResourceConfig | None = None,
        actor_config: ActorConfig | None = None,
        **kwargs: Any,
    ) -> ActorHandle:
        """Create the actor ``name`` as ``actor_class(*args, **kwargs)``; returns a deferred handle at once.

        ``resources=None`` (the default) reserves no cpu, memory or disk: see
        :func:`fray.actor.actor_resources`. ``actor_config`` sets concurrency, restarts
        and lifetime (:class:`~fray.actor_config.ActorConfig`); a field the backend cannot
        honour raises :class:`~fray.errors.ConfigError` naming it.
        """
        ...

    def create_actor_group(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        count: int,
        resources: ResourceConfig | None = None,
        actor_config: ActorConfig | None = None,
        **kwargs: Any,
    ) -> ActorGroup:
        """Create ``count`` actors named ``{name}-0`` ... ``{name}-{count-1}``, each its own job."""
        ...

    def host_actor(
        self, actor_class: type, *args: Any, name: str, actor_config: ActorConfig | None = None, **kwargs: Any
    ) -> HostedActor:
        """Create the actor ``name`` for the caller to stop with ``HostedActor.shutdown()`` (marin's API)."""
        ...

    def create_queue(self, name: str, *, exist_ok: bool = False) -> Queue[Any]:
        """A named queue with leases (see :mod:`fray.queue`); ``exist_ok`` attaches to an existing one.

        Backends without queues refuse with ``ConfigError`` naming the alternatives.
        """
        ...

    def shutdown(self, wait: bool = True) -> None:
        """Stop the client's jobs and actors; ``wait`` for running jobs to finish first."""
        ...

    def __enter__(self) -> Client: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


VALID_SPECS = (
    "local",
    "local?threads=N",
    "ray",
    "ray?namespace=NAME",
    "ray://HOST:PORT[?namespace=NAME]",
    "fray://HOST:PORT",
    "iris://HOST:PORT[?workspace=PATH]",
    "iris (inside an Iris task)",
    "monarch",
    "monarch?procs=N",
)


@dataclass(frozen=True)
class ClientSpec:
    """A parsed ``FRAY_CLIENT_SPEC``: scheme, optional ``host:port``, options from the query string."""

    scheme: str
    address: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    text: str = ""

    def invalid(self, problem: str) -> ConfigError:
        """An error about this spec that lists the valid forms."""
        return ConfigError(f"client spec {self.text!r}: {problem}; valid forms: {', '.join(VALID_SPECS)}")

    def only(self, backend: str, *names: str) -> dict[str, str]:
        """The options, once any that ``backend`` does not take (not among ``names``) was refused by name."""
        unknown = set(self.options) - set(names)
        if unknown:
            takes = ", ".join(f"{name}=..." for name in names) or "no options"
            raise self.invalid(f"unknown option(s) {sorted(unknown)} for {backend} (it takes {takes})")
        return self.options


# scheme -> (module, class); the class has a ``from_spec(ClientSpec)`` constructor.
# Imported lazily so that optional engines cost nothing unless used.
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "local": ("fray.local", "LocalClient", ""),
    "ray": ("fray.ray", "RayClient", 'pip install "fray[ray]"'),
    "fray": ("fray.cluster.client", "ClusterClient", ""),
    "iris": ("fray.iris.client", "IrisClient", 'pip install "fray[iris]" (Python >= 3.12)'),
    "monarch": ("fray.monarch", "MonarchClient", 'pip install "fray[monarch]"'),
}


def detect_spec() -> str | None:
    """The spec of the engine this process runs inside, when that engine marks its processes.

    Only environment variables are read, so finding nothing costs nothing and imports
    no engine: Iris sets ``IRIS_TASK_ID`` and ``IRIS_CONTROLLER_ADDRESS`` on every task.
    """
    if os.environ.get("IRIS_TASK_ID") and os.environ.get("IRIS_CONTROLLER_ADDRESS"):
        return "iris"
    return None


def parse_client_spec(text: str) -> ClientSpec:
    """Parse a client spec such as ``"local?threads=4"`` or ``"fray://host:7100"``; raise ConfigError if malformed."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"client spec {text!r} is empty; valid forms: {', '.join(VALID_SPECS)}")
    text = text.strip()
    parts = urlsplit(text)
    if parts.scheme:
        scheme, address = parts.scheme, parts.netloc or None
        if parts.path not in ("", "/"):
            raise ClientSpec(scheme, text=text).invalid(f"unexpected path {parts.path!r}")
    else:
        scheme, address = parts.path, None
    try:
        options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError:
        raise ClientSpec(scheme, text=text).invalid(f"malformed options {parts.query!r}") from None
    spec = ClientSpec(scheme, address, options, text)
    if scheme not in _BACKENDS:
        raise spec.invalid(f"unknown backend {scheme!r}")
    if address is not None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise spec.invalid(f"address {address!r} must be HOST:PORT")
    return spec


def client_from_spec(text: str) -> Client:
    """Build a new client for a spec string (see :data:`VALID_SPECS`)."""
    spec = parse_client_spec(text)
    module_name, class_name, install = _BACKENDS[spec.scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" ({install})" if install else ""
        raise ConfigError(f"client spec {text!r}: the {spec.scheme!r} backend is not installed{hint}: {exc}") from exc
    backend = getattr(module, class_name, None)
    if backend is None:
        raise ConfigError(f"client spec {text!r}: the {spec.scheme!r} backend is not available in this version of fray")
    client: Client = backend.from_spec(spec)
    return client


_current: contextvars.ContextVar[Client | None] = contextvars.ContextVar("fray_current_client", default=None)
_defaults: dict[str, Client] = {}
_iris_clients: dict[int, tuple[object, Client]] = {}
_defaults_lock = threading.Lock()


def current_client() -> Client:
    """The client for the calling code.

    In order: the client set with :func:`set_current_client` (or the one running the
    current job or actor), else one built from ``FRAY_CLIENT_SPEC``, else the engine
    context the calling code runs in (an Iris context made current with Iris's
    ``iris_ctx_scope``, or an Iris task), else the embedded local backend. Clients
    built from the environment are made once per process and spec.
    """
    check_terminated()
    client = _current.get()
    if client is not None:
        return client
    spec = os.environ.get("FRAY_CLIENT_SPEC", "").strip()
    if not spec:
        found = _engine_context_client()
        if found is not None:
            return found
    from_environment = bool(spec)
    spec = spec or detect_spec() or "local"
    with _defaults_lock:
        client = _defaults.get(spec)
        # A default client someone shut down is replaced rather than handed out dead.
        if client is None or getattr(client, "closed", False):
            try:
                client = client_from_spec(spec)
            except ConfigError as exc:
                if from_environment:
                    _one_line_if_uncaught(exc, "FRAY_CLIENT_SPEC")
                raise
            _defaults[spec] = client
        return client


_uncaught_quietly: list[BaseException] = []  # the latest error to print as one line if nothing catches it
_quiet_hooks: list[object] = []  # the sys.excepthook this module installed, once


def _one_line_if_uncaught(exc: BaseException, source: str) -> None:
    """If nothing catches ``exc`` (a script's mistake in ``source``), end the script with one line, not a traceback.

    The exception is raised as usual (code may catch it); only Python's report of an uncaught
    one changes, through ``sys.excepthook``, and only for this exception. ``FRAY_DEBUG=1``
    keeps the traceback.
    """
    if os.environ.get("FRAY_DEBUG", "").lower() in ("1", "true", "yes"):
        return
    _uncaught_quietly[:] = [exc]
    if sys.excepthook in _quiet_hooks:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if _uncaught_quietly and value is _uncaught_quietly[0]:
            print(f"fray: {source}: {value} (FRAY_DEBUG=1 shows the traceback)", file=sys.stderr)
            return
        previous(kind, value, tb)

    _quiet_hooks[:] = [hook]
    sys.excepthook = hook


def _engine_context_client() -> Client | None:
    """A client for the Iris context the calling code runs in (Iris's ``iris_ctx()``), else None.

    Only looked up when the program already imported Iris's client: finding nothing costs
    nothing and imports no engine. One Fray client per Iris client, so that jobs submitted
    through it are shut down together.
    """
    module = sys.modules.get("iris.client.client")
    get_ctx = getattr(module, "get_iris_ctx", None)
    if get_ctx is None:
        return None
    ctx = get_ctx()
    iris = getattr(ctx, "client", None)
    if iris is None:
        return None
    with _defaults_lock:
        held = _iris_clients.get(id(iris))
        if held is not None and held[0] is iris and not getattr(held[1], "closed", False):
            return held[1]
        backend = getattr(importlib.import_module(_BACKENDS["iris"][0]), _BACKENDS["iris"][1])
        client: Client = backend.from_iris_client(iris)
        _iris_clients[id(iris)] = (iris, client)  # the Iris client is held, so its id is not reused
        return client


@contextmanager
def set_current_client(client: Client) -> Iterator[Client]:
    """Make ``client`` the current client inside the ``with`` block; the previous one is restored on exit.

    Clients are checked by what they are, not by their class: any object may stand for a
    client (marin's tests install fakes that only record what they are asked, or are mere
    markers), so only what is certainly a mistake is refused with a ``ConfigError``: None,
    a spec string (use :func:`client_from_spec`), a class instead of an instance, a module.
    """
    if client is None or isinstance(client, str | bytes | type | types.ModuleType):
        hint = ""
        if isinstance(client, str):
            hint = f"; to make a client from a spec use set_current_client(client_from_spec({client!r}))"
        elif isinstance(client, type):
            hint = f"; pass an instance, e.g. {client.__name__}()"
        raise ConfigError(f"set_current_client needs a client object, got {client!r}{hint}")
    token = _current.set(client)
    try:
        yield client
    finally:
        _current.reset(token)


def _bind_client(client: Client) -> contextvars.Token[Client | None]:
    """Backends call this in a job's context so that ``current_client()`` there returns ``client``."""
    return _current.set(client)
