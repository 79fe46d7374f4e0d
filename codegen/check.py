"""Correctness and timing helpers shared by the tests, `gen.py --run` and the benchmark (torch on a GPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def reference(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
              max_score_bytes: int = 2**31):
    """Attention in float64 on the inputs' device: (o, lse) with o in the inputs' layout, lse (B, H, S).

    Heads are processed in groups so the float64 score matrix stays under `max_score_bytes`.
    Causal is bottom-right aligned: query i sees keys up to i + (S_k - S_q).
    """
    import torch

    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    batch, heads, sq, dim = q.shape
    sk = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    group = max(1, max_score_bytes // (sq * sk * 8))
    o = torch.empty(batch, heads, sq, v.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.empty(batch, heads, sq, dtype=torch.float64, device=q.device)
    keep = None
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
    for b in range(batch):
        for h0 in range(0, heads, group):
            hs = slice(h0, h0 + group)
            scores = (q[b, hs].double() @ k[b, hs].double().transpose(-1, -2)) * scale
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            lse[b, hs] = torch.logsumexp(scores, dim=-1)
            o[b, hs] = torch.softmax(scores, dim=-1) @ v[b, hs].double()
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
