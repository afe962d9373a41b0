"""The controller's cache of job specs, decoded and in the form they were sent in: bounded, least recently used out.

A spec is needed again for every task assignment of its job (retries, worker
re-registration), which forwards the client's bytes as they are, and for the command
shown in listings, which reads the decoded spec. A miss costs one read of the stored
bytes and one decoding (plain data: nothing is unpickled).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from fray.cluster.protocol._codec import decode_spec
from fray.cluster.protocol.messages import JobSpec

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_SPECS", "SpecCache"]

#: Specs kept by default: 1,024.
DEFAULT_MAX_SPECS = 1024
#: Bytes kept by default: 64 MiB; a spec whose bytes alone are over a tenth of it is never kept.
DEFAULT_MAX_BYTES = 64 << 20


def _size(spec: JobSpec, encoded: bytes) -> int:
    # The payload is held twice: once decoded, once inside the encoded form.
    return len(spec.payload or b"") + len(encoded)


class SpecCache:
    """``(spec, encoded)`` by job id; ``load(job_id)`` reads the encoded bytes of one it does not hold. Thread-safe."""

    def __init__(
        self, load: Callable[[str], bytes], max_specs: int = DEFAULT_MAX_SPECS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._load = load
        self._max_specs = max_specs
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._specs: OrderedDict[str, tuple[JobSpec, bytes]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._specs)

    def get(self, job_id: str) -> tuple[JobSpec, bytes]:
        """The job's spec and its encoded form, from memory or else from ``load``."""
        with self._lock:
            entry = self._specs.get(job_id)
            if entry is not None:
                self._specs.move_to_end(job_id)
                return entry
        encoded = self._load(job_id)
        spec = decode_spec(encoded)
        self.remember(job_id, spec, encoded)
        return spec, encoded

    def remember(self, job_id: str, spec: JobSpec, encoded: bytes) -> None:
        """Keep ``spec`` and ``encoded`` (unless too large to keep), dropping the least recently used."""
        size = _size(spec, encoded)
        if size > self._max_bytes // 10:
            return  # a huge argument is read back from the store when needed, never kept
        with self._lock:
            previous = self._specs.pop(job_id, None)
            self._bytes -= _size(*previous) if previous is not None else 0
            self._specs[job_id] = (spec, encoded)
            self._bytes += size
            while len(self._specs) > self._max_specs or self._bytes > self._max_bytes:
                _, dropped = self._specs.popitem(last=False)
                self._bytes -= _size(*dropped)
