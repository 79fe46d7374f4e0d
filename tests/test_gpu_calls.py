"""attention() as users call it, on the GPU: the cached fast path, one launch per call, torch.compile, CUDA
graphs, the SDPA drop-in, streams and threads (skipped with a reason where there is no GPU).

The kernels themselves are checked through prepare() in tests/test_gpu.py; here every result is still held
to 2x the same-dtype SDPA error against a float64 reference, on fresh random inputs.
"""

from __future__ import annotations

import itertools
import threading

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import codegen  # noqa: E402
from codegen import check  # noqa: E402
from codegen.api import InputError, attention, scaled_dot_product_attention  # noqa: E402
from tests.test_gpu import RAGGED, assert_varlen_matches, packed  # noqa: E402

TINY = 1e-6


def assert_matches(q, k, v, o, *, causal=False, layout="bshd"):
    ref, _ = check.reference(q, k, v, causal=causal, layout=layout)
    heads = 2 if layout == "bshd" else 1
    if q.shape[heads] == k.shape[heads]:
        yardstick = check.sdpa_output(q, k, v, causal=causal, layout=layout)
    else:  # grouped-query: the same-dtype flash-style computation (SDPA's needs enable_gqa)
        yardstick = check.same_dtype_output(q, k, v, causal=causal, layout=layout)
    assert not torch.isnan(o).any()
    failure = check.accuracy_failure(o, ref, yardstick, floor=TINY)
    assert failure is None, failure


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize("shape, causal", [((1, 1024, 64, 128), False), ((2, 300, 8, 64), True),
                                           ((8, 512, 32, 128), False), ((1, 129, 4, 256), True)])
def test_repeated_calls_reuse_the_launcher_and_stay_correct(shape, causal):
    q, k, v = (rand(*shape) for _ in range(3))
    first = attention(q, k, v, causal=causal)
    assert_matches(q, k, v, first, causal=causal)
    for _ in range(3):  # the same buffers, new values: cached tensor maps, fresh outputs
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        o = attention(q, k, v, causal=causal)
        assert o.data_ptr() != q.data_ptr()
        assert_matches(q, k, v, o, causal=causal)


def test_a_call_is_one_kernel_launch():
    q, k, v = (rand(1, 1024, 16, 128) for _ in range(3))
    attention(q, k, v)  # first call: compile, load, the stream's tile counter
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            attention(q, k, v)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 5 and all(name.startswith("flashgen_fwd") for name in kernels), kernels


def test_a_reallocated_address_with_another_shape_gets_its_own_tensor_map():
    q, k, v = (rand(2, 512, 8, 128) for _ in range(3))
    attention(q, k, v)
    address = q.data_ptr()
    del q
    q = rand(4, 256, 8, 128)  # same bytes: the caching allocator hands the block back
    k2, v2 = (rand(4, 256, 8, 128) for _ in range(2))
    o = attention(q, k2, v2)
    assert_matches(q, k2, v2, o)
    if q.data_ptr() != address:
        pytest.skip("the allocator did not reuse the address; the shape-keyed cache is still exercised")


def test_every_check_still_runs_on_a_cached_call():
    q, k, v = (rand(1, 256, 8, 128) for _ in range(3))
    attention(q, k, v)
    q.requires_grad_(True)
    assert attention(q, k, v).grad_fn is not None  # grad mode is looked at again: the call goes through autograd
    with torch.no_grad():
        assert attention(q, k, v).grad_fn is None
    buf = torch.empty(1 * 256 * 8 * 128 + 8, device="cuda", dtype=torch.bfloat16)
    misaligned = buf[4:4 + 256 * 8 * 128].view(1, 256, 8, 128)  # 8 bytes in: the same shape and strides as k, misaligned
    with pytest.raises(InputError, match="16-byte aligned"):
        attention(q.detach(), misaligned, v)


