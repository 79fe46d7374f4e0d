"""The one table of element types and the one of head dims flashgen generates kernels for.

Every module that needs a fact about a dtype (its size, its torch, CUDA C and PTX names, its
CUtensorMapDataType) reads it here; nothing else lists them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str      # flashgen's name; also the PTX type suffix (wgmma .f16/.bf16, cvt .f16x2/.bf16x2)
    bytes: int
    torch: str     # the attribute of the torch module
    c: str         # the CUDA C type (cuda_fp16.h / cuda_bf16.h)
    tma: str       # the CUtensorMapDataType enumerator
    tma_code: int  # its value (CUDA driver API)


DTYPES = {
    "f16": DType("f16", 2, "float16", "__half", "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 6),
    "bf16": DType("bf16", 2, "bfloat16", "__nv_bfloat16", "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 9),
}
DTYPE_NAMES = tuple(DTYPES)
BY_TORCH_NAME = {d.torch: d for d in DTYPES.values()}

# Head dims whose rows are whole swizzle atoms (layouts.operands derives their tiles).
HEAD_DIMS = (64, 96, 128, 192, 256)
