"""fp32 accumulator rows staged in shared memory from wgmma fragments and added to global memory as one linear
run of bytes (cp.reduce.async.bulk): row-major, with a column swizzle that spares the stores bank conflicts.

A bulk reduce-add copies bytes in order, so the global rows carry whatever order the staged tile has. Plain
row-major order is the worst one for the fragment's stores: a warp's paired store (st.shared.v2.f32 of values i and
i + 1 of every lane) writes 8 rows x 32 bytes, and rows a multiple of 128 bytes apart put all 8 rows on the same 8
banks, 8 wavefronts where the 256 bytes need 2. The swizzle XORs a row's 32-byte chunk index (column bits 3-4) with
row bits 0-1, so four consecutive rows use four different chunks of a 128-byte bank row::

    column bit:  ... 6 5 | 4 3 | 2 1 0        the chunk a store's 4 lanes x 2 values cover: 8 columns
                     c c   z z   b b b
    result:      ... c c | z^r | b b b        r: row bits 0-1

Only bits inside a 32-column group move, so each row is still one contiguous run of its own columns (a reader of
whole rows, the backward's _post, stays coalesced), the pair (2j, 2j + 1) stays adjacent and 8-byte aligned, and
head dims that are not powers of two (96) keep every column inside the row. The numbers come from the accumulator
map (layouts.fragments) and the bank geometry below; `check_fragment_stores` counts the wavefronts of every store
and fails where they are not the minimum (it fails for the unswizzled rows).
"""

from __future__ import annotations

import numpy as np

from .cexpr import compile_c_expr
from .derive import _linear_closed_form, coord_symbol, to_c
from .errors import LayoutError
from .fragments import address_bases, wgmma_accumulator
from .linear import LinearLayout

BANKS = 32
BANK_BYTES = 4
BANK_ROW_BYTES = BANKS * BANK_BYTES  # one wavefront serves at most one word per bank
F32_BYTES = 4
PAIR = 2  # values per store: v2.f32, the widest a thread's adjacent accumulator columns allow


def _store_chunk_cols() -> int:
    """Columns one paired store covers in one row: the lanes that share a row (lane bits whose image is a column)
    times the pair."""
    acc = wgmma_accumulator(8)
    column_lanes = sum(1 for image in acc.bases["lane"] if image["col"] and not image["row"])
    return PAIR << column_lanes


