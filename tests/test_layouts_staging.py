"""layouts.staging: the fp32 accumulator rows' column swizzle, its C text, the wavefronts of the fragment's paired
stores, and the stores split into bases plus immediates (layouts.fragments.address_bases)."""

from __future__ import annotations

import numpy as np
import pytest

from layouts import LayoutError, fragments, staging
from layouts.cexpr import compile_c_expr


def test_the_swizzle_numbers_come_from_the_accumulator_map_and_the_banks():
    assert staging.CHUNK_COLS == 8   # 4 lanes x 2 values share a row in one paired store: 32 bytes
    assert staging.ROW_BITS == 2     # a 128-byte bank row holds 4 such chunks


def test_the_swizzle_xors_the_32_byte_chunk_with_row_bits_0_and_1():
    layout = staging.column_swizzle(128)
    assert layout.bases["row"] == [{"col": 8}, {"col": 16}]
    assert layout.bases["col"] == [{"col": 1 << b} for b in range(7)]
    assert staging.column_swizzle_c(128) == "(col & 7) + ((row & 3) ^ ((col >> 3) & 3)) * 8 + (col >> 5) * 32"
    # Rows 4 apart are swizzled alike; a row's columns only move inside their 32-column group.
    assert staging.swizzled_offset(5, 9, 128) == 5 * 128 + (9 ^ 8)
    assert staging.swizzled_offset(1, 9, 128) == staging.swizzled_offset(5, 9, 128) - 4 * 128


@pytest.mark.parametrize("cols", [64, 96, 128, 256])
def test_every_row_keeps_its_own_columns_and_the_c_text_agrees(cols):
    rows, columns = np.meshgrid(np.arange(64), np.arange(cols), indexing="ij")
    offsets = staging.swizzled_offset(rows, columns, cols)
    assert np.array_equal(np.sort(offsets, axis=1), rows * cols + np.arange(cols))  # a permutation within the row
    staging.check_column_swizzle_c(cols)
    f = compile_c_expr(staging.column_swizzle_c(cols, "r", "k"), ("r", "k"))
    assert np.array_equal(rows * cols + f({"r": rows + 64, "k": columns}), offsets)  # any row index, bits 0-1 read


def test_the_c_text_check_refuses_a_wrong_text(monkeypatch):
    """check_column_swizzle_c must be able to fail: the text with the XOR dropped (the plain column) is refused."""
    monkeypatch.setattr(staging, "column_swizzle_c", lambda cols, row="row", col="col": col)
    with pytest.raises(LayoutError, match="the C column swizzle is wrong"):
        staging.check_column_swizzle_c(128)


def test_rows_that_are_not_whole_swizzle_groups_are_refused():
    with pytest.raises(LayoutError, match="multiple of 32 columns"):
        staging.column_swizzle(80)


def test_row_major_rows_cost_the_paired_store_8_wavefronts_and_the_swizzle_2():
    acc = fragments.wgmma_accumulator(64)
    at = acc.apply({"lane": np.arange(32), "warp": np.zeros(32, int), "reg": np.zeros(32, int)})
    row, col = np.asarray(at["row"]), np.asarray(at["col"])
    assert staging.wavefronts(4 * (row * 128 + col)) == 8  # what the backward's dQ staging paid before
    assert staging.wavefronts(4 * staging.swizzled_offset(row, col, 128)) == 2
    assert staging.check_fragment_stores(128, 64, ((0, 0), (0, 64))) == 2
    assert staging.check_fragment_stores(64, 32, ((0, 0), (0, 32))) == 2
    assert staging.check_fragment_stores(64, 64, ((0, 0), (64, 0))) == 2  # 128-query blocks: dQ split by rows


def test_the_store_check_fails_without_the_swizzle(monkeypatch):
    monkeypatch.setattr(staging, "swizzled_offset", lambda row, col, cols: np.asarray(row) * cols + np.asarray(col))
    with pytest.raises(LayoutError, match="8 wavefronts, 2 suffice"):
        staging.check_fragment_stores(128, 64, ((0, 0), (0, 64)))


def test_four_bases_serve_every_paired_store():
    stores = staging.fragment_store_bases(128, 64, ((0, 0), (0, 64)))
    assert [i for i, _, _ in stores] == list(range(0, 32, 2))
    assert sorted({b for _, b, _ in stores}) == [0, 4, 8, 12]  # one per value of the swizzled chunk bits
    assert stores[:4] == ((0, 0, 0), (2, 0, 8 * 128 * 4), (4, 4, 0), (6, 4, 8 * 128 * 4))  # value 2: 8 rows down
    assert stores[8] == (16, 0, 32 * 4)  # the next 32-column group
    # Checked here again from the accumulator map, for every thread and both warpgroups.
    acc = fragments.wgmma_accumulator(64)
    lane, warp = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), indexing="ij"))
    for part in range(2):
        def offset(i):
            at = acc.apply({"lane": lane, "warp": warp, "reg": np.full(lane.shape, i)})
            return 4 * staging.swizzled_offset(np.asarray(at["row"]), np.asarray(at["col"]) + 64 * part, 128)
        for i, base, imm in stores:
            assert np.array_equal(offset(i), offset(base) + imm)


def test_address_bases_needs_one_base_where_every_bit_adds():
    assert fragments.address_bases(lambda i: np.arange(128) * 4 + 16 * i, range(4)) == (
        (0, 0, 0), (1, 0, 16), (2, 0, 32), (3, 0, 48))
    xor = fragments.address_bases(lambda i: np.arange(4) ^ i, range(4))
    assert [b for _, b, _ in xor] == [0, 1, 2, 3]
