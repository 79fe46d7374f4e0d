"""The forward attention kernel for sm_90a: warp-specialized, TMA loads into a K/V ring, wgmma, online
softmax, optionally persistent over tiles (templates/fwd_sm90/, the plan in plan.py, the ABI in abi.py)."""

from __future__ import annotations

from layouts import fragments
from layouts.mma import SmemDescriptor

from codegen import trace
from codegen.abi import MBARRIER_BYTES
from codegen.spec import LAZY_RESCALE_LOG2, ROWS_PER_CONSUMER

from .. import Family
from . import abi as fwd_abi
from .plan import (CONSUMER_REGS, PRODUCER_REGS, WARPS_PER_WARPGROUP, Plan, _check_fragments, make_plan,
                   resolve)

# The device functions' names for a tile's tensor-map coordinates (its first sequence row, head, batch).
TMA_COORD_PARAMS = ("row", "head", "batch")


# What the kernel's TMA does with each operand's tile.
# (K and V also load into both CTAs of a cluster at once: KernelSpec.multicast; the code under if constexpr names
# those functions in every kernel.)
TILE_TMA = {"q": ("load", "prefetch"), "k": ("load", "multicast"), "v": ("load", "multicast"), "o": ("store",)}


def tma_tiles(plan: Plan, verbs: dict[str, tuple[str, ...]]) -> list[dict]:
    """Per operand: the TMA device functions to emit, the tensor-map rank and its coordinates as C."""
    return [{"name": name, "verbs": verbs[name], "rank": getattr(plan, name).tensor_map.rank,
             "params": ", ".join(f"int {p}" for p in TMA_COORD_PARAMS),
             "coords": plan.origin_c(getattr(plan, name), TMA_COORD_PARAMS)} for name in verbs]


def summary(plan: Plan) -> str:
    s = plan.spec
    return (f"{s.name}: S={s.seq_len} H={s.heads} D={s.head_dim} {s.dtype} "
            f"{'causal' if s.causal else 'non-causal'}, block {s.block_m}x{s.block_n}, "
            f"PV split {'+'.join(map(str, s.pv_split))}, {s.stages} stages")


def _structure(plan: Plan) -> str:
    """How CTAs take query tiles, for the kernel's header comment."""
    s = plan.spec
    if not s.persistent:
        return f"one CTA per {s.block_m}-row query tile"
    if s.multicast:
        return (f"persistent: as many two-CTA clusters as the GPU holds at once, taking {s.block_m}-row query tiles "
                "at a fixed stride, the pair's two at once")
    return f"persistent: one CTA per SM taking {s.block_m}-row query tiles from a counter"


def _tiles_summary(plan: Plan) -> str:
    pairs = (" in pairs (tiles 2c, 2c+1: a two-CTA cluster) that load the key blocks both visit once"
             if plan.spec.multicast else "")
    if not plan.spec.persistent:
        return f"one tile per CTA{pairs}; its O is stored after its last PV."
    boundary = ("a tile's O is stored while the next tile's first QK^T runs" if plan.tile_overlap
                else "a tile's O is stored after its last PV")
    return (f"tiles{pairs}; " if pairs else "") + boundary + (
        "; the next tile's Q is prefetched to L2 during this one." if plan.prefetch_next_q else ".")


def modes(plan: Plan) -> list[tuple[str, bool]]:
    """The kernel's code paths, as cfg::k<Name> constants (the template branches on them with if constexpr)."""
    s = plan.spec
    return [
        ("Persistent", bool(s.persistent)),  # CTAs loop over tiles (from a counter; multicast pairs: a fixed stride)
        ("Varlen", s.varlen),                # lengths from cu_seqlens at run time
        ("Pingpong", s.pingpong),            # the consumers take turns issuing their MMAs
        ("TileOverlap", plan.tile_overlap),  # a tile's O stored under the next tile's first QK
        ("PrefetchQ", plan.prefetch_next_q),  # the next tile's Q pulled to L2 during this one
        ("QkOverwrites", plan.qk_overwrites),  # QK's first k-slice writes S without reading it
        ("ConditionalRescale", plan.conditional_rescale),  # O rescaled only when a row max grew
        ("TailRescaleVote", plan.tail_rescale_vote),  # the same, in a short last key block's step only
        ("LazyRescale", bool(s.lazy_rescale)),  # a row's running max kept while the new one is within the slack
        ("PinSoftmax", plan.pin_softmax),    # K released after the row maxima, which stay before the PV wait
        ("TailMask", plan.tail_mask),        # some key block reads keys past the end
        ("Sinks", s.sinks),                  # a learned logit per head joins each row's denominator
        ("Multicast", bool(s.multicast)),    # tile pairs (two-CTA clusters) load their shared key blocks once
        # Later query tiles see more keys only when a right bound (causal) moves with the query.
        ("LongTilesLast", plan.window_bounds[1] >= 0),
    ]


