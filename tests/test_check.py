"""codegen.check's failure report (CPU torch)."""

import pytest


def test_worst_element_names_the_index_and_whether_the_value_is_misplaced():
    torch = pytest.importorskip("torch")
    from codegen.check import worst_element

    ref = torch.arange(64, dtype=torch.float64).reshape(2, 4, 8) / 8  # distinct, exact in f16
    x = ref.half()
    x[1, 2, 3] = 100.0  # found nowhere in ref
    assert worst_element(x, ref).startswith("worst at (1, 2, 3): 100.0 vs 6.375")
    assert "does not occur elsewhere" in worst_element(x, ref)
    x = ref.half()
    x[1, 2, 3] = x[0, 0, 0]  # another element's value: stale or misplaced data
    assert "worst at (1, 2, 3)" in worst_element(x, ref) and "occurs elsewhere" in worst_element(x, ref)
    x[0, 1, 1] = float("nan")
    assert worst_element(x, ref).startswith("worst at (0, 1, 1): nan")


def test_lse_rel_err_is_relative_to_at_least_one_a_row():
    """One row whose logsumexp is near 0 (a single key with q.k ~ 0): float32's rounding is no failure there, as
    the plain relative error made it (tests/test_gpu.py's B1-S1-H1 cases, twice in the project's history); over
    many O(1) rows it is the plain relative error, and it still catches an error or a NaN."""
    torch = pytest.importorskip("torch")
    from codegen.check import lse_rel_err, rel_err

    ref = torch.tensor([[[2e-3]]], dtype=torch.float64)  # (B, H, S) = one row
    lse = (ref + 3e-7).float()                            # float32 rounding of an O(1) computation
    assert rel_err(lse, ref) > 1e-5 and lse_rel_err(lse, ref) < 1e-6
    assert lse_rel_err(ref + 1e-3, ref) > 1e-5            # a real error still fails
    assert lse_rel_err(torch.full_like(ref, float("nan")), ref) == float("inf")
    many = torch.linspace(3.0, 9.0, 4096, dtype=torch.float64).reshape(1, 4, 1024)
    off = many * (1 + 2e-5)
    assert lse_rel_err(off, many) == pytest.approx(rel_err(off, many))


def test_row_rel_err_sees_one_wrong_row_that_the_global_error_hides():
    torch = pytest.importorskip("torch")
    from codegen.check import rel_err, row_rel_err

    ref = torch.ones(2, 1000, 4, 8, dtype=torch.float64)  # (B, S, H, D): rows of norm sqrt(8)
    x = ref.clone()
    x[1, 500, 2] = -1.0  # one row of 8000 negated: its own error is 2
    assert row_rel_err(x, ref) == 2.0
    assert rel_err(x, ref) < 0.03
    x = ref.clone()
    x[0, 0, 0, 0] += 0.5
    assert row_rel_err(x, ref) == pytest.approx(0.5 / 8 ** 0.5)
    ref[0, 7, 1] = 0.0  # a row without keys: its absolute error counts
    x = ref.clone()
    assert row_rel_err(x, ref) == 0.0
    x[0, 7, 1, 3] = 1e-3
    assert row_rel_err(x, ref) == pytest.approx(1e-3)
    x[0, 7, 1, 3] = float("nan")
    assert row_rel_err(x, ref) == float("inf")
    assert row_rel_err(ref[:, :0], ref[:, :0]) == 0.0


def test_accuracy_failure_bounds_the_whole_tensor_and_the_worst_row():
    torch = pytest.importorskip("torch")
    from codegen.check import accuracy_failure, reference, same_dtype_output

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 300, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    ref, _ = reference(q, k, v, causal=True)
    same_dtype = same_dtype_output(q, k, v, causal=True)
    assert accuracy_failure(same_dtype, ref, same_dtype) is None
    off_row = same_dtype.clone()
    off_row[0, 123, 2] *= 1.03  # one row in 1200: the global error stays within 2x, the row's does not
    failure = accuracy_failure(off_row, ref, same_dtype)
    assert failure is not None and failure.startswith("worst row's rel err") and "worst at (0, 123, 2," in failure
    off_all = (same_dtype.double() * 1.01).to(torch.bfloat16)
    assert accuracy_failure(off_all, ref, same_dtype).startswith("rel err")
    assert accuracy_failure(same_dtype, ref, ref.to(torch.bfloat16), floor=0.5) is None  # the floor holds


