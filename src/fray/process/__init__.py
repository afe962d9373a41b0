"""Replicas as processes of this host: one replica as a child process and how it ended
(:mod:`fray.process._procjob`), the child's entry point (``python -m fray.process._jobmain``),
the supervisor of a replica's several processes (``python -m fray.process._ranks``), stopping
process trees, and telling a process we started from a recycled PID. Nothing here is public.
"""
