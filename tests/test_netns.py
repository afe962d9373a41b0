"""The simulated hosts of tests/netns.py: reachable only over their own link, partitioned and healed, deleted after."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from netns import Host, Hosts, NamespacesUnavailable, simulated_hosts
from support import alive, wait_until

SERVE = """
import socket, sys
with socket.create_server((sys.argv[1], 0)) as server:
    print(server.getsockname()[1], flush=True)
    while True:
        conn, peer = server.accept()
        conn.sendall(peer[0].encode())
        conn.close()
"""


@pytest.fixture
def rig() -> Iterator[Hosts]:
    try:
        with simulated_hosts() as made:
            yield made
    except NamespacesUnavailable as exc:
        pytest.skip(f"simulated hosts unavailable: {exc}")


def route_of(address: str) -> str:
    """What ``ip route get`` says of ``address`` (its error included)."""
    result = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True)
    return result.stdout + result.stderr


def ask(host: Host, port: int, timeout: float = 10.0) -> str:
    with socket.create_connection((host.address, port), timeout=timeout) as conn:
        return conn.recv(100).decode()


def test_a_host_is_reached_over_its_own_link_and_can_be_partitioned(rig: Hosts) -> None:
    host = rig.add()
    inside = host.run(["ip", "-4", "-o", "addr", "show"]).stdout
    assert f"{host.address}/24" in inside and "127.0.0.1" in inside
    assert "default" not in host.run(["ip", "route"]).stdout, "a host reaches nothing but its link"
    server = subprocess.Popen(
        [*host.prefix, sys.executable, "-c", SERVE, host.address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        assert server.pid in host.pids(), "ip netns exec runs the command itself, under the pid we hold"
        assert ask(host, port) == host.gateway, "the test machine is the other end of the link"
        assert f"dev {host.link}" in route_of(host.address)

        rig.cut(host)
        assert f"dev {host.link}" in route_of(host.address), "a cut host's traffic never takes another route"
        started = time.monotonic()
        with pytest.raises(OSError):
            ask(host, port, timeout=1.0)
        assert time.monotonic() - started >= 0.9, "packets are dropped, as in a partition, not refused"

        rig.heal(host)
        assert ask(host, port) == host.gateway
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert host.pids() == []


def test_with_its_link_gone_a_hosts_subnet_is_unreachable_rather_than_routed_out(rig: Hosts) -> None:
    host = rig.add()
    subprocess.run(["ip", "link", "set", host.link, "down"], check=True)
    route = route_of(host.address)  # asked of the kernel: no packet is sent
    assert "No route to host" in route and "via" not in route, route
    subprocess.run(["ip", "link", "set", host.link, "up"], check=True)


def test_everything_made_is_deleted_even_with_a_process_left_inside() -> None:
    try:
        with pytest.warns(UserWarning, match="still running"), simulated_hosts() as made:
            first, second = made.add(), made.add()
            assert first.name != second.name and first.address != second.address
            left = subprocess.Popen([*second.prefix, "sleep", "300"])
            wait_until(lambda: left.pid in second.pids(), what="the process to run inside")
    except NamespacesUnavailable as exc:
        pytest.skip(f"simulated hosts unavailable: {exc}")
    assert left.wait(timeout=30) == -9
    assert not alive(left.pid)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    for host in (first, second):
        assert host.name not in names and f"{host.link}@" not in links
        assert host.address.rsplit(".", 1)[0] + "." not in routes