def _sink_attention(q, k, v, sinks, keep=None):
    """The definition, written out: o_i = sum_j exp(s_ij) v_j / (exp(sink_h) + sum_j exp(s_ij)), (B, S, H, D)."""
    import math

    import torch

    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    w = torch.exp(s) if keep is None else torch.exp(s) * keep
    den = w.sum(-1) + torch.exp(sinks.double())[None, :, None]
    return torch.einsum("bhqk,bkhd->bqhd", w / den[..., None], v.double()), den.log()


def test_reference_sinks_join_the_denominator_and_the_lse():
    torch = pytest.importorskip("torch")
    from codegen.check import reference

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 40, 3, 16, dtype=torch.float64) for _ in range(3))
    sinks = torch.tensor([0.0, 2.5, -1.0], dtype=torch.float64)
    o, lse = reference(q, k, v, sinks=sinks)
    want_o, want_lse = _sink_attention(q, k, v, sinks)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    # A sink takes weight from the keys: the output shrinks toward 0 by exactly the keys' share.
    plain, plain_lse = reference(q, k, v)
    share = torch.exp(plain_lse - lse)  # (B, H, S): the keys' part of the denominator
    torch.testing.assert_close(o, plain * share.transpose(1, 2)[..., None], rtol=1e-12, atol=1e-12)
    # A sink of -inf is no sink.
    none_o, none_lse = reference(q, k, v, sinks=torch.full((3,), float("-inf"), dtype=torch.float64))
    assert torch.equal(none_o, plain) and torch.equal(none_lse, plain_lse)


def test_reference_sinks_with_masks_gqa_and_rows_without_keys():
    torch = pytest.importorskip("torch")
    from codegen.check import band_mask, reference

    torch.manual_seed(1)
    q = torch.randn(1, 30, 4, 16, dtype=torch.float64)
    k, v = (torch.randn(1, 20, 2, 16, dtype=torch.float64) for _ in range(2))
    sinks = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float32)  # float32, as the API takes them
    o, lse = reference(q, k, v, causal=True, sinks=sinks)  # bottom-right: rows 0..9 see no key
    keep = band_mask(30, 20, causal=True, window=None, device="cpu").double()
    want_o, want_lse = _sink_attention(q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2), sinks, keep)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    assert (o[:, :10] == 0).all()
    torch.testing.assert_close(lse[0, :, :10], sinks.double()[:, None].expand(4, 10))
    # A local window that leaves rows no key (row i sees keys i - 12 .. i - 10): the same.
    o, lse = reference(q, k, v, window=(2, 0), sinks=sinks)
    keep = band_mask(30, 20, causal=False, window=(2, 0), device="cpu").double()
    want_o, want_lse = _sink_attention(q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2), sinks, keep)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    assert (o[:, :10] == 0).all() and (o[:, 10:] != 0).all()
    no_key = reference(q[:, :1], k[:, :0], v[:, :0], sinks=sinks)
    assert (no_key[0] == 0).all() and torch.equal(no_key[1][0, :, 0], sinks.double())


