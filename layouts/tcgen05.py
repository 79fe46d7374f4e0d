"""Blackwell (sm_100a, sm_103a) tensor-core facts as data: the tcgen05.mma instruction descriptor, the tensor
memory (TMEM) column plan of an attention tile, and where a tcgen05.ld puts each TMEM cell.

Instruction descriptor (PTX ISA, "Instruction descriptor format for .kind::f16 and .kind::tf32"), a 32-bit
operand of tcgen05.mma::

    bits    field
    0-1     sparsity selector (0: dense)
    2       sparsity (0: dense, 1: sparse)
    3       saturate (integer kinds only; 0 here)
    4-5     D type: 0 f16, 1 f32
    6       reserved
    7-9     A type: 0 f16, 1 bf16 (2 tf32)
    10-12   B type: the same codes
    13      negate A            14   negate B
    15      A major: 0 K-major, 1 MN-major
    16      B major: the same
    17-22   N >> 3
    23      reserved
    24-28   M >> 4
    29      reserved
    30-31   maximum shift (weight-stationary only; 0 here)

Tensor memory (PTX ISA, "Tensor Memory"): 128 lanes x 512 columns of 32-bit cells per CTA, allocated by
`tcgen05.alloc` in powers of two from 32 columns. A TMEM address is (lane << 16) | column. A warp reaches only
its lane quarter: warp w accesses lanes 32 * (w % 4) .. 32 * (w % 4) + 31 (the seed's probe read repeated
values from the issuing warp for this reason). With M = 128 and cta_group::1, row i of the accumulator is lane i
and column j of it is TMEM column base + j (f32); P written back over S as packed 16-bit pairs takes half of
S's columns.

`tcgen05.ld.sync.aligned.32x32b.x<n>`: thread t of a warp reads lane 32 * (w % 4) + t, columns base .. base + n
- 1 into its registers 0 .. n - 1: the map (lane, warp, reg) -> (row, col) is linear, `tmem_load_32x32b`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DTYPES
from .errors import LayoutError
from .linear import LinearLayout, log2_exact

MMA_TYPE_CODE = {"f16": 0, "bf16": 1}  # A and B types of .kind::f16
ACC_TYPE_CODE = {"f16": 0, "f32": 1}
MAJOR_CODE = {"K": 0, "MN": 1}
TMEM_LANES = 128
TMEM_COLUMNS = 512
TMEM_MIN_ALLOC = 32
LANES_PER_WARP = 32

# (lo, width) of each field
_FIELDS = {
    "sparse_selector": (0, 2), "sparse": (2, 1), "saturate": (3, 1), "d_type": (4, 2), "a_type": (7, 3),
    "b_type": (10, 3), "negate_a": (13, 1), "negate_b": (14, 1), "a_major": (15, 1), "b_major": (16, 1),
    "n_shr3": (17, 6), "m_shr4": (24, 5), "max_shift": (30, 2),
}
_RESERVED_BITS = (6, 23, 29)


@dataclass(frozen=True)
class InstrDescriptor:
    """A dense, non-negated .kind::f16 tcgen05.mma descriptor with cta_group::1."""

    m: int
    n: int
    ab_type: str         # "f16" or "bf16" (A and B share it)
    d_type: str = "f32"
    a_major: str = "K"
    b_major: str = "K"

    def __post_init__(self):
        if self.ab_type not in MMA_TYPE_CODE:
            raise LayoutError(f".kind::f16 takes f16 or bf16 operands, got {self.ab_type!r}")
        if self.d_type not in ACC_TYPE_CODE:
            raise LayoutError(f"the accumulator is f16 or f32, got {self.d_type!r}")
        if self.a_major not in MAJOR_CODE or self.b_major not in MAJOR_CODE:
            raise LayoutError(f"majors are 'K' or 'MN', got {self.a_major!r}, {self.b_major!r}")
        # PTX ISA, "Matrix shape" of tcgen05.mma .kind::f16 with cta_group::1: M 64 or 128; N a multiple of 8
        # (M = 64) or 16 (M = 128) from 8 or 16 to 256.
        if self.m not in (64, 128):
            raise LayoutError(f"M = {self.m}: cta_group::1 .kind::f16 takes M = 64 or 128")
        step = 8 if self.m == 64 else 16
        if not (step <= self.n <= 256 and self.n % step == 0):
            raise LayoutError(f"N = {self.n}: with M = {self.m}, N is a multiple of {step} in {step}..256")

    def encode(self) -> int:
        fields = {"d_type": ACC_TYPE_CODE[self.d_type], "a_type": MMA_TYPE_CODE[self.ab_type],
                  "b_type": MMA_TYPE_CODE[self.ab_type], "a_major": MAJOR_CODE[self.a_major],
                  "b_major": MAJOR_CODE[self.b_major], "n_shr3": self.n >> 3, "m_shr4": self.m >> 4}
        value = 0
        for name, field_value in fields.items():
            lo, width = _FIELDS[name]
            assert 0 <= field_value < 1 << width, (name, field_value)
            value |= field_value << lo
        return value

    @classmethod
    def decode(cls, value: int) -> "InstrDescriptor":
        if not 0 <= value < 1 << 32:
            raise LayoutError(f"instruction descriptor {value:#x} is not a 32-bit value")
        for bit in _RESERVED_BITS:
            if value >> bit & 1:
                raise LayoutError(f"instruction descriptor {value:#010x}: reserved bit {bit} is set")
        f = {name: value >> lo & ((1 << width) - 1) for name, (lo, width) in _FIELDS.items()}
        for name in ("sparse_selector", "sparse", "saturate", "negate_a", "negate_b", "max_shift"):
            if f[name]:
                raise LayoutError(f"instruction descriptor {value:#010x}: {name} = {f[name]} is not modelled")
        if f["a_type"] != f["b_type"]:
            raise LayoutError(f"instruction descriptor {value:#010x}: A and B types differ")
        types = {c: t for t, c in MMA_TYPE_CODE.items()}
        accs = {c: t for t, c in ACC_TYPE_CODE.items()}
        majors = {c: m for m, c in MAJOR_CODE.items()}
        if f["a_type"] not in types or f["d_type"] not in accs:
            raise LayoutError(f"instruction descriptor {value:#010x}: type codes {f['a_type']}, {f['d_type']} "
                              "are not .kind::f16 f16/bf16 -> f16/f32")
        return cls(m=f["m_shr4"] << 4, n=f["n_shr3"] << 3, ab_type=types[f["a_type"]], d_type=accs[f["d_type"]],
                   a_major=majors[f["a_major"]], b_major=majors[f["b_major"]])

    def describe(self) -> str:
        return (f"M={self.m} N={self.n} {self.ab_type}x{self.ab_type}->{self.d_type} A {self.a_major}-major "
                f"B {self.b_major}-major")


@dataclass(frozen=True)
class TmemRegion:
    name: str
    first_column: int
    columns: int


@dataclass(frozen=True)
class TmemPlan:
    """The TMEM columns of one 128-row attention tile: `buffers` copies of S (block_n f32 columns each, P
    written back over its first half as packed 16-bit pairs) and O (head_dim f32 columns), allocated as one
    power-of-two block."""

    block_n: int
    head_dim: int
    elem_bytes: int
    buffers: int = 2

    @property
    def regions(self) -> tuple[TmemRegion, ...]:
        regions, column = [], 0
        for b in range(self.buffers):
            regions.append(TmemRegion(f"s{b}", column, self.block_n))
            column += self.block_n
        regions.append(TmemRegion("o", column, self.head_dim))
        return tuple(regions)

    @property
    def used_columns(self) -> int:
        last = self.regions[-1]
        return last.first_column + last.columns

    @property
    def alloc_columns(self) -> int:
        used = self.used_columns
        alloc = max(TMEM_MIN_ALLOC, 1 << (used - 1).bit_length())
        if alloc > TMEM_COLUMNS:
            raise LayoutError(f"{self.buffers} S buffers of {self.block_n} columns and O of {self.head_dim} need "
                              f"{used} TMEM columns, over the {TMEM_COLUMNS} a CTA has")
        return alloc

    def p_columns(self, buffer: int) -> TmemRegion:
        """Where P of buffer `buffer` sits: over the first block_n * elem_bytes / 4 columns of its S."""
        s = self.regions[buffer]
        packed = self.block_n * self.elem_bytes // 4
        return TmemRegion(f"p{buffer}", s.first_column, packed)

    def check(self) -> None:
        """Regions inside the allocation, disjoint, P inside its S."""
        end = self.alloc_columns
        spans = sorted((r.first_column, r.first_column + r.columns, r.name) for r in self.regions)
        for (a0, a1, a), (b0, _, b) in zip(spans, spans[1:]):
            if a1 > b0:
                raise LayoutError(f"TMEM regions {a} and {b} overlap")
        if spans[-1][1] > end:
            raise LayoutError(f"TMEM region {spans[-1][2]} ends at column {spans[-1][1]}, past the allocation {end}")
        for b in range(self.buffers):
            p, s = self.p_columns(b), self.regions[b]
            if p.first_column < s.first_column or p.first_column + p.columns > s.first_column + s.columns:
                raise LayoutError(f"P of buffer {b} leaves its S")


def tmem_plan(block_n: int, head_dim: int, dtype: str, buffers: int = 2) -> TmemPlan:
    plan = TmemPlan(block_n, head_dim, DTYPES[dtype].bytes, buffers)
    plan.check()
    return plan


def tmem_address(lane: int, column: int) -> int:
    """A TMEM address: lane in bits 16-31, column in bits 0-15 (PTX ISA, "Tensor Memory Addressing")."""
    if not (0 <= lane < TMEM_LANES and 0 <= column < TMEM_COLUMNS):
        raise LayoutError(f"TMEM cell (lane {lane}, column {column}) is outside 128 x 512")
    return lane << 16 | column


def warp_lane_base(warp: int) -> int:
    """The first TMEM lane a warp may access: its lane quarter (warp % 4)."""
    return LANES_PER_WARP * (warp % 4)


def tmem_load_32x32b(columns: int) -> LinearLayout:
    """(lane, warp, reg) -> (row, col) of tcgen05.ld.32x32b.x<columns> by the four warps of a warpgroup:
    thread `lane` of warp `warp` gets row 32 * warp + lane, column `reg`."""
    col_bits = log2_exact(columns, "tcgen05.ld .32x32b repeat count")
    return LinearLayout({
        "lane": [{"row": 1 << b, "col": 0} for b in range(5)],
        "warp": [{"row": 32, "col": 0}, {"row": 64, "col": 0}],
        "reg": [{"row": 0, "col": 1 << b} for b in range(col_bits)],
    }, {"lane": 32, "warp": 4, "reg": columns}, {"row": TMEM_LANES, "col": columns})
