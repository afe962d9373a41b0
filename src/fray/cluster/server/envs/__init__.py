"""A job's environment on a Fray cluster, end to end: its workspace packed as a deterministic archive
(:mod:`fray.cluster.server.envs._workspace`), what the client ships at submit
(:mod:`fray.cluster.server.envs._shipping`), and how a worker prepares it before a task starts: virtual
environments, working directory, container (:mod:`fray.cluster.server.envs._environments`). Light on
purpose: the CLI imports it without loading the client, the controller or the worker daemon.
"""
