"""What runs inside a task process on a Fray cluster worker, and how it is started: the callable task's
entry point (``python -m fray.cluster.taskproc._task``), the actor host, and the warm fork server
with the worker's end of it. Kept apart from :mod:`fray.cluster.worker` so that a task process never
loads the worker daemon.
"""
