"""Correctness and timing helpers shared by the tests, `gen.py --run` and the benchmark (torch on a GPU)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable


# Score bytes a reference helper keeps alive per group of heads (several such matrices live at once): small enough
# for six test workers on one 80 GB GPU beside the kernels' own tensors.
SCORE_BYTES = 2**29


def head_groups(batch: int, heads: int, bytes_per_head: int, budget: int):
    """(b, slice of heads) groups whose score matrices of bytes_per_head each stay under budget (one head at least)."""
    step = max(1, budget // max(1, bytes_per_head))
    for b in range(batch):
        for h0 in range(0, heads, step):
            yield b, slice(h0, min(h0 + step, heads))


def torch_dtype(name: str):
    """The torch dtype of a KernelSpec dtype name ("f16", "bf16")."""
    import torch

    from layouts.dtypes import DTYPES

    return getattr(torch, DTYPES[name].torch)


def reference(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
              window: tuple[int, int] | None = None, softcap: float = 0.0, sinks=None,
              max_score_bytes: int = SCORE_BYTES):
    """Attention in float64 on the inputs' device: (o, lse) with o in q's layout, lse (B, H, S_q).

    k and v may have fewer heads than q (grouped-query: query head h reads K/V head h // (H / H_kv)) and
    another length. Causal and window=(left, right) are bottom-right aligned: query i's diagonal is key
    i + S_k - S_q. `sinks` (H,): a logit per query head that joins each of its rows' softmax denominators (a
    score with no value) and the logsumexp. A row that sees no key outputs 0 with logsumexp -inf (flashgen's
    convention), or its head's sink with sinks. Heads are processed in groups so the float64 score matrix stays
    under `max_score_bytes`.
    """
    import torch

    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    keep = band_mask(sq, sk, causal=causal, window=window, device=q.device)
    o = torch.empty(batch, heads, sq, v.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.empty(batch, heads, sq, dtype=torch.float64, device=q.device)
    for b, hs in head_groups(batch, heads, sq * sk * 8, max_score_bytes):
        kv = torch.arange(hs.start, hs.stop, device=q.device) // group
        scores = (q[b, hs].double() @ k[b, kv].double().transpose(-1, -2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        scores = _with_sinks(scores, sinks, hs)
        lse[b, hs] = torch.logsumexp(scores, dim=-1)
        o[b, hs] = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :sk] @ v[b, kv].double()
    if layout == "bshd":
        o = o.transpose(1, 2)
    return o, lse


def _with_sinks(scores, sinks, heads=slice(None)):
    """(..., H, S_q, S_k) scores with each head's sink appended as one more key column (no sinks: as they are)."""
    import torch

    if sinks is None:
        return scores
    sink = sinks[heads].to(device=scores.device, dtype=scores.dtype)[:, None, None]
    return torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1)


def band_mask(sq: int, sk: int, *, causal: bool, window: tuple[int, int] | None, device):
    """Boolean (S_q, S_k) mask of the keys each query sees, or None when it sees them all."""
    import torch

    left, right = window if window else (-1, -1)
    if causal:  # causal sets right = 0 whatever the window's right bound, as in the kernel
        right = 0
    if left < 0 and right < 0:
        return None
    offset = (torch.arange(sk, device=device)[None, :] - torch.arange(sq, device=device)[:, None]) - (sk - sq)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= offset <= right
    if left >= 0:
        keep &= offset >= -left
    return keep



