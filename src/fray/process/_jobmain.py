"""The process that runs one replica of a callable job: ``python -m fray.process._jobmain PAYLOAD FAILURE``.

The one entry program of every backend that runs callable replicas as processes: Monarch
starts it as a child (:mod:`fray.process._procjob`), a Fray cluster worker's fork server
calls :func:`main` in each forked task. It unpickles the entrypoint (so the user's code is
only ever opened here, in the job's own process) and runs it. ``sys.exit(0)`` (or a plain
``sys.exit()``) ends it as cleanly as returning does. On an exception it prints the user's
traceback to its output and writes the failure to FAILURE in the one form every backend
reads (:meth:`fray.core._lifecycle.Failure.encode`: data a controller reads without
unpickling, plus the pickled exception for the client), then exits 1. Engine imports are
made only on the paths that need them: a job that never touches an actor starts as fast as
Python does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fray.core._lifecycle import Failure

# Where this replica reports its failure (set by main): see if_killed.
_failure_path: str | None = None


def if_killed(failure: Failure) -> None:
    """Report ``failure`` should this process die without saying why (a signal, the OOM killer).

    Whoever started the process reads the failure file of a replica that exits non-zero;
    an exception raised later overwrites it. An actor's host on a Fray cluster uses it to
    have its process's death counted as a lost process (the restart budget) rather than as
    a failure of its code.
    """
    if _failure_path is None:
        raise RuntimeError("if_killed() works only inside a job's replica process")
    _write(_failure_path, failure)


def _write(failure_path: str, failure: Failure) -> None:
    from fray.core._private_files import write_private

    write_private(failure_path, failure.encode())  # Fray's record of the replica, private like its directory


def main(argv: list[str], payload: bytes | None = None) -> int:
    """Run the entrypoint pickled in ``argv[1]`` (or given as ``payload``); report an exception to ``argv[2]``."""
    global _failure_path
    payload_path, failure_path = argv[1], argv[2]
    _failure_path = failure_path
    from fray.core.inside._stacks import serve

    serve()  # the replica answers stacks() (fray.core.inside._stacks): one idle thread until somebody asks
    try:
        import cloudpickle

        if payload is None:
            with open(payload_path, "rb") as f:
                payload = f.read()
        entry = cloudpickle.loads(payload)
        entry.callable(*entry.args, **entry.kwargs)
    except BaseException as exc:
        from fray.core._lifecycle import Failure, exit_status  # only on this path: a job starts as fast as Python

        if exit_status(exc) == 0:  # sys.exit(0) ends a job as cleanly as returning does
            return 0
        failure = Failure.from_exception(exc)
        if failure.remote is not None:  # the job's log shows the user's frames, as wait() will
            sys.stderr.write(failure.remote.traceback_text)
        sys.stderr.flush()
        _write(failure_path, failure)
        return 1
    finally:
        _send_queued_submits()
        sys.stdout.flush()
    return 0


def _send_queued_submits() -> None:
    # A cluster task is a fork that ends with os._exit: no interpreter shutdown waits for the
    # submits its ClusterClients still have on their way (fray.cluster.client._submit_batch).
    client = sys.modules.get("fray.cluster.client")
    if client is not None:
        client.send_queued_submits()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
