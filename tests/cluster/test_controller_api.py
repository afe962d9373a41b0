"""The controller's API is declared once (fray.cluster.protocol.controller_api): the client proxy and the
server's handlers are derived from that table and must cover it exactly; the server enforces each method's
declared access; malformed arguments and undeclared names are refused."""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from fray.cluster.protocol import controller_api as api
from fray.cluster.protocol.controller_api import CONTROLLER_API, Access, Method
from fray.cluster.protocol.controller_client import ControllerProxy, controller_client
from fray.cluster.protocol.credentials import WORKER, Credential, user_principal
from fray.cluster.protocol.messages import WorkerCommands
from fray.cluster.rpc.datarpc import DataClient
from fray.cluster.server.controller import Controller
from fray.cluster.server.controller import _api as server_api
from fray.errors import PermissionDenied, ProtocolError

# ControllerProxy's public methods that are not a call of the table.
_NOT_CALLS = {"close", "with_timeout", "queue"}


class _Recorded(Exception):
    def __init__(self, method: Method[Any]) -> None:
        self.method = method


class _RecordingProxy(ControllerProxy):
    """Records which table entry a proxy method invokes, and sends nothing."""

    def _invoke(self, method: Method[Any], *args: Any, **kwargs: Any) -> Any:
        raise _Recorded(method)


class _FakeRpc:
    address = "nowhere:0"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], dict[str, Any]]] = []

    def call(self, method: str, args: list[Any], kwargs: dict[str, Any], timeout: float | None = None) -> Any:
        self.calls.append((method, args, kwargs))
        return None


def _invoked_by_proxy() -> dict[str, Method[Any]]:
    """Each public ControllerProxy method and the table entry it invokes (called with placeholder arguments)."""
    proxy = _RecordingProxy(mock.Mock(), timeout=1.0)
    invoked: dict[str, Method[Any]] = {}
    for name, function in inspect.getmembers(ControllerProxy, inspect.isfunction):
        if name.startswith("_") or name in _NOT_CALLS:
            continue
        signature = inspect.signature(function)
        args = [
            None
            for p in list(signature.parameters.values())[1:]
            if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        kwargs = {
            p.name: None for p in signature.parameters.values() if p.default is p.empty and p.kind is p.KEYWORD_ONLY
        }
        with pytest.raises(_Recorded) as recorded:
            getattr(proxy, name)(*args, **kwargs)
        invoked[name] = recorded.value.method
    return invoked


def test_every_declared_method_has_one_proxy_method_that_calls_it() -> None:
    invoked = _invoked_by_proxy()
    assert sorted(m.name for m in invoked.values()) == sorted(CONTROLLER_API), (
        "each table entry needs exactly one typed ControllerProxy method (a one-liner over _invoke)"
    )
    for proxy_name, method in invoked.items():
        assert CONTROLLER_API[method.name] is method
        # Named as the RPC, except `list`, which would shadow the builtin in the class's annotations.
        assert proxy_name == method.name or (method.name, proxy_name) == ("list", "list_registered")


def test_the_servers_handlers_are_exactly_the_table() -> None:
    handlers = server_api.ControllerAPI(mock.Mock())._handlers  # construction checks it
    assert set(handlers) == set(CONTROLLER_API)


@pytest.mark.parametrize("change", ["declared without a handler", "handled but not declared"])
def test_a_table_and_handlers_that_differ_are_a_startup_error(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    table = dict(CONTROLLER_API)
    if change == "declared without a handler":
        table["frobnicate"] = Method("frobnicate", Access.READ, (), api.STR)
    else:
        del table["health"]
    monkeypatch.setattr(server_api, "CONTROLLER_API", table)
    with pytest.raises(RuntimeError, match=change):
        server_api.ControllerAPI(mock.Mock())


def test_only_creating_and_preempting_are_not_retried() -> None:
    assert {name for name, m in CONTROLLER_API.items() if not m.idempotent} == {
        "submit",
        "submit_many",
        "preempt",
        "create_token",
        "join",
    }


def test_a_name_not_in_the_table_or_a_wrong_call_is_refused_before_sending() -> None:
    rpc = _FakeRpc()
    proxy = ControllerProxy(rpc)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="not a method of the controller's API"):
        proxy._invoke(Method("frobnicate", Access.READ, (), api.STR))
    with pytest.raises(ProtocolError):
        proxy._invoke(Method("job", Access.ADMIN, (api.Param("job_id", api.STR),), api.VIEW), "j-1")  # not the table's
    with pytest.raises(TypeError, match="missing required argument 'job_id'"):
        proxy._invoke(api.JOB)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        proxy._invoke(api.JOB, "j-1", nope=1)
    with pytest.raises(TypeError, match="positional"):
        proxy._invoke(api.SUBMIT, object(), "alice")  # user is keyword-only
    assert rpc.calls == []


def test_the_proxy_sends_every_argument_encoded_keyword_only_ones_by_name() -> None:
    rpc = _FakeRpc()
    proxy = ControllerProxy(rpc)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):  # the fake answers nil, not a list of views
        proxy.wait(["j-1"], 2)
    assert rpc.calls == [("wait", [["j-1"], 2.0], {"any_finished": True})]


