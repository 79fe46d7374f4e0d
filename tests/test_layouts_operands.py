import dataclasses
import random

import pytest

from layouts import LayoutError, OperandDerivation, TensorMapParams, derive_operand
from layouts.cexpr import compile_c_expr
from layouts.mma import SmemDescriptor
from layouts.operands import ARCHES, COORDS, OPERANDS
from layouts.stacked import StackedLayout
from layouts.swizzle import Swizzle

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


def test_a_head_pack_box_interleaves_adjacent_heads_rows():
    d = derive_operand("k", arch="sm_90a", head_dim=64, block_rows=128, dtype="bf16", head_pack=2)
    tm = d.tensor_map
    assert (tm.head_pack, tm.box, tm.box_bytes) == (2, (64, 2, 64, 1, 1), d.smem_bytes)
    p = tm.instantiate(batch=2, seq_len=1000, heads=8, stride_b=1000 * 8 * 64, stride_s=8 * 64, stride_h=64)
    assert p.dims == (64, 8, 1000, 1, 2) and p.strides_bytes == (128, 8 * 128, 128, 1000 * 8 * 128)
    assert tm.box_origin(batch_index=1, seq_start=64, head=4, seq_len=1000) == (0, 4, 64, 0, 1)
    # The one-head map (keys innermost) writes the same bytes elsewhere: row 1 must be head 1's key 0, not key 1.
    plain = derive_operand("k", arch="sm_90a", head_dim=64, block_rows=128, dtype="bf16").tensor_map
    wrong = plain.instantiate(batch=1, seq_len=256, heads=4, stride_b=0, stride_s=4 * 64, stride_h=64)
    mismatches = d.check_tensor_map(wrong, (0, 0, 0, 2, 0), batch_index=0, seq_start=0, head=2, stride_b=0,
                                    stride_s=4 * 64, stride_h=64)
    assert any(m.coords == {"n": 1, "k": 0} for m in mismatches)
    v = derive_operand("v", arch="sm_90a", head_dim=128, block_rows=128, dtype="f16", head_pack=2)
    assert v.tensor_map.box == (64, 2, 64, 2, 1)  # two column blocks: [d_blk][key][head][64]


@pytest.mark.parametrize("kwargs, reason", [(dict(operand="q", block_rows=64), "only sm_90a's K and V"),
                                            (dict(arch="sm_100a"), "only sm_90a's K and V"),
                                            (dict(head_pack=3), "dividing block_rows"),
                                            (dict(head_pack=0), "positive number")])
def test_a_head_pack_is_refused_where_no_kernel_reads_it(kwargs, reason):
    args = {**dict(operand="k", arch="sm_90a", head_dim=64, block_rows=128, dtype="bf16", head_pack=2), **kwargs}
    with pytest.raises(LayoutError, match=reason):
        derive_operand(args.pop("operand"), **args)


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
    (dict(head_dim=80), "head_dim 80"),
    (dict(head_dim=512), "head_dim 512"),
    (dict(block_rows=100), "multiple of 8"),
    (dict(operand="v", block_rows=40), "multiple of 16"),
    (dict(block_rows=4), "multiple of 8"),
    (dict(block_rows=264), "8..256"),
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


@pytest.mark.parametrize("seed", range(24))
def test_random_valid_specs_verify_and_round_trip(seed):
    rng = random.Random(1000 + seed)
    operand, arch = rng.choice(OPERANDS), rng.choice(ARCHES)
    rows = rng.choice([64, 128, 256] if operand == "q" else [16, 32, 64, 128, 256])
    d = derive_operand(operand, arch=arch, head_dim=rng.choice([64, 96, 128, 192, 256]), block_rows=rows,
                       dtype=rng.choice(["f16", "bf16"]))
    assert isinstance(d, OperandDerivation) and d.verify() == []
    assert d.layout.is_injective()
    inv_point = {name: rng.randrange(extent) for name, extent in d.coords.items()}
    byte = d.layout.apply_flat(inv_point)
    assert d.layout.solve(byte) == inv_point
    assert compile_c_expr(d.formula_c, d.coords)(inv_point) == byte
    for value, desc in zip(d.descriptors(), d.descriptor_objects()):
        assert SmemDescriptor.decode(d.descriptor_kind, value) == desc


