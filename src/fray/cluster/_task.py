"""The process a worker starts for a callable task: ``python -m fray.cluster._task PAYLOAD FAILURE``.

It unpickles the entrypoint (so the user's code is only ever opened here, in the
job's own environment), runs it, and on an exception writes an encoded failure
report to FAILURE and exits 1, so the client can re-raise the original exception.
"""

from __future__ import annotations

import sys
import traceback


def main(argv: list[str]) -> int:
    """Run the entrypoint in ``argv[1]``; report a failure to ``argv[2]``."""
    payload_path, failure_path = argv[1], argv[2]
    try:
        import cloudpickle

        with open(payload_path, "rb") as f:
            entry = cloudpickle.load(f)
        entry.callable(*entry.args, **entry.kwargs)
    except BaseException as exc:
        from fray.cluster.messages import encode_failure

        traceback.print_exc()
        sys.stderr.flush()
        with open(failure_path + ".tmp", "wb") as f:
            f.write(encode_failure(exc))
        import os

        os.replace(failure_path + ".tmp", failure_path)
        return 1
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
