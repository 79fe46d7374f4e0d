"""Attention sinks (`sinks=` of attention() and prepare()) on the GPU against float64 (skipped with a reason where
there is no GPU).

The rules of tests/test_gpu.py: fresh random inputs, o and lse poisoned with NaN before the launch and every
element checked, o within 2x the same-dtype flash-style computation's error (check.same_dtype_output, which
takes the sinks; SDPA has none) over the whole tensor and in the worst row, the logsumexp element by element.
The sinks are drawn around a row's own logsumexp (about ln S_k), so each takes a real share of the weight.
"""

from __future__ import annotations

import itertools
import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import codegen  # noqa: E402
from codegen import check  # noqa: E402
from codegen.api import InputError, attention, prepare  # noqa: E402

DTYPES = {name: check.torch_dtype(name) for name in ("f16", "bf16")}
TINY = 1e-6


def make_sinks(heads, keys, spread=2.0):
    return torch.randn(heads, device="cuda", dtype=torch.float32) * spread + math.log(max(keys, 2))


def assert_lse(lse, ref):
    """Elementwise: infinite exactly where the reference is, within check.LSE_ATOL + LSE_RTOL |ref| elsewhere."""
    failure = check.lse_failure(lse, ref)
    assert failure is None, failure


def run_checked(call):
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    assert not torch.isnan(call.o).any(), "some output elements were never written"
    assert not torch.isnan(call.lse).any(), "some logsumexp rows were never written"
    return call


def run_fixed(batch, seq_q, seq_k, heads, kv_heads, head_dim, dtype="bf16", *, sinks=None, causal=False, window=None,
              softcap=0.0, scale_inputs=1.0, layout="bshd", tuning=None):
    """One fixed-length call with sinks, checked; returns the rows that see no key ((B, H, S_q) bool)."""
    dt = DTYPES[dtype]
    q = torch.randn(batch, seq_q, heads, head_dim, device="cuda", dtype=dt) * scale_inputs
    k = torch.randn(batch, seq_k, kv_heads, head_dim, device="cuda", dtype=dt) * scale_inputs
    v = torch.randn(batch, seq_k, kv_heads, head_dim, device="cuda", dtype=dt)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    sinks = make_sinks(heads, seq_k) if sinks is None else sinks
    call = run_checked(prepare(q, k, v, causal=causal, window=window, softcap=softcap, layout=layout, sinks=sinks,
                               **(tuning or {})))
    assert call.spec.sinks and "_sinks" in call.spec.name
    options = dict(causal=causal, window=window, softcap=softcap, layout=layout, sinks=sinks)
    ref_o, ref_lse = check.reference(q, k, v, **options)
    failure = check.accuracy_failure(call.o, ref_o, check.same_dtype_output(q, k, v, **options), floor=TINY)
    assert failure is None, failure
    assert_lse(call.lse, ref_lse)
    keep = check.band_mask(seq_q, seq_k, causal=causal, window=window, device="cuda")
    empty = torch.zeros(seq_q, dtype=torch.bool, device="cuda") if keep is None else ~keep.any(dim=1)
    o_bhsd = call.o.transpose(1, 2) if layout == "bshd" else call.o
    assert (o_bhsd[:, :, empty] == 0).all(), "a row that sees no key is not 0"
    # Such a row's logsumexp is its head's sink (above, elementwise, against the reference's).
    return empty


FIXED = list(itertools.product(("f16", "bf16"), (64, 128), (False, True)))


@pytest.mark.parametrize("dtype, head_dim, causal", FIXED, ids=[f"{d}-D{h}-{'causal' if c else 'full'}" for d, h, c in FIXED])
def test_sinks_fixed_lengths(dtype, head_dim, causal):
    # Grouped-query heads (4 per K/V head), a part last query tile and key block, batch 2.
    run_fixed(2, 1000, 1000, 8, 2, head_dim, dtype, causal=causal)