def test_same_dtype_output_with_sinks_is_the_yardstick():
    torch = pytest.importorskip("torch")
    from codegen.check import reference, rel_err, same_dtype_output

    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 200, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    sinks = torch.tensor([5.0, 0.0, -3.0, 8.0])
    ref, _ = reference(q, k, v, causal=True, sinks=sinks)
    same = same_dtype_output(q, k, v, causal=True, sinks=sinks)
    assert same.dtype == torch.bfloat16 and rel_err(same, ref) < 1e-2
    without = same_dtype_output(q, k, v, causal=True)
    assert rel_err(without, ref) > 10 * rel_err(same, ref)  # the sinks matter at these values


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("heads_a_group", [1, 3])
def test_same_dtype_output_in_head_groups_matches_the_whole_batch(layout, heads_a_group):
    # Grouped heads (two query heads a K/V head), a sink per head, a window, S_q != S_k, groups of one head or of
    # three (the last group one head): the same sums as the whole batch at once with K/V repeated per query head.
    torch = pytest.importorskip("torch")
    from codegen.check import _band_scores, _with_sinks, rel_err, same_dtype_output

    torch.manual_seed(3)
    q = torch.randn(2, 40, 4, 32, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 56, 2, 32, dtype=torch.bfloat16) for _ in range(2))
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    options = dict(causal=True, window=(20, 0))
    sinks = torch.tensor([3.0, -1.0, 0.5, 6.0])
    grouped = same_dtype_output(q, k, v, layout=layout, sinks=sinks, max_score_bytes=heads_a_group * 40 * 56 * 4,
                                **options)
    qb, kb, vb = ((t.transpose(1, 2) if layout == "bshd" else t).float() for t in (q, k, v))
    kb, vb = kb.repeat_interleave(2, dim=1), vb.repeat_interleave(2, dim=1)
    p = torch.softmax(_with_sinks(_band_scores(qb, kb, scale=None, softcap=0.0, **options), sinks), dim=-1)
    whole = (p.nan_to_num(0.0)[..., :56].to(q.dtype).float() @ vb).to(q.dtype)
    # An order of sums other than the whole batch's may move a bf16 rounding; a wrong head, batch or sink is O(1) off.
    assert rel_err(grouped, whole.transpose(1, 2) if layout == "bshd" else whole) < 1e-3


