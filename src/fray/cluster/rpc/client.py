"""The actor client: a handle that resolves an actor by name and calls it over the wire.

Layers, bottom up (each its own module):

* :class:`~fray.cluster.rpc._connection.Connection` -- one authenticated socket to one
  server: requests in flight by request id, who reads responses (the *read role*),
  the outbox that batches pipelined requests, and the rule that decides what a
  broken connection means for each request (sent or not).
* :class:`~fray.cluster.rpc._channel.Channel` -- what one :class:`ActorClient` is bound to:
  resolution through the resolver, the cached connection, the actor id it has seen,
  re-resolution.
* :mod:`fray.cluster.rpc._calls` -- a call's future, its timeout, and how an error report
  becomes the exception the caller sees.
* :class:`ActorClient` (here) -- the user-facing handle: ``client.method(...)``
  blocks, ``client.method.remote(...)`` returns an :class:`~fray.actor.ActorFuture`.

The at-most-once rule: a call is retried (up to ``RpcOptions.retries``) only when it
provably never reached the actor -- resolution failed, the connection could not be
opened, the actor was not registered, or the frame could not be written. Once a
request is on the wire, a broken connection fails it with
:class:`~fray.errors.ActorUnavailableError` saying it may or may not have run.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar, cast, get_args

from fray.actor import ActorFuture, check_actor_method
from fray.cluster.rpc import wire
from fray.cluster.rpc._calls import CallFuture, rebuild_error, settle, timer
from fray.cluster.rpc._channel import Channel, backoff, control
from fray.cluster.rpc._connection import Connection, NotSent, Pending
from fray.cluster.rpc.namespace import default_token, resolve_namespace
from fray.cluster.rpc.protocol import (
    CONTROL_LIST_ACTORS,
    CONTROL_LIST_METHODS,
    ActorInfo,
    ErrorCode,
    MethodInfo,
    call_request,
    parse_actor_url,
)
from fray.cluster.rpc.resolver import Resolver
from fray.core._serialization import check_call_picklable
from fray.errors import ActorUnavailableError, CallNotSentError, ConfigError, RpcTimeoutError, SerializationError

__all__ = [
    "ActorClient",
    "CallNotSentError",
    "RpcOptions",
    "RpcTimeoutError",
    "list_actors",
    "list_methods",
    "parse_actor_url",
]

T = TypeVar("T")
R = TypeVar("R", covariant=True)
S = TypeVar("S")

# How long _fray_ready() keeps polling an actor that is not up yet when no timeout is set.
_READY_TIMEOUT = 300.0


@dataclass(frozen=True)
class RpcOptions:
    """How a client makes its calls.

    ``timeout``: seconds for a whole call, resolution included (None: no limit; a
    dead server is still detected by the connection breaking). ``retries``: how many
    more times a call that provably did not reach the actor is attempted.
    """

    timeout: float | None = None
    retries: int = 0

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"RpcOptions.timeout must be positive or None, got {self.timeout!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"RpcOptions.retries must be an int >= 0, got {self.retries!r}")


class ActorClient(Generic[T]):
    """A handle to the actor ``name``, found through ``resolver``.

    ``client.method(*args)`` calls and blocks; ``client.method.remote(*args)`` returns
    an :class:`~fray.actor.ActorFuture` at once (the first call resolves and connects
    in the calling thread, so calls leave in program order). Calls from one client
    share one connection and run on the actor in the order they were made.

    ``cls`` (or the subscripted form ``ActorClient[Counter](resolver, name)``) lets the
    client reject unknown methods locally; :meth:`typed` returns the client typed as
    ``cls`` so a type checker checks blocking calls against the real signatures.

    ``namespace`` defaults to the resolver's (when it has one), else the process
    default. ``token`` defaults to ``FRAY_TOKEN``; it is never pickled, so a handle
    sent to another process uses that process's token.
    """

    def __init__(
        self,
        resolver: Resolver,
        name: str,
        options: RpcOptions = RpcOptions(),
        *,
        cls: type[T] | None = None,
        namespace: str | None = None,
        token: str | bytes | None = None,
    ) -> None:
        if namespace is None:
            namespace = getattr(resolver, "namespace", None)
        self._options = options
        self._cls: type[Any] | None = cls
        self._methods: dict[str, _RpcMethod] = {}
        self._channel = Channel(resolver, name, resolve_namespace(namespace), default_token(token))
        self._ready: concurrent.futures.Future[None] | None = None

    @classmethod
    def _from_channel(cls, channel: Channel, options: RpcOptions, actor_cls: type[Any] | None) -> ActorClient[Any]:
        client: ActorClient[Any] = cls.__new__(cls)
        client._options = options
        client._cls = actor_cls
        client._methods = {}
        client._channel = channel
        client._ready = None
        return client

    @property
    def name(self) -> str:
        """The actor's name."""
        return self._channel.name

    @property
    def namespace(self) -> str:
        """The namespace the name is resolved in."""
        return self._channel.namespace

    @property
    def options(self) -> RpcOptions:
        """The options every call of this client uses."""
        return self._options

    def with_options(self, **changes: Any) -> ActorClient[T]:
        """A client for the same actor (sharing this one's connection) with some options changed."""
        return self._from_channel(self._channel, replace(self._options, **changes), self._cls)

    def typed(self) -> T:
        """This client, typed as the actor class: ``client.typed().incr(1)`` is a checked blocking call."""
        return cast(T, self)

    def close(self) -> None:
        """Close the cached connection (the next call reconnects)."""
        self._channel.drop()

    def __getattr__(self, method: str) -> _RpcMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        bound = self._methods.get(method)
        if bound is None:
            actor_cls = self._actor_class()
            if actor_cls is not None:
                check_actor_method(actor_cls, method)
            bound = self._methods[method] = _RpcMethod(self, method)
        return bound

    def _actor_class(self) -> type[Any] | None:
        if self._cls is None:
            args = get_args(self.__dict__.get("__orig_class__"))
            if args and isinstance(args[0], type):
                self._cls = args[0]
        return self._cls

    def __reduce__(self) -> tuple[Any, ...]:
        channel = self._channel
        return (
            _rebuild_client,
            (channel.resolver, channel.name, self._options, self._actor_class(), channel.namespace),
        )

    def __repr__(self) -> str:
        return f"ActorClient({self.name!r}, namespace={self.namespace!r})"

    def _fray_ready(self) -> concurrent.futures.Future[None]:
        """A future done once the actor resolves and answers; ActorUnavailableError if it never does in time."""
        if self._ready is None:
            self._ready = concurrent.futures.Future()
            threading.Thread(target=self._wait_ready, args=(self._ready,), name="fray-rpc-ready", daemon=True).start()
        return self._ready

    def _wait_ready(self, future: concurrent.futures.Future[None]) -> None:
        timeout = self._options.timeout if self._options.timeout is not None else _READY_TIMEOUT
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                self._channel.bind(deadline)
            except NotSent as exc:
                if time.monotonic() + backoff(attempt) >= deadline:
                    settle(
                        future,
                        exception=ActorUnavailableError(f"actor {self.name!r} not ready after {timeout}s: {exc}"),
                    )
                    return
                time.sleep(backoff(attempt))
                attempt += 1
                continue
            except BaseException as exc:
                settle(future, exception=exc)
                return
            settle(future, result=None)
            return

    # -- calls ----------------------------------------------------------------------------------

    def _submit(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], deadline: float | None, send: _Send[S]
    ) -> S:
        """Send one call with ``send(conn, segments)``; retry while it provably was not sent."""
        channel = self._channel
        attempt = 0
        reconnected = False
        while True:
            try:
                conn, actor_id = channel.bind(deadline, check_idle=send.checks_idle)
                segments = self._encode(call_request(channel.namespace, channel.name, actor_id, method, args, kwargs))
                if len(segments) > 1:
                    size = sum(memoryview(segment).nbytes for segment in segments)
                    if size > wire.DEFAULT_MAX_FRAME_BYTES:
                        raise SerializationError(
                            f"arguments of {self.name}.{method} take {size} bytes; a call carries at most "
                            f"{wire.DEFAULT_MAX_FRAME_BYTES} (put large data in shared storage and pass a reference)"
                        )
                return send(conn, segments)
            except NotSent as exc:
                channel.drop()
                if exc.stale and not reconnected:
                    reconnected = True  # the cached connection was dead: reconnect, not an attempt
                    continue
                now = time.monotonic()
                if attempt >= self._options.retries or (deadline is not None and now >= deadline):
                    raise CallNotSentError(
                        f"call {self.name}.{method} was not sent (attempt {attempt + 1} of "
                        f"{self._options.retries + 1}): {exc}"
                    ) from None
                delay = backoff(attempt)
                if deadline is not None:
                    delay = min(delay, max(deadline - now, 0.0))
                time.sleep(delay)
                attempt += 1

    def _encode(self, request: tuple[Any, ...]) -> list[Any]:
        """The CALL frame's segments; an argument that cannot be pickled is named, as on every backend."""
        try:
            return wire.encode(request)
        except SerializationError:
            # Only now, on the failure path, find and name the argument (one pickling pass on success).
            *_, method, args, kwargs = request
            check_call_picklable(self.name, method, args, kwargs)
            raise

    def _outcome(self, response: wire.Frame | BaseException, conn: Connection, method: str) -> tuple[bool, Any]:
        """Turn a response into ``(True, value)`` or ``(False, exception)``; drop a connection that failed."""
        channel = self._channel
        what = f"{channel.name}.{method}"
        if isinstance(response, BaseException):
            if isinstance(response, RpcTimeoutError):
                response = self._timeout_error(method, self._options.timeout)
            elif isinstance(response, ActorUnavailableError):
                channel.drop(conn)
            return False, response
        if response.kind is wire.FrameKind.RESULT:
            try:
                return True, wire.decode(response.segments)
            except Exception as exc:
                return False, SerializationError(f"cannot unpickle the result of {what}: {exc!r}")
        code, error = rebuild_error(response, what)
        if code is ErrorCode.NOT_FOUND:
            channel.drop(conn)
            error = ActorUnavailableError(f"{error}; the call did not run")
        elif code is ErrorCode.REPLACED:
            channel.drop(conn, forget_id=True)
            error = ActorUnavailableError(f"{error}; the call did not run, later calls go to the new instance")
        return False, error

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        timeout = self._options.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        conn, response = self._submit(method, args, kwargs, deadline, _SendAndWait(deadline))
        ok, value = self._outcome(response, conn, method)
        if ok:
            return value
        raise value

    def _call_async(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        explain: Callable[[ActorUnavailableError], BaseException] | None = None,
    ) -> ActorFuture:
        """Start a call; its future is settled by whichever thread reads the answer.

        ``explain`` (for handles that know more about the actor than the connection does)
        turns an ActorUnavailableError into the error the caller should see; it may block,
        so it runs in a thread of its own, never on the thread that read the connection.
        """
        timeout = self._options.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        future = CallFuture()
        try:
            conn, entry = self._submit(method, args, kwargs, deadline, _SendOnly(self, method, future, explain))
        except SerializationError:
            raise  # bad arguments are refused at the call, as on every backend: nothing was sent
        except BaseException as exc:
            self._fail_unsent(future, exc, explain)
            return future
        future._connection, future._deadline = conn, deadline
        if deadline is not None:
            error = self._timeout_error(method, timeout)
            timer.schedule(deadline, lambda: conn.expire(entry, error))
        return future

    @staticmethod
    def _fail_unsent(
        future: concurrent.futures.Future[Any],
        error: BaseException,
        explain: Callable[[ActorUnavailableError], BaseException] | None,
    ) -> None:
        # A call that could not be sent (e.g. the actor's process is gone) is explained like one
        # whose connection broke, and off the caller's thread: .remote() never blocks on it.
        if explain is not None and isinstance(error, ActorUnavailableError):
            threading.Thread(
                target=lambda: settle(future, exception=explain(error)), name="fray-rpc-explain", daemon=True
            ).start()
        else:
            settle(future, exception=error)

    def _complete(
        self,
        future: concurrent.futures.Future[Any],
        conn: Connection,
        method: str,
        explain: Callable[[ActorUnavailableError], BaseException] | None,
        response: wire.Frame | BaseException,
    ) -> None:
        """The callback of a ``.remote()`` call: settle its future with the outcome."""
        ok, value = self._outcome(response, conn, method)
        if ok:
            settle(future, result=value)
        else:
            self._fail_unsent(future, value, explain)

    def _timeout_error(self, method: str, timeout: float | None) -> RpcTimeoutError:
        return RpcTimeoutError(
            f"call {self.name}.{method} did not complete within {timeout}s; it may or may not have run"
        )


