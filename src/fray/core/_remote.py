"""One form for an exception that crossed a boundary: a job, a task, an actor call.

Every backend captures a user exception the same way (:meth:`RemoteFailure.capture`:
the type's qualified name, the message, the traceback trimmed to the user's own
frames, and the exception pickled when it survives a round trip), ships it the same
way (:meth:`RemoteFailure.encode`: a small data-only header that anyone can read
without unpickling, and the pickled exception as opaque bytes that only the caller
opens), and turns it into the same exception for the caller (:func:`job_failed`,
:func:`remote_error`): an instance of :class:`~fray.errors.JobFailed` or
:class:`~fray.errors.RemoteError` that is also an instance of the user's own class.
"""

from __future__ import annotations

import contextlib
import copyreg
import json
import os
import pickle
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import cloudpickle

from fray.errors import ActorDiedError, FrayError, JobFailed, RemoteError, _qualified, _Remote, _short

__all__ = [
    "RemoteFailure",
    "actor_died",
    "copy_died",
    "job_failed",
    "reduce_remote",
    "remote_error",
    "self_ended",
    "user_traceback",
]

_MAGIC = b"FRF1"
_HEADER = struct.Struct("!4sI")
_FRAY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _is_fray_frame(tb: TracebackType) -> bool:
    filename = tb.tb_frame.f_code.co_filename
    return filename.startswith(_FRAY_DIR) or filename.startswith("<frozen runpy>")


def user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as text, without the frames of Fray's own machinery above the user's code.

    Only the leading frames (how Fray called into user code) are dropped; frames of
    Fray code that the user's code called stay, so a failure inside Fray still shows.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _is_fray_frame(tb):
        tb = tb.tb_next
    if tb is not None and _is_fray_frame(tb) and tb.tb_next is None and exc.__traceback__ is not tb:
        tb = None
    return "".join(traceback.TracebackException(type(exc), exc, tb, compact=True).format())


