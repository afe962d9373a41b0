"""The job level (``create_task``, ``put``, ``get``, ``wait``) behind :class:`~fray.JobContext`: its
default context on threads of this process (:class:`~fray.LocalJobContext`), its context on worker
processes (:class:`~fray.ProcessJobContext`), and the task engine the process and cluster contexts
share: the task owner, its records and messages, the fork server and workers, their wire and the
encoding of objects. Nothing here is public: users import from :mod:`fray` (see
``docs/job-level.md``).
"""
