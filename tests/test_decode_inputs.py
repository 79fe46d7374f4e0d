"""The decode API's refusals on the CPU (before any launch) and the float64 reference the GPU tests check against."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def cpu_inputs(**over):
    q = torch.zeros(2, 1, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 256, 2, 64, dtype=torch.bfloat16)
    args = dict(q=q, k_cache=k, v_cache=k.clone(), cache_seqlens=torch.tensor([3, 4], dtype=torch.int32))
    args.update(over)
    return args


META = dict(q=torch.zeros(2, 1, 8, 64, dtype=torch.bfloat16, device="meta"),
            k_cache=torch.zeros(2, 256, 2, 64, dtype=torch.bfloat16, device="meta"),
            v_cache=torch.zeros(2, 256, 2, 64, dtype=torch.bfloat16, device="meta"))


@pytest.mark.parametrize("over, match", [
    (dict(cache_seqlens=torch.tensor([3, 4], dtype=torch.int64)), "int32"),
    (dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), "one length per sequence"),
    (dict(q=torch.zeros(2, 1, 7, 64, dtype=torch.bfloat16)), "multiple"),
    (dict(v_cache=torch.zeros(2, 255, 2, 64, dtype=torch.bfloat16)), "one shape"),
    (dict(q=torch.zeros(2, 1, 8, 64, dtype=torch.float16)), "dtype"),
    (dict(k_new=torch.zeros(2, 1, 2, 64, dtype=torch.bfloat16)), "together"),
    (dict(page_table=torch.zeros(2, 4, dtype=torch.int64)), "int32"),
    (dict(page_table=torch.zeros(3, 4, dtype=torch.int32)), "a row of pages per sequence"),
    (dict(page_table=torch.zeros(2, 4, dtype=torch.int32)), "CUDA device"),
    # On the meta device (past the shape checks, short of a GPU): the tensors q's device must hold.
    (dict(META, page_table=torch.zeros(2, 4, dtype=torch.int32)), "page_table must be on q's device"),
    (dict(META, page_table=torch.zeros(2, 4, dtype=torch.int32, device="meta"),
          cache_seqlens=torch.zeros(2, dtype=torch.int32, device="meta")), "CUDA device"),
    (dict(META, cache_seqlens=torch.tensor([3, 4], dtype=torch.int32)), "cache_seqlens must be on q's device"),
    (dict(META, cache_seqlens=torch.zeros(2, dtype=torch.int32, device="meta"),
          sinks=torch.zeros(8)), "sinks must be contiguous and on q's device"),
    (dict(sinks=torch.zeros(7)), "sinks"),
    (dict(num_splits=-1), "num_splits"),
    (dict(ctas_per_sm=3), "ctas_per_sm"),
    (dict(ctas_per_sm=2.0), "ctas_per_sm"),
    (dict(head_pack=3), "head_pack"),
    (dict(head_pack=True), "head_pack"),
    (dict(num_splits=2.0), "num_splits must be an int"),
    (dict(block_n=True), "block_n must be an int"),
    (dict(window=(3.7, -1)), "window must be"),
    (dict(window=(4, 0, 1)), "window must be"),
    ({}, "CUDA device"),
])
def test_bad_calls_are_refused_before_any_launch(over, match):
    from codegen.api import InputError
    from codegen.decode import attention_with_kvcache

    args = cpu_inputs(**over)
    with pytest.raises(InputError, match=match):
        attention_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_seqlens"),
                               **args)


def test_the_reference_is_attention_over_each_sequences_keys():
    from codegen import check

    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, 32)
    k, v = torch.randn(2, 50, 2, 32), torch.randn(2, 50, 2, 32)
    o, lse = check.kvcache_reference(q, k, v, [50, 20], causal=True)
    for b, n in enumerate((50, 20)):
        ref, ref_lse = check.reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True)
        assert torch.allclose(o[b:b + 1], ref) and torch.allclose(lse[b:b + 1], ref_lse)
    # A sink of -inf is no sink; a sink takes its share of the weight.
    o2, _ = check.kvcache_reference(q, k, v, [50, 20], sinks=torch.full((4,), float("-inf")))
    o3, lse3 = check.kvcache_reference(q, k, v, [50, 20], sinks=torch.full((4,), 5.0))
    plain, plain_lse = check.kvcache_reference(q, k, v, [50, 20])
    assert torch.allclose(o2, plain)
    assert torch.allclose(lse3, torch.logaddexp(plain_lse, torch.tensor(5.0, dtype=torch.float64)))
    assert o3.norm() < plain.norm()


def test_a_call_that_differs_from_a_cached_one_in_anything_checked_makes_its_own_launcher(monkeypatch):
    """The launcher cache's key holds what the first call's checks read of every tensor (shape, strides, dtype,
    device), so a later call that would fail them (a v_cache of another shape behind the same strides, strided
    lengths or sinks, new tokens of another dtype) is checked again instead of launched."""
    import codegen.decode as decode
    from codegen.api import InputError

    made = []

    class Launcher:
        def __call__(self, *args):
            pass

    def make(*args, **kwargs):
        made.append(args)
        return Launcher()

    monkeypatch.setattr(decode, "_LAUNCHERS", {})
    monkeypatch.setattr(decode, "_make_launcher", make)
    monkeypatch.setattr(decode, "_current_stream", lambda device: 0)
    big = torch.zeros(2, 512, 2, 64, dtype=torch.bfloat16)
    base = dict(cpu_inputs(k_cache=big[:, :256], v_cache=big.clone()[:, :256]),
                k_new=torch.zeros(2, 1, 2, 64, dtype=torch.bfloat16), v_new=torch.zeros(2, 1, 2, 64, dtype=torch.bfloat16),
                sinks=torch.zeros(8))
    variants = [
        {},
        dict(v_cache=big.clone()[:, :128]),                                      # same strides, another shape
        dict(cache_seqlens=torch.tensor([3, 0, 4, 0], dtype=torch.int32)[::2]),  # strided lengths
        dict(sinks=torch.zeros(16)[::2]),                                        # strided sinks
        dict(k_new=torch.zeros(2, 1, 2, 64, dtype=torch.float16)),               # another dtype
        dict(v_new=torch.zeros(4, 1, 2, 64, dtype=torch.bfloat16)[::2]),         # another stride
    ]
    for i, over in enumerate(variants):
        args = dict(base, **over)
        decode.attention_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"),
                                      args.pop("cache_seqlens"), **args)
        assert len(made) == i + 1, f"variant {over} reused a launcher made for another call"
    decode.attention_with_kvcache(base["q"], base["k_cache"], base["v_cache"], base["cache_seqlens"],
                                  k_new=base["k_new"], v_new=base["v_new"], sinks=base["sinks"])
    assert len(made) == len(variants), "the same call finds its launcher"
    with pytest.raises(InputError, match="must be an int"):  # equal to the cached call's 0, of another type
        decode.attention_with_kvcache(base["q"], base["k_cache"], base["v_cache"], base["cache_seqlens"],
                                      k_new=base["k_new"], v_new=base["v_new"], sinks=base["sinks"], num_splits=0.0)
    with pytest.raises(InputError, match="no backward pass"):  # decode has none: a sink needing a gradient is refused
        decode.attention_with_kvcache(base["q"], base["k_cache"], base["v_cache"], base["cache_seqlens"],
                                      sinks=torch.zeros(8, requires_grad=True))