def test_reference_varlen_gives_sequences_without_keys_the_sink():
    torch = pytest.importorskip("torch")
    from codegen.check import reference, reference_varlen, same_dtype_output_varlen

    torch.manual_seed(3)
    cu_q = torch.tensor([0, 5, 12, 12, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 8, 8, 10, 17], dtype=torch.int32)  # sequence 1 has no keys, sequence 2 no queries
    q = torch.randn(20, 2, 16, dtype=torch.float64)
    k, v = (torch.randn(17, 2, 16, dtype=torch.float64) for _ in range(2))
    sinks = torch.tensor([1.5, -0.5], dtype=torch.float32)
    o, lse = reference_varlen(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    assert lse.shape == (2, 20) and (o[5:12] == 0).all()
    torch.testing.assert_close(lse[:, 5:12], sinks.double()[:, None].expand(2, 7))
    o0, lse0 = reference(q[None, :5], k[None, :8], v[None, :8], causal=True, sinks=sinks)
    torch.testing.assert_close(o[:5], o0[0])
    torch.testing.assert_close(lse[:, :5], lse0[0])
    same = same_dtype_output_varlen(q.half(), k.half(), v.half(), cu_q, cu_k, causal=True, sinks=sinks)
    assert (same[5:12] == 0).all() and (same[:5] - o[:5]).abs().max() < 1e-2


# ---------------------------------------------------------------------------------------------- backward references


def _grads_by_autograd(q, k, v, do, **options):
    """float64 autograd through check.reference: an independent route to reference_backward's numbers."""
    from codegen.check import reference

    leaves = [t.double().detach().requires_grad_() for t in (q, k, v)]
    o, _ = reference(*leaves, **options)
    o.backward(do.double())
    return [t.grad for t in leaves]


BACKWARD_OPTIONS = [  # (B, S_q, S_k, H, H_kv, D), options
    ((2, 50, 70, 4, 2, 16), {}),
    ((2, 90, 40, 4, 1, 16), {"causal": True}),                        # multi-query; 50 rows see no key
    ((1, 40, 60, 6, 3, 32), {"window": (5, 3), "softcap": 3.0}),
    ((2, 30, 30, 2, 2, 8), {"causal": True, "window": (7, -1), "scale": 0.3}),
    ((1, 33, 47, 4, 2, 16), {"layout": "bhsd", "causal": True}),
]


@pytest.mark.parametrize("dims, options", BACKWARD_OPTIONS)
def test_reference_backward_matches_autograd_through_the_forward_reference(dims, options):
    torch = pytest.importorskip("torch")
    from codegen.check import reference_backward

    torch.manual_seed(1)
    b, sq, sk, h, hk, d = dims
    shape = (lambda s, n: (b, n, s, d)) if options.get("layout") == "bhsd" else (lambda s, n: (b, s, n, d))
    q, do = torch.randn(shape(sq, h)), torch.randn(shape(sq, h))
    k, v = torch.randn(shape(sk, hk)), torch.randn(shape(sk, hk))
    grads = reference_backward(q, k, v, do, **options)
    for got, want, like in zip(grads, _grads_by_autograd(q, k, v, do, **options), (q, k, v)):
        assert got.dtype == torch.float64 and got.shape == like.shape
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # Heads one at a time (the smallest score budget) give the same numbers.
    for got, want in zip(reference_backward(q, k, v, do, max_score_bytes=1, **options), grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-13)


def test_reference_backward_gives_exact_zeros_where_nothing_flows():
    torch = pytest.importorskip("torch")
    from codegen.check import reference, reference_backward

    torch.manual_seed(2)
    q, do = torch.randn(1, 60, 2, 16), torch.randn(1, 60, 2, 16)
    k, v = torch.randn(1, 30, 2, 16), torch.randn(1, 30, 2, 16)
    dq, dk, dv = reference_backward(q, k, v, do, causal=True)   # bottom-right: rows 0..29 see no key
    assert torch.isinf(reference(q, k, v, causal=True)[1][0, :, :30]).all()
    assert (dq[:, :30] == 0).all() and (dq[:, 31:].abs().amax(-1) > 0).all()
    assert (dq[:, 30] == 0).all(), "row 30 sees key 0 alone"
    dq, dk, dv = reference_backward(k, q, q, k, window=(4, 0))  # 30 queries over 60 keys: keys 0..25 unseen
    assert (dk[:, :26] == 0).all() and (dv[:, :26] == 0).all() and (dk[:, 26:].abs().amax(-1) > 0).all()
    dq, dk, dv = reference_backward(q, k[:, :1], v[:, :1], do)  # one key: softmax has no slope
    assert (dq == 0).all() and (dk == 0).all() and (dv != 0).all()


def test_reference_backward_varlen_is_each_sequence_alone():
    torch = pytest.importorskip("torch")
    from codegen.check import reference_backward, reference_backward_varlen

    torch.manual_seed(3)
    q_lens, k_lens = [5, 0, 40, 17], [9, 3, 40, 0]
    cu_q = torch.tensor([0, 5, 5, 45, 62], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 52, 52], dtype=torch.int32)
    q, do = torch.randn(sum(q_lens), 4, 16), torch.randn(sum(q_lens), 4, 16)
    k, v = torch.randn(sum(k_lens), 2, 16), torch.randn(sum(k_lens), 2, 16)
    dq, dk, dv = reference_backward_varlen(q, k, v, do, cu_q, cu_k, causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    alone = reference_backward(q[None, 5:45], k[None, 12:52], v[None, 12:52], do[None, 5:45], causal=True)
    for got, want in zip((dq[5:45], dk[12:52], dv[12:52]), alone):
        torch.testing.assert_close(got, want[0], rtol=0, atol=0)
    assert (dq[45:] == 0).all(), "a sequence without keys has no gradient"
    assert (dk[9:12] == 0).all() and (dv[9:12] == 0).all(), "a sequence without queries has no gradient"


def test_same_dtype_backward_is_a_rounded_copy_of_the_reference():
    torch = pytest.importorskip("torch")
    from codegen.check import (reference_backward, reference_backward_varlen, rel_err, same_dtype_backward,
                               same_dtype_backward_varlen)

    torch.manual_seed(4)
    q, do = (torch.randn(2, 70, 4, 32, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 50, 2, 32, dtype=torch.bfloat16) for _ in range(2))
    options = {"causal": True, "softcap": 5.0}
    grads = same_dtype_backward(q, k, v, do, **options)
    for got, want, like in zip(grads, reference_backward(q, k, v, do, **options), (q, k, v)):
        assert got.dtype == torch.bfloat16 and got.shape == like.shape
        assert 1e-4 < rel_err(got, want) < 3e-2  # bf16 rounding: neither exact nor off
    assert (grads[0][:, :20] == 0).all(), "rows without keys"
    cu = torch.tensor([0, 70, 140], dtype=torch.int32)
    cu_k = torch.tensor([0, 50, 100], dtype=torch.int32)
    packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v, do)]
    for got, want in zip(same_dtype_backward_varlen(*packed, cu, cu_k, **options), grads):
        torch.testing.assert_close(got.float(), want.reshape(got.shape).float(), rtol=0, atol=0)
    ref = reference_backward_varlen(*packed, cu, cu_k, **options)
    assert all(rel_err(g, r) < 3e-2 for g, r in zip(same_dtype_backward_varlen(*packed, cu, cu_k, **options), ref))


