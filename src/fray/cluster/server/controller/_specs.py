"""The controller's cache of what a job's task assignments need: its spec, decoded and in the form it
was sent in, and its namespace. Bounded, least recently used out.

Every task assignment of a job (retries, worker re-registration included) forwards the
client's bytes as they are and names the namespace; listings show the decoded spec's
command. A miss costs two reads of the store and one decoding (plain data: nothing is
unpickled). The default count holds a burst of thousands of small jobs, so that a deep
backlog is placed without reading each job back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from fray.cluster.protocol._codec import decode_spec
from fray.cluster.protocol.messages import JobSpec

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_SPECS", "CachedSpec", "SpecCache"]

#: Specs kept by default: 4,096: a burst of thousands of jobs is placed without reading each back, and
#: deeper backlogs read back only their oldest.
DEFAULT_MAX_SPECS = 4096
#: Bytes kept by default: 64 MiB; a spec whose bytes alone are over a tenth of it is never kept.
DEFAULT_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class CachedSpec:
    """What every task assignment of one job needs from the store. Make it with :meth:`of`."""

    #: The decoded spec without its payload: the controller never opens one, and the payload
    #: travels to workers inside ``encoded`` (so it is held once, not twice).
    spec: JobSpec
    #: The spec as its client encoded it (see :func:`fray.cluster.protocol._codec.encode_spec`).
    encoded: bytes
    namespace: str

    @classmethod
    def of(cls, spec: JobSpec, encoded: bytes, namespace: str) -> CachedSpec:
        return cls(spec if spec.payload is None else replace(spec, payload=None), encoded, namespace)

    @property
    def size(self) -> int:
        return len(self.encoded)


class SpecCache:
    """:class:`CachedSpec` by job id; ``load(job_id)`` reads ``(encoded spec, namespace)`` of one it does not hold.

    Thread-safe.
    """

    def __init__(
        self,
        load: Callable[[str], tuple[bytes, str]],
        max_specs: int = DEFAULT_MAX_SPECS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._load = load
        self._max_specs = max_specs
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._specs: OrderedDict[str, CachedSpec] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._specs)

    def get(self, job_id: str) -> CachedSpec:
        """The job's spec, its encoded form and namespace, from memory or else from ``load``."""
        with self._lock:
            entry = self._specs.get(job_id)
            if entry is not None:
                self._specs.move_to_end(job_id)
                return entry
        encoded, namespace = self._load(job_id)
        entry = CachedSpec.of(decode_spec(encoded), encoded, namespace)
        self.remember(job_id, entry)
        return entry

    def remember(self, job_id: str, entry: CachedSpec) -> None:
        """Keep ``entry`` (unless too large to keep), dropping the least recently used."""
        size = entry.size
        if size > self._max_bytes // 10:
            return  # a huge argument is read back from the store when needed, never kept
        with self._lock:
            previous = self._specs.pop(job_id, None)
            self._bytes -= previous.size if previous is not None else 0
            self._specs[job_id] = entry
            self._bytes += size
            while len(self._specs) > self._max_specs or self._bytes > self._max_bytes:
                _, dropped = self._specs.popitem(last=False)
                self._bytes -= dropped.size