def _band_scores(qb, kb, *, scale, softcap, causal, window):
    """Scaled (and capped) scores of (B, H, S, D) q and k, -inf outside the band: what the same-dtype yardsticks
    softmax."""
    import torch

    scale = 1.0 / math.sqrt(qb.shape[-1]) if scale is None else scale
    scores = (qb @ kb.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    keep = band_mask(qb.shape[2], kb.shape[2], causal=causal, window=window, device=qb.device)
    return scores if keep is None else scores.masked_fill(~keep, float("-inf"))

def same_dtype_output(q, k, v, *, causal: bool = False, window=None, softcap: float = 0.0,
                      scale: float | None = None, layout: str = "bshd", sinks=None,
                      max_score_bytes: int = SCORE_BYTES):
    """A flash-style computation in the inputs' dtype, returned in q's layout: products accumulated in float32,
    softmax in float32 (with `sinks` in its denominators), P rounded to the inputs' dtype before PV, the output
    rounded too. The yardstick for variants SDPA cannot run (softcap, sinks) or aligns differently (causal with
    S_q != S_k). Heads are processed in groups, as in `reference`."""
    import torch

    qb, kb, vb = ((t.transpose(1, 2) if layout == "bshd" else t).float() for t in (q, k, v))  # (B, H, S, D)
    (batch, heads, sq, _), sk = qb.shape, kb.shape[2]
    group = heads // kb.shape[1]
    out = torch.empty(batch, heads, sq, vb.shape[-1], dtype=q.dtype, device=q.device)
    for b, hs in head_groups(batch, heads, sq * sk * 4, max_score_bytes):
        kv = torch.arange(hs.start, hs.stop, device=q.device) // group
        scores = _band_scores(qb[b:b + 1, hs], kb[b:b + 1, kv], scale=scale, softcap=softcap, causal=causal,
                              window=window)
        p = torch.softmax(_with_sinks(scores, sinks, hs), dim=-1).nan_to_num(0.0)[..., :sk].to(q.dtype).float()
        out[b, hs] = (p @ vb[b:b + 1, kv])[0].to(q.dtype)
    return out.transpose(1, 2) if layout == "bshd" else out


def kvcache_reference(q, k_cache, v_cache, lengths, *, causal: bool = True, window=None, softcap: float = 0.0,
                      scale: float | None = None, sinks=None, same_dtype: bool = False):
    """Decode attention as `attention_with_kvcache` defines it, sequence by sequence: q (B, S_q, H, D) over the
    first lengths[b] rows of the (B_cache, S_max, H_kv, D) caches (the new tokens already in them), query t at
    position lengths[b] - S_q + t. Float64 (o, lse), or with same_dtype the flash-style computation in q's dtype
    (the yardstick: products and softmax in float32, P and o rounded). `sinks` (H,) join each row's denominator;
    lse includes them. A row that sees no key (and no sink) outputs 0 with lse -inf."""
    import torch

    batch, sq, heads, dim = q.shape
    group = heads // k_cache.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    work = torch.float32 if same_dtype else torch.float64
    o = torch.zeros(batch, sq, heads, dim, dtype=work, device=q.device)
    lse = torch.full((batch, heads, sq), float("-inf"), dtype=torch.float64, device=q.device)
    for b, n in enumerate(lengths):
        qb = q[b].transpose(0, 1).to(work)                                  # (H, S_q, D)
        kb = k_cache[b, :n].transpose(0, 1).to(work).repeat_interleave(group, 0)  # (H, n, D)
        vb = v_cache[b, :n].transpose(0, 1).to(work).repeat_interleave(group, 0)
        scores = (qb @ kb.transpose(-1, -2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        keep = band_mask(sq, n, causal=causal, window=window, device=q.device)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        if sinks is not None:
            scores = torch.cat([scores, sinks.to(work)[:, None, None].expand(heads, sq, 1)], dim=-1)
        lse[b] = torch.logsumexp(scores.double(), dim=-1)
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :n]
        if same_dtype:
            p = p.to(q.dtype).to(work)
        o[b] = (p @ vb).transpose(0, 1)
    return (o.to(q.dtype) if same_dtype else o), lse


def sequences(cu_seqlens_q, cu_seqlens_k) -> list[tuple[slice, slice]]:
    """The (query rows, key rows) of each sequence of a packed variable-length batch."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])) for i in range(len(cq) - 1)]


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **options):
    """`reference` for packed (total, H, D) tensors, each sequence on its own: o (total_q, H, D) float64 and
    lse (H, total_q). Rows of a sequence without keys are 0 with logsumexp -inf (with sinks: their head's sink)."""
    import torch

    o = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    sinks = options.get("sinks")
    for rows, keys in sequences(cu_seqlens_q, cu_seqlens_k):
        if rows.stop > rows.start and keys.stop > keys.start:
            o_seq, lse_seq = reference(q[None, rows], k[None, keys], v[None, keys], **options)
            o[rows], lse[:, rows] = o_seq[0], lse_seq[0]
        elif sinks is not None:
            lse[:, rows] = sinks.to(device=q.device, dtype=torch.float64)[:, None]
    return o, lse


def same_dtype_output_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **options):
    """`same_dtype_output` for a packed batch, sequence by sequence."""
    import torch

    out = torch.zeros_like(q)
    for rows, keys in sequences(cu_seqlens_q, cu_seqlens_k):
        if rows.stop > rows.start and keys.stop > keys.start:
            out[rows] = same_dtype_output(q[None, rows], k[None, keys], v[None, keys], **options)[0]
    return out


def reference_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
                       window: tuple[int, int] | None = None, softcap: float = 0.0, max_score_bytes: int = SCORE_BYTES):
    """The gradients of `reference`'s o given do (q's shape), in float64: (dq, dk, dv) in the inputs' layout, dk
    and dv with k's heads (a K/V head sums over the query heads that read it).

    Written out rather than taken from autograd, so a test can hold the two against each other: P is reference's
    softmax, dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)) (times 1 - tanh^2 under softcap),
    dQ = scale dS K, dK = scale dS^T Q. A row that sees no key has P = 0, hence dq = 0; a key no query sees gets
    dk = dv = 0. Heads are processed in groups so each float64 score matrix stays under `max_score_bytes` (about
    four of them are alive at once).
    """
    import torch

    if layout == "bshd":
        q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
    batch, heads, sq, dim = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    keep = band_mask(sq, sk, causal=causal, window=window, device=q.device)
    f64 = dict(dtype=torch.float64, device=q.device)
    dq = torch.zeros(batch, heads, sq, dim, **f64)
    dk = torch.zeros(batch, kv_heads, sk, dim, **f64)
    dv = torch.zeros(batch, kv_heads, sk, v.shape[-1], **f64)
    for b, hs in head_groups(batch, heads, sq * sk * 8, max_score_bytes):
        kv = torch.arange(hs.start, hs.stop, device=q.device) // group
        qb, kb, vb, dob = q[b, hs].double(), k[b, kv].double(), v[b, kv].double(), do[b, hs].double()
        scores = (qb @ kb.transpose(-1, -2)) * scale
        capped = None
        if softcap:
            capped = torch.tanh(scores / softcap)
            scores = softcap * capped
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        del scores
        ds = dob @ vb.transpose(-1, -2)                          # dP, turned into dS in place
        ds.sub_((p * ds).sum(-1, keepdim=True)).mul_(p)
        if capped is not None:
            ds.mul_(capped.square_().neg_().add_(1.0))           # d(softcap tanh(x / softcap)) = 1 - tanh^2
        dq[b, hs] = (ds @ kb) * scale
        dk[b].index_add_(0, kv, (ds.transpose(-1, -2) @ qb) * scale)
        dv[b].index_add_(0, kv, p.transpose(-1, -2) @ dob)
    if layout == "bshd":
        dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq, dk, dv


def reference_backward_varlen(q, k, v, do, cu_seqlens_q, cu_seqlens_k, **options):
    """`reference_backward` for packed (total, H, D) tensors, each sequence on its own: float64 dq (total_q, H, D),
    dk and dv (total_k, H_kv, D); rows of a sequence without keys or queries are 0."""
    import torch

    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    for rows, keys in sequences(cu_seqlens_q, cu_seqlens_k):
        if rows.stop > rows.start and keys.stop > keys.start:
            grads = reference_backward(q[None, rows], k[None, keys], v[None, keys], do[None, rows], **options)
            dq[rows], dk[keys], dv[keys] = (g[0] for g in grads)
    return dq, dk, dv


def same_dtype_backward(q, k, v, do, *, causal: bool = False, window=None, softcap: float = 0.0,
                        scale: float | None = None, layout: str = "bshd"):
    """(dq, dk, dv) in the inputs' dtype and layout by PyTorch's autograd through attention computed in that dtype
    (scores, softmax, P and o each rounded to it, K/V heads repeated for grouped-query): FlashAttention's
    same-dtype reference (its attention_ref with upcast=False), the yardstick its tests hold a backward kernel's
    error to, 2x over."""
    import torch

    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        qb, kb, vb = ((t.transpose(1, 2) if layout == "bshd" else t) for t in leaves)  # (B, H, S, D)
        group = qb.shape[1] // kb.shape[1]
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
        scores = _band_scores(qb, kb, scale=scale, softcap=softcap, causal=causal, window=window)
        o = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ vb
        if layout == "bshd":
            o = o.transpose(1, 2)
        return torch.autograd.grad(o, leaves, do)


def same_dtype_backward_varlen(q, k, v, do, cu_seqlens_q, cu_seqlens_k, **options):
    """`same_dtype_backward` for a packed batch, sequence by sequence."""
    import torch

    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for rows, keys in sequences(cu_seqlens_q, cu_seqlens_k):
        if rows.stop > rows.start and keys.stop > keys.start:
            grads = same_dtype_backward(q[None, rows], k[None, keys], v[None, keys], do[None, rows], **options)
            dq[rows], dk[keys], dv[keys] = (g[0] for g in grads)
    return dq, dk, dv


def worst_element(x, ref) -> str:
    """Where x is furthest from ref, for failure messages: index, value, reference, and whether that value
    occurs elsewhere in ref (a stale or misplaced element rather than a numeric error)."""
    import torch

    diff = (x.double() - ref).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), x.shape))
    got, want = float(x.reshape(-1)[flat]), float(ref.reshape(-1)[flat])
    elsewhere = bool((ref.to(x.dtype).double() == got).any()) if got == got else False  # in x's precision
    return (f"worst at {index}: {got!r} vs {want!r}; {int((diff > 1e-2 * ref.abs().max()).sum())} elements off by "
            f"over 1% of max|ref|; value {'occurs' if elsewhere else 'does not occur'} elsewhere in the reference")


