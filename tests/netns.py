"""Simulated hosts for tests that need addresses beyond loopback: one Linux network namespace each.

Tests must never contact this machine's own non-loopback addresses (nor any other machine's),
so a test that needs a peer "on another machine" asks this rig for a host::

    def test_something(hosts: Hosts) -> None:
        host = hosts.add()                  # namespace fray-<pid>-<n>, address 10.231.<k>.1
        proc = subprocess.Popen([*host.prefix, sys.executable, "-m", ...])
        ...connect to host.address from the test process...
        hosts.cut(host)                     # its link goes down (a partition) ...
        hosts.heal(host)                    # ... and up again

Hosts that must reach *each other* (a controller host and worker hosts) are made together on one
LAN: ``controller, worker = hosts.add_lan(2)`` (see :meth:`Hosts.add_lan`).

Each host is a namespace joined to the root namespace (where the test runs) by a veth pair:
the root end has ``10.231.<k>.254/24``, the namespace end ``10.231.<k>.1/24`` (and the
namespace's loopback is up). There is no bridge and no default route in a host, so it reaches
only the test machine's end of its own link (and the root namespace does not forward), and
the test process reaches a host only at ``host.address``. The root namespace also gets an
``unreachable 10.231.<k>.0/24`` route of low priority (metric 4242), so that traffic for a
host never takes the default route out of the machine, whatever state its link is in. ``k`` is free on this machine (an
allocation lock serialises concurrent runs). Everything made is deleted when the rig closes,
even on failure: first any process still inside a host (SIGKILLed by pid, as only the test
started processes there), then the namespace, which takes its veth pair with it. Leftovers of
an earlier run that was killed (namespaces ``fray-<pid>-*`` whose pid is gone) are deleted too.

The ``hosts`` fixture is imported by the ``conftest.py`` of the directories that use it
(``from netns import hosts``); :func:`simulated_hosts` is the same rig as a context manager.
Without the means (not root, no ``ip``, ``ip netns add`` refused) the fixture skips, saying
why; the context manager raises :class:`NamespacesUnavailable`.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from fray.process._process import pid_alive

__all__ = ["Host", "Hosts", "NamespacesUnavailable", "hosts", "simulated_hosts"]

#: Every simulated host's link is 10.231.<k>.0/24 (k in 1..254).
SUBNET_PREFIX = "10.231."
_LOCK = Path("/run/fray-netns.lock")
_NAME = re.compile(r"^fray-(\d+)-\d+$")
_BRIDGE = re.compile(r"^fb(\d+)-\d+$")
_GUARD_METRIC = "4242"  # of the unreachable route that keeps a host's subnet off the default route
_numbers = itertools.count(1)  # names stay unique across every rig of this process


class NamespacesUnavailable(Exception):
    """This process cannot make network namespaces (the reason is the message)."""


@dataclass(frozen=True)
class Host:
    """One simulated host: a network namespace reachable from the test process at ``address``."""

    name: str  #: the namespace's name (``ip netns exec NAME ...``)
    address: str  #: the host's address, on its end of the link
    gateway: str  #: the test machine's address on the same link (what the host sees peers come from)
    link: str  #: the root namespace's end of the veth pair (what ``cut``/``heal`` switch)

    @property
    def prefix(self) -> list[str]:
        """Put before a command's argv to run it inside this host (the command keeps its pid: ``ip`` execs it)."""
        return ["ip", "netns", "exec", self.name]

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to completion, its output captured as text."""
        return subprocess.run([*self.prefix, *argv], capture_output=True, text=True, check=check, timeout=timeout)

    def pids(self) -> list[int]:
        """The processes running inside this host now."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _unavailable() -> str | None:
    """Why this process cannot make network namespaces, or None if it (probably) can."""
    if not hasattr(os, "geteuid") or not Path("/proc/self/ns/net").exists():
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root to use simulated hosts)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    return None


