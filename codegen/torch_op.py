"""flashgen's calls as torch custom ops, so torch.compile traces them into its graph without a break: the forward
and backward (`torch.ops.flashgen.attention`, `torch.ops.flashgen.attention_backward`; training included, the
forward op's autograd formula being the backward op) and decode over a KV cache
(`torch.ops.flashgen.attention_with_kvcache`, and `..._append` where new tokens are written into the cache in
place, the one op that mutates its inputs). The ops' fake implementations give the output shapes, their real
ones are the eager calls (codegen.api, codegen.backward, codegen.decode). Eager calls do not go through the ops
(their dispatch costs more than the whole call), only traced ones."""

from __future__ import annotations

from typing import Optional

import torch

from . import api, backward

# The backward's refusals under torch.compile: run as they are while tracing, their result a constant.
_traced_refusal = torch.compiler.assume_constant_result(backward.backward_refusal)


@torch.library.custom_op("flashgen::attention", mutates_args=(), device_types="cuda")
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                 layout: str, window: Optional[list[int]], softcap: float, pv_split: Optional[list[int]],
                 sinks: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
                 cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                 block_n: int, stages: int, pingpong: Optional[bool], persistent: Optional[bool],
                 tile_overlap: Optional[bool], short_tail: bool, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    tuning = dict(block_n=block_n, stages=stages, pingpong=pingpong, persistent=persistent, tile_overlap=tile_overlap,
                  short_tail=short_tail)
    varlen = None if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    with torch.no_grad():  # below autograd: the op's autograd formula (registered below) owns the gradients
        return api._call(q, k, v, causal, scale, layout, None if window is None else tuple(window), softcap,
                         None if pv_split is None else tuple(pv_split), tuning, sinks=sinks, varlen=varlen)


@attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, layout, window, softcap, pv_split, sinks, cu_seqlens_q, cu_seqlens_k,
                    max_seqlen_q, max_seqlen_k, block_n, stages, pingpong, persistent, tile_overlap, short_tail,
                    deterministic):
    if cu_seqlens_q is not None:  # packed (total, H, D): lse (H, total)
        lse_shape = (q.shape[1], q.shape[0])
    else:
        batch, heads, seq = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else q.shape[:3]
        lse_shape = (batch, heads, seq)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(lse_shape, dtype=torch.float32))


@torch.library.custom_op("flashgen::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                          do: torch.Tensor, causal: bool, scale: Optional[float], layout: str,
                          window: Optional[list[int]], softcap: float, deterministic: bool,
                          cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                          max_seqlen_q: Optional[int],
                          max_seqlen_k: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward.attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale, layout=layout,
                              window=None if window is None else tuple(window), softcap=softcap,
                              deterministic=deterministic, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)


@attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, o, lse, do, causal, scale, layout, window, softcap, deterministic, cu_seqlens_q,
                             cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, layout, window, softcap, _pv_split, _sinks, cu_q, cu_k, max_q, max_k = inputs[:14]
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k)
    ctx.options = (causal, scale, layout, window, softcap, inputs[-1], max_q, max_k)
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    causal, scale, layout, window, softcap, deterministic, max_q, max_k = ctx.options
    dq, dk, dv = attention_backward_op(q, k, v, o, lse, do, causal, scale, layout, window, softcap, deterministic,
                                       cu_q, cu_k, max_q, max_k)
    return (dq, dk, dv) + (None,) * 18  # nothing for the options, sinks included (refused if they need a gradient)


attention_op.register_autograd(_backward, setup_context=_setup_context)


TRACED_KNOBS = ("block_n", "stages", "pingpong", "persistent", "tile_overlap", "short_tail")  # the op's arguments
UNTRACED = ("a varlen batch without both max lengths or with check=True (its offsets are read on the host) or a knob "
            f"the custom op does not take (it takes {', '.join(TRACED_KNOBS)})")