def describe_descriptors(values: list[int], kind: str = "wgmma") -> str:
    """The decoded fields of a tile's k-slice descriptors, for the comment beside their constants."""
    decoded = [SmemDescriptor.decode(kind, v) for v in values]

    def rest(d: SmemDescriptor) -> str:
        return f"LBO {d.lbo} B, SBO {d.sbo} B, swizzle {d.swizzle.name}, base offset {d.base_offset}"

    if len({rest(d) for d in decoded}) == 1:
        return f"k slices start at {', '.join(str(d.start_address) for d in decoded)} B; {rest(decoded[0])}"
    return "; ".join(f"start {d.start_address} B, {rest(d)}" for d in decoded)


def mma_operands(plan) -> dict:
    """The wgmma operands' template values of a plan with q, k, v derivations: each k-slice's descriptor and
    its decoded fields, the transpose bits, the descriptor address shift."""
    values = {"desc_address_shift": plan.desc_address_shift, "k_trans": plan.k.mma_transpose,
              "v_trans": plan.v.mma_transpose}
    for name in "qkv":
        descriptors = getattr(plan, name).descriptors()
        values[f"{name}_desc"], values[f"{name}_desc_fields"] = descriptors, describe_descriptors(descriptors)
    return values


def context(plan: Plan) -> dict:
    s = plan.spec
    tail_n = plan.tail_n
    _check_fragments(s.block_n, s.head_dim, tail_n)
    qk_widths = sorted({s.block_n, tail_n or s.block_n}, reverse=True)
    abi = plan.abi
    import codegen
    from codegen.cli import regenerate_command

    return {
        "version": codegen.__version__,
        "regenerate": regenerate_command(s),
        "summary": summary(plan),
        "tiles_summary": _tiles_summary(plan),
        "structure": _structure(plan),
        "kernel_name": s.name,
        "persistent": bool(s.persistent),
        "multicast": bool(s.multicast),
        "pingpong": s.pingpong,
        "ptx_type": s.dtype,
        "seq_len": s.seq_len,
        "seq_len_k": s.keys,
        "group": s.group,
        "section_heads": plan.section_heads,
        "tiles_m": plan.m_blocks,
        "window_left": plan.window_bounds[0],
        "window_right": plan.window_bounds[1],
        "softcap_c": f"{float(s.softcap)!r}f",
        "lazy_rescale_log2": f"{LAZY_RESCALE_LOG2!r}f",
        "log2e": repr(fwd_abi.LOG2E),
        "heads": s.heads,
        "head_dim": s.head_dim,
        "block_m": s.block_m,
        "block_n": s.block_n,
        "rows_per_consumer": ROWS_PER_CONSUMER,
        "warps_per_consumer": WARPS_PER_WARPGROUP,
        "stages": s.stages,
        "elem_bytes": s.elem_bytes,
        "tail_n": tail_n,
        "modes": modes(plan),
        "qk_widths": qk_widths,
        "qk_wgmmas": [{"name": f"wgmma_qk{n}{'_first' if fresh else ''}", "n": n, "fresh": fresh}
                      for n in qk_widths for fresh in (False, True)],
        "pv_chunks": plan.pv_chunks,
        "pv_chunk_sizes": list(s.pv_split),
        # The last block's PV: over a short tail's keys only, else the whole split.
        "last_pv_chunks": plan.chunks_within(tail_n // 16) if tail_n else plan.pv_chunks,
        "o_vector_elems": plan.o_vector_elems,
        "threads": plan.threads,
        "producer_regs": PRODUCER_REGS,
        "consumer_regs": CONSUMER_REGS,
        "smem": plan.smem,
        "smem_align": plan.smem_align,
        **mma_operands(plan),
        "o_offset_c": plan.o.formula_c,
        "acc": fragments.wgmma_accumulator_c(),
        "tma_ranks": sorted({op.tensor_map.rank for op in (plan.q, plan.k, plan.v, plan.o)}),
        "tma_tiles": tma_tiles(plan, TILE_TMA),
        "abi": abi,
        "family_params": fwd_abi.ALL_PARAMS,
        "family_barriers": fwd_abi.BARRIER_NAMES,
        "mbarrier_bytes": MBARRIER_BYTES,
        "trace": s.trace,
        "trace_events": trace.EVENTS,
        "trace_ctas": trace.TRACE_CTAS,
        "trace_warps": trace.TRACE_WARPS,
        "trace_words": trace.TRACE_WORDS,
    }


FAMILY = Family(name="fwd_sm90", template="fwd_sm90/kernel.cu.j2", resolve=resolve, make_plan=make_plan,
                context=context, kernel_name=lambda spec: spec.name)
