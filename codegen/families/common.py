"""Plan helpers every family shares: layout facts turned into the C a template renders, each checked here."""

from __future__ import annotations

import dataclasses

import sympy

from layouts import mma as layouts_mma
from layouts.derive import to_c

from codegen.abi import Pack, Param

# What a basis-vector probe kernel takes after its tensor maps, on every architecture: the given P, and where S
# and O go as the MMAs left them.
PROBE_PARAMS = (
    Param("p_in", "const float* __restrict__", Pack.POINTER, "float (B, block_m, block_n): the P to multiply V by",
          "p_in"),
    Param("s_out", "float* __restrict__", Pack.POINTER, "float (B, block_m, block_n): S = Q K^T as the MMA left it",
          "s_out"),
    Param("o_out", "float* __restrict__", Pack.POINTER, "float (B, block_m, head_dim): O = P V as the MMA left it",
          "o_out"),
)


def normalized_window(spec) -> tuple[int, int]:
    """spec.window with a bound that reaches past every key made -1 (none): one kernel, and no int overflow, for
    all of them."""
    return tuple(-1 if w >= spec.seq_len + spec.keys else w for w in spec.window)


def window_bounds(spec) -> tuple[int, int]:
    """(left, right) key offsets from each query's diagonal; -1 is unbounded. Causal sets right = 0, whatever the
    window's right bound (as FlashAttention does)."""
    left, right = spec.window
    return left, 0 if spec.causal else right


def tma_origin_c(operand, names: tuple[str, str, str], seq_len: int) -> str:
    """The tensor-map coordinates of the operand's tile as C arguments over `names`: the C names of (first
    sequence row, head, tensor-map batch index) where the expression is used."""
    row, head, batch = (sympy.Symbol(n) for n in names)
    origin = operand.tensor_map.box_origin(batch_index=batch, seq_start=row, head=head, seq_len=seq_len)
    return ", ".join(to_c(sympy.sympify(c)) for c in origin)


def descriptor_address_shift(operands) -> int:
    """How a tile's shared address enters a descriptor built for address 0: encode(start = a) equals
    encode(start = 0) + (a >> shift) for every tile address (checked, per operand, against layouts.mma's
    encoder, wgmma and tcgen05 alike)."""
    shifts = set()
    for op in operands:
        base = op.descriptor_objects()[0]
        zero = dataclasses.replace(base, start_address=0).encode()
        unit = dataclasses.replace(base, start_address=op.smem_align).encode() - zero
        shift = (op.smem_align // unit).bit_length() - 1
        assert unit << shift == op.smem_align, (op.operand, unit)
        for address in range(0, layouts_mma.FIELD_LIMIT, op.smem_align):
            if dataclasses.replace(base, start_address=address).encode() != zero + (address >> shift):
                raise AssertionError(f"{op.operand}: start address {address} does not encode as address >> {shift}")
        shifts.add(shift)
    (shift,) = shifts
    return shift