def rel_err(x, ref, *, norm_at_least: float = 0.0) -> float:
    """||x - ref|| / ||ref|| in float64 (||ref|| taken as at least norm_at_least); inf when x holds a NaN or inf."""
    import torch

    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return float((x - ref).norm() / ref.norm().clamp(min=norm_at_least))


def row_rel_err(x, ref) -> float:
    """The worst row's ||x_r - ref_r|| / ||ref_r||, a row being one query of one head (the last dim); a row whose
    reference is 0 (it sees no key) counts its absolute error. One wrong row in thousands barely moves rel_err:
    it moves this. inf when x holds a NaN or inf."""
    import torch

    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    if x.numel() == 0:
        return 0.0
    diff, size = (x - ref).norm(dim=-1), ref.norm(dim=-1)
    return float(torch.where(size > 0, diff / size.clamp_min(torch.finfo(torch.float64).tiny), diff).max())


def accuracy_failure(x, ref, yardstick, *, factor: float = 2.0, floor: float = 1e-6,
                     name: str = "the same-dtype PyTorch", row_measure=None) -> str | None:
    """Why x fails against the float64 ref, or None. `yardstick` is a same-dtype computation of the same
    attention; x's error may be at most `factor` times its error (or `floor`), over the whole tensor and in
    the worst row alike (row_rel_err, or `row_measure`: a (function, label) pair)."""
    for measure, what in ((rel_err, "rel err"), row_measure or (row_rel_err, "worst row's rel err")):
        err, allowed = measure(x, ref), measure(yardstick, ref)
        if not err <= max(factor * allowed, floor):
            return f"{what} {err:.3e} > {factor:g} x {name}'s {allowed:.3e}; {worst_element(x, ref)}"
    return None


