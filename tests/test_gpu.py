"""The sm_90a kernel on the GPU against float64 (skipped with a reason where there is no GPU).

Rules (DESIGN.md section 6): fresh random inputs every run, outputs poisoned with NaN before launch and every
element checked, error at most 2x the same-dtype PyTorch SDPA error against the same float64 reference.
"""

from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from codegen import check  # noqa: E402
from codegen.api import InputError, attention, prepare  # noqa: E402

DTYPES = {name: check.torch_dtype(name) for name in ("f16", "bf16")}
LSE_TOLERANCE = 1e-5  # float32 running max and sum; measured ~1e-7 (check.lse_rel_err: relative to >= 1 a row)
TINY = 1e-6           # when SDPA is exact (S=1), ours must be too, up to rounding of a copy


def run_checked(q, k, v, *, causal=False, split=None, layout="bshd", scale=None, **tuning):
    """Run with poisoned outputs; return (o, lse) after checking every element was written."""
    call = prepare(q, k, v, causal=causal, pv_split=split, layout=layout, scale=scale, **tuning)
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    assert not torch.isnan(call.o).any(), "some output elements were never written"
    assert not torch.isnan(call.lse).any(), "some logsumexp rows were never written"
    return call.o, call.lse


def assert_close_to_reference(q, k, v, o, lse, *, causal=False, layout="bshd", scale=None):
    ref_o, ref_lse = check.reference(q, k, v, causal=causal, layout=layout, scale=scale)
    sdpa_o = check.sdpa_output(q, k, v, causal=causal, layout=layout, scale=scale)
    failure = check.accuracy_failure(o, ref_o, sdpa_o, floor=TINY, name="SDPA")
    assert failure is None, failure
    lse_err = check.lse_rel_err(lse, ref_lse)
    assert lse_err <= LSE_TOLERANCE, f"logsumexp rel err {lse_err:.3e}"
    failure = check.lse_failure(lse, ref_lse)  # and each row: one row off hides in a global error
    assert failure is None, failure


MATRIX = list(itertools.product((1, 3), (1, 100, 128, 1000, 1024, 4096), (1, 16, 64), ("f16", "bf16"),
                                ((96, 32), (64, 64))))


@pytest.mark.parametrize("batch, seq, heads, dtype, split", MATRIX,
                         ids=[f"B{b}-S{s}-H{h}-{d}-pv{p[0]}x{p[1]}" for b, s, h, d, p in MATRIX])