def _eager_attention(q, k, v, options):
    """attention() outside the graph, for a call the custom op cannot carry: a graph break, then the eager call."""
    return api.attention(q, k, v, return_lse=True, **options)


def _graph_break(fn, untraced: str):
    """fn run outside torch.compile's graph (a break dynamo names, saying why), for calls an op cannot carry."""
    try:
        return torch.compiler.disable(fn, reason=f"flashgen: {untraced} runs eagerly")
    except TypeError:  # a torch whose disable() takes no reason
        return torch.compiler.disable(fn)


_eager_attention = _graph_break(_eager_attention, UNTRACED)


def compiled_attention(q, k, v, *, causal, scale, layout, window, softcap, pv_split, sinks, cu_seqlens_q, cu_seqlens_k,
                       max_seqlen_q, max_seqlen_k, tuning, deterministic=False, check=False):
    """attention() as torch.compile sees it: the custom op; where q, k or v requires grad, the backward kernels'
    refusals are raised while tracing, before anything runs. A variable-length batch goes in the op given both max
    lengths (its offsets are never read); without them, with check=True, or with a knob the op does not take, the
    call breaks the graph and runs eagerly (`fullgraph=True` refuses that, saying why)."""
    varlen = any(x is not None for x in (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    unread = cu_seqlens_q is not None and cu_seqlens_k is not None and not api.reads_offsets(check, max_seqlen_q,
                                                                                               max_seqlen_k)
    if (varlen and not unread) or set(tuning) - set(TRACED_KNOBS):
        return _eager_attention(q, k, v, dict(
            causal=causal, scale=scale, layout=layout, window=window, softcap=softcap, pv_split=pv_split, sinks=sinks,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, deterministic=deterministic, check=check, **tuning))
    # Rank and dtypes are never symbolic: refused while tracing (what reads sizes is the op's to check when it runs).
    api.check_option_types(window=window, pv_split=pv_split, tuning=tuning)
    api.check_kinds(q, k, v, rank=3 if varlen else 4, dims=api.PACKED_DIMS if varlen else api.layout_dims(layout))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        backward.check_differentiable(q, k, layout=layout, causal=causal, window=window, softcap=softcap,
                                      sinks=sinks, deterministic=deterministic, refusal_of=_traced_refusal)
        if varlen and q.dim() == 3 and k.dim() == 3:  # packed tensors: the refusals above are for 4-D ones
            refusal = _traced_refusal(
                api._length_bucket(int(max_seqlen_q)), api._length_bucket(int(max_seqlen_k)), int(q.shape[1]),
                int(k.shape[1]), int(q.shape[2]), str(q.dtype), bool(causal),
                None if window is None else tuple(int(w) for w in window), float(softcap), bool(deterministic),
                q.device.type, q.device.index or 0, True)
            if refusal:
                raise api.InputError(refusal)
    return attention_op(q, k, v, bool(causal), None if scale is None else float(scale), layout,
                        None if window is None else [int(w) for w in window], float(softcap),
                        None if pv_split is None else [int(c) for c in pv_split], sinks, cu_seqlens_q, cu_seqlens_k,
                        max_seqlen_q, max_seqlen_k, int(tuning.get("block_n", 0)),
                        int(tuning.get("stages", 0)), tuning.get("pingpong"), tuning.get("persistent"),
                        tuning.get("tile_overlap"), bool(tuning.get("short_tail", True)), bool(deterministic))


# ----------------------------------------------------------------------------------------------------------------
# Decode over a KV cache (codegen.decode): two ops, so that only a call with new tokens is declared to write the
# caches (a mutation the compiler must order and may not copy around); both return (o, lse).


# The options both ops take after their tensors, in this order (their schemas spell them out with types).
KVCACHE_OPTIONS = ("causal", "scale", "window", "softcap", "sinks", "num_splits", "block_n", "stages", "gather",
                   "ctas_per_sm", "pdl", "swap", "head_pack")


def _kvcache_call(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, *options):
    from .decode import attention_with_kvcache

    named = dict(zip(KVCACHE_OPTIONS, options, strict=True))
    named["window"] = None if named["window"] is None else tuple(named["window"])
    return attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k_new=k_new, v_new=v_new, page_table=page_table,
                                  return_lse=True, **named)


@torch.library.custom_op("flashgen::attention_with_kvcache", mutates_args=(), device_types="cuda")
def kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
               page_table: Optional[torch.Tensor], causal: bool, scale: Optional[float], window: Optional[list[int]],
               softcap: float, sinks: Optional[torch.Tensor], num_splits: int, block_n: int, stages: int,
               gather: Optional[bool], ctas_per_sm: int, pdl: bool, swap: Optional[bool],
               head_pack: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_call(q, k_cache, v_cache, cache_seqlens, None, None, page_table, causal, scale, window, softcap,
                         sinks, num_splits, block_n, stages, gather, ctas_per_sm, pdl, swap, head_pack)


@torch.library.custom_op("flashgen::attention_with_kvcache_append", mutates_args=("k_cache", "v_cache"),
                         device_types="cuda")
def kvcache_append_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                      k_new: torch.Tensor, v_new: torch.Tensor, page_table: Optional[torch.Tensor], causal: bool,
                      scale: Optional[float], window: Optional[list[int]], softcap: float,
                      sinks: Optional[torch.Tensor], num_splits: int, block_n: int, stages: int,
                      gather: Optional[bool], ctas_per_sm: int, pdl: bool, swap: Optional[bool],
                      head_pack: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_call(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, causal, scale, window, softcap,
                         sinks, num_splits, block_n, stages, gather, ctas_per_sm, pdl, swap, head_pack)


def _kvcache_fake(q, *_):
    """o in q's shape (contiguous) and the (B, H, S_q) float32 logsumexp, whatever else the call holds."""
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


kvcache_op.register_fake(_kvcache_fake)
kvcache_append_op.register_fake(_kvcache_fake)

KVCACHE_UNTRACED = "out= or check=True (it writes a given tensor, or reads the lengths on the host)"


def _eager_kvcache(q, k_cache, v_cache, cache_seqlens, options):
    """attention_with_kvcache() outside the graph, for a call the ops cannot carry: a graph break, then the call."""
    from .decode import attention_with_kvcache

    return attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, **options)


