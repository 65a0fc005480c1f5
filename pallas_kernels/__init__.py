"""GPU kernels (Pallas / Mosaic GPU) for block-scaled low-precision matmul (SPEC §3).

Each kernel module is tested against its pure-JAX reference in `horizon.quant`.
"""