class Hosts:
    """The simulated hosts of one test: add them with :meth:`add`; :meth:`close` deletes them all."""

    def __init__(self, *, skip_when_refused: bool = False) -> None:
        why = _unavailable()
        if why is not None:
            raise NamespacesUnavailable(why)
        self.hosts: list[Host] = []
        self.bridges: list[str] = []
        #: Skip the running test (rather than raise) when a namespace is refused (the fixture's way).
        self.skip_when_refused = skip_when_refused

    def add(self) -> Host:
        """A new host, up and reachable at its address (raises :class:`NamespacesUnavailable` if refused)."""
        number = next(_numbers)
        name = f"fray-{os.getpid()}-{number}"
        link = f"fv{os.getpid()}-{number}"  # at most 15 characters (pids stay below 2**22)
        with _allocation_lock():
            _delete_leftovers()
            k = _free_subnet()
            added = _ip("netns", "add", name, check=False)
            if added.returncode != 0:
                if self.skip_when_refused:
                    pytest.skip(f"simulated hosts unavailable: `ip netns add` was refused: {added.stderr.strip()}")
                raise NamespacesUnavailable(f"`ip netns add` was refused: {added.stderr.strip()}")
            host = Host(name, f"{SUBNET_PREFIX}{k}.1", f"{SUBNET_PREFIX}{k}.254", link)
            self.hosts.append(host)  # from here on, close() deletes it whatever happens next
            _ip("route", "add", "unreachable", f"{SUBNET_PREFIX}{k}.0/24", "metric", _GUARD_METRIC)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("addr", "add", f"{host.gateway}/24", "dev", link)
            _ip("link", "set", link, "up")
            inside = ["-n", name]
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
        _wait_reachable(host)
        return host

    def add_lan(self, count: int) -> list[Host]:
        """``count`` new hosts on one LAN: each reaches the others (and the test machine) at their addresses.

        A bridge in the root namespace (``10.231.<k>.254/24``, the hosts' ``gateway``) joins the
        root ends of the hosts' veth pairs; host ``i`` has ``10.231.<k>.<i+1>``. Nothing routes
        beyond the bridge (the same guard route as :meth:`add`), and :meth:`cut` partitions one
        host from all the others at once.
        """
        number = next(_numbers)
        bridge = f"fb{os.getpid()}-{number}"
        made: list[Host] = []
        with _allocation_lock():
            _delete_leftovers()
            k = _free_subnet()
            gateway = f"{SUBNET_PREFIX}{k}.254"
            self.bridges.append(bridge)  # from here on, close() deletes it whatever happens next
            _ip("route", "add", "unreachable", f"{SUBNET_PREFIX}{k}.0/24", "metric", _GUARD_METRIC)
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{gateway}/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            for i in range(count):
                name = f"fray-{os.getpid()}-{next(_numbers)}"
                link = f"fl{os.getpid()}-{number}-{i}"[:15]
                added = _ip("netns", "add", name, check=False)
                if added.returncode != 0:
                    if self.skip_when_refused:
                        pytest.skip(f"simulated hosts unavailable: `ip netns add` was refused: {added.stderr.strip()}")
                    raise NamespacesUnavailable(f"`ip netns add` was refused: {added.stderr.strip()}")
                host = Host(name, f"{SUBNET_PREFIX}{k}.{i + 1}", gateway, link)
                self.hosts.append(host)
                made.append(host)
                _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
                _ip("link", "set", link, "master", bridge)
                _ip("link", "set", link, "up")
                inside = ["-n", name]
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
                _ip(*inside, "link", "set", "eth0", "up")
        for host in made:
            _wait_reachable(host)
        return made

    def cut(self, host: Host) -> None:
        """Partition ``host``: its end of the link goes down, and nothing passes until :meth:`heal`.

        As with a real partition, the test machine's packets to it are dropped silently (the
        root end stays up, without carrier): connections time out rather than being refused.
        The host itself sees its interface down (its sends fail at once).
        """
        _ip("-n", host.name, "link", "set", "eth0", "down")

    def heal(self, host: Host) -> None:
        """Bring ``host``'s link back up (and wait until it carries packets again)."""
        _ip("-n", host.name, "link", "set", "eth0", "up")
        _wait_reachable(host)

    def close(self) -> None:
        """Delete every host (SIGKILLing any process still inside first); never raises for a host already gone."""
        errors: list[str] = []
        for host in reversed(self.hosts):
            leftovers = host.pids()
            if leftovers:
                warnings.warn(f"processes {leftovers} were still running in {host.name}; killed", stacklevel=2)
                for pid in leftovers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while host.pids() and time.monotonic() < deadline:
                    time.sleep(0.02)
            deleted = _ip("netns", "del", host.name, check=False)
            if deleted.returncode != 0 and "No such file" not in deleted.stderr:
                errors.append(f"{host.name}: {deleted.stderr.strip()}")
            # Deleting the namespace deletes the veth pair; make sure of it.
            if _ip("link", "show", host.link, check=False).returncode == 0:
                _ip("link", "del", host.link, check=False)
            subnet = host.address.rsplit(".", 1)[0] + ".0/24"
            _ip("route", "del", "unreachable", subnet, "metric", _GUARD_METRIC, check=False)
        self.hosts.clear()
        for bridge in reversed(self.bridges):
            if _ip("link", "show", bridge, check=False).returncode == 0:
                _ip("link", "del", bridge, check=False)
        self.bridges.clear()
        if errors:
            raise RuntimeError("could not delete simulated hosts: " + "; ".join(errors))


