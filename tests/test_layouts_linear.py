import random

import numpy as np
import pytest

from layouts import LayoutError, LinearLayout


def row_major(rows, cols, elem=2):
    return LinearLayout.from_function({"r": rows, "c": cols}, {"byte": rows * cols * elem},
                                      lambda x: x["r"] * cols * elem + x["c"] * elem)


def test_exact_bases_of_a_strided_layout():
    layout = row_major(4, 8)
    assert layout.bases == {"r": [{"byte": 16}, {"byte": 32}], "c": [{"byte": 2}, {"byte": 4}, {"byte": 8}]}
    assert layout.offset == {"byte": 0}
    assert layout(r=3, c=5) == 3 * 16 + 5 * 2


def test_evaluation_is_xor_of_basis_images_plus_offset():
    layout = LinearLayout({"x": [{"y": 3}, {"y": 5}]}, {"x": 4}, {"y": 8}, {"y": 1})
    assert [layout(x=x) for x in range(4)] == [1, 1 ^ 3, 1 ^ 5, 1 ^ 3 ^ 5]


def test_array_evaluation_matches_scalar():
    layout = row_major(8, 16)
    grid = layout.grid()
    flat = layout.apply_flat(grid)
    assert [int(v) for v in flat[:5]] == [layout(r=int(grid["r"][i]), c=int(grid["c"][i])) for i in range(5)]


@pytest.mark.parametrize("extent", [3, 6, 0, 100])
def test_non_power_of_two_extent_rejected_with_reason(extent):
    with pytest.raises(LayoutError, match="not a power of two"):
        LinearLayout.identity({"x": extent})


def test_image_outside_output_extent_rejected():
    with pytest.raises(LayoutError, match="outside the output extent"):
        LinearLayout({"x": [{"y": 8}]}, {"x": 2}, {"y": 8})


def test_wrong_number_of_images_rejected():
    with pytest.raises(LayoutError, match="needs 2 basis images"):
        LinearLayout({"x": [{"y": 1}]}, {"x": 4}, {"y": 4})


def test_overlapping_fields_are_not_linear():
    with pytest.raises(LayoutError, match="not GF\\(2\\)-linear"):
        LinearLayout.from_function({"r": 4, "c": 4}, {"o": 16}, lambda x: x["r"] * 3 + x["c"])


def test_injective_surjective_and_rank():
    layout = row_major(4, 8)  # byte bit 0 never set: injective, not surjective
    assert layout.is_injective() and not layout.is_surjective() and layout.rank() == 5
    collapse = LinearLayout({"x": [{"y": 1}, {"y": 1}]}, {"x": 4}, {"y": 2})
    assert not collapse.is_injective() and collapse.is_surjective()


def test_inverse_round_trip_and_compose_to_identity():
    layout = row_major(8, 16, elem=1)
    inv = layout.invert()
    assert inv.bases == {"byte": [{"r": 0, "c": 1}, {"r": 0, "c": 2}, {"r": 0, "c": 4}, {"r": 0, "c": 8},
                                  {"r": 1, "c": 0}, {"r": 2, "c": 0}, {"r": 4, "c": 0}]}
    assert inv.compose(layout) == LinearLayout.identity({"r": 8, "c": 16})
    assert layout.compose(inv) == LinearLayout.identity({"byte": 128})


def test_inverse_of_affine_layout_undoes_the_offset():
    layout = LinearLayout({"x": [{"y": 2}, {"y": 1}]}, {"x": 4}, {"y": 4}, {"y": 3})
    inv = layout.invert()
    assert all(inv(y=layout(x=x)) == x for x in range(4))


def test_non_bijective_inverse_rejected():
    with pytest.raises(LayoutError, match="not bijective"):
        row_major(4, 8).invert()


def test_solve_decodes_injective_layouts():
    layout = row_major(4, 8)
    assert layout.solve(3 * 16 + 5 * 2) == {"r": 3, "c": 5}
    assert layout.solve(1) is None


def test_compose_checks_matching_dims():
    with pytest.raises(LayoutError, match="cannot compose"):
        row_major(4, 8).compose(row_major(4, 8))


def test_flatten_outs_puts_first_dim_lowest():
    layout = LinearLayout.identity({"a": 4, "b": 2})
    flat = layout.flatten_outs("z")
    assert flat.bases == {"a": [{"z": 1}, {"z": 2}], "b": [{"z": 4}]}


def test_placed_at_requires_alignment():
    layout = row_major(4, 8)
    assert layout.placed_at(1024)(r=1, c=1) == 1024 + 18
    with pytest.raises(LayoutError, match="not a multiple of the layout span"):
        layout.placed_at(32)


def test_equality_and_repr():
    assert row_major(4, 8) == row_major(4, 8)
    assert row_major(4, 8) != row_major(4, 8, elem=1)
    assert "r[4]: [16, 32]" in repr(row_major(4, 8))


@pytest.mark.parametrize("seed", range(20))
def test_random_bijections_round_trip(seed):
    rng = random.Random(seed)
    nbits = rng.randint(1, 8)
    while True:  # random invertible bit matrix
        images = [rng.randrange(1, 1 << nbits) for _ in range(nbits)]
        layout = LinearLayout({"x": [{"y": v} for v in images]}, {"x": 1 << nbits}, {"y": 1 << nbits},
                              {"y": rng.randrange(1 << nbits)})
        if layout.is_bijective():
            break
    inv = layout.invert()
    xs = np.arange(1 << nbits)
    assert np.array_equal(inv.apply_flat({"y": layout.apply_flat({"x": xs})}), xs)
    assert inv.compose(layout) == LinearLayout.identity({"x": 1 << nbits})
