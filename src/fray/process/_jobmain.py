"""The process that runs one replica of a callable job: ``python -m fray.process._jobmain PAYLOAD FAILURE``.

It unpickles the entrypoint (so the user's code is only ever opened here, in the
job's own process), runs it, and when it raises writes
``RemoteFailure.capture(exc).encode()`` to FAILURE (atomically) and exits 1, so the
client re-raises the user's own exception. The traceback is printed too, so the
job's log shows it. Kept free of engine imports: a job that never touches an actor
starts as fast as Python does.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Run the entrypoint pickled in ``argv[1]``; report an exception to ``argv[2]``."""
    payload_path, failure_path = argv[1], argv[2]
    try:
        import cloudpickle

        with open(payload_path, "rb") as f:
            entry = cloudpickle.load(f)
        entry.callable(*entry.args, **entry.kwargs)
    except BaseException as exc:
        from fray.core._lifecycle import exit_status  # imported only on this path: a job starts as fast as Python

        if exit_status(exc) == 0:  # sys.exit() or sys.exit(0) is a successful end, as in any program
            return 0
        return _report(exc, failure_path)
    finally:
        sys.stdout.flush()
    return 0


def _report(exc: BaseException, failure_path: str) -> int:
    from fray.core._private_files import write_private
    from fray.core._remote import RemoteFailure

    failure = RemoteFailure.capture(exc)
    sys.stderr.write(failure.traceback_text)  # the job's log shows the user's frames, as wait() will
    sys.stderr.flush()
    write_private(failure_path, failure.encode())
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
