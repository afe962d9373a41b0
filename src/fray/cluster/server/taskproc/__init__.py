"""What runs inside a task process on a Fray cluster worker, and how it is started: the actor host, and
the warm fork server (which runs callable tasks with :mod:`fray.process._jobmain`) with the worker's end
of it. Kept apart from :mod:`fray.cluster.server.worker` so that a task process never
loads the worker daemon.
"""
