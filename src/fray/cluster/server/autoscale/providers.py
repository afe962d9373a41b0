"""Making the provider a cluster file names (``provider.kind``), for the controller.

Each kind lives in its own module, imported only when used (``gcp`` needs the
``fray[gcp]`` extra).
"""

from __future__ import annotations

from pathlib import Path

from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import Provider
from fray.errors import ConfigError

__all__ = ["make_provider", "vm_controller_address"]

_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


def vm_controller_address(config: ClusterConfig, bound: str) -> str:
    """The ``HOST:PORT`` the provider's VMs reach the controller at.

    ``provider.controller_address`` when given, else ``bound`` (the controller's own
    address). Simulated VMs run on this machine, so loopback is right for them; a cloud's
    VMs cannot reach this machine's loopback, so a cloud provider without a reachable
    address is refused here rather than leaving every VM to fail its boot.
    """
    given = config.provider.options.get("controller_address")
    if given is not None:
        host, _, port = str(given).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"provider.controller_address {given!r} must be HOST:PORT, e.g. 10.128.0.2:7100")
        return str(given)
    if config.provider.kind != "simulated" and bound.startswith(_LOOPBACK):
        raise ConfigError(
            f"the {config.provider.kind} provider's VMs cannot reach a controller at {bound} (this machine's "
            "loopback): set provider.controller_address to HOST:PORT the VMs reach, and start the controller "
            "listening there (fray controller --config FILE --host ADDRESS; TLS is on beyond loopback)"
        )
    return bound


def make_provider(
    config: ClusterConfig, *, state_dir: Path, controller: str, credential: str, join_token: str | None = None
) -> Provider:
    """The provider of ``config.provider.kind``, whose VMs' workers join the controller at ``controller``.

    ``state_dir`` is where a provider keeps what it must remember across controller
    restarts (the cluster directory's ``vms/``); ``credential`` is the worker credential
    line the simulated VMs' workers authenticate with; ``join_token`` the join token a
    cloud VM's start-up exchanges for its worker's own credential (``gcp``).
    """
    kind = config.provider.kind
    if kind == "simulated":
        from fray.cluster.server.autoscale.simulated import DEFAULT_BOOT_SECONDS, SimulatedProvider, WorkerLaunch

        return SimulatedProvider(
            state_dir,
            cluster=config.name,
            boot_seconds=config.provider.number("boot_seconds", DEFAULT_BOOT_SECONDS),
            worker=WorkerLaunch(controller=controller, credential=credential, log_dir=state_dir),
        )
    if kind == "gcp":
        from fray.cluster.server.autoscale import gcp

        if join_token is None:
            raise ConfigError(
                "the gcp provider needs a join token for its VMs' workers (fray token create --role worker)"
            )
        return gcp.from_config(config, controller=controller, join_token=join_token)
    raise ConfigError(f"provider.kind {kind!r} is not one of simulated, gcp")