# A logsumexp's error against float64: float32 running maxima, sums and log2, per element. Tight enough that a row
# whose sum lost one key of a few thousand (o then scaled by 1e-3 or less, under o's own bound) fails.
LSE_ATOL, LSE_RTOL = 1e-4, 1e-5


def lse_rel_err(lse, ref) -> float:
    """||lse - ref|| over the larger of ||ref|| and sqrt(rows), in float64; inf for a NaN or inf in lse. A row's
    logsumexp can sit near 0 (one key with q.k near 0), so over a handful of rows the plain relative error divides
    by almost nothing (float32's 1e-7 on a value of 1e-3 reads as 1e-4); normalizing by at least 1 a row keeps the
    global bound meaningful there and changes nothing where the rows' RMS is 1 or more. lse_failure checks each row."""
    return rel_err(lse, ref.to(lse.device).double(), norm_at_least=ref.numel() ** 0.5)


def lse_failure(lse, ref) -> str | None:
    """Why lse fails against the float64 `ref`, or None: infinite (no key and no sink) exactly where ref is, NaN
    nowhere, and within LSE_ATOL + LSE_RTOL |ref| elsewhere."""
    import torch

    ref = ref.to(lse.device).double()
    lse = lse.double()
    if torch.isnan(lse).any():
        return f"{int(torch.isnan(lse).sum())} logsumexp rows hold NaN (never written?)"
    if lse.shape != ref.shape:
        return f"lse has shape {tuple(lse.shape)}, the reference {tuple(ref.shape)}"
    if torch.isposinf(lse).any() or not torch.equal(torch.isneginf(lse), torch.isneginf(ref)):
        return "lse is -inf where the reference is not, or not where it is (or +inf anywhere)"
    finite = torch.isfinite(ref)
    if not bool(finite.any()):
        return None
    err, bound = (lse - ref)[finite].abs(), LSE_ATOL + LSE_RTOL * ref[finite].abs()
    if bool((err <= bound).all()):
        return None
    worst = int((err - bound).argmax())
    return (f"lse off by {float(err[worst]):.3e} at a value {float(ref[finite][worst]):.4f}; "
            f"{int((err > bound).sum())} of {err.numel()} outside {LSE_ATOL:g} + {LSE_RTOL:g} |ref|")


