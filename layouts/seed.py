"""The seed's own V layout (B300 story, V46-V47), and the three mistakes it made on the way.

V is the B operand of the TS-form PV product on sm_103a: MN-major, 128-byte swizzle, head dim 128,
128 keys per block, f16, coordinates ``k`` (key in the block) and ``n`` (head-dim index). In the seed's
own words the element offset is

    k_group*1024 + n_atom*512 + k_in*64 + (n_vec ^ k_in)*8        (+ n_lo inside the 8-element vector)

with k_group = k >> 3, k_in = k & 7, n_atom = n >> 6, n_vec = (n >> 3) & 7, n_lo = n & 7. Here that
formula is not typed in: ``element_formula`` renames the sub-fields of the *derived* byte formula and
divides by the element size, and the test compares the result with ``SEED_ELEMENT_FORMULA``.

The mistakes, each one caught on the basis vectors the seed's probe saw:

* ``n_vec ^ (k & 6)``: the swizzle used only the high bits of k_in; injecting (k=1, n=0) lands 8
  columns off;
* physical row ``k ^ n_atom``: the second 64-column atom swapped K rows once more; injecting
  (k=0, n=64) reads row 1, column 72;
* the 4-D tensor map dims {64, 2, heads, seq}, box {64, 2, 1, 128}: it walks 64 features, then the 2
  atoms, then the rows, so each 128-byte row holds atom A then atom B side by side, where tcgen05
  wants each 8 x 64 atom complete before the next. The 5-D map {64, 8, 2, heads, seq/8}, box
  {64, 8, 2, 1, 16} adds a dim that enumerates atoms and fixes it.
"""

from __future__ import annotations

import sympy

from .derive import band, bxor, coord_symbol, shr
from .operands import OperandDerivation, derive_operand
from .tma import TensorMapParams
from .verify import Mismatch

SEED_SPEC = dict(arch="sm_103a", head_dim=128, block_rows=128, dtype="f16")

k_group, k_in, n_atom, n_vec, n_lo = sympy.symbols("k_group k_in n_atom n_vec n_lo", integer=True, nonnegative=True)
_k, _n = coord_symbol("k"), coord_symbol("n")
SUBFIELDS = {shr(_k, 3): k_group, band(_k, 7): k_in, shr(_n, 6): n_atom, band(shr(_n, 3), 7): n_vec, band(_n, 7): n_lo}

SEED_ELEMENT_FORMULA = k_group * 1024 + n_atom * 512 + k_in * 64 + bxor(n_vec, k_in) * 8 + n_lo

# The seed's two wrong V46 formulas, written in bytes as a template would have rendered them.
WRONG_N_VEC_C = "(k >> 3) * 2048 + (n >> 6) * 1024 + (k & 7) * 128 + (((n >> 3) & 7) ^ (k & 6)) * 16 + (n & 7) * 2"
WRONG_ROW_C = "(k >> 3) * 2048 + (n >> 6) * 1024 + ((k & 7) ^ (n >> 6)) * 128 + (((n >> 3) & 7) ^ (k & 7)) * 16 + (n & 7) * 2"


def seed_v() -> OperandDerivation:
    """The derived, verified V tile of the seed's sm_103a kernel."""
    return derive_operand("v", **SEED_SPEC)


def element_formula(derivation: OperandDerivation) -> sympy.Expr:
    """The derived byte formula in the seed's sub-field names, in elements."""
    return sympy.expand(derivation.formula.xreplace(SUBFIELDS) / derivation.elem_bytes)


def four_d_box(heads: int = 4, seq_len: int = 256) -> TensorMapParams:
    """The pv_n128-era map: dims {64, 2, heads, seq}, box {64, 2, 1, 128}, for a (seq, heads, 128) f16 V."""
    row = heads * 128 * 2
    return TensorMapParams(4, (64, 2, heads, seq_len), (128, 256, row), (64, 2, 1, 128), (1, 1, 1, 1), 128, 2, "f16")


def four_d_box_mismatches(derivation: OperandDerivation, heads: int = 4, seq_len: int = 256) -> list[Mismatch]:
    """Compare the 4-D box's placement (tile at keys 128..255 of head 1) with the derived layout."""
    params = four_d_box(heads, seq_len)
    head, seq_start = 1, 128
    return derivation.check_tensor_map(params, (0, 0, head, seq_start), batch_index=0, seq_start=seq_start,
                                       head=head, stride_b=0, stride_s=heads * 128, stride_h=128)
