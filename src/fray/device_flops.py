"""Peak dense FLOP/s of the accelerators Fray knows, per chip and number format.

The numbers are the vendors' published dense (no sparsity) peaks: what MFU
calculations divide by. ``ResourceConfig.device_flops()`` and ``total_flops()`` read
them; :func:`device_flops_for_jax_device` serves code that holds a JAX device's
``device_kind`` (marin's ``fray.device_flops`` module path). An unknown device or a
format the device has no fast path for gives ``None``.
"""

from __future__ import annotations

import re

__all__ = [
    "DEVICE_FLOPS",
    "device_flops",
    "device_flops_for_jax_device",
    "jax_device_kind_to_fray_device_type",
    "normalize_device_type",
    "normalize_dtype",
]

_T = 1e12

# device type (Fray's GPU type or TPU family, lower case) -> number format -> FLOP/s per chip.
DEVICE_FLOPS: dict[str, dict[str, float]] = {
    "h100": {"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T,
             "fp8": 1979 * _T, "int8": 1979 * _T},
    "h100-pcie": {"fp64": 51 * _T, "fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756 * _T, "fp16": 756 * _T,
                  "fp8": 1513 * _T, "int8": 1513 * _T},
    "h200": {"fp64": 67 * _T, "fp32": 67 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T,
             "fp8": 1979 * _T, "int8": 1979 * _T},
    "b100": {"tf32": 875 * _T, "bf16": 1750 * _T, "fp16": 1750 * _T, "fp8": 3500 * _T, "int8": 3500 * _T},
    "b200": {"tf32": 1100 * _T, "bf16": 2250 * _T, "fp16": 2250 * _T, "fp8": 4500 * _T, "int8": 4500 * _T},
    "a100": {"fp64": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T,
             "int8": 624 * _T},
    "a10": {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T, "int8": 250 * _T},
    "a10g": {"fp32": 31.2 * _T, "tf32": 35 * _T, "bf16": 70 * _T, "fp16": 70 * _T, "int8": 140 * _T},
    "l4": {"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T, "fp8": 242.5 * _T,
           "int8": 242.5 * _T},
    "l40s": {"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362 * _T, "fp16": 362 * _T, "fp8": 733 * _T,
             "int8": 733 * _T},
    "t4": {"fp32": 8.1 * _T, "fp16": 65 * _T, "int8": 130 * _T},
    "v100": {"fp64": 7.8 * _T, "fp32": 15.7 * _T, "fp16": 125 * _T},
    "v4": {"bf16": 275 * _T, "int8": 275 * _T},
    "v5e": {"bf16": 197 * _T, "int8": 394 * _T},
    "v5p": {"bf16": 459 * _T, "int8": 918 * _T},
    "v6e": {"bf16": 918 * _T, "int8": 1836 * _T},
}  # fmt: skip

_DTYPES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "f16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "f32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "fp64": "fp64",
    "f64": "fp64",
    "float64": "fp64",
    "double": "fp64",
    "fp8": "fp8",
    "float8": "fp8",
    "int8": "int8",
    "i8": "int8",
}


def normalize_dtype(dtype: str) -> str:
    """``"bfloat16"`` -> ``"bf16"``, ``"float32"`` -> ``"fp32"``, ...; ValueError for an unknown format."""
    key = str(dtype).strip().lower()
    if key not in _DTYPES:
        raise ValueError(f"unknown number format {dtype!r}; known: {', '.join(sorted(set(_DTYPES.values())))}")
    return _DTYPES[key]


_TPU_SLICE = re.compile(r"^(v\d+[a-z]*)-\d+$")


def normalize_device_type(device_type: str) -> str:
    """A device name as a key of :data:`DEVICE_FLOPS`: a GPU type, or a TPU slice type's family."""
    text = str(device_type).strip()
    text = text.split(":", 1)[1] if text.lower().startswith(("tpu:", "gpu:")) else text
    text = text.rsplit(":", 1)[0] if text.count(":") == 1 and text.rsplit(":", 1)[1].isdigit() else text
    key = text.lower()
    # A TPU slice type is its family and its size ("v4-8", "v5p-128", "v6e-16"); v5litepod is v5e, below.
    # Read from the name, not from fray.resources' table, which imports this module.
    slice_type = _TPU_SLICE.match(key)
    if slice_type and not key.startswith("v5lite"):
        return slice_type.group(1)
    if key.startswith("v5litepod") or key.startswith("v5lite"):
        return "v5e"
    if key.startswith("a100"):
        return "a100"
    return key


def device_flops(device_type: str, dtype: str = "bf16") -> float | None:
    """Peak dense FLOP/s of one chip of ``device_type`` (``"H100"``, ``"v5litepod-16"``, ``"v6e"``) in ``dtype``."""
    table = DEVICE_FLOPS.get(normalize_device_type(device_type))
    if table is None:
        return None
    return table.get(normalize_dtype(dtype))


# JAX ``device_kind`` strings, in order: the first pattern that matches names the device.
_JAX_KINDS: tuple[tuple[str, str], ...] = (
    (r"tpu v6( lite|e)", "v6e"),
    (r"tpu v5( lite|e)", "v5e"),
    (r"tpu v5p?$", "v5p"),
    (r"tpu v4", "v4"),
    (r"h100.*pcie", "h100-pcie"),
    (r"h100", "h100"),
    (r"h200", "h200"),
    (r"b200", "b200"),
    (r"b100", "b100"),
    (r"a100", "a100"),
    (r"a10g", "a10g"),
    (r"\ba10\b", "a10"),
    (r"l40s", "l40s"),
    (r"\bl4\b", "l4"),
    (r"\bt4\b", "t4"),
    (r"v100", "v100"),
)


def jax_device_kind_to_fray_device_type(kind: str) -> str:
    """A JAX ``device_kind`` (``"TPU v5 lite"``, ``"NVIDIA H100 80GB HBM3"``) as a :data:`DEVICE_FLOPS` key.

    An unknown kind comes back lower-cased, as it was.
    """
    text = str(kind).strip().lower()
    for pattern, device in _JAX_KINDS:
        if re.search(pattern, text):
            return device
    return text


def device_flops_for_jax_device(jax_device_kind: str, dtype: str = "bf16") -> float | None:
    """Peak dense FLOP/s of one JAX device of ``jax_device_kind`` (``jax.devices()[0].device_kind``)."""
    return device_flops(jax_device_kind_to_fray_device_type(jax_device_kind), dtype)
