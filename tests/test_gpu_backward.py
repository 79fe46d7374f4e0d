"""The backward pass on the GPU against float64 (skipped with a reason where there is no GPU): dq, dk and dv through
autograd (attention() on inputs that require grad, then o.backward(do)) and through
codegen.backward.attention_backward on a saved o and lse.

Rules (DESIGN.md section 6, FlashAttention's for gradients): fresh random inputs every run; the memory the gradients
are NaN until written (neither path takes preallocated gradients, so gradients_poisoned makes torch.empty_like, which
the backward allocates them with, fill them with NaN) and every element checked; each of dq, dk, dv at most 2x the error of PyTorch's autograd through
the same attention in the inputs' dtype (check.same_dtype_backward) against float64 check.reference_backward, over
the whole tensor and on its worst row (check.gradient_failure). A row that sees no key must have dq exactly 0, a key
that no query sees dk = dv = 0; deterministic=True must give the same bits every run.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from codegen import check  # noqa: E402
from codegen.api import InputError, attention  # noqa: E402

DTYPES = {name: check.torch_dtype(name) for name in ("f16", "bf16")}
TINY = 1e-6  # relative floor, as the forward tests': where the yardstick is exact, ours must be too
# A gradient that is 0 throughout (every query sees one key: S_k = 1, window (0, 0)) is computed as dP minus
# rowsum(dO * o), two float32 sums of the same products in different orders: 2-4e-6 apart at D=128 in a CPU emulation
# of a flash-style float32 backward (the same emulation's errors were 0.01-1.04x the yardstick's, the bound 2x).
ZERO_ATOL = 1e-4
RUNS = 10  # deterministic=True: the same bits this many times


def attention_backward(*args, **kwargs):
    """codegen.backward.attention_backward, imported at the call so that this file collects before it exists."""
    from codegen.backward import attention_backward as backward

    return backward(*args, **kwargs)


def make_inputs(batch, seq_q, seq_k, heads, kv_heads, dim, dtype="bf16", scale_inputs=1.0, layout="bshd"):
    """q, k, v and the output gradient do, fresh random; q and k scaled by scale_inputs (large scores)."""

    def randn(seq, n):
        shape = (batch, seq, n, dim) if layout == "bshd" else (batch, n, seq, dim)
        return torch.randn(shape, device="cuda", dtype=DTYPES[dtype])

    q, k = randn(seq_q, heads) * scale_inputs, randn(seq_k, kv_heads) * scale_inputs
    return q, k, randn(seq_k, kv_heads), randn(seq_q, heads)


def packed(lengths, heads, dim, dtype):
    """A packed (total, heads, dim) tensor of these sequence lengths and its int32 offsets."""
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    return torch.randn(sum(lengths), heads, dim, device="cuda", dtype=DTYPES[dtype]), offsets


@contextlib.contextmanager
def gradients_poisoned():
    """While open, torch.empty_like returns floating tensors filled with NaN: the backward allocates dq, dk and dv so
    (codegen/backward.py), so an element its kernels never write reads NaN, not a stale value or a zero. (Baiting the
    caching allocator with freed NaN blocks is not enough: the backward's fp32 work buffers are allocated first.)"""
    real = torch.empty_like

    def nan_like(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            with torch.no_grad():
                t.fill_(float("nan"))
        return t

    torch.empty_like = nan_like
    try:
        yield
    finally:
        torch.empty_like = real


def grads_by_autograd(q, k, v, do, **options):
    """(o, (dq, dk, dv)): attention() on leaves that require grad, then o.backward(do), what users call."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = attention(*leaves, **options)
    assert o.requires_grad and o.grad_fn is not None, "attention() did not attach o to autograd"
    with gradients_poisoned():
        o.backward(do)
    grads = tuple(t.grad for t in leaves)
    for name, g, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert g is not None, f"{name} is None"
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
    return o.detach(), grads


def by_head(x, layout="bshd", varlen=None):
    """x's rows indexed as the logsumexp is: (B, H, S) for dense layouts, (H, total) for varlen."""
    if varlen is not None:
        return x.transpose(0, 1)
    return x.transpose(1, 2) if layout == "bshd" else x


def assert_gradients(q, k, v, do, grads, *, varlen=None, **options):
    """dq, dk, dv each within 2x the same-dtype autograd's error, no NaN; rows without keys have dq exactly 0.
    Returns the (B, H, S_q) (varlen: (H, total_q)) mask of those rows."""
    if varlen is None:
        refs = check.reference_backward(q, k, v, do, **options)
        yardsticks = check.same_dtype_backward(q, k, v, do, **options)
        lse = check.reference(q, k, v, **options)[1]
    else:
        refs = check.reference_backward_varlen(q, k, v, do, *varlen, **options)
        yardsticks = check.same_dtype_backward_varlen(q, k, v, do, *varlen, **options)
        lse = check.reference_varlen(q, k, v, *varlen, **options)[1]
    for name, g, ref, yardstick in zip(("dq", "dk", "dv"), grads, refs, yardsticks):
        nans = int(torch.isnan(g).sum())
        assert nans == 0, f"{name}: {nans} of {g.numel()} elements are NaN (never written?)"
        failure = check.gradient_failure(g, ref, yardstick, floor=TINY, atol=ZERO_ATOL)
        assert failure is None, f"{name}: {failure}"
    empty = torch.isinf(lse)
    assert (by_head(grads[0], options.get("layout", "bshd"), varlen)[empty] == 0).all(), \
        "a row that sees no key must have dq exactly 0"
    return empty


def assert_output(q, k, v, o, *, varlen=None, **options):
    """The forward under autograd still computes o (it also saves the logsumexp for the backward)."""
    if varlen is None:
        ref, yardstick = check.reference(q, k, v, **options)[0], check.same_dtype_output(q, k, v, **options)
    else:
        ref = check.reference_varlen(q, k, v, *varlen, **options)[0]
        yardstick = check.same_dtype_output_varlen(q, k, v, *varlen, **options)
    failure = check.accuracy_failure(o, ref, yardstick, floor=TINY)
    assert failure is None, f"o: {failure}"


def run_case(batch, seq_q, seq_k, heads, kv_heads, dim, dtype="bf16", scale_inputs=1.0, **options):
    """Random inputs through autograd, o and the gradients checked; (inputs, grads, rows without keys)."""
    q, k, v, do = make_inputs(batch, seq_q, seq_k, heads, kv_heads, dim, dtype, scale_inputs,
                              options.get("layout", "bshd"))
    o, grads = grads_by_autograd(q, k, v, do, **options)
    assert_output(q, k, v, o, **options)
    empty = assert_gradients(q, k, v, do, grads, **options)
    return (q, k, v, do), grads, empty


def bits(t):
    """The tensor's bits, to compare runs exactly (NaN and -0 included)."""
    return t.view(torch.int16)


def test_the_gradients_are_poisoned_before_the_kernels_write_them(monkeypatch):
    """The premise of gradients_poisoned: with the backward's launches skipped, every gradient element is NaN."""
    from codegen import launcher
    from codegen.backward import attention_backward

    q, k, v, do = make_inputs(1, 300, 300, 4, 4, 128)
    with torch.no_grad():
        o, lse = attention(q, k, v, return_lse=True)
    monkeypatch.setattr(launcher, "launch_now", lambda *args: None)
    with gradients_poisoned():
        grads = attention_backward(q, k, v, o, lse, do)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert torch.isnan(g).all(), f"{name} holds values no kernel wrote"


# --- the forward tests' shapes (D=128): S = 1, below one tile, ragged, batch > 1, 1 to 64 heads ----------------

BASIC = [(1, 1, 16, "bf16"), (3, 17, 8, "f16"), (3, 100, 16, "bf16"), (1, 128, 64, "f16"), (2, 1000, 16, "bf16"),
         (1, 1024, 64, "f16"), (1, 4096, 16, "bf16")]


@pytest.mark.parametrize("batch, seq, heads, dtype", BASIC, ids=[f"B{b}-S{s}-H{h}-{d}" for b, s, h, d in BASIC])
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_matches_float64(batch, seq, heads, dtype, causal):
    run_case(batch, seq, seq, heads, heads, 128, dtype, causal=causal)


HEAD_DIMS = [pytest.param(d, v, id=f"D{d}-{v[0]}-{'causal' if v[1] else 'full'}")
             for d, v in itertools.product((64, 96, 192, 256), (("bf16", False), ("f16", True)))]


@pytest.mark.parametrize("head_dim, variant", HEAD_DIMS)
def test_head_dims(head_dim, variant):
    dtype, causal = variant
    run_case(2, 1000, 1000, 8, 8, head_dim, dtype, causal=causal)


# --- D=256 and 192, the wide family (bwd_sm90_wide): its own key blocks, P^T and dS^T tiles, transposed dK, dV ---

WIDE = [(1, 1, 1, 4, 4, "bf16", {}), (2, 63, 65, 4, 2, "f16", {"causal": True}), (1, 300, 1000, 8, 2, "bf16", {"causal": True}),
        (1, 1000, 300, 4, 1, "bf16", {"causal": True}), (2, 700, 900, 4, 4, "bf16", {"window": (64, 64)}),
        (1, 513, 513, 4, 4, "f16", {"softcap": 30.0, "scale_inputs": 4.0}), (1, 2048, 2048, 8, 8, "bf16", {})]


@pytest.mark.parametrize("head_dim", (256, 192), ids=("D256", "D192"))
@pytest.mark.parametrize("batch, seq_q, seq_k, heads, kv_heads, dtype, options", WIDE,
                         ids=[f"B{b}-{sq}x{sk}-H{h}-kv{kv}-{d}-{'-'.join(o) or 'plain'}" for b, sq, sk, h, kv, d, o in WIDE])
def test_wide_head_dim(batch, seq_q, seq_k, heads, kv_heads, dtype, options, head_dim):
    run_case(batch, seq_q, seq_k, heads, kv_heads, head_dim, dtype, **options)


@pytest.mark.parametrize("seq_q, seq_k", [(300, 1000), (1000, 300), (1, 777), (129, 128), (17, 500)])
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_separate_key_length(seq_q, seq_k, causal):
    _, _, empty = run_case(2, seq_q, seq_k, 4, 2, 128, "f16", causal=causal)
    if causal and seq_q > seq_k:
        assert empty.any(), "bottom-right causal leaves the first S_q - S_k rows without keys"


@pytest.mark.parametrize("window", [(128, 0), (64, 64), (0, 0), (300, -1), (-1, 100)])
def test_local_window(window):
    run_case(2, 1000, 1000, 4, 4, 128, window=window)


@pytest.mark.parametrize("seq_q, seq_k, options", [(700, 300, {"causal": True}), (500, 200, {"window": (20, 0)})],
                         ids=("causal", "window"))
def test_rows_without_keys_have_zero_dq(seq_q, seq_k, options):
    # Bottom-right alignment: query i's diagonal is key i - (S_q - S_k), so the first S_q - S_k rows see nothing.
    _, grads, empty = run_case(2, seq_q, seq_k, 8, 2, 128, **options)
    assert empty[:, :, : seq_q - seq_k].all() and not empty[:, :, seq_q - seq_k:].any()


def test_keys_no_query_sees_have_zero_dk_dv():
    # 200 queries over 900 keys, window (50, 0): query i sees keys i + 650 .. i + 700, so keys 0..649 none.
    _, (dq, dk, dv), _ = run_case(2, 200, 900, 8, 2, 128, window=(50, 0))
    assert (dk[:, :650] == 0).all() and (dv[:, :650] == 0).all(), "a key no query sees must get dk = dv = 0"
    assert (dv[:, 650:].abs().amax(-1) > 0).all()


@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_softcap(causal):
    run_case(2, 1000, 1000, 4, 4, 128, causal=causal, softcap=30.0, scale_inputs=4.0)


@pytest.mark.parametrize("head_dim", [pytest.param(d, id=f"D{d}") for d in (64, 96, 192, 256)])
def test_every_option_together(head_dim):
    run_case(2, 700, 900, 8, 2, head_dim, causal=True, window=(256, -1), softcap=20.0, scale_inputs=2.0)


# A grid of the SM count plus a few CTAs: those last few run as pieces of their query blocks (Plan.tail_split), each
# piece's dK and dV summed in fp32 and stored by the last. S_k = 1000 is 8 key blocks (the last one ragged).
TAIL = [(1000, 128, "bf16", {}), (1000, 96, "f16", {}), (700, 96, "bf16", {"softcap": 20.0}),
        (1000, 128, "bf16", {"layout": "bhsd", "scale": 0.3})]


@pytest.mark.parametrize("seq_q, dim, dtype, options", TAIL,
                         ids=[f"{sq}-D{d}-{dt}-{'-'.join(o) or 'plain'}" for sq, d, dt, o in TAIL])
def test_split_tail_pieces(seq_q, dim, dtype, options):
    from codegen.api import Shape
    from codegen.backward import backward_spec
    from codegen.families.bwd_sm90.plan import make_plan

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    heads = sms // 8 + 1  # 8 key blocks each: the SM count plus 8 - sms % 8 CTAs
    shape = Shape(batch=1, seq_q=seq_q, seq_k=1000, heads=heads, kv_heads=heads, dim=dim)
    plan = make_plan(backward_spec(shape, DTYPES[dtype], causal=False, window=None, softcap=options.get("softcap", 0.0),
                                   arch="sm_90a"))
    units, pieces = plan.tail_split(1, sms)
    assert units == 8 * heads - sms and pieces >= 2, "the shape no longer splits its tail: the test proves nothing"
    run_case(1, seq_q, 1000, heads, heads, dim, dtype, **options)


@pytest.mark.parametrize("kv_heads", (4, 2, 1), ids=("4-groups", "8-groups", "mqa"))
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_grouped_query_heads(kv_heads, causal):
    # dk, dv have the K/V heads: each sums the gradients of the 16 / kv_heads query heads that read it.
    run_case(2, 1000, 1000, 16, kv_heads, 128, causal=causal)


def test_large_scores_stay_finite():
    # Scores around +-1000 x the usual: nearly one-hot softmax rows, whose exact gradients are nearly 0.
    run_case(1, 1024, 1024, 4, 4, 128, "f16", scale_inputs=12.0)


def test_sdpa_layout_and_custom_scale():
    run_case(2, 777, 777, 8, 8, 128, "f16", layout="bhsd", scale=0.05)


def test_strided_views_of_a_packed_qkv():
    qkv = torch.randn(2, 500, 3, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = qkv.unbind(2)  # strides (500*3*4*128, 3*4*128, 128, 1): no copies
    do = torch.randn(2, 500, 4, 128, device="cuda", dtype=torch.bfloat16)
    with gradients_poisoned():
        attention(q, k, v, causal=True).backward(do)
    assert_gradients(q.detach(), k.detach(), v.detach(), do, qkv.grad.unbind(2), causal=True)


@pytest.mark.parametrize("seq", (100, 1000))
def test_repeated_calls_with_fresh_inputs(seq):
    # Races show as rare wrong values: many small backward passes, every one checked.
    for _ in range(10):
        run_case(1, seq, seq, 2, 2, 128, "f16", causal=True)


# --- variable-length batches (cu_seqlens) -----------------------------------------------------------------------

# Lengths around the 128-row tile, a sequence shorter than a tile's half, and an empty one.
RAGGED = [1, 127, 128, 129, 300, 1000, 64, 65, 0, 513]


def run_varlen(q_lens, k_lens, heads, kv_heads, head_dim, dtype="bf16", deterministic=False, **options):
    q, cu_q = packed(q_lens, heads, head_dim, dtype)
    k, cu_k = packed(k_lens, kv_heads, head_dim, dtype)
    v, _ = packed(k_lens, kv_heads, head_dim, dtype)
    do, _ = packed(q_lens, heads, head_dim, dtype)
    o, grads = grads_by_autograd(q, k, v, do, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, deterministic=deterministic,
                                 **options)
    assert_output(q, k, v, o, varlen=(cu_q, cu_k), **options)
    assert_gradients(q, k, v, do, grads, varlen=(cu_q, cu_k), **options)
    for rows, keys in check.sequences(cu_q, cu_k):
        if rows.stop == rows.start:  # keys of a sequence without queries
            assert (grads[1][keys] == 0).all() and (grads[2][keys] == 0).all()
    return (q, k, v, do, cu_q, cu_k), grads


@pytest.mark.parametrize("head_dim, dtype", [(64, "f16"), (128, "bf16")])
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_varlen(head_dim, dtype, causal):
    run_varlen(RAGGED, RAGGED, 8, 8, head_dim, dtype, causal=causal)


def test_varlen_separate_key_lengths_and_gqa():
    # Keys longer and shorter than queries (bottom-right per sequence), a sequence without keys, one without queries.
    run_varlen([100, 700, 128, 5, 0, 260], [300, 200, 128, 0, 7, 1000], 16, 4, 128, causal=True)


# A band bounded on both sides at D=64 (at D=128 the varlen backward refuses it with a soft cap, registers; at D=96
# the varlen forward of it spills), one bound at D=128.
@pytest.mark.parametrize("head_dim, options", [(64, {"causal": True, "window": (96, -1)}), (128, {"window": (96, -1)})],
                         ids=("D64-causal-left", "D128-left"))
def test_varlen_window_and_softcap(head_dim, options):
    run_varlen(RAGGED, RAGGED, 4, 2, head_dim, softcap=20.0, **options)


def test_varlen_with_max_lengths_trains_without_a_synchronization():
    """Given both max lengths, neither the forward nor the backward reads the offsets (torch's sync debug mode
    raises on a synchronization), and the outputs and gradients are right."""
    q, cu_q = packed(RAGGED, 8, 128, "bf16")
    k, cu_k = packed(RAGGED, 2, 128, "bf16")
    v, _ = packed(RAGGED, 2, 128, "bf16")
    do, _ = packed(RAGGED, 8, 128, "bf16")
    given = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(RAGGED), max_seqlen_k=max(RAGGED), causal=True)
    grads_by_autograd(q, k, v, do, **given)  # the first step compiles and loads both directions
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = attention(*leaves, **given)
        with gradients_poisoned():
            o.backward(do)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_output(q, k, v, o.detach(), varlen=(cu_q, cu_k), causal=True)
    assert_gradients(q, k, v, do, tuple(t.grad for t in leaves), varlen=(cu_q, cu_k), causal=True)


def test_varlen_attention_backward_matches_autograd():
    # Deterministic: the two ways in give the same bits (total_q 493).
    (q, k, v, do, cu_q, cu_k), grads = run_varlen([300, 0, 129, 64], [300, 5, 700, 64], 8, 4, 64, "f16", causal=True,
                                                  deterministic=True)
    with torch.no_grad():
        o, lse = attention(q, k, v, causal=True, return_lse=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    direct = attention_backward(q, k, v, o, lse, do, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), direct, grads):
        assert torch.equal(bits(a), bits(b)), f"{name}: attention_backward and autograd differ"
    with pytest.raises(InputError, match="lse must be the forward's float32 logsumexp of shape \\(8, 493\\)"):
        attention_backward(q, k, v, o, lse.transpose(0, 1), do, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


# --- deterministic=True: the same bits every run ----------------------------------------------------------------

DETERMINISTIC = [  # batch, S_q, S_k, H, H_kv, D, options: where dq sums over key blocks and dk, dv over groups
    (2, 1000, 1000, 16, 4, 128, {"causal": True}),
    (1, 4096, 4096, 8, 8, 64, {}),
    (2, 700, 900, 8, 1, 128, {"window": (256, -1), "softcap": 20.0}),
]


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, kv_heads, dim, options", DETERMINISTIC,
                         ids=("gqa-causal", "D64-4096", "mqa-window-softcap"))
def test_deterministic_autograd_gives_the_same_bits(batch, seq_q, seq_k, heads, kv_heads, dim, options):
    q, k, v, do = make_inputs(batch, seq_q, seq_k, heads, kv_heads, dim)
    _, first = grads_by_autograd(q, k, v, do, deterministic=True, **options)
    assert_gradients(q, k, v, do, first, **options)
    for run in range(1, RUNS):
        _, grads = grads_by_autograd(q, k, v, do, deterministic=True, **options)
        for name, g, f in zip(("dq", "dk", "dv"), grads, first):
            assert torch.equal(bits(g), bits(f)), f"run {run}: {name} differs from run 0"


def test_deterministic_attention_backward_gives_the_same_bits():
    q, k, v, do = make_inputs(2, 1000, 1000, 16, 2, 128)
    with torch.no_grad():
        o, lse = attention(q, k, v, causal=True, return_lse=True)
    first = attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
    assert_gradients(q, k, v, do, first, causal=True)
    for run in range(1, RUNS):
        with gradients_poisoned():
            grads = attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
        for name, g, f in zip(("dq", "dk", "dv"), grads, first):
            assert torch.equal(bits(g), bits(f)), f"run {run}: {name} differs from run 0"


def test_deterministic_varlen_gives_the_same_bits():
    (q, k, v, do, cu_q, cu_k), first = run_varlen(RAGGED, RAGGED, 8, 2, 128, causal=True, deterministic=True)
    for run in range(1, RUNS):
        _, grads = grads_by_autograd(q, k, v, do, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                                     deterministic=True)
        for name, g, f in zip(("dq", "dk", "dv"), grads, first):
            assert torch.equal(bits(g), bits(f)), f"run {run}: {name} differs from run 0"


# --- the two ways in: autograd and attention_backward -----------------------------------------------------------


@pytest.mark.parametrize("kv_heads, causal", [(8, False), (2, True)], ids=("mha-full", "gqa-causal"))
def test_autograd_matches_attention_backward(kv_heads, causal):
    q, k, v, do = make_inputs(2, 1000, 1000, 8, kv_heads, 128)
    with torch.no_grad():
        o, lse = attention(q, k, v, causal=causal, return_lse=True)
    assert lse.shape == (2, 8, 1000) and lse.dtype == torch.float32
    with gradients_poisoned():
        direct = attention_backward(q, k, v, o, lse, do, causal=causal, deterministic=True)
    for name, g, like in zip(("dq", "dk", "dv"), direct, (q, k, v)):
        assert g.shape == like.shape and g.dtype == like.dtype, (name, g.shape, g.dtype)
    assert_gradients(q, k, v, do, direct, causal=causal)
    o_autograd, through = grads_by_autograd(q, k, v, do, causal=causal, deterministic=True)
    assert torch.equal(bits(o_autograd), bits(o)), "the forward under autograd computed another o"
    for name, g, d in zip(("dq", "dk", "dv"), through, direct):
        assert torch.equal(bits(g), bits(d)), f"{name}: autograd and attention_backward differ"


def test_attention_backward_takes_every_option():
    options = dict(layout="bhsd", scale=0.07, window=(100, 20), softcap=15.0)
    q, k, v, do = make_inputs(2, 600, 800, 8, 2, 128, "f16", layout="bhsd")
    with torch.no_grad():
        o, lse = attention(q, k, v, return_lse=True, **options)
    with gradients_poisoned():
        grads = attention_backward(q, k, v, o, lse, do, **options)
    assert_gradients(q, k, v, do, grads, **options)


def test_requires_grad_under_no_grad_runs_the_forward_only():
    q, k, v, _ = make_inputs(1, 300, 300, 4, 4, 128)
    for t in (q, k, v):
        t.requires_grad_()
    with torch.no_grad():
        o, lse = attention(q, k, v, causal=True, return_lse=True)
    assert not o.requires_grad and o.grad_fn is None
    ref, ref_lse = check.reference(q.detach(), k.detach(), v.detach(), causal=True)
    failure = check.accuracy_failure(o, ref, check.same_dtype_output(q.detach(), k.detach(), v.detach(), causal=True),
                                     floor=TINY)
    assert failure is None, failure
    assert check.lse_rel_err(lse, ref_lse) <= 1e-5
    assert check.lse_failure(lse, ref_lse) is None
    o = attention(q.detach(), k.detach(), v.detach(), causal=True)  # grad mode on, nothing requires grad
    assert not o.requires_grad and o.grad_fn is None


@pytest.mark.parametrize("needs", ("q", "kv"))
def test_gradients_flow_only_to_the_inputs_that_require_them(needs):
    q, k, v, do = make_inputs(2, 500, 500, 8, 4, 128)
    wants = {"q": (True, False, False), "kv": (False, True, True)}[needs]
    leaves = [t.detach().requires_grad_(w) for t, w in zip((q, k, v), wants)]
    with gradients_poisoned():
        attention(*leaves, causal=True).backward(do)
    refs = check.reference_backward(q, k, v, do, causal=True)
    yardsticks = check.same_dtype_backward(q, k, v, do, causal=True)
    for t, want, ref, yardstick in zip(leaves, wants, refs, yardsticks):
        if not want:
            assert t.grad is None
            continue
        failure = check.gradient_failure(t.grad, ref, yardstick, floor=TINY, atol=ZERO_ATOL)
        assert failure is None, failure


BAD_ARGUMENTS = {  # what is wrong -> the argument replaced
    "do of another shape": lambda q, k, v, o, lse, do: dict(do=do[:, :128]),
    "do of another dtype": lambda q, k, v, o, lse, do: dict(do=do.half()),
    "lse of another dtype": lambda q, k, v, o, lse, do: dict(lse=lse.half()),
    "lse of another shape": lambda q, k, v, o, lse, do: dict(lse=lse[:, :2]),
    "o of another shape": lambda q, k, v, o, lse, do: dict(o=o[:, :100]),
    "do on the host": lambda q, k, v, o, lse, do: dict(do=do.cpu()),
}


@pytest.mark.parametrize("what", list(BAD_ARGUMENTS))
def test_attention_backward_refuses_bad_inputs(what):
    q, k, v, do = make_inputs(1, 256, 256, 4, 4, 128)
    with torch.no_grad():
        o, lse = attention(q, k, v, return_lse=True)
    args = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    args.update(BAD_ARGUMENTS[what](**args))
    with pytest.raises(InputError):
        attention_backward(args["q"], args["k"], args["v"], args["o"], args["lse"], args["do"])


# --- torch.compile: training through the custom ops ---------------------------------------------------------------


def test_torch_compile_trains_through_the_custom_ops():
    # fullgraph: attention() is the forward op and its autograd formula the backward op, no graph break; with
    # deterministic=True the compiled step gives eager's bits.
    q, k, v, do = make_inputs(2, 1000, 1000, 8, 2, 128)
    eager_o, eager = grads_by_autograd(q, k, v, do, causal=True, deterministic=True)
    assert_output(q, k, v, eager_o, causal=True)
    assert_gradients(q, k, v, do, eager, causal=True)  # eager's bits are right, so the compiled ones are
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    step = torch.compile(lambda q, k, v: attention(q, k, v, causal=True, deterministic=True), fullgraph=True)
    o = step(*leaves)
    assert o.grad_fn is not None
    o.backward(do)
    assert torch.equal(bits(o.detach()), bits(eager_o)), "the compiled forward computed another o"
    for name, leaf, e in zip(("dq", "dk", "dv"), leaves, eager):
        assert torch.equal(bits(leaf.grad), bits(e)), f"{name}: the compiled backward differs from eager's"


def test_torch_compile_trains_a_varlen_batch_through_the_custom_ops():
    # Given both max lengths the packed batch traces without a graph break; deterministic: eager's bits.
    q, cu_q = packed(RAGGED, 8, 128, "bf16")
    k, cu_k = packed(RAGGED, 2, 128, "bf16")
    v, _ = packed(RAGGED, 2, 128, "bf16")
    do, _ = packed(RAGGED, 8, 128, "bf16")
    given = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(RAGGED), max_seqlen_k=max(RAGGED), causal=True,
                 deterministic=True)
    eager_o, eager = grads_by_autograd(q, k, v, do, **given)
    assert_output(q, k, v, eager_o, varlen=(cu_q, cu_k), causal=True)
    assert_gradients(q, k, v, do, eager, varlen=(cu_q, cu_k), causal=True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = torch.compile(lambda q, k, v: attention(q, k, v, **given), fullgraph=True)(*leaves)
    assert o.grad_fn is not None
    o.backward(do)
    assert torch.equal(bits(o.detach()), bits(eager_o)), "the compiled forward computed another o"
    for name, leaf, e in zip(("dq", "dk", "dv"), leaves, eager):
        assert torch.equal(bits(leaf.grad), bits(e)), f"{name}: the compiled backward differs from eager's"
