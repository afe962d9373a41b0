"""The shared backend core: what every backend's client is built from, written once. The client
skeleton and the backend contract, the job state machine and retry budgets, remote failures,
pickling checks and code pickling, per-job runtime state and log capture, the actor event loop,
driver-exit and pending notices, progress bars, queue checks, sizes, private files and the TPU
environment. Nothing here is public: users import from :mod:`fray`.
"""
