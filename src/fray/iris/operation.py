"""The future of a long-running actor call on Iris: :class:`OperationFuture`.

``handle.method.submit(...)`` starts the method as one of Iris's long-running operations
(``ActorClient.start_operation``: one short RPC that returns an operation id) instead of
holding a connection open for the call's whole run. The future polls it with short
``GetOperation`` RPCs. Like every :class:`~fray.actor.ActorFuture` it is a
``concurrent.futures.Future``: ``result()``/``exception()`` poll on the caller's own thread;
waiting on it with ``concurrent.futures.wait``/``as_completed`` or ``add_done_callback`` starts
one poller thread for it. Polls back off from 50 ms to ``poll_interval``.

``result(timeout)`` that runs out cancels the operation on the actor's server (Iris sets its
cancelled flag and discards the result) and raises ``TimeoutError``. An operation the server
no longer knows (its actor restarted, or its result was already taken) raises
:class:`~fray.errors.ActorUnavailableError` saying it was lost.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from iris.rpc import actor_pb2

from fray.actor import ActorFuture
from fray.errors import ActorUnavailableError
from fray.iris._wire import CallFailed, raised, unpickled

__all__ = ["OperationFuture"]

#: The first poll's delay; later ones grow by half up to the future's ``poll_interval``.
FIRST_POLL = 0.05
_RUNNING = frozenset({actor_pb2.Operation.PENDING, actor_pb2.Operation.RUNNING})


def _default_convert(exc: BaseException) -> BaseException:
    """A Fray actor's raised exception as Fray's error; a failed poll as an unreachable actor."""
    if isinstance(exc, CallFailed):
        return raised(exc)
    return ActorUnavailableError(f"the actor did not answer a poll of its operation: {exc}")


def _operation_error(error: actor_pb2.ActorError) -> BaseException:
    """The exception a FAILED operation carries (as Iris's own client unwraps a failed call)."""
    if error.serialized_exception:
        exc: BaseException = cloudpickle.loads(error.serialized_exception)
        return exc
    try:
        return ConnectError(Code(error.error_type), error.message)
    except ValueError:
        return RuntimeError(f"{error.error_type}: {error.message}")


class _ArmingWaiters(list[Any]):
    """``Future._waiters``: ``concurrent.futures.wait`` and ``as_completed`` append a waiter here, which
    starts the poller, so that the waiter is woken without anyone pulling."""

    def __init__(self, arm: Callable[[], None]) -> None:
        super().__init__()
        self._arm = arm

    def append(self, waiter: Any) -> None:
        super().append(waiter)  # first: if the poller finds the operation done already, this waiter hears of it
        self._arm()


class OperationFuture(ActorFuture):
    """A polling future backed by Iris long-running operation ``operation_id`` on ``client`` (an ``ActorClient``).

    See the module docstring. ``result()`` returns the method's value or raises its exception
    (a Fray actor's in Fray's dual form, also of the user's class).
    """

    def __init__(self, client: Any, operation_id: str, poll_interval: float = 1.0) -> None:
        super().__init__()
        self._client = client
        self._operation_id = operation_id
        self._poll_interval = max(FIRST_POLL, poll_interval)
        self._poll_lock = threading.Lock()
        self._armed = False
        self._arm_lock = threading.Lock()
        self._waiters = _ArmingWaiters(self._arm)
        #: How a Fray actor's raised exception and a failed poll become the caller's error; the
        #: handle that started the operation puts its own here (it knows whether the actor died).
        self._convert: Callable[[BaseException], BaseException] = _default_convert

    def __repr__(self) -> str:
        return f"OperationFuture({self._operation_id!r}, done={super().done()})"

    @property
    def operation_id(self) -> str:
        """Iris's id of the operation."""
        return self._operation_id

    def _settle_error(self, error: BaseException) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.set_exception(error)

    def _poll(self) -> bool:
        """Ask the server once (unless done); settle the future when the operation ended. True once done."""
        with self._poll_lock:  # one poll at a time: the server forgets an operation once it reported its end
            if super().done():
                return True
            try:
                op = self._client.poll_operation_status(self._operation_id)
            except ConnectError as exc:
                if exc.code == Code.NOT_FOUND:
                    self._settle_error(
                        ActorUnavailableError(
                            f"Operation {self._operation_id} was lost: the actor's server does not know it "
                            f"(the actor restarted, or the result was taken already): {exc.message}"
                        )
                    )
                else:
                    self._settle_error(self._convert(exc))
                return True
            except Exception as exc:
                self._settle_error(self._convert(exc))
                return True
            if op.state in _RUNNING:
                return False
            if op.state == actor_pb2.Operation.SUCCEEDED:
                try:
                    value = unpickled(cloudpickle.loads(op.serialized_result), f"operation {self._operation_id}")
                except Exception as exc:
                    self._settle_error(exc)
                else:
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        self.set_result(value)
            elif op.state == actor_pb2.Operation.FAILED:
                error = _operation_error(op.error)
                self._settle_error(self._convert(error) if isinstance(error, CallFailed) else error)
            else:  # CANCELLED
                super().cancel()
            return True

    def _pull(self, timeout: float | None, *, cancel_on_timeout: bool) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(FIRST_POLL, self._poll_interval)
        while not self._poll():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                if cancel_on_timeout:
                    self._cancel_remote()
                    raise TimeoutError(
                        f"operation {self._operation_id} did not finish within {timeout}s; it was cancelled"
                    )
                raise TimeoutError(f"operation {self._operation_id} did not finish within {timeout}s")
            time.sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 1.5, self._poll_interval)

    def _cancel_remote(self) -> None:
        with contextlib.suppress(Exception):  # best effort: the actor may be gone
            self._client.cancel_operation(self._operation_id)

    def result(self, timeout: float | None = None) -> Any:
        """The method's value; its exception; ``TimeoutError`` after ``timeout`` seconds, cancelling the operation."""
        self._pull(timeout, cancel_on_timeout=True)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The method's exception (None if it returned); ``TimeoutError`` after ``timeout`` seconds."""
        self._pull(timeout, cancel_on_timeout=False)
        return super().exception(0)

    def done(self) -> bool:
        """True once the operation ended (or was cancelled); asks the server once if not known yet."""
        return self._poll()

    def cancel(self) -> bool:
        """Cancel the operation on the server and this future (False if it already ended)."""
        if super().done():
            return False
        self._cancel_remote()
        return super().cancel()

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[Any]], object]) -> None:
        """Call ``fn(self)`` when the operation ends (starts the poller, so nobody has to pull)."""
        self._arm()
        super().add_done_callback(fn)

    def _arm(self) -> None:
        # Called with the future's condition held (concurrent.futures.wait): take no lock a poll holds.
        with self._arm_lock:
            if self._armed:
                return
            self._armed = True
        threading.Thread(target=self._pull_forever, name=f"fray-iris-op-{self._operation_id[:8]}", daemon=True).start()

    def _pull_forever(self) -> None:
        self._pull(None, cancel_on_timeout=False)
