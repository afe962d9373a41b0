"""What runs inside the processes where user code runs, on every backend.

The per-process stack server (:mod:`._stacks`), the routing of in-process jobs' output to
their own logs (:mod:`._logcapture`), the termination flag of in-process jobs
(:mod:`._runtime`), the event loop that runs actors' ``async def`` methods
(:mod:`._eventloop`), and the environment of one host process of a TPU job
(:mod:`._tpu_env`).
"""
