"""The bytes of one actor RPC connection, below the frames of :mod:`fray.cluster.rpc.wire`: the authenticating
handshake, values as pickle-5 segments with out-of-band buffers (and fresh ``bytes`` for received
ones), opening a client's TCP socket, and the same-host transport (an abstract Unix socket, large
segments as sealed memfds).
"""