def test_gradient_failure_holds_rows_to_the_typical_row_and_zero_gradients_to_atol():
    torch = pytest.importorskip("torch")
    from codegen.check import gradient_failure, row_err_vs_rms, row_rel_err

    torch.manual_seed(5)
    ref = torch.randn(1, 50, 4, 8, dtype=torch.float64)
    ref[0, :3] *= 1e-6  # three nearly one-hot queries: their dq is almost 0
    yardstick = (ref * (1 + 1e-3 * torch.randn_like(ref))).float()
    assert gradient_failure(yardstick, ref, yardstick) is None
    noisy = yardstick.clone()
    noisy[0, 1, 2, 5] += 3e-6  # a float32 rounding: 3x the row itself, nothing beside the others
    assert row_rel_err(noisy, ref) > 1 > 100 * row_rel_err(yardstick, ref)
    assert row_err_vs_rms(noisy, ref) == pytest.approx(row_err_vs_rms(yardstick, ref), rel=1e-2)
    assert gradient_failure(noisy, ref, yardstick) is None
    wrong = yardstick.clone()
    wrong[0, 40, 3] *= 1.02  # one row of 200: the worst-row bound sees it, at its own index
    failure = gradient_failure(wrong, ref, yardstick)
    assert failure.startswith("worst row's error (of the RMS row)") and "worst at (0, 40, 3," in failure
    wrong[0, 10, 1, 1] = float("nan")
    assert gradient_failure(wrong, ref, yardstick).startswith("rel err inf")
    zero = torch.zeros_like(ref)  # every query saw one key: dq is 0 throughout
    assert gradient_failure(torch.zeros_like(yardstick), zero, torch.zeros_like(yardstick)) is None
    failure = gradient_failure(noisy - yardstick, zero, torch.zeros_like(yardstick))
    assert failure.startswith("the reference is 0 throughout: |x| up to 3.0")
    assert gradient_failure(noisy - yardstick, zero, torch.zeros_like(yardstick), atol=1e-5) is None


def test_lse_failure_catches_a_row_that_lost_one_key_of_thousands():
    torch = pytest.importorskip("torch")
    from codegen import check

    torch.manual_seed(0)
    scores = torch.randn(4, 3000, dtype=torch.float64)
    ref = torch.logsumexp(scores, dim=-1)
    assert check.lse_failure(ref.float(), ref) is None  # float32 rounding alone passes
    lost = ref.clone()
    lost[2] = torch.logsumexp(scores[2, 1:], dim=-1)  # one key of 3000 left out of row 2's sum
    assert "1 of 4 outside" in check.lse_failure(lost.float(), ref)
    never = ref.float().clone()
    never[1] = float("nan")
    assert "NaN" in check.lse_failure(never, ref)
    empty = ref.clone()
    empty[0] = float("-inf")  # a row that sees no key
    assert check.lse_failure(empty.float(), empty) is None
    assert "-inf" in check.lse_failure(ref.float(), empty)
    flipped = empty.float().clone()
    flipped[0] = float("inf")  # the right rows infinite, with the wrong sign
    assert "+inf" in check.lse_failure(flipped, empty)
