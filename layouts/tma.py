"""A hardware model of the TMA tiled copy, and the limits ``cuTensorMapEncodeTiled`` enforces.

``TensorMapParams`` holds exactly the arguments the driver takes (rank, global dims innermost first,
byte strides of dims 1.., box dims, element strides, swizzle, element type) and refuses, on
construction, anything the driver documentation says it rejects. Interleave is always NONE here:
flashgen never uses the interleaved (NC/8HWC8) layouts, so they are not modelled.

``place_box`` is the model of what one ``cp.async.bulk.tensor`` load does with such a map: it walks
the box innermost dimension first, packs the elements densely into shared memory in that order, and
then applies the swizzle to the shared-memory byte address (a permutation of 16-byte chunks inside
each span). It knows nothing about operands or formulas; derivations are checked against it. The
swizzle is ``hw_swizzle``'s, written from the PTX ISA's "Swizzling Modes" tables, not ``swizzle.Swizzle``
that builds the tiles: a model sharing the tiles' swizzle would agree with a wrong one.

Requirements checked (CUDA Driver API, "Tensor Map Object Management", cuTensorMapEncodeTiled):
tensorRank 1..5; globalAddress 16-byte aligned; globalDim non-zero and <= 2^32; globalStrides a
multiple of 16 and < 2^40; boxDim non-zero and <= 256; with interleave NONE, boxDim[0] * element size a
multiple of 16 bytes; with a swizzle, that inner box extent <= the swizzle span; elementStrides
non-zero and <= 8. Shared memory: the destination of a tensor copy must be 128-byte aligned (CUDA C++
Programming Guide, TMA alignment: "Shared memory address: must be 128 byte aligned"). A swizzled destination
need not sit on its pattern boundary (1024 B for the 128-byte swizzle): PTX ISA "Swizzling Modes" gives the
copy a swizzle base offset, (dstMem / 128) % 8 for the 128-byte mode, the pattern line its first 128 bytes
take, so the pattern stays anchored to the absolute shared address; the model swizzles the absolute address
(``hw_swizzle.swizzle_base_offset`` is the ISA's formula, and the tests hold the two to each other). Whole
tiles sit on their boundary anyway, because the MMA descriptors read them from there (mma.py); a paged
cache's loads of 1-4 rows land inside a tile (layouts.paged).
The driver's illustration "globalStrides[i] = globalStrides[i-1] * (globalDim[i] + padding)" is not a
requirement: strides may go in any order, which the seed's 5-D V map depends on (dim 2 has a smaller
stride than dim 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import DTYPES
from .errors import LayoutError
from .hw_swizzle import hw_swizzle
from .swizzle import Swizzle  # only for the ``swizzle`` property other code reads; the model never calls it

# CUtensorMapDataType values (driver API enum) and sizes for the types flashgen stages.
TMA_DTYPES = {name: (d.tma_code, d.bytes) for name, d in DTYPES.items()}
# CUtensorMapSwizzle values: NONE, 32B, 64B, 128B.
TMA_SWIZZLE_ENUM = {0: 0, 32: 1, 64: 2, 128: 3}
# The same enums by name, for code that calls the driver (codegen.driver) or emits C (codegen.export).
TMA_DTYPE_NAMES = {name: d.tma for name, d in DTYPES.items()}
TMA_SWIZZLE_NAMES = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
                     64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}

# CUtensorMapL2promotion by bytes: how far the L2 widens a tensor copy's misses. A map's own choice comes from
# its derivation (layouts.derive_operand); L2_PROMOTION_BYTES is the forward and backward families' (measured
# with it; 128 was within run-to-run noise there). A pure stream of decode's K/V boxes ran at 4.0 TB/s with 256
# and 4.33-4.39 TB/s with 128, 64 or none (H200, scripts/stream_probe.cu; bench/LOG.md "Decode", d5): the
# widened fetches came back as a quarter more L2 sector lookups, all hits, and L2 throughput was the limit.
TMA_L2_PROMOTION_ENUM = {0: 0, 64: 1, 128: 2, 256: 3}
TMA_L2_PROMOTION_NAMES = {0: "CU_TENSOR_MAP_L2_PROMOTION_NONE", 64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
                          128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", 256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}
L2_PROMOTION_BYTES = 256

MAX_RANK = 5
MAX_GLOBAL_DIM = 1 << 32
STRIDE_LIMIT = 1 << 40
MAX_BOX_DIM = 256
MAX_ELEMENT_STRIDE = 8
GLOBAL_ALIGN = 16
SMEM_ALIGN = 128


@dataclass(frozen=True)
class TensorMapParams:
    """The arguments of cuTensorMapEncodeTiled, validated on construction."""

    rank: int
    dims: tuple
    strides_bytes: tuple
    box: tuple
    elem_strides: tuple
    swizzle_bytes: int
    elem_bytes: int
    dtype: str
    global_address: int = 0
    l2_promotion_bytes: int = L2_PROMOTION_BYTES

    def __post_init__(self):
        for name in ("dims", "strides_bytes", "box", "elem_strides"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        r = self.rank
        if not 1 <= r <= MAX_RANK:
            raise LayoutError(f"tensorRank {r}: cuTensorMapEncodeTiled supports ranks 1..{MAX_RANK}")
        if self.dtype not in TMA_DTYPES:
            raise LayoutError(f"dtype {self.dtype!r}: flashgen stages only {sorted(TMA_DTYPES)} through TMA")
        if self.elem_bytes != TMA_DTYPES[self.dtype][1]:
            raise LayoutError(f"elem_bytes {self.elem_bytes} does not match {self.dtype} ({TMA_DTYPES[self.dtype][1]} B)")
        if len(self.dims) != r:
            raise LayoutError(f"globalDim has {len(self.dims)} entries; the rank is {r}")
        if len(self.strides_bytes) != r - 1:
            raise LayoutError(f"globalStrides has {len(self.strides_bytes)} entries; rank {r} needs {r - 1} (dims 1..)")
        if len(self.box) != r:
            raise LayoutError(f"boxDim has {len(self.box)} entries; the rank is {r}")
        if len(self.elem_strides) != r:
            raise LayoutError(f"elementStrides has {len(self.elem_strides)} entries; the rank is {r}")
        if self.global_address % GLOBAL_ALIGN:
            raise LayoutError(f"globalAddress {self.global_address:#x} is not 16-byte aligned, as TMA requires")
        for i, d in enumerate(self.dims):
            if not 0 < d <= MAX_GLOBAL_DIM:
                raise LayoutError(f"globalDim[{i}] = {d}: must be non-zero and at most 2^32")
        for i, s in enumerate(self.strides_bytes, start=1):
            if s % 16:
                raise LayoutError(f"globalStrides for dim {i} = {s} B: TMA needs a multiple of 16 bytes")
            if not 0 <= s < STRIDE_LIMIT:
                raise LayoutError(f"globalStrides for dim {i} = {s} B: must be below 2^40")
        for i, b in enumerate(self.box):
            if not 0 < b <= MAX_BOX_DIM:
                raise LayoutError(f"boxDim[{i}] = {b}: must be non-zero and at most 256")
        inner_bytes = self.box[0] * self.elem_bytes
        if inner_bytes % 16:
            raise LayoutError(f"inner box extent {inner_bytes} B: with interleave NONE it must be a multiple of 16 bytes")
        if self.swizzle_bytes not in TMA_SWIZZLE_ENUM:
            raise LayoutError(f"swizzle {self.swizzle_bytes} B: expected 0 (none), 32, 64 or 128")
        if self.swizzle_bytes and inner_bytes > self.swizzle_bytes:
            raise LayoutError(
                f"inner box extent {inner_bytes} B exceeds the {self.swizzle_bytes} B swizzle span; the driver "
                "requires boxDim[0] * element size <= swizzle size"
            )
        for i, e in enumerate(self.elem_strides):
            if not 0 < e <= MAX_ELEMENT_STRIDE:
                raise LayoutError(f"elementStrides[{i}] = {e}: must be non-zero and at most 8")
        if self.l2_promotion_bytes not in TMA_L2_PROMOTION_NAMES:
            raise LayoutError(f"L2 promotion {self.l2_promotion_bytes} B: expected 0 (none), 64, 128 or 256")

    @property
    def swizzle(self) -> Swizzle:
        return Swizzle(self.swizzle_bytes)

    @property
    def box_counts(self) -> tuple:
        """Elements actually copied per dim: ceil(box / elementStride); dim 0 ignores its stride."""
        return tuple(self.box[0] if i == 0 else -(-b // e) for i, (b, e) in enumerate(zip(self.box, self.elem_strides)))

    @property
    def box_bytes(self) -> int:
        """Bytes one load writes to shared memory (the mbarrier expect_tx count)."""
        return int(np.prod(self.box_counts)) * self.elem_bytes

    def driver_args(self) -> dict:
        """The enum-level argument set, for the code that calls the driver."""
        return {
            "tensorDataType": TMA_DTYPES[self.dtype][0],
            "tensorRank": self.rank,
            "globalAddress": self.global_address,
            "globalDim": list(self.dims),
            "globalStrides": list(self.strides_bytes),
            "boxDim": list(self.box),
            "elementStrides": list(self.elem_strides),
            "interleave": 0,
            "swizzle": TMA_SWIZZLE_ENUM[self.swizzle_bytes],
            "l2Promotion": TMA_L2_PROMOTION_ENUM[self.l2_promotion_bytes],
        }


@dataclass(frozen=True)
class BoxPlacement:
    """Where every element of one box goes: parallel arrays, one entry per box element."""

    global_address: np.ndarray  # byte address in global memory; -1 where out of bounds (zero-filled)
    smem_offset: np.ndarray     # byte offset from the start of the shared-memory destination

    def smem_for_global(self, addresses):
        """Shared offset holding each global byte address, or -1 where the box did not copy it."""
        order = np.argsort(self.global_address, kind="stable")
        keys = self.global_address[order]
        addresses = np.asarray(addresses, dtype=np.int64)
        pos = np.clip(np.searchsorted(keys, addresses), 0, len(keys) - 1)
        hit = keys[pos] == addresses
        return np.where(hit, self.smem_offset[order][pos], -1)


def place_box(params: TensorMapParams, origin, smem_address: int = 0) -> BoxPlacement:
    """Model one tiled TMA load of the box whose first element is at tensor coordinates ``origin``, into the
    shared address ``smem_address`` (128-byte aligned; off the swizzle pattern's boundary it starts at the ISA's
    swizzle base offset, which swizzling the absolute address gives)."""
    origin = tuple(int(o) for o in origin)
    if len(origin) != params.rank:
        raise LayoutError(f"box origin has {len(origin)} coordinates; the rank is {params.rank}")
    if smem_address % SMEM_ALIGN:
        raise LayoutError(f"shared destination {smem_address} is not 128-byte aligned, as tensor copies require")
    counts = params.box_counts
    n = len(counts)
    idx = np.indices(tuple(reversed(counts)), dtype=np.int64).reshape(n, -1)
    box_coord = [idx[n - 1 - i] for i in range(n)]  # dim 0 varies fastest: the box is walked innermost first
    strides = (params.elem_bytes,) + params.strides_bytes
    address = np.full(idx.shape[1], params.global_address, dtype=np.int64)
    inside = np.ones(idx.shape[1], dtype=bool)
    for i in range(n):
        step = 1 if i == 0 else params.elem_strides[i]
        coord = origin[i] + box_coord[i] * step
        inside &= (coord >= 0) & (coord < params.dims[i])
        address += coord * strides[i]
    dense = np.arange(idx.shape[1], dtype=np.int64) * params.elem_bytes
    smem = hw_swizzle(params.swizzle_bytes, smem_address + dense) - smem_address
    return BoxPlacement(np.where(inside, address, -1), smem)