_eager_kvcache = _graph_break(_eager_kvcache, KVCACHE_UNTRACED)


def compiled_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new, v_new, page_table, return_lse, out,
                                    check, **options):
    """attention_with_kvcache() as torch.compile sees it: one of the two ops (the append op where k_new is given),
    `options` being KVCACHE_OPTIONS. The shape checks run while tracing (they read no data), the rest when the op
    runs, before its launch; `out=` and `check=True` break the graph and run eagerly (`fullgraph=True` refuses
    that, saying why)."""
    from .decode import NO_BACKWARD, InputError, _check_shapes

    if out is not None or check:
        return _eager_kvcache(q, k_cache, v_cache, cache_seqlens, dict(
            k_new=k_new, v_new=v_new, page_table=page_table, return_lse=return_lse, out=out, check=check, **options))
    _check_shapes(q, k_cache, v_cache, k_new, v_new, page_table)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (q, k_cache, v_cache, k_new, v_new, options["sinks"])):
        raise InputError(NO_BACKWARD)
    window = options["window"]
    options = dict(options, causal=bool(options["causal"]), softcap=float(options["softcap"]),
                   window=None if window is None else [int(w) for w in window])
    values = tuple(options[name] for name in KVCACHE_OPTIONS)
    if k_new is None:
        o, lse = kvcache_op(q, k_cache, v_cache, cache_seqlens, page_table, *values)
    else:
        o, lse = kvcache_append_op(q, k_cache, v_cache, cache_seqlens, k_new, v_new, page_table, *values)
    return (o, lse) if return_lse else o
