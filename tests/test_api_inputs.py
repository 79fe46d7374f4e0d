"""Every input check of codegen.attention raises a clear InputError before any launch (CPU tensors)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from codegen.api import InputError, attention  # noqa: E402


def qkv(shape=(1, 128, 2, 128), dtype=torch.float16):
    return [torch.randn(shape, dtype=dtype) for _ in range(3)]


def test_rank():
    q, k, v = qkv()
    with pytest.raises(InputError, match="rank 4"):
        attention(q[0], k[0], v[0])


def test_dtype_unsupported():
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(InputError, match="float32"):
        attention(q, k, v)


def test_dtype_mismatch():
    q, k, v = qkv()
    with pytest.raises(InputError, match="one dtype"):
        attention(q, k.bfloat16(), v)


def test_k_and_v_shapes_differ():
    q, k, v = qkv()
    with pytest.raises(InputError, match="k and v must have the same shape"):
        attention(q, k[:, :64], v)


def test_batch_or_head_dim_disagree():
    q, k, v = qkv()
    with pytest.raises(InputError, match="batch and head dim"):
        attention(q, torch.cat([k, k]), torch.cat([v, v]))


def test_heads_not_a_multiple_of_kv_heads():
    q = torch.randn(1, 128, 6, 128, dtype=torch.float16)
    k = torch.randn(1, 128, 4, 128, dtype=torch.float16)
    with pytest.raises(InputError, match="multiple of k and v's 4"):
        attention(q, k, k)


def test_window_and_softcap_values():
    q, k, v = qkv()
    with pytest.raises(InputError, match="window"):
        attention(q, k, v, window=(-3, 0))
    with pytest.raises(InputError, match="softcap"):
        attention(q, k, v, softcap=float("inf"))


def test_head_dim_unsupported():
    q, k, v = qkv(shape=(1, 128, 2, 80))
    with pytest.raises(InputError, match="head_dim 80"):
        attention(q, k, v)


def test_innermost_dimension_not_contiguous():
    q, k, v = qkv(shape=(1, 128, 2, 256))
    with pytest.raises(InputError, match="contiguous"):
        attention(q[..., ::2], k[..., ::2], v[..., ::2])


def test_stride_not_a_multiple_of_16_bytes():
    base = torch.randn(1, 128, 2, 129, dtype=torch.float16)
    q = base[..., :128]
    with pytest.raises(InputError, match="multiple of 16 bytes"):
        attention(q, q, q)


def test_expanded_tensor():
    q, k, v = qkv()
    with pytest.raises(InputError, match="stride\\(1\\) is 0"):
        attention(q, k[:, :1].expand(-1, 128, -1, -1), v)


def test_inputs_that_need_gradients():
    q, k, v = qkv()
    cu = torch.tensor([0, 128], dtype=torch.int32)
    packed = torch.randn(128, 2, 192, dtype=torch.float16, requires_grad=True)
    with pytest.raises(InputError, match="backward of variable-length batches is written for head dims \\(64, 96, 128\\)"):
        attention(packed, packed, packed, cu_seqlens_q=cu, cu_seqlens_k=cu)  # refused before the forward runs
    packed = torch.randn(128, 2, 128, dtype=torch.float16, requires_grad=True)
    with pytest.raises(InputError, match="soft cap and a band bounded on both sides"):
        attention(packed, packed, packed, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, window=(64, -1), softcap=5.0)
    wide = torch.randn(1, 128, 2, 192, dtype=torch.float16, requires_grad=True)
    with pytest.raises(InputError, match="backward: deterministic=True needs dQ"):  # refused before the forward runs
        attention(wide, wide, wide, deterministic=True)
    narrow = torch.randn(1, 128, 2, 96, dtype=torch.float16, requires_grad=True)
    with pytest.raises(InputError, match="deterministic=True needs dQ added as one tile"):  # D=96: atomics only
        attention(narrow, narrow, narrow, deterministic=True)
    sinks = torch.zeros(2, requires_grad=True)
    with pytest.raises(InputError, match="gradient of sinks is not computed"):
        attention(narrow, narrow, narrow, sinks=sinks)


def test_misaligned_pointer():
    flat = torch.randn(1 * 128 * 2 * 128 + 1, dtype=torch.float16)
    q = flat[1:].view(1, 128, 2, 128)
    with pytest.raises(InputError, match="16-byte aligned"):
        attention(q, q, q)


def test_layout_name():
    q, k, v = qkv()
    with pytest.raises(InputError, match="layout"):
        attention(q, k, v, layout="sbhd")


def test_scale():
    q, k, v = qkv()
    with pytest.raises(InputError, match="scale"):
        attention(q, k, v, scale=float("nan"))


def test_split_that_does_not_fit_the_block():
    q, k, v = qkv(shape=(1, 128, 2, 256))
    with pytest.raises(InputError, match="add up to block_n 64"):
        attention(q, k, v, pv_split=(96, 32), block_n=64)
    # A split alone asks for its own key block (128 here), too wide for D=256's registers.
    with pytest.raises(InputError, match="needs 224 accumulator registers"):
        attention(q, k, v, pv_split=(96, 32))


def test_cpu_tensors_are_refused_last():
    q, k, v = qkv()
    with pytest.raises(InputError, match="CUDA device"):
        attention(q, k, v)


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(InputError, match="torch.Tensor"):
        attention(q.numpy(), k, v)


# --- variable-length batches ---------------------------------------------------------------------------------


def varlen(lengths=(100, 300), heads=2, dim=64, cu_dtype=torch.int32):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    t = torch.randn(offsets[-1], heads, dim, dtype=torch.float16)
    return t, torch.tensor(offsets, dtype=cu_dtype)


@pytest.mark.parametrize("change, message", [
    (lambda t, cu: dict(cu_seqlens_q=cu.long()), "1-D torch.int32"),
    (lambda t, cu: dict(cu_seqlens_q=cu[None]), "1-D torch.int32"),
    (lambda t, cu: dict(cu_seqlens_q=cu[:1]), "B \\+ 1 >= 2"),
    (lambda t, cu: dict(cu_seqlens_q=cu + 1), "from 0 to the packed length 400"),
    (lambda t, cu: dict(cu_seqlens_q=cu[:-1]), "from 0 to the packed length 400"),
    (lambda t, cu: dict(cu_seqlens_q=torch.tensor([0, 300, 100, 400], dtype=torch.int32)),
     "nondecreasing, but sequence 1 has length -200"),
    (lambda t, cu: dict(cu_seqlens_q=torch.tensor([0, 100, 100, 400], dtype=torch.int32)), "same number of sequences"),
    (lambda t, cu: dict(cu_seqlens_k=None), "both cu_seqlens_q and cu_seqlens_k"),
    (lambda t, cu: dict(max_seqlen_k=299), "max_seqlen_k = 299 is shorter than sequence 1 of length 300"),
    (lambda t, cu: dict(layout="bhsd"), "packed \\(total, H, D\\)"),
    (lambda t, cu: dict(cu_seqlens_q=cu[::2].contiguous()[:2] * 0), "from 0 to the packed length"),
])
def test_varlen_bad_offsets(change, message):
    t, cu = varlen()
    kwargs = dict(cu_seqlens_q=cu, cu_seqlens_k=cu)
    kwargs.update(change(t, cu))
    with pytest.raises(InputError, match=message):
        attention(t, t, t, **kwargs)


def test_varlen_needs_packed_rank_3():
    t, cu = varlen()
    with pytest.raises(InputError, match="rank 3 \\(total, H, D\\)"):
        attention(t[None], t[None], t[None], cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_max_seqlen_without_offsets():
    q, k, v = qkv()
    with pytest.raises(InputError, match="pass cu_seqlens_q and cu_seqlens_k too"):
        attention(q, k, v, max_seqlen_q=128)


def test_valid_varlen_reaches_the_device_check():
    # Everything about the batch is accepted; only the CPU device is refused, after the spec resolved.
    t, cu = varlen((1, 1000, 0, 37))
    with pytest.raises(InputError, match="run on a CUDA device"):
        attention(t, t, t, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)


def test_varlen_kernels_are_shared_across_max_lengths():
    from codegen.api import _length_bucket

    assert [_length_bucket(n) for n in (1, 128, 129, 1000, 1024, 1025)] == [128, 128, 256, 1024, 1024, 2048]


# --- attention sinks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sinks, message", [
    (lambda: [0.0, 0.0], "sinks must be a torch.Tensor of float32 logits"),
    (lambda: torch.zeros(2, dtype=torch.float16), "sinks must be float32 .* got torch.float16"),
    (lambda: torch.zeros(2, dtype=torch.float64), "sinks must be float32"),
    (lambda: torch.zeros(3), "sinks must have shape \\(2,\\), one logit per query head, got \\(3,\\)"),
    (lambda: torch.zeros(1, 2), "sinks must have shape \\(2,\\)"),
    (lambda: torch.zeros(()), "sinks must have shape \\(2,\\)"),
    (lambda: torch.zeros(2, device="meta"), "sinks must be on q's device cpu, got meta"),
    (lambda: torch.zeros(4)[::2], "sinks must be contiguous \\(stride 1\\), got stride 2"),
    (lambda: torch.zeros(2, requires_grad=True), "no backward pass"),
    (lambda: torch.frombuffer(bytearray(16), dtype=torch.float32, offset=1, count=2), "4-byte aligned"),
])
@pytest.mark.filterwarnings("ignore::UserWarning")  # frombuffer of a writable bytearray
def test_sinks_are_checked(sinks, message):
    q, k, v = qkv()
    with pytest.raises(InputError, match=message):
        attention(q, k, v, sinks=sinks())


def test_sinks_are_checked_on_the_varlen_path_too():
    t, cu = varlen()
    with pytest.raises(InputError, match="sinks must have shape \\(2,\\)"):
        attention(t, t, t, cu_seqlens_q=cu, cu_seqlens_k=cu, sinks=torch.zeros(4))


def test_sinks_of_grouped_query_heads_count_the_query_heads():
    q = torch.randn(1, 128, 8, 128, dtype=torch.float16)
    k = torch.randn(1, 128, 2, 128, dtype=torch.float16)
    with pytest.raises(InputError, match="shape \\(8,\\)"):
        attention(q, k, k, sinks=torch.zeros(2))


def test_valid_sinks_reach_the_device_check():
    # Accepted, and the spec resolved with the mode on; only the CPU device is refused, last.
    q, k, v = qkv()
    with torch.no_grad():  # learned sinks are parameters: under no_grad they are plain inputs
        with pytest.raises(InputError, match="run on a CUDA device"):
            attention(q, k, v, sinks=torch.zeros(2, requires_grad=True), causal=True)
    t, cu = varlen()
    with pytest.raises(InputError, match="run on a CUDA device"):
        attention(t, t, t, cu_seqlens_q=cu, cu_seqlens_k=cu, sinks=torch.zeros(2))


def test_a_resolved_call_with_sinks_has_the_mode_on(monkeypatch):
    from codegen import api

    monkeypatch.setattr(api, "_check_device", lambda t: None)  # resolve as if q were on an H100
    _resolve_call = api._resolve_call
    q, k, v = qkv()
    options = dict(causal=False, scale=None, layout="bshd", window=None, softcap=0.0, pv_split=None, tuning={})
    with_sinks = _resolve_call(q, k, v, sinks=torch.zeros(2), **options).spec
    without = _resolve_call(q, k, v, **options).spec
    assert with_sinks.sinks and not without.sinks and with_sinks.name != without.name


# --- varlen calls with their max lengths: the offsets stay on the device ------------------------------------


@pytest.mark.parametrize("grad", [False, True], ids=("inference", "autograd"))
def test_varlen_offsets_with_both_max_lengths_are_not_read_unless_checked(grad):
    t, _ = varlen()
    t.requires_grad_(grad)  # with autograd the forward and the backward take the max lengths as the checks leave them
    bad = torch.tensor([0, 300, 100, 400], dtype=torch.int32)  # decreasing: only a read of the offsets shows it
    given = dict(cu_seqlens_q=bad, cu_seqlens_k=bad, max_seqlen_q=300, max_seqlen_k=300)
    with pytest.raises(InputError, match="run on a CUDA device"):  # not read: the call reaches the device check
        attention(t, t, t, **given)
    with pytest.raises(InputError, match="nondecreasing, but sequence 1 has length -200"):
        attention(t, t, t, check=True, **given)
    with pytest.raises(InputError, match="nondecreasing"):  # one max length missing: the offsets are read
        attention(t, t, t, cu_seqlens_q=bad, cu_seqlens_k=bad, max_seqlen_q=300)
    with pytest.raises(InputError, match="max_seqlen_q/max_seqlen_k are for variable-length batches"):
        attention(t, t, t, max_seqlen_q=300, max_seqlen_k=300)
    from codegen.backward import attention_backward

    x, lse = t.detach(), torch.zeros(2, 400)
    with pytest.raises(InputError, match="run on a CUDA device"):  # the backward called directly: the same rule
        attention_backward(x, x, x, x, lse, x, **given)
    with pytest.raises(InputError, match="nondecreasing"):
        attention_backward(x, x, x, x, lse, x, **dict(given, max_seqlen_k=None))


@pytest.mark.parametrize("max_len", [0, -1, 2.0, True, "300"])
def test_unread_offsets_need_positive_int_max_lengths(max_len):
    t, cu = varlen()
    with pytest.raises(InputError, match="max_seqlen_k must be a positive int where the offsets are not read"):
        attention(t, t, t, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=max_len)


def fake_gpu(monkeypatch) -> list:
    """attention() on the CPU as if on an H100: no device checks, a faked kernel load, tensor maps and launch (each
    launch's arguments appended to the list returned), empty launcher caches."""
    import hashlib
    from types import SimpleNamespace

    from codegen import api, driver, launcher
    from codegen.families import make_plan

    monkeypatch.setattr(api, "_check_device", lambda t: None)
    monkeypatch.setattr(api, "_current_stream", lambda device: 7)
    monkeypatch.setattr(api, "_sm_count", lambda index: 132)
    monkeypatch.setattr(api, "_loaded", lambda key: (SimpleNamespace(plan=make_plan(key.spec), spec=key.spec),
                                                     SimpleNamespace(dynamic_smem=0, context_handle=1, function_handle=2)))
    monkeypatch.setattr(api, "_LAUNCHERS", {})
    monkeypatch.setattr(api, "_VARLEN_LAUNCHERS", {})
    monkeypatch.setattr(driver, "encode_tensor_map", lambda params, address: hashlib.sha512(
        repr((params, address)).encode()).digest() * 2)
    monkeypatch.setattr(launcher, "stream_counter", lambda device, stream: (4096, None))
    monkeypatch.setattr(launcher, "_load_driver_lib", lambda: None)
    monkeypatch.setattr(launcher, "_lib_set_ctx", lambda handle: 0)
    monkeypatch.setattr(launcher, "_lib_get_ctx", lambda pointer: 0)
    launches = []
    monkeypatch.setattr(launcher, "_lib_launch", lambda *a: launches.append(a) or 0)
    return launches


@pytest.mark.parametrize("tuning", [{"persistent": False}, {"persistent": True}])
def test_a_varlen_call_launches_with_the_arguments_prepare_lays_out(tuning, monkeypatch):
    """attention()'s cached varlen launcher and prepare() pass the kernel the same arguments, but for the per-call
    outputs and the tile counter; the launcher writes each call's offsets and o by address (CPU, faked launch)."""
    import ctypes

    from codegen import api

    launches = fake_gpu(monkeypatch)

    def values(args, names):
        return {n: ctypes.string_at(ctypes.addressof(h), ctypes.sizeof(h)) for n, h in zip(names, args.holders)}

    t, cu = varlen((100, 300), heads=4, dim=128)
    k = t[:, :2]  # grouped-query K/V heads, read in place
    options = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=300, causal=True, **tuning)
    for cu_q in (cu, cu.clone()):  # a second call: new offsets and o, the same launcher
        o, lse = attention(t, k, k, return_lse=True, **dict(options, cu_seqlens_q=cu_q))
        (call,) = api._VARLEN_LAUNCHERS.values()
        names = call.built.plan.abi.names
        fast = values(call._args, names)
        prepared = api.prepare(t, k, k, **dict(options, cu_seqlens_q=cu_q))
        assert prepared.spec == call.built.spec and prepared.grid == call.grid
        slow = values(prepared.args, names)
        per_call = {"o_gmem", "tmap_o", "lse_out", "tile_counter"}
        assert {n for n in names if fast[n] != slow[n]} <= per_call
        read = {n: int.from_bytes(fast[n][:8], "little") for n in ("cu_seqlens_q", "cu_seqlens_k", "o_gmem", "lse_out")}
        assert read == {"cu_seqlens_q": cu_q.data_ptr(), "cu_seqlens_k": cu.data_ptr(), "o_gmem": o.data_ptr(),
                        "lse_out": lse.data_ptr()}
        assert o.shape == t.shape and lse.shape == (4, 400)
    assert len(launches) == 2 and launches[-1][1:4] == call.grid


