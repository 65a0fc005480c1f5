"""horizon.quant: the grouped expert GEMM, MXFP8 / NVFP4 formats, block-scaled matmul references, the quantized
MoE GEMM (docs/SPEC.md §1.2, §3): the matmul numerics `horizon.model` builds on.

Pure-JAX references that define correctness for the GPU kernels in ``pallas_kernels/``
(contract: docs/KERNELS.md).
"""

from horizon.quant.formats import (
    MXTensor,
    NVFP4Tensor,
    approx_reciprocal,
    dequantize,
    dequantize_mxfp8,
    dequantize_nvfp4,
    pack_fp4,
    quantize_mxfp8,
    quantize_nvfp4,
    unpack_fp4,
)
from horizon.quant.matmul import (
    blockscaled_matmul,
    blockscaled_matmul_reference,
    grouped_blockscaled_matmul,
    grouped_blockscaled_matmul_reference,
)
from horizon.quant.qmoe import PRECISIONS, quantized_ragged_dot

__all__ = [
    "MXTensor", "NVFP4Tensor", "approx_reciprocal", "dequantize", "dequantize_mxfp8", "dequantize_nvfp4",
    "pack_fp4", "quantize_mxfp8", "quantize_nvfp4", "unpack_fp4", "blockscaled_matmul",
    "blockscaled_matmul_reference", "grouped_blockscaled_matmul", "grouped_blockscaled_matmul_reference",
    "PRECISIONS", "quantized_ragged_dot",
]
