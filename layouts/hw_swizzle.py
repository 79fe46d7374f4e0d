"""The shared-memory swizzle as the PTX ISA documents it, for the hardware models (``tma``, ``mma``) only.

Why a second swizzle: the tiles under test are built from ``swizzle.Swizzle``. If the TMA and MMA models
that check them used ``Swizzle`` too, a wrong swizzle would build wrong tiles and then agree with itself,
and every CPU check would pass. So this module writes the hardware's swizzle again, from the ISA's text
and in the ISA's terms, and imports nothing from ``swizzle`` or anything built on it.

What the ISA says (PTX ISA, "Tensors" > "Swizzling Modes"): for the 32, 64 and 128 byte modes it gives a
table "where each element (numbered cell) is 16 byte and the starting address is 256 [512, 1024] bytes
aligned", one table row per 128-byte shared-memory line, and "... Pattern repeats ...". Read off those
tables, line ``r`` of the pattern holds, in each span, the 16-byte cells ``c ^ r``: the 128-byte table is

    line 0:  0 1 2 3 4 5 6 7
    line 1:  1 0 3 2 5 4 7 6
    ...
    line 7:  7 6 5 4 3 2 1 0

A pattern is as many 128-byte lines as a span has cells (2, 4, 8), so the line index always fits the cell
index. The MMA side reads through the same pattern, anchored at the same boundaries (PTX ISA, wgmma
"Matrix Descriptor Format" and tcgen05 "Shared Memory Descriptor", table "Starting address of the
repeating pattern": 128-Byte swizzle -> 1024-Byte boundary, 64 -> 512, 32 -> 256). Only the 16-byte
atomicity sub-mode is modelled: flashgen uses no other.

A tensor copy may start off the pattern boundary (PTX ISA, "Swizzling Modes", the table after "The value
of swizzle base offset is 0 when the dstMem shared memory address is located at the following boundary"):
its pattern then starts at line ``base offset = (dstMem / 128) % 8`` (128-byte mode; ``% 4`` for 64, ``% 2``
for 32). ``swizzle_base_offset`` is that formula as the ISA writes it; swizzling the absolute address, as
``hw_swizzle`` does, is the same thing (tests/test_layouts_hw_swizzle.py checks the two agree), which is what
lets a TMA load of 1, 2 or 4 rows land in the middle of a swizzled tile (layouts.paged). The MMA descriptors'
own base offset is another field, which the read model refuses (mma.py).
"""

from __future__ import annotations

from .errors import LayoutError

CELL_BYTES = 16   # "each element (numbered cell) is 16 byte": the unit the swizzle moves
LINE_BYTES = 128  # one row of the ISA's tables: eight cells

# Swizzle span (bytes) -> the boundary its repeating pattern starts on (ISA tables and descriptor table).
PATTERN_START = {32: 256, 64: 512, 128: 1024}


def _check_span(span: int) -> None:
    if span != 0 and span not in PATTERN_START:
        raise LayoutError(f"swizzle span {span} B: the hardware modes are 0 (none), 32, 64 and 128 bytes")


def pattern_bytes(span: int) -> int:
    """Length of the span's repeating pattern, which is also where it must start; 0 for no swizzle."""
    _check_span(span)
    return PATTERN_START.get(span, 0)


def hw_swizzle(span: int, address):
    """The shared-memory byte the hardware uses for ``address`` under a ``span``-byte swizzle.

    ``address`` is an absolute shared address (int or numpy integer array): the pattern is anchored at
    multiples of its length, not at the start of whatever buffer holds it.
    """
    period = pattern_bytes(span)
    if not period:
        return address
    in_pattern = address % period             # where the address sits inside its repeating pattern
    line = in_pattern // LINE_BYTES           # which row of the ISA's table
    cell = in_pattern % span // CELL_BYTES    # which 16-byte cell of its span
    return address + ((cell ^ line) - cell) * CELL_BYTES


def swizzle_base_offset(span: int, dst_address: int) -> int:
    """The pattern line a tensor copy to ``dst_address`` starts on: 0 on the pattern boundary, else the ISA's
    ``(dstMem / 128) % lines`` (lines: 8, 4, 2 for the 128, 64, 32-byte modes); 0 without a swizzle."""
    period = pattern_bytes(span)
    if not period or dst_address % period == 0:
        return 0
    return (dst_address // LINE_BYTES) % (period // LINE_BYTES)


def check_pattern_start(span: int, address: int, what: str) -> None:
    """Refuse a swizzled buffer that does not start on its pattern boundary (it would be read shifted)."""
    period = pattern_bytes(span)
    if period and address % period:
        raise LayoutError(
            f"{what} at shared address {address} is not aligned to {period} B: the {span}B swizzle pattern "
            f"starts on {period}-byte boundaries (PTX ISA \"Swizzling Modes\"), so this buffer would be "
            "written or read with a shifted pattern"
        )
