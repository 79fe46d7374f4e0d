"""Shared-memory swizzles (none, 32 B, 64 B, 128 B), defined once, in address bits.

A swizzle permutes 16-byte chunks of a shared-memory buffer so that the eight rows of an MMA core
matrix, which sit one row pitch apart, fall into different banks. It is a pure function of the byte
*address*: the chunk index (bits 4 and up) is XORed with the "row" bits that start at bit 7.

128-byte swizzle (CuTe writes it ``Swizzle<3,4,3>``)::

    address bit:  ... 9 8 7 | 6 5 4 | 3 2 1 0
                      y y y   z z z   b b b b      b: byte inside a 16-byte chunk (untouched)
                      |_______^                     z: chunk within the 128-byte row
                                                    y: row within the 1024-byte pattern
    result:       ... y y y | z^y   | b b b b      bits [4,7) ^= bits [7,10)

64-byte swizzle: bits [4,6) ^= bits [7,9); 32-byte swizzle: bit 4 ^= bit 7; none: identity.
The source bits always start at bit 7, so the pattern repeats every ``2**(7 + bits)`` bytes:
256, 512 and 1024 bytes. The PTX ISA anchors the pattern at those boundaries ("Matrix Descriptor
Format", table "Starting address of the repeating pattern": 128B -> 1024, 64B -> 512, 32B -> 256).
A swizzled buffer placed anywhere else reads a shifted pattern, so every placement is checked
with ``check_placement``.

Because the XOR only reads bits it does not write, a swizzle is its own inverse and is GF(2)-linear;
``layout()`` returns it as a ``LinearLayout`` over byte offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayoutError
from .linear import LinearLayout, log2_exact

CHUNK_SHIFT = 4  # 16-byte chunks are the unit a swizzle moves
ROW_SHIFT = 7    # the XOR source bits start here for every mode

_BITS_BY_SPAN = {0: 0, 32: 1, 64: 2, 128: 3}


@dataclass(frozen=True)
class Swizzle:
    """One swizzle mode, named by its span in bytes (0 means no swizzle)."""

    span_bytes: int

    def __post_init__(self):
        if self.span_bytes not in _BITS_BY_SPAN:
            raise LayoutError(f"swizzle span {self.span_bytes} B is not one of 0 (none), 32, 64, 128")

    @classmethod
    def from_name(cls, name: str) -> "Swizzle":
        names = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
        if name not in names:
            raise LayoutError(f"unknown swizzle {name!r}; expected one of {sorted(names)}")
        return cls(names[name])

    @property
    def name(self) -> str:
        return f"{self.span_bytes}B" if self.span_bytes else "none"

    @property
    def bits(self) -> int:
        """How many chunk bits are XORed (0, 1, 2 or 3)."""
        return _BITS_BY_SPAN[self.span_bytes]

    @property
    def repeat_bytes(self) -> int:
        """Period of the pattern, and so the alignment a swizzled buffer needs (16 when unswizzled)."""
        return 1 << (ROW_SHIFT + self.bits) if self.bits else 1 << CHUNK_SHIFT

    def apply(self, address):
        """Swizzled address of ``address`` (an int or a numpy integer array)."""
        if not self.bits:
            return address
        mask = (1 << self.bits) - 1
        return address ^ (((address >> ROW_SHIFT) & mask) << CHUNK_SHIFT)

    def layout(self, nbytes: int, dim: str = "byte") -> LinearLayout:
        """The swizzle on a buffer of ``nbytes`` (a power of two) as a byte -> byte LinearLayout."""
        nbits = log2_exact(nbytes, "swizzled buffer size")
        bases = {dim: [{dim: self.apply(1 << i)} for i in range(nbits)]}
        if any(img[dim] >= nbytes for img in bases[dim]):
            raise LayoutError(f"a {self.name} swizzle moves bytes outside a {nbytes}-byte buffer")
        return LinearLayout(bases, {dim: nbytes}, {dim: nbytes})

    def check_placement(self, address: int, what: str) -> None:
        """Refuse a buffer start that would shift the pattern (see the module docstring)."""
        if address % self.repeat_bytes:
            raise LayoutError(
                f"{what} at shared address {address} is not aligned to {self.repeat_bytes} B: the {self.name} "
                f"swizzle pattern repeats every {self.repeat_bytes} B from aligned addresses, so this buffer "
                "would be read with a shifted pattern"
            )


SWIZZLE_NONE = Swizzle(0)
SWIZZLE_32B = Swizzle(32)
SWIZZLE_64B = Swizzle(64)
SWIZZLE_128B = Swizzle(128)


def widest_swizzle(row_bytes: int) -> Swizzle:
    """The widest swizzle whose span divides ``row_bytes``, so a row is a whole number of swizzle atoms.

    Wider spans spread an 8-row core matrix over more banks, and TMA boxes are at most one span wide
    (cuTensorMapEncodeTiled: "CU_TENSOR_MAP_SWIZZLE_64B requires the bounding box inner dimension to be
    <= 64"), so a 192-byte row (head dim 96, 16-bit) is three 64-byte atoms, not one and a half 128-byte ones.
    """
    for span in (128, 64, 32):
        if row_bytes > 0 and row_bytes % span == 0:
            return Swizzle(span)
    raise LayoutError(f"a {row_bytes}-byte row is not a whole number of 32-byte swizzle atoms")