# ----- head dims 96 and 192: three swizzle atoms across the head dim ------------------------------------------

# [d_blk][row][col % A] with A = 32 columns of 64-byte rows at D=96 and A = 64 of 128-byte rows at D=192;
# written from the swizzle definitions (64B: chunk ^= (addr >> 7) & 3; 128B: chunk ^= (addr >> 7) & 7).
THREE_ATOM_FORMULAS = {
    96: "(c>>5)*(R*64) + r*64 + (((c>>3)&3) ^ ((r>>1)&3))*16 + (c&7)*2",
    192: "(c>>6)*(R*128) + r*128 + (((c>>3)&7) ^ (r&7))*16 + (c&7)*2",
}


@pytest.mark.parametrize("operand", OPERANDS)
@pytest.mark.parametrize("head_dim,rows", [(96, 64), (96, 128), (192, 64), (192, 128)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_three_atom_tiles_match_the_specified_formulas(operand, head_dim, rows, dtype):
    d = derive_operand(operand, arch="sm_90a", head_dim=head_dim, block_rows=rows, dtype=dtype)
    row, col = COORDS[operand]
    text = THREE_ATOM_FORMULAS[head_dim].replace("R", str(rows)).replace("r", row).replace("c", col)
    assert list(d.coords.items()) == [(row, rows), (col, head_dim)]
    assert d.check_formula(text) == []
    assert isinstance(d.layout, StackedLayout) and d.layout.counts == {col: 3}
    span = 64 if head_dim == 96 else 128
    assert d.layout.strides == {col: rows * span} and d.swizzle.span_bytes == span
    assert d.smem_bytes == rows * head_dim * 2 and d.smem_align == 8 * span  # the pattern repeats every 8 rows
    # The formula the kernel renders evaluates to the layout on every element, and every byte decodes back.
    fn = compile_c_expr(d.formula_c, d.coords)
    grid = d.layout.grid()
    assert (fn(grid) == d.layout.apply_flat(grid)).all()
    for point in ({row: 0, col: 0}, {row: rows - 1, col: head_dim - 1}, {row: 5, col: 2 * span // 2 + 9}):
        assert d.layout.solve(d.layout.apply_flat(point)) == point


def test_three_atom_block_bases_are_exact():
    d96 = derive_operand("q", arch="sm_90a", head_dim=96, block_rows=64, dtype="f16").layout
    # 64-byte rows: row bits 1 and 2 carry the swizzle into chunk bits 4 and 5.
    assert d96.block.bases == {"m": [{"byte": b} for b in (64, 144, 288, 512, 1024, 2048)],
                               "k": [{"byte": b} for b in (2, 4, 8, 16, 32)]}
    d192 = derive_operand("v", arch="sm_90a", head_dim=192, block_rows=64, dtype="bf16").layout
    assert d192.block.bases == {"k": [{"byte": b} for b in (144, 288, 576, 1024, 2048, 4096)],
                                "n": [{"byte": b} for b in (2, 4, 8, 16, 32, 64)]}
    assert (d192.counts, d192.strides) == ({"n": 3}, {"n": 8192})


def test_d96_q_descriptors_use_the_64b_swizzle_and_cross_atoms():
    d = derive_operand("q", arch="sm_90a", head_dim=96, block_rows=64, dtype="bf16")
    f = d.descriptor_fields()
    # K-major 64B (PTX canonical ((8,m),(T,2k)):((4T,SBO),(1,T))): rows 64 B apart, SBO = 8 rows, LBO unused.
    assert (f["kind"], f["lbo"], f["sbo"], f["swizzle"], f["swizzle_code"]) == ("wgmma", 16, 512, "64B", 2)
    # Two 16-column k-slices per 32-column atom, the atoms 64 x 64 bytes apart.
    assert f["slice_start_bytes"] == [0, 32, 4096, 4128, 8192, 8224]
    assert d.descriptors()[0] == 1 << 16 | 32 << 32 | 2 << 62
    assert [x - d.descriptors()[0] for x in d.descriptors()] == [0, 2, 256, 258, 512, 514]


def test_d96_v_lbo_steps_between_the_three_atoms():
    d = derive_operand("v", arch="sm_90a", head_dim=96, block_rows=128, dtype="f16")
    assert (d.mma_major, d.mma_transpose, d.mma_rows) == ("MN", 1, 96)
    f = d.descriptor_fields()
    # MN-major 64B (PTX ((T,4,m),(8,k)):((1,T,LBO),(4T,SBO))): LBO from one 32-column atom to the next (128 keys
    # x 64 B), SBO from one 8-key group to the next.
    assert (f["lbo"], f["sbo"], f["swizzle_code"]) == (128 * 64, 512, 2)
    assert f["slice_start_bytes"] == [1024 * j for j in range(8)]
    assert d.descriptors()[0] == (8192 >> 4) << 16 | (512 >> 4) << 32 | 2 << 62


def test_d192_v_lbo_steps_between_the_three_atoms():
    d = derive_operand("v", arch="sm_90a", head_dim=192, block_rows=64, dtype="bf16")
    f = d.descriptor_fields()
    assert (d.mma_rows, f["lbo"], f["sbo"], f["swizzle_code"]) == (192, 64 * 128, 1024, 1)
    assert f["slice_start_bytes"] == [0, 2048, 4096, 6144]
    k = derive_operand("k", arch="sm_90a", head_dim=192, block_rows=64, dtype="bf16").descriptor_fields()
    assert k["slice_start_bytes"] == [a + b for a in (0, 8192, 16384) for b in (0, 32, 64, 96)]


@pytest.mark.parametrize("head_dim,atom,span", [(96, 32, 64), (192, 64, 128)])
def test_three_atom_tensor_maps(head_dim, atom, span):
    d = derive_operand("k", arch="sm_90a", head_dim=head_dim, block_rows=128, dtype="f16")
    tm = d.tensor_map
    assert (tm.atom_cols, tm.col_blocks, tm.box, tm.box_bytes) == (atom, 3, (atom, 128, 3, 1, 1), d.smem_bytes)
    assert tm.describe()["dims"] == [str(atom), "S", "3", "H", "B"]
    p = tm.instantiate(batch=2, seq_len=1000, heads=8, stride_b=1000 * 8 * head_dim, stride_s=8 * head_dim,
                       stride_h=head_dim)
    assert p.dims == (atom, 1000, 3, 8, 2)
    assert p.strides_bytes == (8 * head_dim * 2, span, head_dim * 2, 1000 * 8 * head_dim * 2)
    assert p.swizzle_bytes == span and p.box[0] * 2 == span  # the driver's rule: inner box <= swizzle span


def test_a_box_wider_than_the_64b_swizzle_is_refused():
    # cuTensorMapEncodeTiled: "CU_TENSOR_MAP_SWIZZLE_64B requires the bounding box inner dimension to be <= 64".
    with pytest.raises(LayoutError, match="exceeds the 64 B swizzle span"):
        TensorMapParams(5, (64, 256, 1, 2, 1), (384, 128, 192, 0), (64, 64, 1, 1, 1), (1,) * 5, 64, 2, "f16")


def test_d96_verification_rejects_broken_variants():
    d = derive_operand("v", arch="sm_90a", head_dim=96, block_rows=64, dtype="f16")
    good = d.descriptor_objects()[0]
    # LBO of one atom too many: the second atom's columns are read from the third.
    wrong_lbo = SmemDescriptor(good.kind, 0, 2 * good.lbo, good.sbo, good.swizzle)
    object.__setattr__(d, "descriptor_objects", lambda: [wrong_lbo])
    object.__setattr__(d, "_slices", (0,))
    mismatches = d._verify_descriptors()
    assert str(mismatches[0]) == ("wgmma k-slice 0: inject (k=0, n=32): expected byte 4096, model reads byte 8192 "
                                  "(n off by 32)")
    # The 128B swizzle mode on the 64B-swizzled tile: chunks move on the rows the two modes treat differently.
    wrong_mode = SmemDescriptor(good.kind, 0, good.lbo, good.sbo, Swizzle(128))
    object.__setattr__(d, "descriptor_objects", lambda: [wrong_mode])
    assert any(m.coords == {"k": 1, "n": 0} for m in d._verify_descriptors())
    # A formula with the old assumption of 64-column blocks.
    old = "(n>>6)*(64*128) + k*128 + (((n>>3)&7) ^ (k&7))*16 + (n&7)*2"
    assert d.check_formula(old)
    # The pre-96 tensor map: 64-column boxes of a 128-byte swizzle, head_dim // 64 = 1 block.
    bad = TensorMapParams(5, (64, 256, 1, 3, 1), (3 * 96 * 2, 128, 96 * 2, 256 * 3 * 96 * 2), (64, 64, 1, 1, 1),
                          (1,) * 5, 128, 2, "f16")
    found = d.check_tensor_map(bad, (0, 0, 0, 0, 0), batch_index=0, seq_start=0, head=0, stride_b=256 * 3 * 96,
                               stride_s=3 * 96, stride_h=96)
    assert found[0].check == "tensor map box bytes" and any(m.coords.get("n", 0) >= 64 for m in found[1:])


def test_d96_broken_stride_in_the_derivation_is_caught(monkeypatch):
    """Break the derivation itself (column blocks one 8-row group too far apart) and watch verification fail."""
    import layouts.operands as operands

    real = operands.stack

    def too_far(block, extents, strides):
        return real(block, extents, {d: s + 512 for d, s in strides.items()})

    monkeypatch.setattr(operands, "stack", too_far)
    with pytest.raises(LayoutError, match="not a dense"):
        derive_operand("k", arch="sm_90a", head_dim=96, block_rows=64, dtype="f16")


def test_d96_tensor_map_with_the_wrong_swizzle_is_caught(monkeypatch):
    """Keep the 64B-swizzled tile but let the tensor map write it with the 128B swizzle: the TMA model disagrees."""
    import layouts.operands as operands

    real = operands._recipe
    monkeypatch.setattr(operands, "_recipe", lambda kind, swizzle, *rest: dataclasses.replace(
        real(kind, swizzle, *rest), swizzle=Swizzle(128)))
    with pytest.raises(LayoutError, match="TMA: inject"):
        derive_operand("o", arch="sm_90a", head_dim=96, block_rows=64, dtype="f16")


def test_d96_key_group_v_on_blackwell_stacks_keys_and_atoms():
    d = derive_operand("v", arch="sm_103a", head_dim=96, block_rows=128, dtype="bf16")
    # 8 keys x 32 columns per 512-byte atom; three atoms side by side; then the next 8 keys, 1536 bytes on.
    assert d.check_formula("(k>>3)*1536 + (n>>5)*512 + (k&7)*64 + (((n>>3)&3) ^ ((k>>1)&3))*16 + (n&7)*2") == []
    assert (d.layout.counts, d.layout.strides) == ({"k": 16, "n": 3}, {"k": 1536, "n": 512})
    f = d.descriptor_fields()
    assert (f["kind"], f["lbo"], f["sbo"], f["swizzle_code"]) == ("tcgen05", 512, 1536, 4)
    assert d.tensor_map.box == (32, 8, 3, 1, 16)


# ----- key blocks that are not a power of two (80, 96, 112 keys): a restricted domain of a 128-row block ------

@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("rows", [80, 96, 112])
@pytest.mark.parametrize("operand", ["k", "v"])
def test_short_key_blocks_match_the_specified_formulas(operand, rows, head_dim):
    d = derive_operand(operand, arch="sm_90a", head_dim=head_dim, block_rows=rows, dtype="bf16")
    row, col = COORDS[operand]
    if head_dim == 96:
        text = THREE_ATOM_FORMULAS[96]
    else:  # 64-column atoms of the 128B swizzle, as many as the head dim holds
        text = "(c>>6)*(R*128) + r*128 + (((c>>3)&7) ^ (r&7))*16 + (c&7)*2"
    assert d.check_formula(text.replace("R", str(rows)).replace("r", row).replace("c", col)) == []
    assert isinstance(d.layout, StackedLayout) and d.layout.block.in_dims[row] == 128 and d.layout.in_dims[row] == rows
    span = d.swizzle.span_bytes
    assert d.smem_bytes == rows * head_dim * 2 and d.tensor_map.box == (span // 2, rows, head_dim * 2 // span, 1, 1)
    assert (rows * span) % d.smem_align == 0  # column blocks stay on the swizzle pattern's boundary
    f = d.descriptor_fields()
    if operand == "k":  # K-major: N = rows of QK^T, one descriptor per 16 head-dim columns
        assert (f["sbo"], len(f["slice_start_bytes"]), d.mma_rows) == (8 * span, head_dim // 16, rows)
    else:  # MN-major: K = rows of PV in 16-key slices, LBO between head-dim atoms rows * span apart
        assert f["slice_start_bytes"] == [16 * span * j for j in range(rows // 16)]
        assert f["lbo"] == (rows * span if head_dim * 2 > span else 16) and f["sbo"] == 8 * span


def test_a_short_key_block_with_the_power_of_two_stride_is_caught():
    """Stage 80 keys but keep the 128-row block stride (the old rows * 128 with rows rounded up): the TMA box of
    80 rows packs the next atom right after row 79, so the model disagrees from the second atom on."""
    d = derive_operand("v", arch="sm_90a", head_dim=128, block_rows=80, dtype="f16")
    wrong = "(n>>6)*(128*128) + k*128 + (((n>>3)&7) ^ (k&7))*16 + (n&7)*2"
    mismatches = d.check_formula(wrong)
    assert str(mismatches[0]) == "formula: inject (k=0, n=64): expected byte 10240, model reads byte 16384 (k off by 48)"
    good = d.descriptor_objects()[0]
    object.__setattr__(d, "descriptor_objects", lambda: [SmemDescriptor(good.kind, 0, 128 * 128, good.sbo, good.swizzle)])
    object.__setattr__(d, "_slices", (0,))
    assert any(m.coords == {"k": 0, "n": 64} for m in d._verify_descriptors())


def test_a_formula_right_on_every_basis_point_but_wrong_between_them_is_caught():
    """compare_maps' second pass, over the whole tile: `+` where `^` belongs agrees wherever one coordinate bit is
    set (a basis point) and nowhere the swizzle's two terms overlap; only the full-tile pass sees that."""
    d = derive_operand("q", arch="sm_90a", head_dim=128, block_rows=64, dtype="f16")
    text = HOPPER_FORMULAS["q"][2].replace("R", "64")
    assert d.check_formula(text) == []
    found = d.check_formula(text.replace(" ^ ", " + "))
    assert found and not any(m.basis for m in found)


@pytest.mark.parametrize("operand, rows, head_pack, arch", [("q", 64, 1, "sm_90a"), ("k", 128, 1, "sm_90a"),
                                                          ("v", 128, 1, "sm_90a"), ("k", 128, 2, "sm_90a"),
                                                          ("v", 64, 2, "sm_90a"), ("v", 128, 1, "sm_100a")])
def test_the_recipes_symbolic_dims_and_strides_are_its_instantiation(operand, rows, head_pack, arch):
    """The manifest and the exported launcher read describe()'s symbolic dims and byte strides, the Python path
    instantiate()'s numbers: the two must be one map (a swap in either would read other heads' rows)."""
    d = derive_operand(operand, arch=arch, head_dim=128, block_rows=rows, dtype="bf16", head_pack=head_pack)
    recipe = d.tensor_map
    names = dict(B=3, S=1024, H=8, stride_s=8 * 128 + 64, stride_h=128)
    # A padded batch stride, except where the key-group map folds batch into keys (it needs S * stride_s).
    names["stride_b"] = names["S"] * names["stride_s"] + (64 if recipe.kind == "row_tiles" else 0)
    made = recipe.instantiate(batch=names["B"], seq_len=names["S"], heads=names["H"], stride_b=names["stride_b"],
                              stride_s=names["stride_s"], stride_h=names["stride_h"])
    described = recipe.describe()
    value = lambda text: int(eval(str(text), {"__builtins__": {}}, names))  # noqa: E731,S307 - our own strings
    assert tuple(map(value, described["dims"])) == tuple(made.dims)
    assert tuple(map(value, described["strides_bytes"])) == tuple(made.strides_bytes)
    assert tuple(described["box"]) == tuple(made.box)


def test_a_128_byte_swizzled_tile_moves_16_bytes_at_a_time_along_its_columns():
    """contiguous_run sets the store width of the O epilogue and decode's row copies: under a 128 B swizzle the
    XOR reaches bit 4 of the byte offset, so 8 halves (16 bytes) stay consecutive and 16 do not."""
    o = derive_operand("o", arch="sm_90a", head_dim=128, block_rows=64, dtype="f16")
    assert o.layout.contiguous_run("n", 2) == 8
    assert o.layout.contiguous_run("m", 2) == 1  # rows are 128 bytes apart: no run along m
