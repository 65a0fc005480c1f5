"""Backend selection for the block-scaled matmul kernels (docs/SPEC.md §3).

`supported_backend()` names the kernel family usable on the current default device
("hopper" for sm_90, "blackwell" for sm_100, else None: CPU, older GPUs).
`blockscaled_matmul_pallas(a, b, out_dtype=...)` runs the Pallas kernel for the
operands' format (backend "hopper": MXFP8 + NVFP4, dense and grouped MXFP8; backend
"blackwell": tcgen05 MXFP8 / NVFP4, lowering-verified only) or raises `NotImplementedError`.
`is_supported(a, b)` gates `horizon.quant.matmul.blockscaled_matmul(impl="auto"|"pallas")`: it
is True only for the Hopper kernels on a Hopper device, else the dispatcher falls back to the
pure-JAX reference (with a one-time warning when "pallas" was asked).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from horizon.quant import formats as F
from pallas_kernels import _common as C
from pallas_kernels import blockscaled_matmul_hopper as H
from pallas_kernels import grouped_matmul as GM


@functools.cache
def supported_backend() -> str | None:
    """"hopper" | "blackwell" | None for the default device (never raises)."""
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return None
    if dev.platform != "gpu":
        return None
    cc = getattr(dev, "compute_capability", None)
    try:
        major = int(str(cc).split(".")[0])
    except (TypeError, ValueError):
        return None
    if major == 9:
        return "hopper"
    if major == 10:
        return "blackwell"
    return None


def device_sm_count(default: int = C.H100_SMS) -> int:
    """SM count of the default GPU, or `default` when it cannot be read (CPU, export)."""
    try:
        return int(jax.devices()[0].core_count)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return default


def blockscaled_matmul_pallas(a: Any, b: Any, *, out_dtype: Any = jnp.float32,
                              backend: str | None = None, num_sms: int | None = None,
                              interpret: Any = None) -> jax.Array:
    """A [M, K] @ B [N, K]^T with both operands MXTensor (or both NVFP4Tensor) via Pallas."""
    backend = backend or supported_backend()
    if interpret is not None and backend is None:
        backend = "hopper"  # interpret mode runs the Hopper kernels on CPU
    if backend is None:
        raise NotImplementedError("no Pallas block-scaled kernel for this device")
    sms = num_sms or device_sm_count()
    if isinstance(a, F.MXTensor) and isinstance(b, F.MXTensor):
        if a.values.ndim != 2 or b.values.ndim != 2:
            raise NotImplementedError("Pallas path takes 2-D operands")
        # wgmma is sm_90a-only: Blackwell gets the tcgen05 kernel (lowering-verified only, so
        # `is_supported` does not auto-route to it; callers must ask for backend="blackwell").
        if backend == "blackwell":
            from pallas_kernels import blockscaled_matmul_blackwell as BW  # noqa: PLC0415 - lowering-verified only
            return BW.mxfp8_matmul_from_parts(a.values, a.scales, b.values, b.scales, out_dtype=out_dtype)
        if backend != "hopper":
            raise NotImplementedError(f"no MXFP8 Pallas kernel for backend {backend!r}")
        return H.mxfp8_matmul_from_parts(a.values, a.scales, b.values, b.scales, out_dtype=out_dtype,
                                         num_sms=sms, interpret=interpret)
    if isinstance(a, F.NVFP4Tensor) and isinstance(b, F.NVFP4Tensor):
        if a.values.ndim != 2 or b.values.ndim != 2:
            raise NotImplementedError("Pallas path takes 2-D operands")
        if backend == "blackwell":
            from pallas_kernels import blockscaled_matmul_blackwell as BW  # noqa: PLC0415 - lowering-verified only
            return BW.nvfp4_matmul_from_parts(a.values, a.block_scales, a.global_scale, b.values,
                                              b.block_scales, b.global_scale, out_dtype=out_dtype)
        return H.nvfp4_matmul_from_parts(F.pack_fp4(a.values), a.block_scales, a.global_scale,
                                         F.pack_fp4(b.values), b.block_scales, b.global_scale,
                                         out_dtype=out_dtype, num_sms=sms, interpret=interpret)
    raise TypeError(f"operands must both be MXTensor or both NVFP4Tensor, got {type(a).__name__}, "
                    f"{type(b).__name__}")


def is_supported(a: Any, b: Any) -> bool:
    """True when a Pallas kernel covers these operands on this device (used by horizon.quant.matmul).

    2-D B: dense kernel; 3-D B [G, N, K]: grouped (MoE) kernel. MXFP8 on Hopper only.
    """
    if supported_backend() != "hopper":
        return False
    if isinstance(a, F.NVFP4Tensor) and isinstance(b, F.NVFP4Tensor):
        if a.values.ndim != 2 or b.values.ndim != 2 or a.values.shape[1] % 128:
            return False  # dense only; K % 128 (the lowering-tested tile_k)
        try:
            H.auto_config(a.values.shape[0], b.values.shape[0], a.values.shape[1])
        except ValueError:
            return False
        return True
    if not (isinstance(a, F.MXTensor) and isinstance(b, F.MXTensor)):
        return False
    if a.values.ndim != 2 or b.values.ndim not in (2, 3):
        return False
    m = a.values.shape[0] if b.values.ndim == 2 else 64  # grouped: any T (padded to the tile)
    try:
        H.auto_config(m, b.values.shape[-2], a.values.shape[1])
    except ValueError:
        return False
    return True


def blockscaled_matmul(a: Any, b: Any, *, out_dtype: Any = jnp.float32) -> jax.Array:
    """Kernel route of `horizon.quant.matmul` (`KERNELS`; call only when `is_supported`)."""
    return blockscaled_matmul_pallas(a, b, out_dtype=out_dtype)


def grouped_blockscaled_matmul_pallas(a: Any, b: Any, group_sizes: Any, *, out_dtype: Any = jnp.float32,
                                      backend: str | None = None, num_sms: int | None = None,
                                      interpret: Any = None) -> jax.Array:
    """Grouped A [T, K] x B [G, N, K] (MXTensor both) via the Hopper grouped Pallas kernel (docs/SPEC.md §3)."""
    backend = backend or supported_backend()
    if interpret is not None and backend is None:
        backend = "hopper"
    if backend != "hopper":
        raise NotImplementedError(f"no grouped Pallas kernel for backend {backend!r}")
    if not (isinstance(a, F.MXTensor) and isinstance(b, F.MXTensor)):
        raise NotImplementedError("grouped Pallas kernel covers MXFP8 operands only")
    if a.values.ndim != 2 or b.values.ndim != 3:
        raise NotImplementedError("grouped Pallas path takes A [T, K] and B [G, N, K]")
    return GM.grouped_mxfp8_matmul_from_parts(a.values, a.scales, b.values, b.scales,
                                              jnp.asarray(group_sizes, jnp.int32), out_dtype=out_dtype,
                                              num_sms=num_sms or device_sm_count(), interpret=interpret)


def grouped_blockscaled_matmul(a: Any, b: Any, group_sizes: Any, *, out_dtype: Any = jnp.float32) -> jax.Array:
    """Grouped kernel route of `horizon.quant.matmul` (`KERNELS`; call only when `is_supported`)."""
    return grouped_blockscaled_matmul_pallas(a, b, group_sizes, out_dtype=out_dtype)


# What this package registers with horizon.quant (setup.cfg entry point `horizon.quant_kernels`:
# `horizon.quant.matmul.kernel_impl` loads it; horizon.quant never imports pallas_kernels).
KERNELS = dict(blockscaled_matmul=blockscaled_matmul, grouped_blockscaled_matmul=grouped_blockscaled_matmul,
               is_supported=is_supported)