class _Send(Protocol[R]):
    """How :meth:`ActorClient._submit` sends a call once it has a connection and the frame's segments."""

    checks_idle: bool

    def __call__(self, conn: Connection, segments: list[Any]) -> R: ...


class _SendAndWait:
    """A blocking call: send and read the response in this thread (:meth:`Connection.call`)."""

    __slots__ = ("deadline",)
    checks_idle = False  # Connection.call looks for a dead idle server itself

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, conn: Connection, segments: list[Any]) -> tuple[Connection, wire.Frame | BaseException]:
        return conn, conn.call(wire.FrameKind.CALL, segments, self.deadline)


class _SendOnly:
    """A ``.remote()`` call: send, and settle ``future`` from whichever thread reads the response."""

    __slots__ = ("client", "explain", "future", "method")
    checks_idle = True

    def __init__(
        self,
        client: ActorClient[Any],
        method: str,
        future: concurrent.futures.Future[Any],
        explain: Callable[[ActorUnavailableError], BaseException] | None,
    ) -> None:
        self.client, self.method, self.future, self.explain = client, method, future, explain

    def __call__(self, conn: Connection, segments: list[Any]) -> tuple[Connection, Pending]:
        callback = functools.partial(self.client._complete, self.future, conn, self.method, self.explain)
        return conn, conn.request(wire.FrameKind.CALL, segments, callback)


