"""The exceptions Fray raises.

Every error Fray raises on purpose derives from :class:`FrayError`, so callers can
catch Fray's failures without catching their own bugs. Errors about bad input also
derive from the matching built-in (``ValueError``, ``TypeError``) so that generic
code that validates input keeps working.
"""

from __future__ import annotations


class FrayError(Exception):
    """Base class of every error raised by Fray itself."""


class ConfigError(FrayError, ValueError):
    """A value given to Fray is malformed: a resource size, a device, a client spec, a job name.

    The message says what was given, what is accepted, and how to fix it.
    """


class SerializationError(FrayError, TypeError):
    """An argument, entrypoint or result cannot be pickled to cross a process boundary."""


class JobFailed(FrayError):
    """A job ended in the FAILED state.

    ``cause`` is the job's original exception when the job was a Python callable
    (it is also chained as ``__cause__``), ``traceback_text`` the remote traceback as
    text, and ``exit_code`` the process exit code for binary jobs.
    """

    def __init__(
        self,
        job_id: str,
        message: str,
        *,
        cause: BaseException | None = None,
        traceback_text: str = "",
        exit_code: int | None = None,
    ) -> None:
        super().__init__(f"job {job_id!r} failed: {message}")
        self.job_id = job_id
        self.cause = cause
        self.traceback_text = traceback_text
        self.exit_code = exit_code
        if cause is not None:
            self.__cause__ = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_job_failed, (self.job_id, self.args[0], self.cause, self.traceback_text, self.exit_code))

    def __str__(self) -> str:
        text = str(self.args[0])
        if self.traceback_text:
            text += "\n\nRemote traceback:\n" + self.traceback_text.rstrip()
        return text


def _rebuild_job_failed(
    job_id: str, text: str, cause: BaseException | None, traceback_text: str, exit_code: int | None
) -> JobFailed:
    err = JobFailed(job_id, "", cause=cause, traceback_text=traceback_text, exit_code=exit_code)
    err.args = (text,)
    return err


class JobAlreadyExists(FrayError):
    """A job or actor with this name is already live where the backend requires unique names."""


class JobTerminated(FrayError):
    """Raised inside a job (at its next Fray call) after the job was terminated from outside."""


class ActorDiedError(FrayError):
    """The actor is gone: its constructor raised, its process died, or it was shut down.

    Calls to it will never succeed; ``__cause__`` holds the original error when known.
    """


class ActorUnavailableError(FrayError):
    """The actor could not be reached, or was replaced by a new instance under the same name.

    When raised for a call already sent, the call may or may not have run.
    """


class RemoteError(FrayError):
    """An exception raised remotely whose type cannot be rebuilt on this side.

    ``type_name`` is the qualified name of the original type, ``traceback_text`` the remote traceback.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[object, ...]:
        return (RemoteError, (self.type_name, self.message, self.traceback_text))
