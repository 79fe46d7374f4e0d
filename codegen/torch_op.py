"""flashgen's forward and backward as torch custom ops (`torch.ops.flashgen.attention`,
`torch.ops.flashgen.attention_backward`), so torch.compile traces `codegen.attention` into its graph without a
break, training included: the ops' fake implementations give the output shapes, their real ones are the eager
calls (codegen.api, codegen.backward), and the forward op's autograd formula is the backward op. Eager calls do
not go through the ops (their dispatch costs more than the whole call), only traced ones."""

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
                 block_n: int, stages: int, pingpong: bool, persistent: Optional[bool],
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


try:
    _eager_attention = torch.compiler.disable(_eager_attention, reason=f"flashgen: {UNTRACED} runs eagerly")
except TypeError:  # a torch whose disable() takes no reason
    _eager_attention = torch.compiler.disable(_eager_attention)


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
                        int(tuning.get("stages", 0)), bool(tuning.get("pingpong", True)), tuning.get("persistent"),
                        tuning.get("tile_overlap"), bool(tuning.get("short_tail", True)), bool(deterministic))
