"""Shared-memory matrix descriptors of wgmma (sm_90a) and tcgen05 (sm_100a, sm_103a), and a model of
which shared-memory byte an MMA reads for each operand element.

Encoding (PTX ISA; every field is ``matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4``, so byte
values must be multiples of 16 below 2^18)::

    bits    wgmma ("Matrix Descriptor Format")      tcgen05 ("Shared Memory Descriptor")
    0-13    start address                           start address
    16-29   leading dimension byte offset (LBO)     LBO (relative) or absolute address (bit 52)
    32-45   stride dimension byte offset (SBO)      SBO
    46-48   -                                       fixed 0b001
    49-51   base offset                             base offset
    52      -                                       LBO mode: 0 relative, 1 absolute (sm_103a)
    53-60   -                                       fixed 0
    61-63   bits 62-63: 0 none, 1 128B, 2 64B,      0 none, 1 128B with 32B atoms, 2 128B,
            3 32B                                   4 64B, 6 32B (3, 5, 7 invalid)

Read model. The operand is split into 8-row groups of "core matrices". With S the swizzle span
(bytes), e the element size, r the M/N index and k the K index:

* K-major, swizzled: rows are S bytes apart inside an 8-row atom; atoms along M/N are SBO apart;
  one instruction's K (32 bytes) lies inside a row, so LBO is unused ("not used, assumed to be 1").
  ``pre = start + (r % 8) * S + (r // 8) * SBO + k * e``
* K-major, no swizzle: 8 x 16-byte core matrices; LBO steps along K, SBO along M/N.
  ``pre = start + (r % 8) * 16 + (r // 8) * SBO + (k*e // 16) * LBO + k*e % 16``
* MN-major, swizzled: an atom is S bytes of M/N by 8 K-rows; LBO is the stride from one group of
  S/16 128-bit M/N "rows" to the next, i.e. between atoms along M/N; SBO steps between 8-row K groups
  (PTX ISA "Major-ness supported by Strides": "Swizzled layouts: stride from the first
  (swizzle-byte-size/16) rows to the next (swizzle-byte-size/16) rows").
  ``pre = start + (r*e % S) + (k % 8) * S + (r*e // S) * LBO + (k // 8) * SBO``
* MN-major, no swizzle: LBO steps between 8-column K groups ("Interleave: stride from the first 8
  columns to the next 8 columns"), SBO between 16-byte M/N core matrices.
  ``pre = start + (r*e % 16) + (k % 8) * 16 + (r*e // 16) * SBO + (k // 8) * LBO``

The byte read is ``swizzle(pre)``: the swizzle acts on the address, so a start address moved by 32,
64 or 96 bytes inside a 128-byte row (the next K slice of a K-major tile) stays correct. That swizzle
is ``hw_swizzle``'s, written from the PTX ISA's own description, not ``swizzle.Swizzle``, which builds
the tiles this model checks: sharing it would let a wrong swizzle agree with itself. Base offset
and the absolute-LBO mode are encoded and decoded but not modelled: the read model refuses them,
because flashgen places every tile on its pattern boundary where the base offset is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayoutError
from .hw_swizzle import hw_swizzle
from .swizzle import Swizzle  # names the descriptor's mode; the read model takes only its span

DESCRIPTOR_KINDS = ("wgmma", "tcgen05")
ARCH_DESCRIPTOR_KIND = {"sm_90a": "wgmma", "sm_100a": "tcgen05", "sm_103a": "tcgen05"}

# Swizzle span (bytes) -> mode code, per descriptor kind (see the table in the module docstring).
WGMMA_SWIZZLE_CODE = {0: 0, 128: 1, 64: 2, 32: 3}
TCGEN05_SWIZZLE_CODE = {0: 0, 128: 2, 64: 4, 32: 6}
TCGEN05_SWIZZLE_128B_ATOM_32B = 1

FIELD_LIMIT = 1 << 18  # matrix-descriptor-encode keeps address bits 4..17
TCGEN05_FIXED_46_48 = 0b001
MMA_K_BYTES = 32  # K of one f16/bf16 (k16), tf32 (k8) or 8-bit (k32) instruction, in bytes

_MASK14 = (1 << 14) - 1


def _encode_field(value: int, name: str) -> int:
    if value % 16:
        raise LayoutError(f"{name} = {value} B: descriptors drop the low 4 bits, so it must be a multiple of 16")
    if not 0 <= value < FIELD_LIMIT:
        raise LayoutError(f"{name} = {value} B: the 14-bit field holds (x & 0x3FFFF) >> 4, so 0 <= x < 2^18")
    return value >> 4


@dataclass(frozen=True)
class SmemDescriptor:
    """One 64-bit shared-memory matrix descriptor, fields in bytes."""

    kind: str
    start_address: int
    lbo: int
    sbo: int
    swizzle: Swizzle
    base_offset: int = 0
    lbo_mode: int = 0

    def __post_init__(self):
        if self.kind not in DESCRIPTOR_KINDS:
            raise LayoutError(f"descriptor kind {self.kind!r}: expected one of {DESCRIPTOR_KINDS}")
        _encode_field(self.start_address, "start address")
        _encode_field(self.lbo, "leading dimension byte offset")
        _encode_field(self.sbo, "stride dimension byte offset")
        if not 0 <= self.base_offset <= 7:
            raise LayoutError(f"base offset {self.base_offset}: a 3-bit field, 0..7")
        if self.kind == "wgmma" and self.base_offset and not self.swizzle.span_bytes:
            raise LayoutError("wgmma base offset is only valid with a swizzle mode, not with no-swizzle")
        if self.lbo_mode not in (0, 1):
            raise LayoutError(f"LBO mode {self.lbo_mode}: bit 52 is 0 (relative) or 1 (absolute)")
        if self.kind == "wgmma" and self.lbo_mode:
            raise LayoutError("LBO mode (bit 52) exists only in tcgen05 descriptors")

    @property
    def swizzle_code(self) -> int:
        table = WGMMA_SWIZZLE_CODE if self.kind == "wgmma" else TCGEN05_SWIZZLE_CODE
        return table[self.swizzle.span_bytes]

    def encode(self) -> int:
        value = (_encode_field(self.start_address, "start address")
                 | _encode_field(self.lbo, "LBO") << 16
                 | _encode_field(self.sbo, "SBO") << 32
                 | self.base_offset << 49)
        if self.kind == "wgmma":
            return value | self.swizzle_code << 62
        return value | TCGEN05_FIXED_46_48 << 46 | self.lbo_mode << 52 | self.swizzle_code << 61

    @classmethod
    def decode(cls, kind: str, value: int) -> "SmemDescriptor":
        if not 0 <= value < 1 << 64:
            raise LayoutError(f"descriptor {value:#x} is not a 64-bit value")
        if kind not in DESCRIPTOR_KINDS:
            raise LayoutError(f"descriptor kind {kind!r}: expected one of {DESCRIPTOR_KINDS}")
        for lo, hi in ((14, 15), (30, 31)):
            if value >> lo & ((1 << (hi - lo + 1)) - 1):
                raise LayoutError(f"descriptor {value:#018x}: reserved bits {lo}-{hi} are set")
        fields = dict(start_address=(value & _MASK14) << 4, lbo=(value >> 16 & _MASK14) << 4,
                      sbo=(value >> 32 & _MASK14) << 4, base_offset=value >> 49 & 7)
        if kind == "wgmma":
            if value >> 46 & 0b111 or value >> 52 & ((1 << 10) - 1):
                raise LayoutError(f"descriptor {value:#018x}: unused wgmma bits 46-48 or 52-61 are set")
            spans = {c: s for s, c in WGMMA_SWIZZLE_CODE.items()}
            return cls("wgmma", swizzle=Swizzle(spans[value >> 62]), **fields)
        if value >> 46 & 0b111 != TCGEN05_FIXED_46_48:
            raise LayoutError(f"descriptor {value:#018x}: tcgen05 bits 46-48 must hold the fixed value 0b001")
        if value >> 53 & 0xFF:
            raise LayoutError(f"descriptor {value:#018x}: tcgen05 bits 53-60 must be 0")
        code = value >> 61
        spans = {c: s for s, c in TCGEN05_SWIZZLE_CODE.items()}
        if code == TCGEN05_SWIZZLE_128B_ATOM_32B:
            raise LayoutError("swizzle code 1 (128B with 32B atomicity) is valid PTX but not modelled by flashgen")
        if code not in spans:
            raise LayoutError(f"descriptor {value:#018x}: tcgen05 swizzle code {code} is invalid (3, 5, 7 are reserved)")
        return cls("tcgen05", swizzle=Swizzle(spans[code]), lbo_mode=value >> 52 & 1, **fields)

    def fields(self) -> dict:
        out = {"kind": self.kind, "start_address": self.start_address, "lbo": self.lbo, "sbo": self.sbo,
               "swizzle": self.swizzle.name, "swizzle_code": self.swizzle_code, "base_offset": self.base_offset}
        if self.kind == "tcgen05":
            out.update(lbo_mode=self.lbo_mode, fixed_46_48=TCGEN05_FIXED_46_48)
        return out


def check_footprint(desc: SmemDescriptor, *, major: str, elem_bytes: int, rows: int, k: int) -> None:
    """Refuse instruction footprints the canonical layouts cannot describe."""
    if major not in ("K", "MN"):
        raise LayoutError(f"major-ness {major!r}: expected 'K' or 'MN'")
    if desc.base_offset:
        raise LayoutError("non-zero base offset is not modelled: place tiles on their swizzle pattern boundary")
    if desc.lbo_mode:
        raise LayoutError("absolute LBO mode (48-byte K tiles on sm_103a) is not modelled")
    if rows % 8 or rows <= 0:
        raise LayoutError(f"footprint of {rows} M/N rows: core matrices come in groups of 8 rows")
    if k * elem_bytes != MMA_K_BYTES:
        raise LayoutError(f"footprint K = {k} x {elem_bytes} B: one instruction reads {MMA_K_BYTES} bytes of K")
    span = desc.swizzle.span_bytes
    if major == "K" and span and desc.start_address % span + k * elem_bytes > span:
        raise LayoutError("K-major swizzled: LBO is unused, so one instruction's K must fit in one swizzle row")


def mma_read_byte(desc: SmemDescriptor, *, major: str, elem_bytes: int, row, k):
    """Shared-memory byte the MMA reads for operand element (row, k); ints or numpy arrays."""
    span = desc.swizzle.span_bytes
    start = desc.start_address
    if major == "K":
        kb = k * elem_bytes
        if span:
            pre = start + (row % 8) * span + (row // 8) * desc.sbo + kb
        else:
            pre = start + (row % 8) * 16 + (row // 8) * desc.sbo + (kb // 16) * desc.lbo + kb % 16
    elif major == "MN":
        mb = row * elem_bytes
        if span:
            pre = start + mb % span + (k % 8) * span + (mb // span) * desc.lbo + (k // 8) * desc.sbo
        else:
            pre = start + mb % 16 + (k % 8) * 16 + (mb // 16) * desc.sbo + (k // 8) * desc.lbo
    else:
        raise LayoutError(f"major-ness {major!r}: expected 'K' or 'MN'")
    return hw_swizzle(span, pre)