def test_matches_float64(batch, seq, heads, dtype, split):
    q, k, v = (torch.randn(batch, seq, heads, 128, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    o, lse = run_checked(q, k, v, split=split)
    assert_close_to_reference(q, k, v, o, lse)


@pytest.mark.parametrize("seq", (1024, 2048, 2112, 4096, 5000))
@pytest.mark.parametrize("dtype", ("f16", "bf16"))
def test_default_tiles_match_float64(seq, dtype):
    # No split given: the plan's own tile (block_n 176 at D=128 from 1024 keys): 2112 = 12 x 176 keys end in a whole
    # block, the others in a part block.
    q, k, v = (torch.randn(2, seq, 4, 128, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    o, lse = run_checked(q, k, v)
    assert_close_to_reference(q, k, v, o, lse)


CAUSAL = list(itertools.product((1, 3), (1, 100, 128, 1000, 4096), (16,), ("f16", "bf16"), ((96, 32), (64, 64))))


@pytest.mark.parametrize("batch, seq, heads, dtype, split", CAUSAL,
                         ids=[f"B{b}-S{s}-H{h}-{d}-pv{p[0]}x{p[1]}" for b, s, h, d, p in CAUSAL])
def test_causal_matches_float64(batch, seq, heads, dtype, split):
    q, k, v = (torch.randn(batch, seq, heads, 128, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    o, lse = run_checked(q, k, v, causal=True, split=split)
    assert_close_to_reference(q, k, v, o, lse, causal=True)
    # The first row sees only key 0; the last row sees every key.
    torch.testing.assert_close(o[:, 0].float(), v[:, 0].float(), rtol=0, atol=0)


# Head dims 96 (three 32-column atoms of the 64B swizzle) and 192 (three 64-column atoms): both dtypes, both
# masks, S a multiple of the tile and not, S below one tile, batch > 1; default tiles (block_n 128 / 64).
THREE_ATOMS = list(itertools.product((96, 192), (1, 3), (1, 100, 1000, 4096), ("f16", "bf16"), (False, True)))


@pytest.mark.parametrize("head_dim, batch, seq, dtype, causal", THREE_ATOMS,
                         ids=[f"D{d}-B{b}-S{s}-{dt}-{'causal' if c else 'full'}" for d, b, s, dt, c in THREE_ATOMS])
def test_three_atom_head_dims_match_float64(head_dim, batch, seq, dtype, causal):
    q, k, v = (torch.randn(batch, seq, 16, head_dim, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    o, lse = run_checked(q, k, v, causal=causal)
    assert_close_to_reference(q, k, v, o, lse, causal=causal)
    if causal:  # the first row sees only key 0
        torch.testing.assert_close(o[:, 0].float(), v[:, 0].float(), rtol=0, atol=0)


OTHER_HEAD_DIMS = [(64, (96, 32)), (64, (64, 64)), (96, (96, 32)), (96, (64, 64)), (192, (32, 32)), (192, (64,)),
                   (256, (32, 32)), (256, (64,))]


@pytest.mark.parametrize("head_dim, split", OTHER_HEAD_DIMS,
                         ids=[f"D{d}-pv{'x'.join(map(str, p))}" for d, p in OTHER_HEAD_DIMS])
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_other_head_dims(head_dim, split, causal):
    q, k, v = (torch.randn(2, 1000, 8, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = run_checked(q, k, v, causal=causal, split=split)
    assert_close_to_reference(q, k, v, o, lse, causal=causal)


# Key blocks other than the defaults (the block_n knob): stacked K/V tiles of 80-112 rows, and wide ones up to
# the accumulator-register limit (the wide D <= 128 ones run persistent by default).
SHORT_KEY_BLOCKS = [(256, 80), (192, 96), (192, 112), (128, 80), (96, 112), (64, 96),
                    (128, 144), (128, 176), (128, 192), (96, 176), (64, 160), (64, 208)]


@pytest.mark.parametrize("head_dim, block_n", SHORT_KEY_BLOCKS, ids=[f"D{d}-n{n}" for d, n in SHORT_KEY_BLOCKS])
@pytest.mark.parametrize("dtype", ("f16", "bf16"))
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_short_key_blocks_match_float64(head_dim, block_n, dtype, causal):
    q, k, v = (torch.randn(2, 1000, 8, head_dim, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    o, lse = run_checked(q, k, v, causal=causal, block_n=block_n)
    assert_close_to_reference(q, k, v, o, lse, causal=causal)


@pytest.mark.parametrize("head_dim", (128, 96, 192), ids=lambda d: f"D{d}")
def test_large_scores_stay_finite(head_dim):
    q, k, v = (torch.randn(1, 1024, 4, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    q, k = q * 12, k * 12  # scores around +-1000 x the usual: the running max must carry the softmax
    o, lse = run_checked(q, k, v)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert_close_to_reference(q, k, v, o, lse)


def test_sdpa_layout_and_custom_scale():
    q, k, v = (torch.randn(2, 8, 777, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    o, lse = run_checked(q, k, v, layout="bhsd", scale=0.05)
    assert o.shape == q.shape
    assert_close_to_reference(q, k, v, o, lse, layout="bhsd", scale=0.05)


@pytest.mark.parametrize("head_dim", (128, 96, 192), ids=lambda d: f"D{d}")
def test_strided_views_of_a_packed_qkv(head_dim):
    qkv = torch.randn(2, 500, 3, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)  # strides (500*3*4*128, 3*4*128, 128, 1): no copies needed
    o, lse = run_checked(q, k, v)
    assert_close_to_reference(q, k, v, o, lse)


def test_attention_returns_output_and_lse():
    q, k, v = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    o, lse = attention(q, k, v, return_lse=True)
    assert o.shape == q.shape and lse.shape == (1, 2, 256) and lse.dtype == torch.float32
    assert_close_to_reference(q, k, v, o, lse)


def test_mixed_devices_are_refused():
    q = torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(InputError, match="one device"):
        attention(q, q.cpu(), q)


def test_misaligned_cuda_pointer_is_refused():
    flat = torch.randn(128 * 2 * 128 + 8, device="cuda", dtype=torch.float16)
    q = flat[1:1 + 128 * 2 * 128].view(1, 128, 2, 128)
    with pytest.raises(InputError, match="16-byte aligned"):
        attention(q, q, q)


# --- coverage: grouped-query heads, separate key length, local windows, softcap, fully masked rows ---------


def run_coverage(batch, seq_q, seq_k, heads, kv_heads, head_dim, dtype="bf16", causal=False, window=None,
                 softcap=0.0, scale_inputs=1.0, tuning=None):
    dt = DTYPES[dtype]
    q = torch.randn(batch, seq_q, heads, head_dim, device="cuda", dtype=dt) * scale_inputs
    k = torch.randn(batch, seq_k, kv_heads, head_dim, device="cuda", dtype=dt) * scale_inputs
    v = torch.randn(batch, seq_k, kv_heads, head_dim, device="cuda", dtype=dt)
    call = prepare(q, k, v, causal=causal, window=window, softcap=softcap, **(tuning or {}))
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    assert not torch.isnan(call.o).any() and not torch.isnan(call.lse).any(), "unwritten outputs"
    options = dict(causal=causal, window=window, softcap=softcap)
    ref_o, ref_lse = check.reference(q, k, v, **options)
    failure = check.accuracy_failure(call.o, ref_o, check.same_dtype_output(q, k, v, **options), floor=TINY)
    assert failure is None, failure
    empty = torch.isinf(ref_lse)  # rows that see no key: 0 output, logsumexp -inf
    assert torch.equal(torch.isinf(call.lse), empty), "fully masked rows differ"
    assert (call.o.transpose(1, 2)[empty] == 0).all(), "a fully masked row is not 0"
    if (~empty).any():
        assert check.lse_rel_err(call.lse[~empty], ref_lse[~empty]) <= LSE_TOLERANCE
    failure = check.lse_failure(call.lse, ref_lse)
    assert failure is None, failure
    return empty


# The consumers without ping-pong turns, which the policy does not take (codegen.policy's pingpong rows).
@pytest.mark.parametrize("head_dim", (256, 128, 64), ids=lambda d: f"D{d}")
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_consumers_without_turns(head_dim, causal):
    run_coverage(2, 1000, 1100, 8, 2, head_dim, causal=causal, tuning=dict(pingpong=False))


@pytest.mark.parametrize("kv_heads", (1, 4, 16))
@pytest.mark.parametrize("causal", (False, True))
def test_grouped_query_heads(kv_heads, causal):
    run_coverage(2, 1000, 1000, 16, kv_heads, 128, causal=causal)


@pytest.mark.parametrize("seq_q, seq_k", [(300, 1000), (1000, 300), (1, 777), (129, 128), (128, 4096)])
@pytest.mark.parametrize("causal", (False, True))
def test_separate_key_length(seq_q, seq_k, causal):
    empty = run_coverage(2, seq_q, seq_k, 4, 2, 128, dtype="f16", causal=causal)
    if causal and seq_q > seq_k:
        assert empty.any(), "bottom-right causal leaves the first S_q - S_k rows without keys"


@pytest.mark.parametrize("window", [(128, 0), (64, 64), (0, 0), (300, -1), (-1, 100)])
def test_local_window(window):
    run_coverage(2, 1000, 1000, 4, 4, 128, window=window)


def test_causal_local_window_with_longer_keys():
    run_coverage(1, 500, 1500, 8, 2, 128, causal=True, window=(200, -1))


@pytest.mark.parametrize("causal", (False, True))
def test_softcap(causal):
    run_coverage(2, 1000, 1000, 4, 4, 128, causal=causal, softcap=30.0, scale_inputs=4.0)


@pytest.mark.parametrize("head_dim", (64, 96, 192, 256), ids=lambda d: f"D{d}")
def test_every_option_together(head_dim):
    run_coverage(2, 700, 900, 8, 2, head_dim, causal=True, window=(256, -1), softcap=20.0, scale_inputs=2.0)


# --- variable-length batches (cu_seqlens) ------------------------------------------------------------------


def packed(lengths, heads, head_dim, dt, scale_inputs=1.0):
    """A packed (total, heads, head_dim) tensor of the given sequence lengths and its int32 offsets."""
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    return torch.randn(sum(lengths), heads, head_dim, device="cuda", dtype=dt) * scale_inputs, offsets


def run_varlen(q_lens, k_lens, heads, kv_heads, head_dim, dtype="bf16", scale_inputs=1.0, max_seqlens=(None, None),
               tuning=None, **options):
    dt = DTYPES[dtype]
    q, cu_q = packed(q_lens, heads, head_dim, dt, scale_inputs)
    k, cu_k = packed(k_lens, kv_heads, head_dim, dt, scale_inputs)
    v, _ = packed(k_lens, kv_heads, head_dim, dt)
    call = prepare(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_seqlens[0],
                   max_seqlen_k=max_seqlens[1], **(tuning or {}), **options)
    assert call.o.shape == q.shape and call.lse.shape == (heads, q.shape[0])
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    assert_varlen_matches(q, k, v, cu_q, cu_k, call.o, call.lse, **options)
    return call


def assert_varlen_matches(q, k, v, cu_q, cu_k, o, lse, **options):
    """A packed batch's o and lse (written over NaN) against float64, the whole batch and each sequence."""
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "unwritten outputs"
    ref_o, ref_lse = check.reference_varlen(q, k, v, cu_q, cu_k, **options)
    same_dtype = check.same_dtype_output_varlen(q, k, v, cu_q, cu_k, **options)
    failure = check.accuracy_failure(o, ref_o, same_dtype, floor=TINY)
    assert failure is None, failure
    yardstick = check.rel_err(same_dtype, ref_o)
    # Each sequence on its own too: a tile that spilled into its neighbour would show here even when the
    # whole-batch error is small.
    for i, (rows, _) in enumerate(check.sequences(cu_q, cu_k)):
        if rows.stop > rows.start and ref_o[rows].norm() > 0:
            seq_err = check.rel_err(o[rows], ref_o[rows])
            assert seq_err <= max(4 * yardstick, 1e-2), f"sequence {i}: rel err {seq_err:.3e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty), "fully masked rows differ"
    assert (o.transpose(0, 1)[empty] == 0).all(), "a fully masked row is not 0"
    if (~empty).any():
        assert check.lse_rel_err(lse[~empty], ref_lse[~empty]) <= LSE_TOLERANCE
    failure = check.lse_failure(lse, ref_lse)
    assert failure is None, failure


# Lengths around the 128-row query tile and the key block, a sequence shorter than one tile's consumer half,
# and empty sequences on either side.
RAGGED = [1, 127, 128, 129, 300, 1000, 64, 65, 0, 513]


@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", ("f16", "bf16"))
def test_varlen(head_dim, causal, dtype):
    run_varlen(RAGGED, RAGGED, 8, 8, head_dim, dtype=dtype, causal=causal)


@pytest.mark.parametrize("causal", (False, True))
def test_varlen_separate_key_lengths_and_gqa(causal):
    # Keys longer and shorter than queries (bottom-right per sequence), one sequence with no keys at all.
    run_varlen([100, 700, 128, 5, 0, 260], [300, 200, 128, 0, 7, 1000], 16, 4, 128, causal=causal)


def test_varlen_window_and_softcap():
    run_varlen(RAGGED, RAGGED, 4, 2, 128, causal=True, window=(96, -1), softcap=20.0, scale_inputs=2.0)


def test_varlen_max_seqlen_larger_than_needed():
    call = run_varlen([200, 50], [200, 50], 2, 2, 64, max_seqlens=(1000, 1000))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = 8 * 2 * 2  # ceil(1000 / 128) query tiles x 2 heads x 2 sequences; the unused ones are skipped
    assert call.grid == ((min(tiles, sms), 1, 1) if call.spec.persistent else (8, 2, 2))
    assert "s1024" in call.spec.name


def test_varlen_short_max_seqlen_is_refused():
    q, cu = packed([100, 300], 2, 64, torch.float16)
    with pytest.raises(InputError, match="shorter than sequence 1 of length 300"):
        prepare(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=256)


# --- persistent CTAs: one per SM, looping over tiles ---------------------------------------------------------

PERSISTENT = {"persistent": True}


@pytest.mark.parametrize("seq", (100, 1000, 4096))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", (64, 128))
def test_persistent(seq, causal, head_dim):
    # 3 batches x 16 heads x up to 32 tiles (x 128 heads of one tile at 100): more tiles than 2 x 132 SMs, so most
    # CTAs run several tiles, and ring positions carry across them.
    heads = 128 if seq == 100 else 16
    run_coverage(3, seq, seq, heads, heads, head_dim, causal=causal, tuning=PERSISTENT)


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, kv_heads", [
    (3, 2048, 2048, 40, 40),   # 120 (sequence, head) pairs in L2 sections of 32: the last holds 24
    (3, 512, 8192, 16, 4),     # queries after a key prefix, grouped heads: 48 pairs, sections of 32 and 16
    (1, 4096, 4096, 40, 40),   # 40 pairs, sections of 16: the last holds 8
])
def test_persistent_causal_tiles_in_sections(batch, seq_q, seq_k, heads, kv_heads):
    # Persistent causal CTAs take tiles in the per-tile grid's order (longest first across each L2 section's
    # pairs): every tile exactly once, whatever the sections.
    run_coverage(batch, seq_q, seq_k, heads, kv_heads, 128, causal=True, tuning=PERSISTENT)


@pytest.mark.parametrize("tile_overlap", (True, False))
@pytest.mark.parametrize("seq, heads, kv_heads, softcap", [(4096, 16, 16, 0.0), (1000, 16, 4, 20.0),
                                                            (100, 128, 128, 0.0)])
def test_persistent_tile_boundaries(tile_overlap, seq, heads, kv_heads, softcap):
    # Each tile's O is stored under the next tile's first QK (tile_overlap, the default for fixed lengths without
    # a window) or before it (the boundary kept to A/B against); 3 batches put several tiles on most CTAs.
    run_coverage(3, seq, seq, heads, kv_heads, 128, softcap=softcap,
                 tuning=dict(persistent=True, tile_overlap=tile_overlap))


@pytest.mark.parametrize("causal, dtype, head_dim, persistent", [(False, "bf16", 256, False), (True, "f16", 128, None),
                                                             (False, "f16", 64, True), (False, "bf16", 192, False)])
def test_lazy_rescale(causal, dtype, head_dim, persistent):
    # A row's running max kept while the new one is within 2^8 (KernelSpec.lazy_rescale): keys growing 16-fold along
    # the sequence push every row's max up past the slack several times, and by less than it in between.
    dt = DTYPES[dtype]
    batch, seq, heads = 2, 1000, 8
    q = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=dt)
    ramp = torch.linspace(0.5, 8.0, seq, device="cuda").view(1, seq, 1, 1)
    k = (torch.randn(batch, seq, heads, head_dim, device="cuda") * ramp).to(dt)
    v = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=dt)
    o, lse = run_checked(q, k, v, causal=causal, lazy_rescale=True, persistent=persistent)
    assert_close_to_reference(q, k, v, o, lse, causal=causal)


# Keys ending in a part block (short_tail): its QK and PV run over its keys rounded up to 16, the rest of the
# block unread. Tails of whole 16-key slices (no mask) and with a masked remainder; wide and default key blocks;
# persistent and one CTA per tile; against the whole masked block (short_tail=False).
@pytest.mark.parametrize("short_tail", (True, False))
@pytest.mark.parametrize("seq_q, seq_k, head_dim, block_n, persistent, softcap", [
    (1024, 1024, 128, 176, True, 0.0),     # 5 x 176 + 144
    (4096, 4096, 128, 0, True, 0.0),       # the default 176: 48 keys
    (1000, 1000, 128, 176, True, 20.0),    # 120 keys: the last slice masked
    (300, 16400, 128, 0, True, 0.0),       # 32 keys
    (1000, 700, 64, 0, True, 0.0),         # D=64, block 128: 60 keys
    (700, 1000, 256, 0, False, 0.0),       # D=256, block 64: 40 keys
    (500, 1000, 128, 176, False, 0.0),
])
def test_short_tail_block(short_tail, seq_q, seq_k, head_dim, block_n, persistent, softcap):
    run_coverage(2, seq_q, seq_k, 8, 4, head_dim, softcap=softcap,
                 tuning=dict(block_n=block_n, persistent=persistent, short_tail=short_tail))


# --- multicast: query tiles 2c, 2c+1 as a two-CTA cluster, each key block both visit loaded once for both --------
# Causal pairs share all but the longer tile's last block(s); fewer keys than queries leave pairs whose first tile
# (or both) sees no key; a right window and a short tail block; D from 64 to 256 (block_n 64 to 176); GQA.
@pytest.mark.parametrize("seq_q, seq_k, head_dim, causal, kv_heads, window, softcap", [
    (4096, 4096, 128, True, 16, None, 0.0),
    (4096, 4096, 128, False, 4, None, 0.0),     # block_n 176: a 48-key short tail
    (1000, 1000, 128, True, 4, None, 20.0),     # a ragged last tile
    (256, 1000, 64, True, 16, None, 0.0),       # the diagonal 744 keys in
    (1000, 300, 64, True, 1, None, 0.0),        # the first tiles see no key
    (1000, 1000, 128, False, 16, (-1, 100), 0.0),
    (512, 512, 256, True, 16, None, 0.0),
    (768, 768, 96, True, 8, None, 0.0),
    (512, 700, 192, False, 16, None, 0.0),
    (1100, 1100, 128, True, 4, None, 0.0),      # 9 tiles: the last cluster's second CTA idles
    (1100, 1500, 64, False, 16, None, 0.0),
    (300, 300, 96, True, 8, None, 0.0),         # 3 tiles
])
def test_multicast(seq_q, seq_k, head_dim, causal, kv_heads, window, softcap):
    run_coverage(2, seq_q, seq_k, 16, kv_heads, head_dim, causal=causal, window=window, softcap=softcap,
                 tuning=dict(multicast=True))


# Persistent pairs (alike tiles: no causal or window bound): both CTAs of a cluster take tiles 2c, 2c+1 at every
# step of a fixed stride; each stages its O in its last block's K slot, released on both CTAs. Several tiles per
# CTA (2 x 4096 x 16 heads: 1024 tiles), fewer tiles than the grid holds, both tile boundaries, a ragged last tile.
@pytest.mark.parametrize("batch, seq_q, seq_k, heads, kv_heads, head_dim, overlap", [
    (2, 4096, 4096, 16, 4, 128, None),       # the default boundary: O stored under the next tile's first QK
    (2, 4096, 4096, 16, 16, 128, False),     # O stored after the last PV
    (1, 256, 256, 2, 2, 128, None),          # 4 tiles: two clusters, one tile each
    (3, 1000, 1000, 8, 2, 64, None),         # a ragged last tile
    (2, 2048, 3000, 8, 8, 96, False),
])
def test_persistent_multicast(batch, seq_q, seq_k, heads, kv_heads, head_dim, overlap):
    run_coverage(batch, seq_q, seq_k, heads, kv_heads, head_dim,
                 tuning=dict(multicast=True, persistent=True, tile_overlap=overlap))


def test_persistent_pairs_fill_the_resident_clusters():
    from codegen import driver

    q, k, v = (torch.randn(2, 4096, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call = prepare(q, k, v, multicast=True, persistent=True)
    assert call.spec.multicast and call.spec.persistent and call.tile_counter is None
    clusters = driver.resident_clusters(call.kernel, call.built.plan.threads, 2)
    assert 1 <= clusters <= torch.cuda.get_device_properties(0).multi_processor_count // 2
    assert call.grid == (2 * clusters, 1, 1)
    ref_o, ref_lse = check.reference(q, k, v)
    same_dtype = check.same_dtype_output(q, k, v)
    for _ in range(3):  # no state carried between launches (the fixed stride needs no counter)
        call.o.fill_(float("nan"))
        call.lse.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        failure = check.accuracy_failure(call.o, ref_o, same_dtype, floor=0.0) or check.lse_failure(call.lse, ref_lse)
        assert failure is None, failure
    for causal in (False, True):  # attention()'s cached launcher, persistent pairs and one tile per CTA
        knobs = dict(multicast=True, persistent=None if causal else True)
        expected = prepare(q, k, v, causal=causal, **knobs)
        expected.o.fill_(float("nan"))
        expected.lse.fill_(float("nan"))
        expected()
        assert_close_to_reference(q, k, v, expected.o, expected.lse, causal=causal)
        assert torch.equal(attention(q, k, v, causal=causal, **knobs), expected.o)


def test_multicast_launches_clusters_of_two():
    q = torch.randn(1, 1000, 4, 128, device="cuda", dtype=torch.bfloat16)
    call = prepare(q, q, q, causal=True, multicast=True)
    assert call.spec.multicast and not call.spec.persistent
    assert call.grid == (8, 4, 1) and call.built.plan.abi.grid.cluster_dims == (2, 1, 1)
    odd = torch.randn(1, 1100, 4, 128, device="cuda", dtype=torch.bfloat16)  # 9 query tiles, 5 clusters
    assert prepare(odd, odd, odd, multicast=True).grid == (10, 4, 1)
    with pytest.raises(InputError, match="an even number of 128-row query tiles"):
        prepare(odd, odd, odd, multicast=True, persistent=True)


def test_persistent_grid_is_one_cta_per_sm():
    q = torch.randn(2, 1000, 16, 128, device="cuda", dtype=torch.float16)
    call = prepare(q, q, q, persistent=True)
    assert call.grid == (torch.cuda.get_device_properties(0).multi_processor_count, 1, 1)


@pytest.mark.parametrize("causal", (False, True))
def test_persistent_with_every_option(causal):
    run_coverage(2, 700, 900, 8, 2, 128, causal=causal, window=(256, -1), softcap=20.0, scale_inputs=2.0,
                 tuning=PERSISTENT)


@pytest.mark.parametrize("causal", (False, True))
def test_persistent_varlen(causal):
    # Tiles past a short sequence are skipped by producer and consumers alike.
    run_varlen(RAGGED * 3, RAGGED * 3, 8, 2, 128, causal=causal, tuning=PERSISTENT)


def test_persistent_counter_is_ready_for_every_launch():
    # The kernel leaves its tile counter at zero; a counter left dirty would skip tiles on the next launch.
    q, k, v = (torch.randn(2, 3000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call = prepare(q, k, v, causal=True, persistent=True)
    ref_o, _ = check.reference(q, k, v, causal=True)
    same_dtype = check.same_dtype_output(q, k, v, causal=True)
    for _ in range(3):
        call.o.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        failure = check.accuracy_failure(call.o, ref_o, same_dtype, floor=0.0)
        assert failure is None, failure
        assert int(call.tile_counter.item()) == 0, "the tile counter was not reset"


@pytest.mark.parametrize("seq, persistent", [(1, True), (1, False), (100, True), (1000, True)])
def test_repeated_small_calls(seq, persistent):
    # Races show as rare wrong values: many launches of small kernels, fresh inputs each, every one checked.
    # (A single wrong value at S=1 was seen once in a full GPU run, then not in 3780 more launches.)
    for _ in range(20):
        q, k, v = (torch.randn(1, seq, 2, 128, device="cuda", dtype=torch.float16) for _ in range(3))
        o, lse = run_checked(q, k, v, persistent=persistent)
        assert_close_to_reference(q, k, v, o, lse)


# The instrumented build (codegen/trace.py): within the same bound as the plain kernel, and one complete step
# record per steady key block of every tile the traced CTAs ran, from every consumer warp, clocks in order.
@pytest.mark.parametrize("seq, head_dim, dtype", [(1024, 128, "f16"), (1000, 64, "bf16"), (700, 256, "bf16")])
def test_traced_kernel_matches_and_records_every_step(seq, head_dim, dtype):
    from codegen import trace

    q, k, v = (torch.randn(2, seq, 16, head_dim, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    call = prepare(q, k, v, trace=True)
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    trace.clear(call)
    call()
    torch.cuda.synchronize()
    assert not torch.isnan(call.o).any() and not torch.isnan(call.lse).any()
    assert_close_to_reference(q, k, v, call.o, call.lse)
    rows = trace.read(call)
    n_kv = -(-seq // call.built.spec.block_n)
    for (cta, consumer, warp), events in rows.items():
        tiles = sum(e.name == "q_ready" for e in events)
        assert tiles >= 1, f"CTA {cta} consumer {consumer} warp {warp} recorded no tile"
        assert [e.clock for e in events] == sorted(e.clock for e in events)
        steps = trace.phases(events)["step"]
        assert len(steps) == tiles * (n_kv - 1), (cta, consumer, warp, tiles, len(steps))
        assert all(s > 0 for s in steps)
    assert len(rows) == trace.TRACE_CTAS * 2 * trace.TRACE_WARPS
