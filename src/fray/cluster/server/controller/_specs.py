"""The controller's cache of decoded job specs: bounded in count and in payload bytes, least recently used out.

A spec is needed again for every task assignment of its job (retries, worker
re-registration) and for the command shown in listings; a miss costs one read and one
decoding of the stored request (plain data: nothing is unpickled).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from fray.cluster.protocol.messages import JobSpec

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_SPECS", "SpecCache"]

#: Specs kept by default: 1,024.
DEFAULT_MAX_SPECS = 1024
#: Payload bytes kept by default: 64 MiB; a spec whose payload alone is over a tenth of it is never kept.
DEFAULT_MAX_BYTES = 64 << 20


class SpecCache:
    """Job specs by job id; ``load(job_id)`` reads (and decodes) one the cache does not hold. Thread-safe."""

    def __init__(
        self, load: Callable[[str], JobSpec], max_specs: int = DEFAULT_MAX_SPECS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._load = load
        self._max_specs = max_specs
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._specs: OrderedDict[str, JobSpec] = OrderedDict()
        self._bytes = 0  # payload bytes held

    def __len__(self) -> int:
        with self._lock:
            return len(self._specs)

    def get(self, job_id: str) -> JobSpec:
        """The job's spec, from memory or else from ``load``."""
        with self._lock:
            spec = self._specs.get(job_id)
            if spec is not None:
                self._specs.move_to_end(job_id)
                return spec
        spec = self._load(job_id)
        self.remember(job_id, spec)
        return spec

    def remember(self, job_id: str, spec: JobSpec) -> None:
        """Keep ``spec`` (unless its payload is too large to keep), dropping the least recently used."""
        size = len(spec.payload or b"")
        if size > self._max_bytes // 10:
            return  # a huge argument is read back from the store when needed, never kept
        with self._lock:
            previous = self._specs.pop(job_id, None)
            self._bytes -= len(previous.payload or b"") if previous is not None else 0
            self._specs[job_id] = spec
            self._bytes += size
            while len(self._specs) > self._max_specs or self._bytes > self._max_bytes:
                _, dropped = self._specs.popitem(last=False)
                self._bytes -= len(dropped.payload or b"")