def _compiled(fullgraph: bool, dynamic=None, **options):
    def call(q, k, v):
        torch._dynamo.reset()
        return torch.compile(lambda q, k, v: attention(q, k, v, **options), fullgraph=fullgraph, dynamic=dynamic,
                             backend="eager")(q, k, v)
    return call


@pytest.mark.parametrize("dynamic", [None, True], ids=("static", "dynamic"))
@pytest.mark.parametrize("make, options, message", [
    (lambda: qkv(dtype=torch.float32), {}, "float32"),
    (lambda: [qkv()[0], qkv()[1].bfloat16(), qkv()[2]], {}, "one dtype"),
    (lambda: [t[0] for t in qkv()], {}, r"rank 4 \(B, S, H, D\)"),
    (lambda: [t[0] for t in qkv()], {"layout": "bhsd"}, r"rank 4 \(B, H, S, D\)"),
    (lambda: qkv(), {"cu_seqlens_q": torch.tensor([0, 128], dtype=torch.int32),
                     "cu_seqlens_k": torch.tensor([0, 128], dtype=torch.int32),
                     "max_seqlen_q": 128, "max_seqlen_k": 128}, r"rank 3 \(total, H, D\)"),
], ids=("dtype", "mixed-dtypes", "rank", "rank-bhsd", "rank-varlen"))
def test_torch_compile_refuses_a_wrong_rank_or_dtype_while_tracing(make, options, message, dynamic):
    # Rank and dtype are never symbolic, so the trace refuses them (before: a rank-2 q failed inside the op's fake
    # implementation with an IndexError, a float32 one traced). Without fullgraph the frame falls back to eager,
    # which raises the same InputError; with fullgraph=True dynamo's own error carries it.
    q, k, v = make()
    with pytest.raises(InputError, match=message):
        _compiled(False, dynamic, **options)(q, k, v)
    with pytest.raises(Exception, match=f"InputError.*{message}"):
        _compiled(True, dynamic, **options)(q, k, v)