@pytest.mark.parametrize("dtype, head_dim", list(itertools.product(("f16", "bf16"), (64, 128))))
@pytest.mark.parametrize("seq_q, seq_k, causal, window", [
    (1000, 300, True, None),        # bottom-right causal: the first 700 rows see no key
    (700, 500, False, (16, 0)),     # a local window past the keys' start: the first 200 rows see none
    (500, 500, False, (64, 64)),
    (300, 1000, True, (128, -1)),
])
def test_sinks_with_masks_that_leave_rows_without_keys(dtype, head_dim, seq_q, seq_k, causal, window):
    empty = run_fixed(2, seq_q, seq_k, 8, 4, head_dim, dtype, causal=causal, window=window)
    assert empty.any() == (seq_q > seq_k), "the masks leave the rows before the first diagonal without keys"


@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("tuning", [dict(persistent=True, tile_overlap=True), dict(persistent=True, tile_overlap=False),
                                    dict(persistent=False), dict(persistent=True, block_n=176)], ids=str)
def test_sinks_on_every_tile_path(head_dim, tuning):
    # 3 batches x 16 heads: most persistent CTAs run several tiles; tile_overlap finishes a tile's rows before the
    # next tile's first QK; 1024 keys end in a part block of 176 (the short tail).
    run_fixed(3, 1024, 1024, 16, 16, head_dim, "f16", tuning=tuning)


def test_sinks_with_every_option_and_large_scores():
    run_fixed(2, 700, 900, 8, 2, 128, "bf16", causal=True, window=(256, -1), softcap=20.0, scale_inputs=3.0)


@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_sinks_other_head_dims_and_the_sdpa_layout(head_dim):
    run_fixed(2, 777, 777, 4, 4, head_dim, "f16", causal=True, layout="bhsd")


def test_sinks_far_apart():
    # -inf is no sink; a dominant one takes nearly all the weight; 0 and a negative one next to them.
    sinks = torch.tensor([float("-inf"), math.log(1000) + 5.0, 0.0, -5.0], device="cuda")
    empty = run_fixed(1, 1000, 600, 4, 4, 128, "bf16", sinks=sinks, causal=True)
    assert empty.any()  # those rows of head 0 (sink -inf) output 0 with lse -inf, as without sinks


# --- variable-length batches ---------------------------------------------------------------------------------

RAGGED = [1, 127, 128, 129, 300, 1000, 64, 65, 0, 513]


def packed(lengths, heads, head_dim, dt, scale_inputs=1.0):
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    return torch.randn(sum(lengths), heads, head_dim, device="cuda", dtype=dt) * scale_inputs, offsets


def run_varlen(q_lens, k_lens, heads, kv_heads, head_dim, dtype="bf16", *, tuning=None, **options):
    dt = DTYPES[dtype]
    q, cu_q = packed(q_lens, heads, head_dim, dt)
    k, cu_k = packed(k_lens, kv_heads, head_dim, dt)
    v, _ = packed(k_lens, kv_heads, head_dim, dt)
    sinks = make_sinks(heads, max(k_lens))
    call = run_checked(prepare(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sinks=sinks, **(tuning or {}),
                               **options))
    assert call.spec.varlen and call.spec.sinks and call.lse.shape == (heads, q.shape[0])
    ref_o, ref_lse = check.reference_varlen(q, k, v, cu_q, cu_k, sinks=sinks, **options)
    same = check.same_dtype_output_varlen(q, k, v, cu_q, cu_k, sinks=sinks, **options)
    failure = check.accuracy_failure(call.o, ref_o, same, floor=TINY)
    assert failure is None, failure
    yardstick = check.rel_err(same, ref_o)
    for i, (rows, _) in enumerate(check.sequences(cu_q, cu_k)):  # a tile spilling into its neighbour shows here
        if rows.stop > rows.start and ref_o[rows].norm() > 0:
            seq_err = check.rel_err(call.o[rows], ref_o[rows])
            assert seq_err <= max(4 * yardstick, 1e-2), f"sequence {i}: rel err {seq_err:.3e}"
    assert_lse(call.lse, ref_lse)
    for rows, keys in check.sequences(cu_q, cu_k):
        if keys.stop == keys.start:  # a sequence without keys: 0, and each head's sink as its logsumexp
            assert (call.o[rows] == 0).all()
    return call


@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", ("f16", "bf16"))
def test_sinks_varlen(head_dim, causal, dtype):
    run_varlen(RAGGED, RAGGED, 8, 2, head_dim, dtype, causal=causal)


