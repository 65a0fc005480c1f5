"""GPU kernels (Pallas / Mosaic GPU) for block-scaled low-precision matmul (docs/SPEC.md §3).

Each kernel module is tested against its pure-JAX reference in `horizon.quant`.
"""

from pallas_kernels.dispatch import (  # noqa: E402,F401
    blockscaled_matmul,
    blockscaled_matmul_pallas,
    grouped_blockscaled_matmul,
    grouped_blockscaled_matmul_pallas,
    is_supported,
    supported_backend,
)