def test_torch_compile_fullgraph_matches_eager():
    """The op inside a compiled module (an op before it and one after, in float32 so that nothing rounds the
    attention's output away) gives eager's bits, and eager's output is right against float64."""
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return codegen.attention(q * 1.0, k, v, causal=True).float() * 2.0

    q, k, v = (rand(2, 512, 8, 128) for _ in range(3))
    eager = Block()(q, k, v)
    assert_matches(q, k, v, (eager / 2.0).to(q.dtype), causal=True)
    compiled = torch.compile(Block(), fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_torch_compile_refuses_a_bad_shape_when_the_op_runs(fullgraph):
    # Sizes are not read while tracing (a symbolic size would be pinned); the op's run checks them before its
    # launch, so the compiled call's first run raises attention()'s InputError.
    q, k, v = (rand(1, 256, 4, 80) for _ in range(3))
    torch._dynamo.reset()
    with pytest.raises(InputError, match="head_dim 80 is not supported"):
        torch.compile(lambda q, k, v: attention(q, k, v), fullgraph=fullgraph, backend="eager")(q, k, v)


def test_cuda_graph_replays_with_refilled_inputs():
    q, k, v = (rand(1, 1024, 16, 128) for _ in range(3))
    attention(q, k, v)  # compiled, loaded and the launcher made before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attention(q, k, v)  # the capture stream's tile counter, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = attention(q, k, v)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(q, k, v, out)


@pytest.mark.parametrize("shape, causal", [((2, 4096, 16, 128), False),   # per-tile grid (policy v35)
                                           ((2, 1024, 16, 128), False),   # persistent: the tile counter
                                           ((2, 1024, 8, 64), True)])     # persistent, causal tiles
def test_torch_compile_reduce_overhead_replays_with_fresh_inputs(shape, causal):
    """mode="reduce-overhead": inductor records the call in its own CUDA graph pool and replays it; the launcher's
    per-stream tile counter must survive that (it lives outside torch's pools). Each replay gets fresh inputs and
    its output buffer, poisoned before, is checked against float64."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, causal=causal), mode="reduce-overhead",
                             fullgraph=True)
    out = None
    for _ in range(4):  # warm-up, record, two replays
        q, k, v = (rand(*shape) for _ in range(3))
        if out is not None:
            out.fill_(float("nan"))
        out = compiled(q, k, v)
        torch.cuda.synchronize()
        assert_matches(q, k, v, out, causal=causal)


@pytest.mark.parametrize("kv_heads, causal", [(16, False), (4, True)])
def test_sdpa_drop_in(kv_heads, causal):
    q = rand(2, 16, 300, 128)
    k, v = (rand(2, kv_heads, 300, 128) for _ in range(2))
    gqa = kv_heads != 16
    ours = scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert ours.shape == (2, 16, 300, 128) and ours.is_contiguous()  # SDPA's result: (B, H, S_q, D_v)
    assert_matches(q, k, v, ours, causal=causal, layout="bhsd")
    with pytest.raises(InputError, match="attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(300, 300, device="cuda", dtype=torch.bool))
    with pytest.raises(InputError, match="enable_gqa"):
        scaled_dot_product_attention(q, rand(2, 4, 300, 128), rand(2, 4, 300, 128))
    with pytest.raises(InputError, match="top left"):
        scaled_dot_product_attention(q, rand(2, 16, 500, 128), rand(2, 16, 500, 128), is_causal=True)


def test_two_streams_at_once():
    """Persistent kernels on two streams at once: each stream has its own tile counter. Every call has fresh
    inputs and its output is poisoned once checked, so a later call handed the same memory cannot pass on it."""
    shape = (4, 2048, 16, 128)
    inputs = [tuple(rand(*shape) for _ in range(3)) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [None, None]
    for _ in range(3):
        for i, (stream, qkv) in enumerate(zip(streams, inputs)):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for t in qkv:
                    t.copy_(torch.randn_like(t))
                outs[i] = attention(*qkv)
        torch.cuda.synchronize()
        for (q, k, v), o in zip(inputs, outs):
            assert_matches(q, k, v, o)
            o.fill_(float("nan"))
        torch.cuda.synchronize()


def test_threads_at_once():
    """Four threads, each on its own stream, five calls each on fresh inputs; every call is checked."""
    shape = (2, 1024, 8, 128)
    calls, errors = [[] for _ in range(4)], []

    def work(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(5):
                    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    calls[i].append((q, k, v, attention(q, k, v)))
            stream.synchronize()
        except Exception as e:  # reported below, with the thread
            errors.append((i, e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [len(c) for c in calls] == [5] * 4
    for q, k, v, o in (call for thread in calls for call in thread):
        assert_matches(q, k, v, o)


# --- varlen calls given their max lengths: the offsets stay on the device ------------------------------------

LONGEST = max(RAGGED)
ORDERS = (RAGGED, RAGGED[::-1], RAGGED[1::2] + RAGGED[::2])  # one packed length, one longest sequence


def offsets_of(lengths):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")


def packed_batch(lengths, heads, kv_heads, **options):
    """q, k, v of a packed bf16 batch (D=128) and attention()'s keyword arguments for it with both max lengths."""
    q, cu_q = packed(lengths, heads, 128, torch.bfloat16)
    k, cu_k = packed(lengths, kv_heads, 128, torch.bfloat16)
    v, _ = packed(lengths, kv_heads, 128, torch.bfloat16)
    return q, k, v, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=LONGEST, max_seqlen_k=LONGEST,
                         return_lse=True, **options)


