"""Where a decode call's time goes: host per call, GPU per call behind a sleep or not, with events per call or not, and a profile.

    python3 scripts/decode_host_probe.py   (on the GPU machine; bench/LOG.md d17)
"""
import cProfile, io, pathlib, pstats, statistics, sys, time

# The checkout's root on the path (codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import codegen
from codegen import launcher as L
from codegen.decode import attention_with_kvcache as fn

def gpu_loop(f, iters=50, sleep=True, per_event=False):
    for _ in range(5): f()
    torch.cuda.synchronize()
    if sleep: torch.cuda._sleep(2_000_000)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        f()
        if per_event: ev[i + 1].record()
    if not per_event: ev[-1].record()
    torch.cuda.synchronize()
    if per_event:
        return statistics.median(a.elapsed_time(b) for a, b in zip(ev, ev[1:])) * 1000
    return ev[0].elapsed_time(ev[-1]) / iters * 1000

def host_loop(f, calls=2000):
    for _ in range(50): f()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls): f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / calls * 1e6)
    return best

sdpa = torch.nn.functional.scaled_dot_product_attention
for B, S in ((1, 2048), (1, 8192), (1, 32768), (8, 2048)):
    sets = []
    for _ in range(2):
        q = torch.randn(B, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(B, S, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        sets.append((q, k, v, lens, torch.empty_like(q)))
    i = [0]
    def mk(**kw):
        def f():
            s = sets[i[0] & 1]; i[0] += 1
            return fn(s[0], s[1], s[2], s[3], causal=False, **kw)
        return f
    def mko(**kw):
        def f():
            s = sets[i[0] & 1]; i[0] += 1
            return fn(s[0], s[1], s[2], s[3], causal=False, out=s[4], **kw)
        return f
    def cud():
        s = sets[i[0] & 1]; i[0] += 1
        return sdpa(s[0].transpose(1, 2), s[1].transpose(1, 2), s[2].transpose(1, 2), enable_gqa=True)
    def captured():
        """One call captured in a CUDA graph (the first input set), replayed: what an engine's decode step costs."""
        s = sets[0]
        fn(s[0], s[1], s[2], s[3], causal=False)  # compiled and loaded outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(s[0], s[1], s[2], s[3], causal=False)
        return graph.replay

    def compiled():
        """The call under torch.compile (the custom op, codegen.torch_op), on the first input set."""
        step = torch.compile(lambda q, k, v, n: fn(q, k, v, n, causal=False), fullgraph=True)
        return lambda: step(*sets[0][:4])

    print(f"== B={B} S={S}")
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        variants = {"default": mk(), "out=": mko(), "pdl=0": mk(pdl=False), "s16": mk(num_splits=16),
                    "s16 pdl=0": mk(num_splits=16, pdl=False), "s1": mk(num_splits=1), "graph": captured(),
                    "compiled": compiled(), "cudnn": cud}
        for name, f in variants.items():
            h = host_loop(f)
            g_sleep = gpu_loop(f, sleep=True)
            g_ev = gpu_loop(f, sleep=False, per_event=True)
            g_ev_sleep = gpu_loop(f, sleep=True, per_event=True)
            print(f"  {name:10s} host {h:6.1f} us | GPU/call behind sleep {g_sleep:6.1f} | per-event no sleep {g_ev:6.1f}"
                  f" | per-event behind sleep {g_ev_sleep:6.1f}")
        # host path without the launch itself
        real_ex, real = L._lib_launch_ex, L._lib_launch
        L._lib_launch_ex = lambda *a: 0
        L._lib_launch = lambda *a: 0
        print(f"  host without the launch: {host_loop(mk()):.1f} us; out= {host_loop(mko()):.1f} us")
        L._lib_launch_ex, L._lib_launch = real_ex, real
        if B == 1 and S == 2048:
            f = mk()
            pr = cProfile.Profile(); pr.enable()
            for _ in range(3000): f()
            pr.disable(); torch.cuda.synchronize()
            st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(25); print(st.getvalue()[:6000])
            s = sets[0]
            parts = {
              "torch.empty o": lambda: torch.empty(s[0].shape, dtype=s[0].dtype, device=s[0].device),
              "is_grad_enabled+requires_grad": lambda: torch.is_grad_enabled() and any(t.requires_grad for t in s[:3]),
              "data_ptr x3": lambda: [t.data_ptr() for t in s[:3]],
              "current stream": lambda: codegen.api._current_stream(s[0].device),
              "q.shape,q.stride()": lambda: (s[0].shape, s[0].stride()),
              "q.device": lambda: s[0].device,
              "event record": lambda: torch.cuda.Event(enable_timing=True).record(),
            }
            for name, p in parts.items():
                t0 = time.perf_counter()
                for _ in range(20000): p()
                print(f"  part {name:32s} {(time.perf_counter()-t0)/20000*1e6:6.2f} us")
