"""What the cluster's client and server sides share: plain-data messages, records and credentials.

:mod:`~fray.cluster.protocol.messages` (what they send each other), :mod:`~fray.cluster.protocol.records`
(the controller's records and their state machines), :mod:`~fray.cluster.protocol.capacity` (what workers
offer and tasks need), :mod:`~fray.cluster.protocol.credentials` (principals and keys),
:mod:`~fray.cluster.protocol._codec` (messages to and from plain data) and
:mod:`~fray.cluster.protocol.controller_client` (reaching the controller). Nothing is imported here.
"""
