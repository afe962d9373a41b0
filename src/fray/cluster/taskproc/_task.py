"""The process a worker starts for a callable task: ``python -m fray.cluster.taskproc._task PAYLOAD FAILURE``.

It unpickles the entrypoint (so the user's code is only ever opened here, in the
job's own environment) and runs it. On an exception it prints the user's traceback
to its output and writes the failure to FAILURE in the one form every backend uses
(:meth:`fray.core._lifecycle.Failure.encode`: data the controller reads without
unpickling, plus the pickled exception for the client), then exits 1.
"""

from __future__ import annotations

import sys

import cloudpickle

from fray.core._lifecycle import Failure, exit_status
from fray.core._private_files import write_private

# Where this task reports its failure (set by main): see if_killed.
_failure_path: str | None = None


def if_killed(failure: Failure) -> None:
    """Report ``failure`` should this task's process die without saying why (a signal, the OOM killer).

    The worker reads the failure file of a task that exits non-zero; an exception the
    task raises later overwrites it. An actor's host uses it to have its process's death
    counted as a lost process (the restart budget) rather than as a failure of its code.
    """
    if _failure_path is None:
        raise RuntimeError("if_killed() works only inside a Fray cluster task")
    _write(_failure_path, failure)


def _write(failure_path: str, failure: Failure) -> None:
    write_private(failure_path, failure.encode())  # Fray's record of the task, private like its directory


def main(argv: list[str]) -> int:
    """Run the entrypoint in ``argv[1]``; report a failure to ``argv[2]``."""
    global _failure_path
    payload_path, failure_path = argv[1], argv[2]
    _failure_path = failure_path
    try:
        with open(payload_path, "rb") as f:
            entry = cloudpickle.load(f)
        entry.callable(*entry.args, **entry.kwargs)
    except BaseException as exc:
        if exit_status(exc) == 0:  # sys.exit(0) ends a job as cleanly as returning does
            return 0
        failure = Failure.from_exception(exc)
        if failure.remote is not None:
            sys.stderr.write(failure.remote.traceback_text)
        sys.stderr.flush()
        _write(failure_path, failure)
        return 1
    finally:
        _send_queued_submits()
        sys.stdout.flush()
    return 0


def _send_queued_submits() -> None:
    # A callable task is a fork that ends with os._exit: no interpreter shutdown waits for
    # the submits its ClusterClients still have on their way (fray.cluster.client._submit_batch).
    client = sys.modules.get("fray.cluster.client")
    if client is not None:
        client.send_queued_submits()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