@pytest.mark.parametrize("tuning", [dict(persistent=True), dict(persistent=False)], ids=str)
@pytest.mark.parametrize("causal", (False, True))
def test_sinks_varlen_separate_key_lengths(tuning, causal):
    # Keys longer and shorter than queries, one sequence without keys at all, one without queries.
    run_varlen([100, 700, 128, 5, 0, 260], [300, 200, 128, 0, 7, 1000], 16, 4, 128, causal=causal, tuning=tuning)


def test_sinks_varlen_window_and_softcap():
    run_varlen(RAGGED, RAGGED, 4, 2, 64, "f16", causal=True, window=(96, -1), softcap=20.0)


# --- as users call it: attention(), its cached launcher, torch.compile, CUDA graphs -------------------------------


def reference_check(q, k, v, o, lse=None, **options):
    ref_o, ref_lse = check.reference(q, k, v, **options)
    failure = check.accuracy_failure(o, ref_o, check.same_dtype_output(q, k, v, **options), floor=TINY)
    assert failure is None, failure
    if lse is not None:
        assert_lse(lse, ref_lse)


def test_attention_passes_each_calls_sinks():
    q, k, v = (torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plain = attention(q, k, v, causal=True)
    for _ in range(3):  # the cached launcher, a new sinks tensor (values and address) each call
        sinks = make_sinks(8, 512)
        o, lse = attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
        reference_check(q, k, v, o, lse, causal=True, sinks=sinks)
        o = attention(q, k, v, causal=True, sinks=sinks)  # without lse: the kernel skips it
        reference_check(q, k, v, o, causal=True, sinks=sinks)
    assert not torch.equal(o, plain)
    torch.testing.assert_close(attention(q, k, v, causal=True), plain, rtol=0, atol=0)  # its own launcher


def test_attention_varlen_with_sinks():
    q, cu = packed([300, 0, 1000, 77], 8, 128, torch.float16)
    sinks = make_sinks(8, 1000)
    o, lse = attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, sinks=sinks, return_lse=True)
    ref_o, ref_lse = check.reference_varlen(q, q, q, cu, cu, causal=True, sinks=sinks)
    same = check.same_dtype_output_varlen(q, q, q, cu, cu, causal=True, sinks=sinks)
    failure = check.accuracy_failure(o, ref_o, same, floor=TINY)
    assert failure is None, failure
    assert_lse(lse, ref_lse)


def test_sinks_checks_run_on_a_cached_call():
    q, k, v = (torch.randn(1, 256, 4, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    sinks = make_sinks(4, 256)
    attention(q, k, v, sinks=sinks)
    sinks.requires_grad_(True)
    with pytest.raises(InputError, match="no backward pass"):
        attention(q, k, v, sinks=sinks)
    with torch.no_grad():
        attention(q, k, v, sinks=sinks)
    with pytest.raises(InputError, match="on q's device"):
        attention(q, k, v, sinks=sinks.detach().cpu())
    with pytest.raises(InputError, match="shape \\(4,\\)"):
        attention(q, k, v, sinks=make_sinks(8, 256))


def test_torch_compile_with_sinks_matches_eager():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sinks = torch.nn.Parameter(make_sinks(8, 512), requires_grad=False)

        def forward(self, q, k, v):
            return codegen.attention(q * 1.0, k, v, causal=True, sinks=self.sinks) + 1.0

    q, k, v = (torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    block = Block()
    eager = block(q, k, v)
    compiled = torch.compile(block, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    reference_check(q, k, v, codegen.attention(q, k, v, causal=True, sinks=block.sinks), causal=True,
                    sinks=block.sinks.detach())


def test_cuda_graph_replays_with_refilled_sinks():
    q, k, v = (torch.randn(1, 1024, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sinks = make_sinks(16, 1024)
    attention(q, k, v, sinks=sinks)  # compiled, loaded and the launcher made before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attention(q, k, v, sinks=sinks)  # the capture stream's tile counter, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = attention(q, k, v, sinks=sinks)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        sinks.copy_(make_sinks(16, 1024))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        reference_check(q, k, v, out, sinks=sinks)


def test_gen_cli_runs_a_kernel_with_sinks(tmp_path, capsys):
    from codegen.cli import main

    assert main(["--shape", "1000,4,128", "--causal", "--sinks", "--run", "--out", str(tmp_path)]) == 0
    assert "PASS" in capsys.readouterr().out
