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
    assert check.rel_err(call.lse[finite], ref_lse[finite]) <= 1e-5
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
