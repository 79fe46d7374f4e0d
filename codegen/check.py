"""Correctness and timing helpers shared by the tests, `gen.py --run` and the benchmark (torch on a GPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def reference(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd"):
    """Attention in float64 on the inputs' device: (o, lse) with o in the inputs' layout, lse (B, H, S)."""
    import torch

    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.double() for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        sq, sk = scores.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.softmax(scores, dim=-1) @ v
    if layout == "bshd":
        o = o.transpose(1, 2)
    return o, lse


def rel_err(x, ref) -> float:
    """||x - ref|| / ||ref|| in float64; inf when x holds a NaN or inf."""
    import torch

    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return float((x - ref).norm() / ref.norm())


def snr_db(x, ref) -> float:
    err = rel_err(x, ref)
    return float("inf") if err == 0 else -20.0 * math.log10(err) if math.isfinite(err) else float("-inf")


def sdpa_error(q, k, v, ref, *, causal: bool, layout: str = "bshd") -> float:
    """The same-dtype PyTorch SDPA error against the float64 reference: the yardstick for ours."""
    import torch

    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if layout == "bshd":
        o = o.transpose(1, 2)
    return rel_err(o, ref)


@dataclass(frozen=True)
class Timing:
    ms: float
    tflops: float


def attention_flops(batch: int, seq: int, heads: int, dim: int, causal: bool) -> float:
    flops = 4.0 * batch * heads * seq * seq * dim
    return flops / 2 if causal else flops


def time_cuda(fn, *, warmup: int = 10, iters: int = 50) -> float:
    """Median milliseconds of `fn` by CUDA events, after warm-up."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]
