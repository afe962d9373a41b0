"""The server side of Fray's cluster: the controller, the worker daemon and what they run.

* :mod:`fray.cluster.server.controller` -- :class:`~fray.cluster.server.controller.Controller` (the
  running server) and ``ControllerService`` (jobs, workers, scheduling), with
  :mod:`fray.cluster.server.store` (durable SQLite state), :mod:`fray.cluster.server.scheduler`
  (placement), :mod:`fray.cluster.server.credit` (the per-user credit that orders jobs),
  :mod:`fray.cluster.server.ops` (the operator API), :mod:`fray.cluster.server._retention`,
  :mod:`fray.cluster.server.dashboard` (the web dashboard) and :mod:`fray.cluster.server.autoscale`.
* :mod:`fray.cluster.server.worker` -- the worker daemon; :mod:`fray.cluster.server.taskproc` what runs in
  a task's process; :mod:`fray.cluster.server.envs` a task's environment and workspace.
* :mod:`fray.cluster.server.launcher` -- a controller and workers as local processes.

Nothing is imported here: a client that hosts an actor (``taskproc._actor_host``) or ships a workspace
(``envs._shipping``) loads only that module.
"""
