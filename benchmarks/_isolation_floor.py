"""The least an isolated process per job costs on this machine, whatever the scheduler around it does.

Fray's cluster runs every callable job in a process of its own, forked from a warm fork
server (seed ``001_…``: jobs run isolated). This measures that bare cost with nothing of
Fray's protocol around it: a process with the fork server's modules imported forks a
child that exits at once, and reaps it. Run in a fresh interpreter, so the parent's
memory (which the kernel copies page tables of, and tears down in the child) is what the
fork server's is, not the benchmark's.

Reported: CPU per job (the parent's fork and reap, plus the child's own, kernel time
included), the parent's ``fork()`` call (wall), and the child's ``_exit`` until
``waitpid`` returns (wall): the part of a job's latency a process per job cannot avoid.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["Floor", "isolation_floor"]

# Run in a fresh interpreter: the fork server's imports (fray.cluster.server.taskproc._forkserver.main), then the loop.
_PROBE = """
import json, os, resource, sys, time
import cloudpickle, fray, fray.cluster.client, fray.process._jobmain
count = int(sys.argv[1])
forks, exits = [], []
before_self = resource.getrusage(resource.RUSAGE_SELF)
before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(count):
    go_r, go_w = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.read(go_r, 1)
        os._exit(0)
    forks.append(time.perf_counter() - started)
    os.write(go_w, b"g")  # the child exits now
    exited = time.perf_counter()
    os.waitpid(pid, 0)
    exits.append(time.perf_counter() - exited)
    os.close(go_r)
    os.close(go_w)
after_self = resource.getrusage(resource.RUSAGE_SELF)
after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = lambda a, b: (b.ru_utime + b.ru_stime) - (a.ru_utime + a.ru_stime)
print(json.dumps({
    "parent_cpu": cpu(before_self, after_self) / count,
    "child_cpu": cpu(before_children, after_children) / count,
    "forks": forks,
    "exits": exits,
}))
"""


@dataclass(frozen=True)
class Floor:
    """Per job, in seconds: CPU of the parent and of the child, and the wall time of fork() and of exit -> reaped."""

    parent_cpu: float
    child_cpu: float
    fork_wall: float
    exit_wall: float

    @property
    def cpu(self) -> float:
        """All the CPU one isolated process costs, however little it runs."""
        return self.parent_cpu + self.child_cpu


def isolation_floor(count: int = 300) -> Floor:
    """Fork ``count`` do-nothing children from a process with the fork server's modules loaded; medians per child."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(count)], capture_output=True, text=True, check=True, timeout=300
    )
    data = json.loads(result.stdout)
    return Floor(
        data["parent_cpu"], data["child_cpu"], statistics.median(data["forks"]), statistics.median(data["exits"])
    )


if __name__ == "__main__":
    floor = isolation_floor()
    print(
        f"isolated process per job: {floor.cpu * 1e3:.2f} ms CPU (parent {floor.parent_cpu * 1e3:.2f}, "
        f"child {floor.child_cpu * 1e3:.2f}); fork() {floor.fork_wall * 1e3:.2f} ms, "
        f"exit -> reaped {floor.exit_wall * 1e3:.2f} ms"
    )