@contextlib.contextmanager
def _allocation_lock() -> Iterator[None]:
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_subnet() -> int:
    """A ``k`` such that 10.231.<k>.0/24 is on no interface or route of the root namespace."""
    used = _ip("-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    for k in range(1, 255):
        if f"{SUBNET_PREFIX}{k}." not in used:
            return k
    raise RuntimeError(f"no free {SUBNET_PREFIX}<k>.0/24 subnet is left for a simulated host")


def _delete_leftovers() -> None:
    """Delete namespaces this rig made in runs that have ended (killed before they could clean up)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not pid_alive(int(match.group(1))):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip() if len(fields) > 1 else ""
        match = _BRIDGE.match(name)
        if match and not pid_alive(int(match.group(1))):
            _ip("link", "del", name, check=False)
    # A guard route whose subnet is on no interface any more belongs to a rig that is gone.
    addresses = _ip("-4", "addr", "show").stdout
    for line in _ip("-4", "route", "show", "type", "unreachable").stdout.splitlines():
        subnet = line.split()[1] if len(line.split()) > 1 else ""
        ours = subnet.startswith(SUBNET_PREFIX) and f"metric {_GUARD_METRIC}" in line
        if ours and subnet.rsplit(".", 1)[0] + "." not in addresses:
            _ip("route", "del", "unreachable", subnet, "metric", _GUARD_METRIC, check=False)


def _wait_reachable(host: Host, timeout: float = 10.0) -> None:
    """Until the link is up at both ends (a fresh veth takes a moment to leave NO-CARRIER)."""
    deadline = time.monotonic() + timeout
    while True:
        inside = _ip("-n", host.name, "-o", "link", "show", "eth0", check=False).stdout
        outside = _ip("-o", "link", "show", host.link, check=False).stdout
        if all("LOWER_UP" in state and ",UP" in state for state in (inside, outside)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the link of {host.name} did not come up: {inside.strip()} / {outside.strip()}")
        time.sleep(0.01)


@contextlib.contextmanager
def simulated_hosts() -> Iterator[Hosts]:
    """A :class:`Hosts` rig, deleted (with everything in it) when the block ends, even on failure."""
    rig = Hosts()
    try:
        yield rig
    finally:
        rig.close()


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    """Simulated hosts for this test (skipped, saying why, where network namespaces cannot be made)."""
    try:
        rig = Hosts(skip_when_refused=True)
    except NamespacesUnavailable as exc:
        pytest.skip(f"simulated hosts unavailable: {exc}")
    try:
        yield rig
    finally:
        rig.close()
