"""How the ``fray`` command reports trouble: one ``error:`` line, one ``hint:`` line, exit code 2.

A user's mistake (a bad option, an unknown job, a cluster that is not there, a wrong
token) is a :class:`CliError`. Fray's own exceptions are translated by
:func:`as_cli_error`; anything else is a bug and is reported as one (exit 1). A
traceback is printed only with ``fray --debug`` or ``FRAY_DEBUG=1``.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

import click

from fray.errors import (
    ActorUnavailableError,
    AuthenticationError,
    ConfigError,
    FrayError,
    JobAlreadyExists,
    NotFound,
    PermissionDenied,
    ProtocolError,
    RpcTimeoutError,
)

__all__ = ["USER_ERROR", "CliError", "as_cli_error", "debug_enabled", "report", "set_debug", "set_target"]

#: The exit code of every user mistake.
USER_ERROR = 2

_state: dict[str, Any] = {"debug": False, "target": None}


def set_debug(enabled: bool) -> None:
    """Turn on tracebacks for this invocation (``fray --debug``)."""
    _state["debug"] = enabled


def debug_enabled() -> bool:
    """True with ``--debug`` or ``FRAY_DEBUG`` set to 1/true/yes."""
    return bool(_state["debug"]) or os.environ.get("FRAY_DEBUG", "").lower() in ("1", "true", "yes")


def set_target(address: str, source: str) -> None:
    """Remember which controller this invocation talks to, and how it was found, for error messages."""
    _state["target"] = (address, source)


class CliError(Exception):
    """A user's mistake: printed as ``error: MESSAGE`` and ``hint: HINT``; exit code 2 (unless told)."""

    def __init__(self, message: str, hint: str = "", exit_code: int = USER_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the error and its hint to stderr."""
        click.echo(f"error: {self.message}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _unreachable(address: str, source: str, detail: str) -> CliError:
    return CliError(
        f"cannot reach a Fray controller at {address} ({source}): {detail}",
        "start one with `fray cluster up`, or point FRAY_CLIENT_SPEC=fray://HOST:PORT (or --controller) "
        "at a running controller",
    )


def as_cli_error(exc: BaseException) -> CliError | None:
    """The user-facing form of a Fray exception, or None if ``exc`` is not a user's mistake."""
    address, source = _state["target"] or ("the controller", "")
    where = f"{address}" + (f" ({source})" if source else "")
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, AuthenticationError) and ("was revoked" in str(exc) or "has expired" in str(exc)):
        # The controller knows this credential and says why it no longer works.
        why = "was revoked" if "was revoked" in str(exc) else "has expired"
        return CliError(
            f"the controller at {where} refused this credential: it {why}",
            "ask the cluster's administrator for a new one (`fray token create --role user:NAME` prints it), "
            "and set FRAY_CREDENTIAL to it",
        )
    if isinstance(exc, AuthenticationError):
        return CliError(
            f"the controller at {where} refused this cluster token (or credential)",
            "use the token of the cluster you mean: set FRAY_TOKEN, or write it to ~/.config/fray/token "
            "(`fray cluster up` creates that file); or set FRAY_CREDENTIAL to a credential of that cluster",
        )
    if isinstance(exc, PermissionDenied):
        return CliError(
            _first_line(str(exc)),
            "run it with the credential of the job's owner, or with the cluster token (the administrator's)",
        )
    if isinstance(exc, RpcTimeoutError):
        return CliError(
            f"the controller at {where} did not answer in time: {_first_line(str(exc))}",
            "check that the controller is healthy (its log is in the cluster directory), then retry",
        )
    if isinstance(exc, ActorUnavailableError | ConnectionError):
        detail = _first_line(str(exc)).rsplit(": ", 1)[-1]
        return _unreachable(address, source or "default", detail)
    if isinstance(exc, ProtocolError):
        return CliError(
            f"{address} does not speak Fray's protocol: {_first_line(str(exc))}",
            "point --controller or FRAY_CLIENT_SPEC at a Fray controller of the same version",
        )
    if isinstance(exc, NotFound):
        text = str(exc.args[0]) if exc.args else str(exc)
        return CliError(text.removeprefix("NotFound: "), "`fray job list` shows the jobs the cluster knows")
    if isinstance(exc, JobAlreadyExists):
        return CliError(_first_line(str(exc)), "stop the live one first (`fray job stop ID`) or pick another name")
    if isinstance(exc, ConfigError):
        # Some say themselves how to fix them (the cluster CA a TLS connection needs: fray.cluster.rpc.tls.CaNotFound).
        hint = getattr(exc, "hint", "") or "fix the value and try again (`fray COMMAND --help` lists the options)"
        return CliError(_first_line(str(exc)), hint)
    if isinstance(exc, FrayError):
        return CliError(_first_line(str(exc)), "rerun with --debug (or FRAY_DEBUG=1) for details")
    return None


def report(exc: BaseException) -> int:
    """Print ``exc`` the way the CLI reports errors; return the process's exit code."""
    if isinstance(exc, click.exceptions.Abort | KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    if isinstance(exc, click.UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "fray"
        CliError(_first_line(exc.format_message()), f"see `{command} --help`").show()
        return USER_ERROR
    error = as_cli_error(exc)
    if error is None:
        if isinstance(exc, click.ClickException):
            CliError(exc.format_message(), exit_code=exc.exit_code).show()
            return exc.exit_code
        CliError(
            f"internal error: {type(exc).__name__}: {_first_line(str(exc))}",
            "rerun with --debug (or FRAY_DEBUG=1) to see the traceback, and please report it",
        ).show()
        return 1
    error.show(sys.stderr)
    return error.exit_code