def _rebuild_client(
    resolver: Resolver, name: str, options: RpcOptions, cls: type[Any] | None, namespace: str
) -> ActorClient[Any]:
    return ActorClient(resolver, name, options, cls=cls, namespace=namespace)


class _RpcMethod:
    """One method of an ActorClient: call it to block, or ``.remote(...)`` for a future."""

    __slots__ = ("_client", "_method")

    def __init__(self, client: ActorClient[Any], method: str) -> None:
        self._client = client
        self._method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client._call(self._method, args, kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """marin's name for :meth:`remote`: start the call, return its future."""
        return self.remote(*args, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> ActorFuture:
        """Start the call and return its future at once."""
        return self._client._call_async(self._method, args, kwargs)

    def __repr__(self) -> str:
        return f"<actor method {self._client.name}.{self._method}>"


def list_methods(client: ActorClient[Any]) -> list[MethodInfo]:
    """The remotely callable methods of the actor behind ``client``, with signatures and docstrings."""
    deadline = None if client.options.timeout is None else time.monotonic() + client.options.timeout
    try:
        conn, _ = client._channel.bind(deadline)
        return list(control(conn, CONTROL_LIST_METHODS, (client.namespace, client.name), deadline))
    except NotSent as exc:
        raise CallNotSentError(str(exc)) from None


def list_actors(
    address: str, *, namespace: str | None = None, token: str | bytes | None = None, timeout: float = 10.0
) -> list[ActorInfo]:
    """The actors served at ``address`` (``host:port``) in ``namespace`` (default: the process's)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    conn = Connection(host.strip("[]"), int(port), default_token(token), timeout)
    try:
        return list(control(conn, CONTROL_LIST_ACTORS, (resolve_namespace(namespace),), deadline))
    except NotSent as exc:
        raise CallNotSentError(str(exc)) from None
    finally:
        conn.close()