def _pickle_exception(exc: BaseException) -> bytes:
    """``exc`` cloudpickled, or ``b""`` when it cannot be pickled or not rebuilt (custom ``__init__``)."""
    try:
        blob = bytes(cloudpickle.dumps(exc))
        return blob if isinstance(pickle.loads(blob), BaseException) else b""
    except Exception:
        return b""


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised by user code, in the form every backend ships it in.

    ``pickled`` is empty when the exception could not be pickled (or not rebuilt);
    the caller then gets a :class:`~fray.errors.RemoteError` naming type, message
    and traceback.
    """

    type_name: str
    message: str
    traceback_text: str = ""
    pickled: bytes = b""

    @classmethod
    def capture(cls, exc: BaseException, *, traceback_text: str | None = None) -> RemoteFailure:
        """Capture ``exc`` where it was raised (its traceback trimmed to the user's frames)."""
        text = user_traceback(exc) if traceback_text is None else traceback_text
        return cls(_qualified(type(exc)), _message(exc), text, _pickle_exception(exc))

    @property
    def summary(self) -> str:
        """``"ValueError: message"``: how the failure reads in one line."""
        short = _short(self.type_name)
        return f"{short}: {self.message}" if self.message else short

    def encode(self) -> bytes:
        """Bytes to ship: a JSON header (readable without unpickling anything) then the pickled exception."""
        header = json.dumps(
            {"type": self.type_name, "message": self.message, "traceback": self.traceback_text}
        ).encode()
        return _HEADER.pack(_MAGIC, len(header)) + header + self.pickled

    @classmethod
    def decode(cls, data: bytes) -> RemoteFailure:
        """The failure :meth:`encode` wrote; ``ValueError`` if ``data`` is not one."""
        if len(data) < _HEADER.size:
            raise ValueError("not an encoded failure: too short")
        magic, length = _HEADER.unpack_from(data)
        if magic != _MAGIC or _HEADER.size + length > len(data):
            raise ValueError("not an encoded failure: bad header")
        header = json.loads(bytes(data[_HEADER.size : _HEADER.size + length]))
        if not isinstance(header, dict):
            raise ValueError("not an encoded failure: header is not an object")
        return cls(
            str(header.get("type", "")),
            str(header.get("message", "")),
            str(header.get("traceback", "")),
            bytes(data[_HEADER.size + length :]),
        )

    def original(self) -> BaseException | None:
        """The original exception, unpickled here; None if it was not pickled or cannot be rebuilt here."""
        if not self.pickled:
            return None
        try:
            exc = pickle.loads(self.pickled)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as err:  # a broken __str__ must not hide the failure itself
        return f"<str() failed: {err!r}>"


# ----- building the exception the caller sees -------------------------------------------------

_DUALS: dict[tuple[type, type], type | None] = {}
_DUALS_LOCK = threading.Lock()
# Attributes Fray owns on the exception it raises: the original exception's own attributes
# (copied over so ``e.errno`` or ``e.code`` keep working) never replace these.
_FRAY_FIELDS = frozenset(
    {"_text", "_reason", "_failure", "job_id", "traceback_text", "type_name", "exit_code", "cause"}
)


def _dual_class(base: type[FrayError], user_cls: type, reducer: Callable[[Any], Any] | None = None) -> type | None:
    """``base`` and ``user_cls`` in one class (like Ray's ``RayTaskError(ValueError)``), or None if impossible.

    Instances pickle through ``reducer`` (default :func:`reduce_remote`), which rebuilds the dual on the other side.
    """
    if not issubclass(user_cls, Exception) or issubclass(user_cls, base):
        return None
    key = (base, user_cls)
    with _DUALS_LOCK:
        if key in _DUALS:
            return _DUALS[key]
        try:
            dual: type | None = type(
                f"{base.__name__}({user_cls.__name__})",
                (base, user_cls),
                {"__module__": base.__module__, "__doc__": base.__doc__},
            )
        except TypeError:  # e.g. an incompatible instance layout or a final class
            dual = None
        if dual is not None:
            copyreg.pickle(dual, reducer or reduce_remote)
        _DUALS[key] = dual
        return dual


def _user_class(failure: RemoteFailure | None, original: BaseException | None) -> type | None:
    if original is not None:
        return type(original)
    if failure is None or not failure.type_name:
        return None
    # Only classes whose module this process already imported: never import by a peer's say-so.
    module_name, _, qualname = failure.type_name.rpartition(".")
    module = sys.modules.get(module_name or "builtins")
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def _instantiate(base: type[_Remote], user_cls: type | None, original: BaseException | None) -> _Remote:
    dual = _dual_class(base, user_cls) if user_cls is not None else None
    if dual is not None and user_cls is not None:
        args = original.args if original is not None else ()
        # The user's built-in base owns the instance layout (OSError's is larger than RuntimeError's,
        # whose __new__ comes first in the MRO and refuses such a class).
        layout = next((c for c in user_cls.__mro__ if c.__module__ == "builtins"), BaseException)
        for attempt, make in ((args, dual.__new__), ((), dual.__new__), (args, layout.__new__), ((), layout.__new__)):
            try:
                obj = make(dual, *attempt)
            except Exception:
                continue
            assert isinstance(obj, _Remote)
            # Built-in bases keep C-level fields (OSError.errno, ...) that only their __init__ sets;
            # theirs is side-effect free, unlike a user class's own __init__, which is never called.
            if layout not in (BaseException, Exception):
                with contextlib.suppress(Exception):
                    layout.__init__(obj, *attempt)  # type: ignore[misc]
            return obj
    obj = base.__new__(base)
    return obj


def _finish(obj: _Remote, original: BaseException | None, failure: RemoteFailure | None, text: str) -> None:
    obj._failure = failure  # type: ignore[attr-defined]
    if original is not None:
        for key, value in (getattr(original, "__dict__", None) or {}).items():
            if key not in _FRAY_FIELDS:
                obj.__dict__[key] = value
        obj.args = original.args
    else:
        obj.args = (text,)


def job_failed(
    job_id: str,
    message: str,
    failure: RemoteFailure | None = None,
    *,
    original: BaseException | None = None,
    exit_code: int | None = None,
) -> JobFailed:
    """The :class:`JobFailed` a job's ``wait()`` raises; also of the user's class when the job raised."""
    if original is None and failure is not None:
        original = failure.original()
    user_cls = _user_class(failure, original)
    obj = _instantiate(JobFailed, user_cls, original)
    assert isinstance(obj, JobFailed)
    text = failure.traceback_text if failure is not None else ""
    obj._init_job(job_id, message, cause=original, traceback_text=text, exit_code=exit_code)
    obj.type_name = failure.type_name if failure is not None else ""
    _finish(obj, original, failure, obj._text)
    return obj


def remote_error(failure: RemoteFailure, *, original: BaseException | None = None) -> RemoteError:
    """The :class:`RemoteError` a failed actor call raises; also of the user's class where it exists here."""
    if original is None:
        original = failure.original()
    user_cls = _user_class(failure, original)
    obj = _instantiate(RemoteError, user_cls, original)
    assert isinstance(obj, RemoteError)
    obj._init_remote(failure.type_name, failure.message, failure.traceback_text, original)
    _finish(obj, original, failure, obj._text)
    return obj


def reduce_remote(err: _Remote) -> tuple[Callable[..., _Remote], tuple[Any, ...]]:
    """Pickle support for :class:`JobFailed` / :class:`RemoteError` and their dual classes."""
    failure: RemoteFailure | None = getattr(err, "_failure", None)
    if failure is None and err.cause is not None:
        failure = RemoteFailure.capture(err.cause, traceback_text=err.traceback_text)
    encoded = failure.encode() if failure is not None else None
    if isinstance(err, JobFailed):
        return (
            _rebuild_job_failed,
            (err.job_id, err._reason, encoded, err.traceback_text, err.exit_code),
        )
    assert isinstance(err, RemoteError)
    return (_rebuild_remote_error, (err.type_name, err._reason, encoded, err.traceback_text))


def _rebuild_job_failed(
    job_id: str, message: str, encoded: bytes | None, traceback_text: str, exit_code: int | None
) -> JobFailed:
    if encoded is None:
        return JobFailed(job_id, message=message, traceback_text=traceback_text, exit_code=exit_code)
    return job_failed(job_id, message, RemoteFailure.decode(encoded), exit_code=exit_code)


def _rebuild_remote_error(type_name: str, message: str, encoded: bytes | None, traceback_text: str) -> RemoteError:
    if encoded is None:
        return RemoteError(type_name, message, traceback_text)
    return remote_error(RemoteFailure.decode(encoded))


# Plain instances built here carry their failure in the data-only form too.
copyreg.pickle(JobFailed, reduce_remote)  # type: ignore[arg-type]
copyreg.pickle(RemoteError, reduce_remote)  # type: ignore[arg-type]


# ----- an actor's death, of the user's class when its own code caused it ------------------------


def _users_class(cause: BaseException | None) -> type | None:
    """The user's exception class behind ``cause`` (a user exception, or a Fray error standing for one)."""
    if isinstance(cause, ActorDiedError):
        return _users_class(cause.__cause__)
    if isinstance(cause, _Remote):
        return _user_class(getattr(cause, "_failure", None), cause.cause)
    if cause is None or isinstance(cause, FrayError):
        return None
    return type(cause)


def actor_died(message: str, cause: BaseException | None = None) -> ActorDiedError:
    """The :class:`ActorDiedError` callers see; ``__cause__`` is ``cause``.

    When the actor's own code caused the death (its constructor raised ``KeyError``, or it
    failed itself with one), the error is also an instance of that class, as a failed job's
    :class:`JobFailed` is: ``except KeyError`` catches it on every backend. Copies made for
    each caller (``actor_died(str(death), death.__cause__)``) keep that.
    """
    user_cls = _users_class(cause)
    dual = _dual_class(ActorDiedError, user_cls, _reduce_actor_died) if user_cls is not None else None
    err: ActorDiedError = ActorDiedError.__new__(dual) if dual is not None else ActorDiedError.__new__(ActorDiedError)
    err.args = (message,)
    err.__cause__ = cause
    return err


def copy_died(death: ActorDiedError) -> ActorDiedError:
    """A fresh copy of an actor's death for each caller: one object raised from many threads tangles its traceback."""
    return actor_died(str(death), death.__cause__)


def self_ended(name: str, error: BaseException | None) -> ActorDiedError:
    """The death of actor ``name`` that ended itself: ``current_actor().exit()`` (``error`` None) or ``fail(error)``."""
    if error is None:
        return ActorDiedError(f"actor {name!r} ended itself (current_actor().exit())")
    remote = RemoteFailure.capture(error)
    return actor_died(f"actor {name!r} failed itself: {remote.summary}", remote_error(remote, original=error))


def _reduce_actor_died(err: ActorDiedError) -> tuple[Callable[..., ActorDiedError], tuple[Any, ...]]:
    return actor_died, (str(err), err.__cause__)
