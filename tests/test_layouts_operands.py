import random

import pytest

from layouts import LayoutError, OperandDerivation, TensorMapParams, derive_operand
from layouts.cexpr import compile_c_expr
from layouts.mma import SmemDescriptor
from layouts.operands import ARCHES, OPERANDS

HOPPER_FORMULAS = {
    "q": ("m", "k", "(k>>6)*(R*128) + m*128 + (((k>>3)&7) ^ (m&7))*16 + (k&7)*2"),
    "k": ("n", "k", "(k>>6)*(R*128) + n*128 + (((k>>3)&7) ^ (n&7))*16 + (k&7)*2"),
    "v": ("k", "n", "(n>>6)*(R*128) + k*128 + (((n>>3)&7) ^ (k&7))*16 + (n&7)*2"),
    "o": ("m", "n", "(n>>6)*(R*128) + m*128 + (((n>>3)&7) ^ (m&7))*16 + (n&7)*2"),
}


@pytest.mark.parametrize("operand", OPERANDS)
@pytest.mark.parametrize("head_dim,rows", [(64, 64), (128, 128), (256, 64)])
def test_hopper_tiles_match_the_specified_formulas(operand, head_dim, rows):
    d = derive_operand(operand, arch="sm_90a", head_dim=head_dim, block_rows=rows, dtype="f16")
    row, col, text = HOPPER_FORMULAS[operand]
    assert list(d.coords.items()) == [(row, rows), (col, head_dim)]
    assert d.check_formula(text.replace("R", str(rows))) == []
    assert d.smem_bytes == rows * head_dim * 2 and d.smem_align == 1024 and d.swizzle.span_bytes == 128


def test_hopper_q_descriptor_fields_and_encodings():
    d = derive_operand("q", arch="sm_90a", head_dim=128, block_rows=64, dtype="bf16")
    assert (d.mma_major, d.mma_transpose, d.mma_rows, d.mma_k) == ("K", 0, 64, 16)
    f = d.descriptor_fields()
    assert (f["kind"], f["lbo"], f["sbo"], f["swizzle_code"], f["base_offset"]) == ("wgmma", 16, 1024, 1, 0)
    assert f["slice_start_bytes"] == [0, 32, 64, 96, 8192, 8224, 8256, 8288]
    assert d.descriptors()[0] == 1 << 16 | 64 << 32 | 1 << 62
    assert d.descriptors()[1] == d.descriptors()[0] + 2


def test_hopper_v_is_mn_major_with_lbo_between_head_dim_atoms():
    d = derive_operand("v", arch="sm_90a", head_dim=128, block_rows=64, dtype="f16")
    assert (d.mma_major, d.mma_transpose, d.mma_rows) == ("MN", 1, 128)
    f = d.descriptor_fields()
    assert (f["lbo"], f["sbo"]) == (64 * 128, 1024)
    assert f["slice_start_bytes"] == [0, 2048, 4096, 6144]


def test_swapping_lbo_and_sbo_for_v_is_caught_by_the_model():
    d = derive_operand("v", arch="sm_90a", head_dim=128, block_rows=64, dtype="f16")
    good = d.descriptor_objects()[0]
    swapped = SmemDescriptor(good.kind, 0, good.sbo, good.lbo, good.swizzle)
    object.__setattr__(d, "descriptor_objects", lambda: [swapped])
    object.__setattr__(d, "_slices", (0,))
    mismatches = d._verify_descriptors()
    # LBO and SBO swapped: the next 64 head-dim columns are read from the next 8 keys, and vice versa.
    assert str(mismatches[0]) == "wgmma k-slice 0: inject (k=8, n=0): expected byte 1024, model reads byte 8192 (k off by -8, n off by 64)"


def test_tensor_map_recipe_and_instance():
    d = derive_operand("k", arch="sm_90a", head_dim=128, block_rows=128, dtype="f16")
    tm = d.tensor_map
    assert (tm.rank, tm.box, tm.box_bytes) == (5, (64, 128, 2, 1, 1), d.smem_bytes)
    p = tm.instantiate(batch=2, seq_len=1000, heads=8, stride_b=1000 * 8 * 128, stride_s=8 * 128, stride_h=128)
    assert isinstance(p, TensorMapParams)
    assert p.dims == (64, 1000, 2, 8, 2)
    assert p.strides_bytes == (8 * 128 * 2, 128, 256, 1000 * 8 * 128 * 2)
    assert p.swizzle_bytes == 128 and p.elem_strides == (1,) * 5 and p.box_bytes == d.smem_bytes
    with pytest.raises(LayoutError, match="multiple of 16"):
        tm.instantiate(batch=1, seq_len=10, heads=3, stride_b=0, stride_s=3 * 128 + 4, stride_h=128)


def test_tensor_map_model_catches_a_wrong_stride():
    d = derive_operand("q", arch="sm_90a", head_dim=128, block_rows=64, dtype="f16")
    params = d.tensor_map.instantiate(batch=1, seq_len=256, heads=2, stride_b=0, stride_s=256, stride_h=128)
    wrong = TensorMapParams(5, params.dims, (params.strides_bytes[0], 256) + params.strides_bytes[2:], params.box,
                            params.elem_strides, 128, 2, "f16")
    mismatches = d.check_tensor_map(wrong, (0, 0, 0, 0, 0), batch_index=0, seq_start=0, head=0, stride_b=0,
                                    stride_s=256, stride_h=128)
    assert any(m.coords == {"m": 0, "k": 64} for m in mismatches)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(operand="x"), "operand"),
    (dict(arch="sm_90"), "arch"),
    (dict(dtype="f32"), "dtype"),
    (dict(head_dim=96), "head_dim 96"),
    (dict(head_dim=512), "head_dim 512"),
    (dict(block_rows=96), "power of two"),
    (dict(block_rows=4), "8..256"),
    (dict(block_rows=512), "8..256"),
    (dict(operand="q", block_rows=32), "M = 64"),
    (dict(operand="v", block_rows=8), "16 keys"),
])
def test_bad_specs_rejected(kwargs, reason):
    spec = dict(operand="k", arch="sm_90a", head_dim=128, block_rows=64, dtype="f16")
    spec.update(kwargs)
    operand = spec.pop("operand")
    with pytest.raises(LayoutError, match=reason):
        derive_operand(operand, **spec)


def test_o_has_no_descriptor():
    d = derive_operand("o", arch="sm_90a", head_dim=64, block_rows=64, dtype="f16")
    assert (d.mma_major, d.mma_transpose, d.descriptors(), d.descriptor_fields()) == (None, None, [], {})


@pytest.mark.parametrize("seed", range(16))
def test_random_valid_specs_verify_and_round_trip(seed):
    rng = random.Random(1000 + seed)
    operand, arch = rng.choice(OPERANDS), rng.choice(ARCHES)
    rows = rng.choice([64, 128, 256] if operand == "q" else [16, 32, 64, 128, 256])
    d = derive_operand(operand, arch=arch, head_dim=rng.choice([64, 128, 256]), block_rows=rows,
                       dtype=rng.choice(["f16", "bf16"]))
    assert isinstance(d, OperandDerivation) and d.verify() == []
    assert d.layout.is_injective()
    inv_point = {name: rng.randrange(extent) for name, extent in d.coords.items()}
    byte = d.layout.apply_flat(inv_point)
    assert d.layout.solve(byte) == inv_point
    assert compile_c_expr(d.formula_c, d.coords)(inv_point) == byte
    for value, desc in zip(d.descriptors(), d.descriptor_objects()):
        assert SmemDescriptor.decode(d.descriptor_kind, value) == desc
