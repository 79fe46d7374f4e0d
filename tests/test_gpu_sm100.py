"""The Blackwell forward kernel on a B200/B300, against float64 (skipped with the reason on any other GPU, and
on the H200 this project is lent: these tests have not run yet)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from codegen import check  # noqa: E402
from codegen.api import ARCH_BY_CAPABILITY, attention, prepare  # noqa: E402


def _blackwell():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    capability = torch.cuda.get_device_capability()
    if ARCH_BY_CAPABILITY.get(capability) not in ("sm_100a", "sm_103a"):
        pytest.skip(f"the Blackwell kernels need a B200 (10.0) or B300 (10.3); this GPU is "
                    f"{capability[0]}.{capability[1]}")


def _check_forward(q, k, v, **mask):
    call = prepare(q, k, v, **mask)
    assert call.built.family.name == "fwd_sm100"
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    assert not torch.isnan(call.o).any() and not torch.isnan(call.lse).any()
    ref, ref_lse = check.reference(q, k, v, **mask)
    failure = check.accuracy_failure(call.o, ref, check.same_dtype_output(q, k, v, **mask), floor=0.0)
    assert failure is None, failure
    finite = torch.isfinite(ref_lse)
    assert check.lse_rel_err(call.lse[finite], ref_lse[finite]) <= 1e-5
    assert (call.lse[~finite] == -float("inf")).all()  # rows that see no key
    torch.testing.assert_close(attention(q, k, v, **mask), call.o, rtol=0, atol=0)


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, kv_heads, dim, causal, dtype", [
    (1, 1024, 1024, 64, 64, 128, False, torch.float16),
    (2, 1000, 1000, 8, 8, 128, True, torch.bfloat16),
    (2, 300, 1024, 8, 2, 64, True, torch.bfloat16),
    (1, 4096, 4096, 16, 16, 128, False, torch.bfloat16),
    (1, 512, 512, 4, 1, 256, False, torch.bfloat16),
    (1, 777, 776, 4, 4, 96, True, torch.float16),
])
def test_forward_matches_float64(batch, seq_q, seq_k, heads, kv_heads, dim, causal, dtype):
    _blackwell()
    q = torch.randn(batch, seq_q, heads, dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, seq_k, kv_heads, dim, device="cuda", dtype=dtype) for _ in range(2))
    _check_forward(q, k, v, causal=causal)


@pytest.mark.parametrize("batch, seq_q, seq_k, heads, kv_heads, dim, causal, window, softcap, dtype", [
    (1, 1024, 1024, 16, 16, 128, False, (256, 0), 0.0, torch.bfloat16),
    # A left bound of 16: a tile's first key block is empty for most of its rows.
    (2, 1000, 1000, 8, 8, 64, False, (16, 0), 0.0, torch.float16),
    (1, 1024, 1024, 8, 2, 128, False, (100, 37), 30.0, torch.bfloat16),
    (2, 777, 776, 4, 4, 96, True, (-1, -1), 5.0, torch.float16),
    # S_q > S_k with causal and a left window: the first query tiles see no key at all (output 0, lse -inf).
    (1, 2048, 1024, 4, 4, 128, True, (40, 0), 0.0, torch.bfloat16),
    (1, 512, 512, 4, 1, 256, False, (-1, 8), 20.0, torch.bfloat16),
])
def test_windows_and_softcap_match_float64(batch, seq_q, seq_k, heads, kv_heads, dim, causal, window, softcap, dtype):
    _blackwell()
    q = torch.randn(batch, seq_q, heads, dim, device="cuda", dtype=dtype) * (3 if softcap else 1)  # the cap bites
    k, v = (torch.randn(batch, seq_k, kv_heads, dim, device="cuda", dtype=dtype) for _ in range(2))
    _check_forward(q, k, v, causal=causal, window=window, softcap=softcap)


# --- variable-length batches (cu_seqlens), with the Hopper tests' semantics ---------------------------------

# Lengths around the 128-row query tile and the key block, one-row and empty sequences, first keys off the 8-key
# groups. The packed keys add up to a multiple of 8 (the V map's key groups; the API refuses other totals).
RAGGED_Q = [1, 127, 128, 129, 300, 1000, 64, 65, 0, 513, 5]
RAGGED_K = [1, 127, 128, 129, 300, 1000, 64, 65, 0, 513, 1]


def _packed(lengths, heads, dim, dtype, scale=1.0):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    t = torch.randn(offsets[-1], heads, dim, device="cuda", dtype=dtype) * scale
    return t, torch.tensor(offsets, dtype=torch.int32, device="cuda")


def _check_varlen(q_lens, k_lens, heads, kv_heads, dim, dtype, scale=1.0, max_seqlens=(None, None), **mask):
    q, cu_q = _packed(q_lens, heads, dim, dtype, scale)
    k, cu_k = _packed(k_lens, kv_heads, dim, dtype, scale)
    v, _ = _packed(k_lens, kv_heads, dim, dtype)
    offsets = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    call = prepare(q, k, v, **offsets, max_seqlen_q=max_seqlens[0], max_seqlen_k=max_seqlens[1], **mask)
    assert call.built.family.name == "fwd_sm100" and call.spec.varlen
    assert call.o.shape == q.shape and call.lse.shape == (heads, q.shape[0])
    call.o.fill_(float("nan"))
    call.lse.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    assert not torch.isnan(call.o).any() and not torch.isnan(call.lse).any(), "unwritten outputs"
    ref, ref_lse = check.reference_varlen(q, k, v, cu_q, cu_k, **mask)
    same_dtype = check.same_dtype_output_varlen(q, k, v, cu_q, cu_k, **mask)
    failure = check.accuracy_failure(call.o, ref, same_dtype, floor=0.0)
    assert failure is None, failure
    yardstick = check.rel_err(same_dtype, ref)
    for i, (rows, _) in enumerate(check.sequences(cu_q, cu_k)):  # a tile spilling into its neighbour shows here
        if rows.stop > rows.start and ref[rows].norm() > 0:
            assert check.rel_err(call.o[rows], ref[rows]) <= max(4 * yardstick, 1e-2), f"sequence {i}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(call.lse), empty), "fully masked rows differ"
    assert (call.o.transpose(0, 1)[empty] == 0).all(), "a fully masked row is not 0"
    if (~empty).any():
        assert check.lse_rel_err(call.lse[~empty], ref_lse[~empty]) <= 1e-5
    torch.testing.assert_close(attention(q, k, v, **offsets, **mask), call.o, rtol=0, atol=0)


@pytest.mark.parametrize("dim", (64, 128, 256))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_varlen_matches_float64(dim, causal, dtype):
    _blackwell()
    _check_varlen(RAGGED_Q, RAGGED_K, 8, 8, dim, dtype, causal=causal)


@pytest.mark.parametrize("causal", (False, True))
def test_varlen_separate_key_lengths_and_gqa(causal):
    _blackwell()
    # S_q > S_k and S_q < S_k per sequence, a sequence without keys, one without queries.
    _check_varlen([100, 700, 128, 5, 0, 260], [300, 200, 128, 0, 7, 1013], 16, 4, 128, torch.bfloat16, causal=causal)


@pytest.mark.parametrize("window, softcap", [((96, -1), 20.0), ((16, 0), 0.0), ((100, 37), 30.0)])
def test_varlen_windows_and_softcap(window, softcap):
    _blackwell()
    _check_varlen(RAGGED_Q, RAGGED_K, 4, 2, 128, torch.bfloat16, scale=2.0, causal=window[1] == 0, window=window,
                  softcap=softcap)


def test_varlen_max_seqlen_larger_than_needed():
    _blackwell()
    _check_varlen([200, 50], [200, 56], 2, 2, 64, torch.float16, max_seqlens=(1000, 1000))


def test_varlen_many_sequences_over_the_persistent_ctas():
    """More tiles than SMs, most of them past their sequence's end (skipped by every role)."""
    _blackwell()
    _check_varlen(RAGGED_Q * 40, RAGGED_K * 40, 8, 2, 128, torch.bfloat16, causal=True)
