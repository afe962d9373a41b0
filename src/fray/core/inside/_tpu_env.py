"""The environment of one host process of a TPU job: the same variables on every backend that runs slices.

A TPU replica is a whole slice and runs one process per host of the slice. Each process
gets ``FRAY_TPU_SLICE_NAME`` (the slice it runs on), ``FRAY_TPU_HOST_INDEX`` (its host's
index in the slice, 0 = the slice's head) and ``FRAY_TPU_HOST_COUNT``; a multislice job
(``replicas > 1``) also gets the ``MEGASCALE_*`` variables by which JAX's megascale
runtime coordinates slices, pointing at host 0 of slice 0.
"""

from __future__ import annotations

__all__ = ["MEGASCALE_PORT", "megascale_env", "tpu_host_env"]

MEGASCALE_PORT = 8081
"""The port of the multislice coordinator (the default of JAX's megascale runtime and of Ray)."""


def megascale_env(coordinator_ip: str, num_slices: int, slice_id: int, port: int = MEGASCALE_PORT) -> dict[str, str]:
    """The variables by which the processes of a multislice job find each other."""
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_ip}:{port}",
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
        "MEGASCALE_PORT": str(port),
    }


def tpu_host_env(
    slice_name: str, host: int, hosts: int, *, slice_id: int, num_slices: int, coordinator_ip: str
) -> dict[str, str]:
    """Everything Fray tells host ``host`` of slice ``slice_id`` (of ``num_slices``) about its place."""
    env = {"FRAY_TPU_SLICE_NAME": slice_name, "FRAY_TPU_HOST_INDEX": str(host), "FRAY_TPU_HOST_COUNT": str(hosts)}
    if num_slices > 1:
        env.update(megascale_env(coordinator_ip, num_slices, slice_id))
    return env