CHUNK_COLS = _store_chunk_cols()                                      # 8 columns, 32 bytes
ROW_BITS = (BANK_ROW_BYTES // (CHUNK_COLS * F32_BYTES)).bit_length() - 1  # 2: four chunks per bank row


def column_swizzle(cols: int) -> LinearLayout:
    """(row, col) -> the column that (row, col) is stored at, for rows of `cols` fp32 values (any multiple of
    4 * CHUNK_COLS; the map is built over the next power of two and checked to stay inside the row)."""
    group = CHUNK_COLS << ROW_BITS
    if cols % group:
        raise LayoutError(f"swizzled fp32 rows need a multiple of {group} columns, got {cols}")
    width = 1 << (cols - 1).bit_length()
    chunk_bit = CHUNK_COLS.bit_length() - 1
    bases = {"row": [{"col": 1 << (chunk_bit + b)} for b in range(ROW_BITS)],
             "col": [{"col": 1 << b} for b in range(width.bit_length() - 1)]}
    layout = LinearLayout(bases, {"row": 1 << ROW_BITS, "col": width}, {"col": width})
    rows, columns = np.meshgrid(np.arange(1 << ROW_BITS), np.arange(cols), indexing="ij")
    moved = np.asarray(layout.apply({"row": rows.ravel(), "col": columns.ravel()})["col"]).reshape(rows.shape)
    for r in range(1 << ROW_BITS):
        if sorted(moved[r]) != list(range(cols)):
            raise LayoutError(f"row {r}: the swizzle does not permute the {cols} columns of the row")
    return layout


def column_swizzle_c(cols: int, row: str = "row", col: str = "col") -> str:
    """C expression of the stored column of (row, col); `row` may be any row index (only bits 0-1 are read)."""
    layout = column_swizzle(cols)
    # A row index of any size (its bits above ROW_BITS masked off); a column below `cols`.
    expr = _linear_closed_form(layout, {"row": 32, "col": layout.in_dims["col"].bit_length() - 1})
    return to_c(expr.subs({coord_symbol("row"): coord_symbol(row), coord_symbol("col"): coord_symbol(col)},
                          simultaneous=True))


def check_column_swizzle_c(cols: int) -> None:
    """The C text the kernels render (`column_swizzle_c`) against the layout, at every (row, col) of a 128-row block."""
    f = compile_c_expr(column_swizzle_c(cols), ("row", "col"))
    rows, columns = (g.ravel() for g in np.meshgrid(np.arange(128), np.arange(cols), indexing="ij"))
    bad = np.nonzero(rows * cols + np.asarray(f({"row": rows, "col": columns})) != swizzled_offset(rows, columns, cols))[0]
    if bad.size:
        raise LayoutError(f"the C column swizzle is wrong at row {rows[bad[0]]}, column {columns[bad[0]]}")


def swizzled_offset(row, col, cols: int):
    """fp32 element offset of (row, col) in the staged tile and in the global rows (numpy or ints)."""
    layout = column_swizzle(cols)
    mask = (1 << ROW_BITS) - 1
    moved = layout.apply({"row": np.asarray(row) & mask, "col": np.asarray(col)})["col"]
    return np.asarray(row) * cols + np.asarray(moved)


def wavefronts(byte_addresses) -> int:
    """Shared-memory wavefronts of one warp's access: the most distinct 4-byte words any bank must serve."""
    words = np.unique(np.asarray(byte_addresses).ravel() // BANK_BYTES)
    return int(np.bincount(words % BANKS, minlength=BANKS).max())


def check_fragment_stores(cols: int, n: int, origins) -> int:
    """Count the wavefronts of every paired store of a 64 x n accumulator written into a staged tile of `cols`
    columns, by warpgroup `part` at origins[part] = (row0, col0); raise where one is above the minimum (each store
    moves 32 lanes x 8 bytes). Also checks the pairs stay adjacent. Returns the largest count."""
    acc = wgmma_accumulator(n)
    lane = np.arange(32)
    worst = 0
    minimum = -(-32 * PAIR * F32_BYTES // BANK_ROW_BYTES)
    for part, (row0, col0) in enumerate(origins):
        for warp in range(4):
            for i in range(0, n // 2, PAIR):
                at = acc.apply({"lane": lane, "warp": np.full(32, warp), "reg": np.full(32, i)})
                row, col = np.asarray(at["row"]) + row0, np.asarray(at["col"]) + col0
                first = swizzled_offset(row, col, cols)
                if np.any(swizzled_offset(row, col + 1, cols) != first + 1) or np.any(first % PAIR):
                    raise LayoutError(f"value pair {i}, {i + 1} of warp {warp} is not adjacent and 8-byte aligned")
                count = wavefronts(first * F32_BYTES)
                if count > minimum:
                    raise LayoutError(f"the store of values {i}, {i + 1} of warp {warp} (part {part}) takes {count} "
                                      f"wavefronts, {minimum} suffice")
                worst = max(worst, count)
    return worst


def fragment_store_bases(cols: int, n: int, origins) -> tuple[tuple[int, int, int], ...]:
    """The paired stores of `check_fragment_stores` as (i, base value, immediate bytes) per pair
    (fragments.address_bases): with the swizzle, four bases serve every store."""
    acc = wgmma_accumulator(n)
    lane, warp = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), indexing="ij"))

    def offsets(i: int) -> np.ndarray:
        at = acc.apply({"lane": lane, "warp": warp, "reg": np.full(lane.shape, i)})
        row, col = np.asarray(at["row"]), np.asarray(at["col"])
        return np.stack([swizzled_offset(row + row0, col + col0, cols) * F32_BYTES for row0, col0 in origins])

    return address_bases(offsets, range(0, n // 2, PAIR))
