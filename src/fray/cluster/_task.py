"""The process a worker starts for a callable task: ``python -m fray.cluster._task PAYLOAD FAILURE``.

It unpickles the entrypoint (so the user's code is only ever opened here, in the
job's own environment) and runs it. On an exception it prints the user's traceback
to its output and writes the failure to FAILURE in the one form every backend uses
(:meth:`fray._lifecycle.Failure.encode`: data the controller reads without
unpickling, plus the pickled exception for the client), then exits 1.
"""

from __future__ import annotations

import os
import sys

import cloudpickle

from fray._lifecycle import Failure


def main(argv: list[str]) -> int:
    """Run the entrypoint in ``argv[1]``; report a failure to ``argv[2]``."""
    payload_path, failure_path = argv[1], argv[2]
    try:
        with open(payload_path, "rb") as f:
            entry = cloudpickle.load(f)
        entry.callable(*entry.args, **entry.kwargs)
    except BaseException as exc:
        failure = Failure.from_exception(exc)
        if failure.remote is not None:
            sys.stderr.write(failure.remote.traceback_text)
        sys.stderr.flush()
        with open(failure_path + ".tmp", "wb") as f:
            f.write(failure.encode())
        os.replace(failure_path + ".tmp", failure_path)
        return 1
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