def row_err_vs_rms(x, ref) -> float:
    """The worst row's ||x_r - ref_r|| over the RMS row norm of ref (||ref|| / sqrt(rows)), a row being the last dim.
    One wrong row stands out as in row_rel_err, but a row far smaller than the others is not held to its own tiny
    norm: a gradient row that is nearly 0 (a softmax almost one-hot, the difference of two nearly equal sums) is
    missed by more than its norm through float32 rounding alone. inf when x holds a NaN or inf."""
    import torch

    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    if x.numel() == 0:
        return 0.0
    typical = ref.norm() / math.sqrt(ref.numel() // ref.shape[-1])
    return float((x - ref).norm(dim=-1).max() / typical)


def gradient_failure(x, ref, yardstick, *, factor: float = 2.0, floor: float = 1e-6, atol: float = 0.0,
                     name: str = "the same-dtype PyTorch") -> str | None:
    """Why a gradient x (dq, dk or dv) fails against its float64 ref, or None: accuracy_failure's bounds, the
    whole tensor's rel err and the worst row's error, each at most `factor` times the yardstick's, the row's taken
    against the RMS row (row_err_vs_rms) rather than its own norm. A reference that is 0 throughout (every query
    sees one key, so its softmax has no slope: dq = dk = 0) has no scale to be relative to: every element of x
    must then be within atol (or factor times the yardstick's largest)."""
    if ref.numel() and not ref.abs().max() > 0:
        err, allowed = float(x.double().abs().max()), float(yardstick.double().abs().max())
        if not err <= max(factor * allowed, atol):
            return (f"the reference is 0 throughout: |x| up to {err:.3e} > max({factor:g} x {name}'s {allowed:.3e}, "
                    f"atol {atol:.1e}); {worst_element(x, ref)}")
        return None
    return accuracy_failure(x, ref, yardstick, factor=factor, floor=floor, name=name,
                            row_measure=(row_err_vs_rms, "worst row's error (of the RMS row)"))


def snr_db(x, ref) -> float:
    err = rel_err(x, ref)
    return float("inf") if err == 0 else -20.0 * math.log10(err) if math.isfinite(err) else float("-inf")


def sdpa_output(q, k, v, *, causal: bool, layout: str = "bshd", scale: float | None = None):
    """PyTorch SDPA's output in the inputs' dtype and layout: the yardstick's numbers."""
    import torch

    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return o.transpose(1, 2) if layout == "bshd" else o


# Timing (time_gpu): how far ahead of the timed calls the GPU is put to sleep, and the clock it sleeps by.
QUEUE_AHEAD_S_PER_ITER = 20e-6  # GPU sleep per timed iteration beyond the call's own host time (events)
MAX_QUEUE_AHEAD_S = 1.0
ASSUMED_CLOCK_HZ = 2.0e9


def time_gpu(torch, fn: Callable[[], object], *, warmup: int, iters: int) -> float:
    """Median milliseconds per call by CUDA events (time_gpu_samples)."""
    return statistics.median(time_gpu_samples(torch, fn, warmup=warmup, iters=iters))


def time_gpu_samples(torch, fn: Callable[[], object], *, warmup: int, iters: int,
                     min_sleep_s: float = 0.0) -> list[float]:
    """Milliseconds of each of `iters` calls by CUDA events, after `warmup` untimed calls.

    All iterations are enqueued behind a GPU sleep long enough to cover the CPU's enqueueing, and
    synchronized once, so each event pair brackets GPU work alone. Synchronizing every iteration (as
    a simple per-call timer would) adds the launch latency, about 20 us, to every call; a sleep shorter than
    the enqueueing lets the GPU catch up and time the CPU (flex_attention's guards cost ~100 us a call).
    The sleep is at least `min_sleep_s`: under a power cap the idle ahead of the calls sets their clock, so
    implementations compared side by side get the same one (bench.gpu_run.round_sleep_s).
    """
    host_s = []
    for _ in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn()
        host_s.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(max(min_sleep_s, queue_ahead_s(statistics.median(host_s), iters)) * ASSUMED_CLOCK_HZ))
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def queue_ahead_s(host_s_per_call: float, iters: int) -> float:
    """GPU sleep before the timed calls: their enqueueing (events included) with a margin, capped."""
    per_call = 1.5 * host_s_per_call + QUEUE_AHEAD_S_PER_ITER
    return min(MAX_QUEUE_AHEAD_S, iters * per_call)