@pytest.mark.parametrize("options, message", [({"window": (3.7, -1)}, "window must be a sequence of ints"),
                                              ({"block_n": 64.9}, "block_n must be int"),
                                              ({"short_tail": 1}, "short_tail must be bool")])
def test_torch_compile_refuses_an_option_of_the_wrong_type_instead_of_converting_it(options, message):
    with pytest.raises(Exception, match=f"InputError.*{message}"):
        _compiled(True, **options)(*qkv())


def test_a_cached_launcher_is_not_found_by_an_equal_option_of_another_type(monkeypatch):
    """scale=np.float32(0.125) equals 0.125, but a first call refuses it: the cache's key holds the options' types,
    so the second call is checked, not launched (CPU, faked launch, as above)."""
    import numpy as np

    from codegen import api

    launches = fake_gpu(monkeypatch)
    q, k, v = qkv()
    for _ in range(2):
        attention(q, k, v, scale=0.125)
    assert len(launches) == 2 and len(api._LAUNCHERS) == 1
    with pytest.raises(InputError, match="scale must be a positive finite number"):
        attention(q, k, v, scale=np.float32(0.125))
    assert len(launches) == 2


@pytest.mark.parametrize("dynamic", [None, True], ids=("static", "dynamic"))
def test_torch_compile_traces_a_good_call_to_the_op(dynamic):
    # No graph break before the op (on the CPU it has no kernel: NotImplementedError names it).
    with pytest.raises(NotImplementedError, match="flashgen::attention"):
        _compiled(True, dynamic)(*qkv())


def test_threads_that_miss_a_full_launcher_cache_at_once_do_not_trip_over_each_other():
    import threading

    from codegen.launcher import remember

    cache, errors, start = {}, [], threading.Barrier(16)

    def insert(i):
        start.wait()
        try:
            for j in range(2000):
                remember(cache, (i, j), j, 1)
        except Exception as e:  # noqa: BLE001 - any exception is the failure
            errors.append(e)

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(16)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: the race shows if there is one
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors and len(cache) == 1
