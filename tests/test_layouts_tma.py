import numpy as np
import pytest

from layouts import LayoutError, TensorMapParams
from layouts.tma import place_box


def params(**overrides):
    base = dict(rank=2, dims=(64, 32), strides_bytes=(128,), box=(64, 8), elem_strides=(1, 1),
                swizzle_bytes=128, elem_bytes=2, dtype="f16")
    base.update(overrides)
    return TensorMapParams(**base)


@pytest.mark.parametrize("overrides,reason", [
    (dict(rank=0, dims=(), strides_bytes=(), box=(), elem_strides=()), "ranks 1..5"),
    (dict(rank=6, dims=(1,) * 6, strides_bytes=(16,) * 5, box=(8,) * 6, elem_strides=(1,) * 6), "ranks 1..5"),
    (dict(dims=(64,)), "globalDim has 1 entries"),
    (dict(strides_bytes=()), "needs 1"),
    (dict(box=(64,)), "boxDim has 1"),
    (dict(elem_strides=(1,)), "elementStrides has 1"),
    (dict(dims=(0, 32)), "non-zero and at most 2\\^32"),
    (dict(dims=(64, (1 << 32) + 1)), "non-zero and at most 2\\^32"),
    (dict(strides_bytes=(136,)), "multiple of 16"),
    (dict(strides_bytes=(1 << 40,)), "below 2\\^40"),
    (dict(box=(64, 0)), "non-zero and at most 256"),
    (dict(box=(64, 257)), "non-zero and at most 256"),
    (dict(box=(4, 8), swizzle_bytes=0), "multiple of 16 bytes"),
    (dict(box=(128, 8)), "exceeds the 128 B swizzle span"),
    (dict(box=(32, 8), swizzle_bytes=32), "exceeds the 32 B swizzle span"),
    (dict(swizzle_bytes=96), "expected 0"),
    (dict(elem_strides=(1, 0)), "non-zero and at most 8"),
    (dict(elem_strides=(1, 9)), "non-zero and at most 8"),
    (dict(global_address=8), "16-byte aligned"),
    (dict(dtype="f32", elem_bytes=4), "stages only"),
    (dict(elem_bytes=4), "does not match"),
    (dict(l2_promotion_bytes=32), "L2 promotion 32 B"),
])
def test_every_driver_limit_rejected(overrides, reason):
    with pytest.raises(LayoutError, match=reason):
        params(**overrides)


def test_limits_at_their_edges_accepted():
    params(dims=(64, 1 << 32), strides_bytes=((1 << 40) - 16,), box=(64, 256), elem_strides=(1, 8))
    params(box=(32, 8), swizzle_bytes=64)


def test_box_walked_innermost_first_and_packed_densely_without_swizzle():
    p = params(rank=3, dims=(16, 4, 3), strides_bytes=(32, 1024), box=(8, 2, 3), elem_strides=(1, 1, 1), swizzle_bytes=0,
               global_address=4096)
    placed = place_box(p, (8, 1, 0))
    # element (d0, d1, d2) of the box sits at ((d2 * 2 + d1) * 8 + d0) * 2 in shared memory
    g = lambda d0, d1, d2: 4096 + (8 + d0) * 2 + (1 + d1) * 32 + d2 * 1024
    assert placed.smem_for_global([g(0, 0, 0), g(1, 0, 0), g(0, 1, 0), g(0, 0, 1), g(7, 1, 2)]).tolist() == \
        [0, 2, 16, 32, 2 * (7 + 8 * (1 + 2 * 2))]
    assert p.box_bytes == 8 * 2 * 3 * 2


def test_swizzle_permutes_chunks_within_each_row():
    p = params(dims=(64, 16), strides_bytes=(128,), box=(64, 8))
    placed = place_box(p, (0, 0))
    row3_chunk0 = placed.smem_for_global([3 * 128])[0]
    assert row3_chunk0 == 3 * 128 + (0 ^ 3) * 16
    assert sorted(placed.smem_offset.tolist()) == list(range(0, 1024, 2))


def test_out_of_bounds_elements_are_not_copied():
    p = params(dims=(64, 10), box=(64, 8))
    placed = place_box(p, (0, 4))
    assert int(np.sum(placed.global_address < 0)) == 64 * 2