# -- a real controller ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Controller, str]]:
    token = secrets.token_hex(16)
    ctl = Controller(str(tmp_path_factory.mktemp("ctl") / "controller.db"), token=token).start()
    try:
        yield ctl, token
    finally:
        ctl.stop()


# One method of each access class, called by each kind of caller: None if allowed, else the refusal.
_CALLS = {
    Access.READ: ("health", lambda c: c.health()),
    Access.USER: ("list_jobs", lambda c: c.list_jobs()),
    Access.WORKER: ("poll", lambda c: c.poll("w-unknown", 0, 0.0)),
    Access.ADMIN: ("list_credentials", lambda c: c.list_credentials()),
    Access.JOIN: ("join", lambda c: c.join("w-joined")),
}
_EXPECTED: dict[str, dict[Access, str | None]] = {
    "admin": {
        Access.READ: None,
        Access.USER: None,
        Access.WORKER: None,
        Access.ADMIN: None,
        Access.JOIN: "join needs a join token",
    },
    "user": {
        Access.READ: None,
        Access.USER: None,
        Access.WORKER: "poll needs the worker credential",
        Access.ADMIN: "list_credentials needs the cluster token",
        Access.JOIN: "join needs a join token",
    },
    "worker": {
        Access.READ: None,
        Access.USER: "a worker credential may not call list_jobs",
        Access.WORKER: None,
        Access.ADMIN: "list_credentials needs the cluster token",
        Access.JOIN: "a worker credential may not call join",
    },
    "join token": {
        Access.READ: "a join token may only join a worker, not call health",
        Access.USER: "a join token may only join a worker, not call list_jobs",
        Access.WORKER: "a join token may only join a worker, not call poll",
        Access.ADMIN: "a join token may only join a worker, not call list_credentials",
        Access.JOIN: None,
    },
}


def test_each_access_class_admits_exactly_its_callers(controller: tuple[Controller, str]) -> None:
    ctl, token = controller
    assert {CONTROLLER_API[name].access for name, _ in _CALLS.values()} == set(Access)
    assert all(CONTROLLER_API[name].access is access for access, (name, _) in _CALLS.items())
    admin = controller_client(ctl.address, token)
    join_line = admin.create_token("worker", 600)["line"]
    credentials = {
        "admin": token,
        "user": Credential.mint(token.encode(), user_principal("alice")),
        "worker": Credential.mint(token.encode(), WORKER),
        "join token": Credential.decode(join_line),
    }
    try:
        for who, expected in _EXPECTED.items():
            client = controller_client(ctl.address, credentials[who])
            try:
                for access, (name, call) in _CALLS.items():
                    refusal = expected[access]
                    if refusal is None:
                        answer = call(client)
                        if name == "join":
                            assert isinstance(answer, Credential) and "w-joined" in answer.principal
                        if name == "poll":
                            assert isinstance(answer, WorkerCommands)
                    else:
                        with pytest.raises(PermissionDenied, match=refusal):
                            call(client)
            finally:
                client.close()
    finally:
        admin.close()


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("job", [42], {}),  # not a string
        ("wait", [["j-1"], 1.0], {"any_finished": "yes"}),  # not a boolean
        ("logs", ["j-1", None, True], {}),  # a boolean is not a line id
        ("preempt", ["j-1", 1.5], {}),  # a replica is a whole number
        ("submit", [{"name": "x"}, "alice"], {}),  # a spec travels as its encoded bytes
        ("lend_cpu", [["j-1", "zero", 0], True], {}),  # a malformed task key
        ("job", [], {}),  # a missing argument
        ("job", ["j-1", "extra"], {}),  # one too many
        ("health", [], {"verbose": True}),  # an unknown keyword
        ("frobnicate", [], {}),  # no such method
    ],
)
def test_malformed_calls_are_a_protocol_error(
    controller: tuple[Controller, str], method: str, args: list[Any], kwargs: dict[str, Any]
) -> None:
    ctl, token = controller
    rpc = DataClient(ctl.address, token.encode())
    try:
        with pytest.raises(ProtocolError):
            rpc.call(method, args, kwargs)
    finally:
        rpc.close()
