"""LocalCluster's daemons end with the process that started them, even when it never stopped them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import wait_until

_ABANDON = """
import json, os, sys
from fray.cluster.server.launcher import LocalCluster
cluster = LocalCluster(sys.argv[1])
cluster.start(1, "--cpu", "1")
print(json.dumps([cluster.controller.pid, *[w.pid for w in cluster.workers.values()]]), flush=True)
os._exit(0)  # as a test run killed by a timeout: no stop(), no finalizers
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent, now init, reaps it).
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split(") ", 1)[1][0] != "Z"


def test_daemons_of_an_abandoned_local_cluster_exit(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _ABANDON, str(tmp_path / "cluster")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(pids) == 2
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=60, what="the abandoned daemons to exit")