def test_element_strides_shrink_the_box():
    p = params(dims=(64, 32), box=(64, 8), elem_strides=(1, 2))
    assert p.box_counts == (64, 4) and p.box_bytes == 64 * 4 * 2
    placed = place_box(p, (0, 0))
    assert placed.smem_for_global([2 * 128])[0] == 128 + (0 ^ 1) * 16


def test_shared_destination_alignment():
    with pytest.raises(LayoutError, match="128-byte aligned"):
        place_box(params(), (0, 0), smem_address=64)
    with pytest.raises(LayoutError, match="128-byte aligned"):
        place_box(params(swizzle_bytes=0), (0, 0), smem_address=16)
    place_box(params(swizzle_bytes=0), (0, 0), smem_address=128)


# PTX ISA "Swizzling Modes", the 128-byte mode's table: line r holds the 16-byte cells c ^ r (typed in).
ISA_128B_LINES = [[0, 1, 2, 3, 4, 5, 6, 7], [1, 0, 3, 2, 5, 4, 7, 6], [2, 3, 0, 1, 6, 7, 4, 5], [3, 2, 1, 0, 7, 6, 5, 4],
                  [4, 5, 6, 7, 0, 1, 2, 3], [5, 4, 7, 6, 1, 0, 3, 2], [6, 7, 4, 5, 2, 3, 0, 1], [7, 6, 5, 4, 3, 2, 1, 0]]


@pytest.mark.parametrize("line", range(8))
def test_a_destination_inside_the_pattern_starts_at_the_isas_base_offset(line):
    """A copy to dstMem off the 1024-byte boundary takes pattern line (dstMem / 128) % 8 first, then the lines
    after it (PTX ISA, "Swizzling Modes", "swizzle base offset"): three rows from 1024 * 5 + 128 * line."""
    dst = 5 * 1024 + 128 * line
    placed = place_box(params(box=(64, 3)), (0, 0), smem_address=dst)
    for row in range(3):
        pattern_line = ISA_128B_LINES[(line + row) % 8]
        for cell in range(8):
            at = placed.smem_for_global([row * 128 + cell * 16])[0]
            assert at == row * 128 + pattern_line[cell] * 16, (row, cell)


def test_driver_args_use_enum_values():
    args = params(dtype="bf16").driver_args()
    assert args["tensorDataType"] == 9 and args["swizzle"] == 3 and args["interleave"] == 0
    assert params().driver_args()["tensorDataType"] == 6
    # CUtensorMapL2promotion: NONE, L2_64B, L2_128B, L2_256B
    assert [params(l2_promotion_bytes=b).driver_args()["l2Promotion"] for b in (0, 64, 128, 256)] == [0, 1, 2, 3]


def test_the_swizzle_and_dtype_enums_are_the_drivers():
    """The numbers and names flashgen writes into tensor maps (Python path) and C launchers (export), against the
    driver API's own enums (cuda.bindings), not against each other."""
    cu = pytest.importorskip("cuda.bindings.driver")
    from layouts.tma import TMA_DTYPE_NAMES, TMA_DTYPES, TMA_SWIZZLE_ENUM, TMA_SWIZZLE_NAMES

    for span, value in TMA_SWIZZLE_ENUM.items():
        name = TMA_SWIZZLE_NAMES[span]
        assert int(getattr(cu.CUtensorMapSwizzle, name)) == value, (span, name, value)
    assert TMA_SWIZZLE_NAMES[64] == "CU_TENSOR_MAP_SWIZZLE_64B" and TMA_SWIZZLE_NAMES[32] == "CU_TENSOR_MAP_SWIZZLE_32B"
    for dtype, (code, nbytes) in TMA_DTYPES.items():
        assert int(getattr(cu.CUtensorMapDataType, TMA_DTYPE_NAMES[dtype])) == code, dtype


def test_a_box_not_divisible_by_its_element_stride_copies_the_ceiling():
    params = TensorMapParams(2, (64, 64), (128,), (64, 9), (1, 2), 128, 2, "f16")
    assert params.box_counts == (64, 5)  # rows 0, 2, 4, 6, 8
    assert params.box_bytes == 64 * 5 * 2
