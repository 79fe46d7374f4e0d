"""flashgen's forward as a torch custom op (`torch.ops.flashgen.attention`), so torch.compile traces
`codegen.attention` into its graph without a break: the op's fake implementation gives the output shapes,
its real one is the eager call (codegen.api). Eager calls do not go through the op (its dispatch costs
more than the whole call), only traced ones."""

from __future__ import annotations

from typing import Optional

import torch

from . import api


@torch.library.custom_op("flashgen::attention", mutates_args=(), device_types="cuda")
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                 layout: str, window: Optional[list[int]], softcap: float, pv_split: Optional[list[int]],
                 sinks: Optional[torch.Tensor], block_n: int, stages: int, pingpong: bool, persistent: Optional[bool],
                 tile_overlap: Optional[bool], short_tail: bool) -> tuple[torch.Tensor, torch.Tensor]:
    tuning = dict(block_n=block_n, stages=stages, pingpong=pingpong, persistent=persistent, tile_overlap=tile_overlap,
                  short_tail=short_tail)
    return api._call(q, k, v, causal, scale, layout, None if window is None else tuple(window), softcap,
                     None if pv_split is None else tuple(pv_split), tuning, sinks=sinks)


@attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, layout, window, softcap, pv_split, sinks, block_n, stages, pingpong,
                    persistent, tile_overlap, short_tail):
    batch, heads, seq = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else q.shape[:3]
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((batch, heads, seq), dtype=torch.float32))


def compiled_attention(q, k, v, *, causal, scale, layout, window, softcap, pv_split, sinks, cu_seqlens_q, cu_seqlens_k,
                       max_seqlen_q, max_seqlen_k, tuning):
    """attention() as torch.compile sees it: the custom op (fixed lengths only)."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None or max_seqlen_k is not None:
        raise api.InputError("variable-length batches are not supported under torch.compile (their offsets are "
                             "checked on the host every call); call attention() outside the compiled region")
    unknown = set(tuning) - {"block_n", "stages", "pingpong", "persistent", "tile_overlap", "short_tail"}
    if unknown:
        raise api.InputError(f"{sorted(unknown)} cannot be passed under torch.compile")
    return attention_op(q, k, v, bool(causal), None if scale is None else float(scale), layout,
                        None if window is None else [int(w) for w in window], float(softcap),
                        None if pv_split is None else [int(c) for c in pv_split], sinks, int(tuning.get("block_n", 0)),
                        int(tuning.get("stages", 0)), bool(tuning.get("pingpong", True)), tuning.get("persistent"),
                        tuning.get("tile_overlap"), bool(tuning.get("short_tail", True)))
