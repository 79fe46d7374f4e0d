import itertools

import numpy as np
import pytest

from layouts import LayoutError, LinearLayout
from layouts.cexpr import compile_c_expr
from layouts.derive import closed_form, to_c
from layouts.stacked import StackedLayout, stack
from layouts.swizzle import Swizzle
from layouts.verify import basis_points, compare_maps


def swizzled_block(rows, cols, span, e=2):
    tile = LinearLayout.from_function({"r": rows, "c": cols}, {"byte": rows * span}, lambda p: p["r"] * span + p["c"] * e)
    return Swizzle(span).layout(rows * span).compose(tile)


def three_atoms(rows=8):
    """Head dim 96 in 16-bit: three 32-column atoms of 64-byte rows, rows * 64 bytes apart."""
    return stack(swizzled_block(rows, 32, 64), {"r": rows, "c": 96}, {"c": rows * 64})


def reference(r, c, rows=8):
    """The same tile written from the swizzle's definition, not from the algebra."""
    pre = (c // 32) * rows * 64 + r * 64 + (c % 32) * 2
    return Swizzle(64).apply(pre)


def test_three_atoms_evaluate_like_the_swizzle_definition():
    layout = three_atoms()
    assert isinstance(layout, StackedLayout)
    assert layout.in_dims == {"r": 8, "c": 96} and layout.counts == {"c": 3} and layout.strides == {"c": 512}
    grid = layout.grid()
    assert np.array_equal(layout.apply_flat(grid), reference(grid["r"], grid["c"]))
    assert layout(r=1, c=64) == reference(1, 64) == 2 * 512 + 64
    assert layout.out_size == 96 * 8 * 2 - 1  # one past the last element's first byte


def test_solve_round_trips_every_point_and_refuses_gaps():
    layout = three_atoms(rows=16)
    for r, c in itertools.product(range(16), range(96)):
        assert layout.solve(layout(r=r, c=c)) == {"r": r, "c": c}
    assert layout.solve(1) is None                   # inside an element
    assert layout.solve(layout.out_size + 1) is None  # past the tile


def test_closed_form_round_trips_and_masks_the_block_fields():
    layout = three_atoms(rows=16)
    text = to_c(closed_form(layout))
    assert text == "(c & 7) * 2 + (((c >> 3) & 3) ^ ((r >> 1) & 3)) * 16 + r * 64 + (c >> 5) * 1024"
    assert compare_maps(layout.in_dims, layout.apply_flat, compile_c_expr(text, ["r", "c"]), decode=layout) == []


def test_a_power_of_two_stack_is_returned_as_the_linear_layout():
    stacked = stack(swizzled_block(16, 64, 128), {"r": 16, "c": 128}, {"c": 16 * 128})
    direct = Swizzle(128).layout(16 * 128 * 2).compose(LinearLayout.from_function(
        {"r": 16, "c": 128}, {"byte": 16 * 128 * 2},
        lambda p: (p["c"] >> 6) * 16 * 128 + p["r"] * 128 + (p["c"] & 63) * 2))
    assert isinstance(stacked, LinearLayout) and stacked == direct


def test_a_stride_that_is_not_a_power_of_two_stays_stacked():
    # Four blocks (a power-of-two count) at 1.5 block spans: the outer digit carries, so not GF(2)-linear.
    layout = stack(swizzled_block(8, 32, 64), {"r": 8, "c": 128}, {"c": 768})
    assert isinstance(layout, StackedLayout) and layout.as_linear() is None
    assert layout(r=0, c=96) == 3 * 768


def test_overlapping_blocks_are_refused_with_the_collision():
    with pytest.raises(LayoutError, match="overlap: .* both map to byte 256"):
        stack(swizzled_block(8, 32, 64), {"r": 8, "c": 96}, {"c": 256})


@pytest.mark.parametrize("extents, strides, message", [
    ({"r": 8, "c": 80}, {"c": 512}, "whole number"),
    ({"r": 8, "c": 96}, {}, "no stride"),
    ({"r": 8, "c": 96}, {"c": 0}, "positive"),
    ({"r": 0, "c": 32}, {}, "at least 1"),
    ({"x": 8}, {}, "not input dims"),
])
def test_bad_stacks_are_refused(extents, strides, message):
    with pytest.raises(LayoutError, match=message):
        StackedLayout(swizzled_block(8, 32, 64), extents, strides)


def test_a_restricted_domain_keeps_its_rows_and_decodes_only_them():
    # 80 rows of a 128-row block, two 64-column atoms 80 rows apart: the rows past 80 do not exist.
    layout = stack(swizzled_block(128, 64, 128), {"r": 80, "c": 128}, {"c": 80 * 128})
    assert isinstance(layout, StackedLayout) and layout.in_size == 80 * 128
    values = np.sort(np.asarray(layout.apply_flat(layout.grid())))
    assert np.array_equal(values, np.arange(0, 80 * 128 * 2, 2))  # dense
    assert layout.solve(layout(r=79, c=127)) == {"r": 79, "c": 127}
    with pytest.raises(LayoutError, match="out of range"):
        layout(r=80, c=0)
    text = to_c(closed_form(layout))
    assert compare_maps(layout.in_dims, layout.apply_flat, compile_c_expr(text, ["r", "c"])) == []


def test_basis_points_reach_past_the_last_power_of_two():
    points = basis_points({"r": 8, "c": 96})
    assert {p["c"] for p in points} == {0, 1, 2, 4, 8, 16, 32, 64}
    assert basis_points({"x": 64}) == [{"x": 0}] + [{"x": 1 << i} for i in range(6)]


def test_a_wrong_block_stride_is_reported_seed_style():
    layout = three_atoms()
    wrong = "(c & 7) * 2 + (((c >> 3) & 3) ^ ((r >> 1) & 3)) * 16 + r * 64 + (c >> 5) * 768"
    mismatches = compare_maps(layout.in_dims, layout.apply_flat, compile_c_expr(wrong, ["r", "c"]), decode=layout)
    assert mismatches and str(mismatches[0]) == ("inject (r=0, c=32): expected byte 512, model reads byte 768 "
                                                 "(r off by 4, c off by 16)")
    assert any(m.coords == {"r": 0, "c": 64} for m in mismatches)  # c=64 starts the third atom


def test_contiguous_runs_are_the_16_byte_chunks_of_the_swizzle():
    layout = three_atoms(rows=16)
    assert layout.contiguous_run("c", 2) == 8   # 8 halves: one 16-byte chunk, which the 64B swizzle moves whole
    assert layout.contiguous_run("r", 2) == 1   # rows are 64 bytes apart
    short = stack(swizzled_block(128, 64, 128), {"r": 80, "c": 192}, {"c": 80 * 128})
    assert short.contiguous_run("c", 2) == 8
    rows = LinearLayout.from_function({"r": 8, "c": 32}, {"byte": 512}, lambda p: p["r"] * 64 + p["c"] * 2)
    unswizzled = stack(rows, {"r": 8, "c": 96}, {"c": 512})
    assert unswizzled.contiguous_run("c", 2) == 32  # a whole 64-byte row, and no further: the next block
