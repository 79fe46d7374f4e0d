"""attention_with_kvcache under torch.compile, on the CPU: the decode custom ops' schemas, and a compiled decode step
traced whole (fullgraph) into them, with a CPU stand-in kernel behind the ops (tests only: the real kernels are
CUDA; tests/test_gpu_decode.py runs the same step on the GPU). The stand-in is the float64 reference of
codegen.check, so a compiled step that loses the append, reorders it after the attention, or drops an option fails."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from codegen import check  # noqa: E402
from codegen.api import InputError  # noqa: E402
from codegen.decode import attention_with_kvcache  # noqa: E402
from codegen.torch_op import KVCACHE_OPTIONS, kvcache_append_op, kvcache_op  # noqa: E402


def _cpu_reference(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, window, softcap, sinks, *_):
    assert page_table is None, "the stand-in reads dense caches"
    o, lse = check.kvcache_reference(q, k_cache, v_cache, cache_seqlens.tolist(), causal=causal, scale=scale,
                                     window=None if window is None else tuple(window), softcap=softcap, sinks=sinks)
    return o.to(q.dtype), lse.float()


def _cpu_append(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, *options):
    for b, n in enumerate(cache_seqlens.tolist()):
        k_cache[b, n:n + q.shape[1]] = k_new[b]
        v_cache[b, n:n + q.shape[1]] = v_new[b]
    return _cpu_reference(q, k_cache, v_cache, cache_seqlens + q.shape[1], page_table, *options)


kvcache_op.register_kernel("cpu")(_cpu_reference)
kvcache_append_op.register_kernel("cpu")(_cpu_append)


def inputs(seed=0, batch=2, q_len=2, capacity=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, 8, 64, generator=g).bfloat16()
    k_cache, v_cache = (torch.randn(batch, capacity, 2, 64, generator=g).bfloat16() for _ in range(2))
    k_new, v_new = (torch.randn(batch, q_len, 2, 64, generator=g).bfloat16() for _ in range(2))
    lens = torch.tensor([5, 40][:batch], dtype=torch.int32)
    return q, k_cache, v_cache, lens, k_new, v_new


def test_only_the_append_op_writes_the_caches():
    mutated = lambda op: sorted(a.name for a in op._opoverload._schema.arguments  # noqa: E731
                                if a.alias_info is not None and a.alias_info.is_write)
    assert mutated(kvcache_op) == []
    assert mutated(kvcache_append_op) == ["k_cache", "v_cache"]
    # Both take the options in KVCACHE_OPTIONS' order after their tensors.
    for op, tensors in ((kvcache_op, 5), (kvcache_append_op, 7)):
        names = [a.name for a in op._opoverload._schema.arguments]
        assert tuple(names[tensors:]) == KVCACHE_OPTIONS


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_decode_step_appends_then_attends_in_one_graph(backend):
    """Two steps: each appends its tokens into the caches in place and attends over them, as eager does."""
    torch._dynamo.reset()
    sinks = torch.randn(8, dtype=torch.float32)

    def step(q, k_cache, v_cache, lens, k_new, v_new):
        o, lse = attention_with_kvcache(q, k_cache, v_cache, lens, k_new=k_new, v_new=v_new, causal=True,
                                        softcap=3.0, sinks=sinks, return_lse=True)
        return o * 2, lse

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    q, k_cache, v_cache, lens, k_new, v_new = inputs()
    before = k_cache.clone()
    for _ in range(2):
        o, lse = compiled(q, k_cache, v_cache, lens, k_new, v_new)
        for b, n in enumerate(lens.tolist()):  # the new rows in place, nothing else written
            assert torch.equal(k_cache[b, n:n + 2], k_new[b]) and torch.equal(v_cache[b, n:n + 2], v_new[b])
            assert torch.equal(k_cache[b, :n], before[b, :n]) and torch.equal(k_cache[b, n + 2:], before[b, n + 2:])
        ref_o, ref_lse = check.kvcache_reference(q, k_cache, v_cache, (lens + 2).tolist(), causal=True, softcap=3.0,
                                                 sinks=sinks)
        assert torch.equal(o, 2 * ref_o.to(o.dtype)) and torch.equal(lse, ref_lse.float())
        lens += 2
        before = k_cache.clone()
        q, k_new, v_new = (torch.randn_like(t) for t in (q, k_new, v_new))


def test_a_compiled_call_without_new_tokens_takes_the_op_that_writes_nothing():
    torch._dynamo.reset()
    q, k_cache, v_cache, lens, _, _ = inputs(seed=1, q_len=1)
    window = (8, 0)
    compiled = torch.compile(lambda *a: attention_with_kvcache(*a, window=window, scale=0.3), fullgraph=True,
                             backend="aot_eager")
    before = (k_cache.clone(), v_cache.clone())
    o = compiled(q, k_cache, v_cache, lens)
    ref, _ = check.kvcache_reference(q, k_cache, v_cache, lens.tolist(), window=window, scale=0.3)
    assert torch.equal(o, ref.to(o.dtype))
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_shapes_are_refused_while_tracing_and_out_breaks_the_graph():
    torch._dynamo.reset()
    q, k_cache, v_cache, lens, _, _ = inputs(seed=2, q_len=1)
    bad_q = torch.randn(2, 1, 7, 64).bfloat16()  # 7 heads over 2 K/V heads
    with pytest.raises(Exception, match="multiple of the cache's 2 K/V heads") as info:
        torch.compile(attention_with_kvcache, fullgraph=True, backend="eager")(bad_q, k_cache, v_cache, lens)
    assert isinstance(info.value, InputError) or "InputError" in str(info.value)
    torch._dynamo.reset()
    out = torch.empty_like(q)
    with pytest.raises(Exception, match="out= or check=True"):
        torch.compile(lambda *a: attention_with_kvcache(*a, out=out), fullgraph=True, backend="eager")(
            q, k_cache, v_cache, lens)


def test_inductor_calls_the_append_op_on_the_caches_themselves():
    """A compiled step must write the caches where they are: no copy of a (possibly GB-sized) cache before the op
    and no copy back after it (the op's write annotations let inductor call it on the graph's inputs)."""
    import shutil

    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        pytest.skip("inductor's CPU backend needs a C++ compiler, and none is on PATH")
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k_cache, v_cache, lens, k_new, v_new = inputs(seed=3)
    step = torch.compile(lambda q, k, v, n, kn, vn: attention_with_kvcache(q, k, v, n, k_new=kn, v_new=vn),
                         fullgraph=True)
    o, codes = run_and_get_code(step, q, k_cache, v_cache, lens, k_new, v_new)
    code = "\n".join(codes)
    calls = [line for line in code.splitlines() if "flashgen.attention_with_kvcache_append.default(" in line]
    assert len(calls) == 1, code
    assert "clone" not in code and "copy" not in code, code
    for b, n in enumerate(lens.tolist()):
        assert torch.equal(k_cache[b, n:n + 2], k_new[b]) and torch.equal(v_cache[b, n:n + 2], v_new[b])
    ref, _ = check.kvcache_reference(q, k_cache, v_cache, (lens + 2).tolist())
    assert torch.equal(o, ref.to(o.dtype))