@pytest.mark.parametrize("causal, tuning", [(False, {}), (True, {"persistent": False}), (True, {"persistent": True})])
def test_varlen_calls_with_max_lengths_never_synchronize_and_stay_correct(causal, tuning):
    """Given both max lengths, a varlen call neither reads nor checks its offsets: no synchronization (torch's sync
    debug mode raises on one), the same launcher for new lengths under the same max, every output right."""
    from codegen import api

    launchers = []
    for lengths in ORDERS:
        q, k, v, kwargs = packed_batch(lengths, 8, 2, causal=causal, **tuning)
        attention(q, k, v, **kwargs)  # the first call may compile and load
        launchers.append({id(x) for x in api._VARLEN_LAUNCHERS.values()})
        # Freed: the allocator hands the poisoned blocks to the next o and lse.
        torch.empty_like(q).fill_(float("nan"))
        torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device="cuda").fill_(float("nan"))
        torch.cuda.set_sync_debug_mode("error")
        try:
            o, lse = attention(q, k, v, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert_varlen_matches(q, k, v, kwargs["cu_seqlens_q"], kwargs["cu_seqlens_k"], o, lse, causal=causal)
    assert launchers[1] <= launchers[0] and launchers[2] <= launchers[0], "new lengths made a new launcher"
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):  # check=True reads the offsets: a synchronization
            attention(q, k, v, check=True, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_torch_compile_takes_a_varlen_call_given_its_max_lengths():
    q, k, v, given = packed_batch(RAGGED, 8, 2, causal=True)
    eager = attention(q, k, v, **given)
    compiled = torch.compile(lambda q, k, v: attention(q * 1.0, k, v, **given), fullgraph=True)(q, k, v)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert_varlen_matches(q, k, v, given["cu_seqlens_q"], given["cu_seqlens_k"], *compiled, causal=True)
    del given["max_seqlen_k"]  # not traceable: the call runs eagerly behind a graph break, with the same result
    torch._dynamo.reset()
    broken = torch.compile(lambda q, k, v: attention(q * 1.0, k, v, **given))(q, k, v)
    for a, b in zip(broken, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cuda_graph_replays_a_varlen_call_with_new_offsets():
    q, k, v, kwargs = packed_batch(RAGGED, 8, 8, causal=True)
    cu_q, cu_k = kwargs["cu_seqlens_q"], kwargs["cu_seqlens_k"]
    attention(q, k, v, **kwargs)  # compiled, loaded and the launcher made before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attention(q, k, v, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out, lse = attention(q, k, v, **kwargs)
    for lengths in ORDERS[1:] + ORDERS[:1]:  # new offsets in the captured tensors, then the first ones again
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        cu_q.copy_(offsets_of(lengths))
        cu_k.copy_(cu_q)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_varlen_matches(q, k, v, cu_q, cu_k, out, lse, causal=True)
