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
                 sinks: Optional[torch.Tensor], block_n: int, stages: int, pingpong: bool, persistent: Optional[bool],
                 tile_overlap: Optional[bool], short_tail: bool, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    tuning = dict(block_n=block_n, stages=stages, pingpong=pingpong, persistent=persistent, tile_overlap=tile_overlap,
                  short_tail=short_tail)
    with torch.no_grad():  # below autograd: the op's autograd formula (registered below) owns the gradients
        return api._call(q, k, v, causal, scale, layout, None if window is None else tuple(window), softcap,
                         None if pv_split is None else tuple(pv_split), tuning, sinks=sinks)


@attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, layout, window, softcap, pv_split, sinks, block_n, stages, pingpong,
                    persistent, tile_overlap, short_tail, deterministic):
    batch, heads, seq = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else q.shape[:3]
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((batch, heads, seq), dtype=torch.float32))


@torch.library.custom_op("flashgen::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                          do: torch.Tensor, causal: bool, scale: Optional[float], layout: str,
                          window: Optional[list[int]], softcap: float,
                          deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward.attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale, layout=layout,
                              window=None if window is None else tuple(window), softcap=softcap,
                              deterministic=deterministic)


@attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, o, lse, do, causal, scale, layout, window, softcap, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, layout, window, softcap = inputs[:8]
    ctx.save_for_backward(q, k, v, *output)
    ctx.options = (causal, scale, layout, window, softcap, inputs[-1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(q, k, v, o, lse, do, *ctx.options)
    return (dq, dk, dv) + (None,) * 14  # nothing for the options, sinks included (refused if they need a gradient)


attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_attention(q, k, v, *, causal, scale, layout, window, softcap, pv_split, sinks, cu_seqlens_q, cu_seqlens_k,
                       max_seqlen_q, max_seqlen_k, tuning, deterministic=False):
    """attention() as torch.compile sees it: the custom op (fixed lengths only); where q, k or v requires grad, the
    backward kernels' refusals are raised while tracing, before anything runs."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None or max_seqlen_k is not None:
        raise api.InputError("variable-length batches are not supported under torch.compile yet; call attention() "
                             "outside the compiled region (given both max lengths it does not synchronize)")
    unknown = set(tuning) - {"block_n", "stages", "pingpong", "persistent", "tile_overlap", "short_tail"}
    if unknown:
        raise api.InputError(f"{sorted(unknown)} cannot be passed under torch.compile")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        backward.check_differentiable(q, k, layout=layout, causal=causal, window=window, softcap=softcap,
                                      sinks=sinks, deterministic=deterministic, refusal_of=_traced_refusal)
    return attention_op(q, k, v, bool(causal), None if scale is None else float(scale), layout,
                        None if window is None else [int(w) for w in window], float(softcap),
                        None if pv_split is None else [int(c) for c in pv_split], sinks, int(tuning.get("block_n", 0)),
                        int(tuning.get("stages", 0)), bool(tuning.get("pingpong", True)), tuning.get("persistent"),
                        tuning.get("tile_overlap"), bool(tuning.get("short_tail", True)), bool(deterministic))
