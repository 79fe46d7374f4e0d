"""The backward kernels for sm_90a: dQ, dK and dV from the forward's o and logsumexp (templates/bwd_sm90/, the
plan in plan.py, the ABI in abi.py)."""

from __future__ import annotations

import numpy as np

from layouts import fragments, staging
from layouts.cexpr import compile_c_expr

from codegen.abi import MBARRIER_BYTES

from .. import Family
from ..fwd_sm90 import describe_descriptors
from ..fwd_sm90.abi import LOG2E
from . import abi as bwd_abi
from .plan import (BLOCK_N, CONSUMER_REGS, KEYS_PER_CONSUMER, POST_SUFFIX, PRE_SUFFIX, PRODUCER_REGS,
                   ROW_THREADS, ROW_WARPS, THREADS_PER_WARPGROUP, WARPS_PER_WARPGROUP, BackwardSpec, Plan,
                   make_plan, resolve)

__all__ = ["BackwardSpec", "Plan", "FAMILY", "make_plan", "resolve"]

TMA_COORD_PARAMS = ("row", "head", "batch")


def pre_name(spec: BackwardSpec) -> str:
    return spec.name + PRE_SUFFIX


def post_name(spec: BackwardSpec) -> str:
    return spec.name + POST_SUFFIX


def regenerate_command(spec: BackwardSpec) -> str:
    s = spec
    args = ["flashgen", "--shape", f"{s.seq_len},{s.heads},{s.head_dim}", "--backward", "--dtype", s.dtype]
    if s.seq_len_k != s.seq_len:
        args += ["--seq-k", str(s.seq_len_k)]
    if s.kv_heads != s.heads:
        args += ["--kv-heads", str(s.kv_heads)]
    if s.causal:
        args.append("--causal")
    if s.window != (-1, -1):
        args += ["--window", ",".join(map(str, s.window))]
    if s.softcap:
        args += ["--softcap", repr(float(s.softcap))]
    if s.deterministic:
        args.append("--deterministic")
    if s.varlen:
        args.append("--varlen")
    return " ".join(args)


def summary(plan: Plan) -> str:
    s = plan.spec
    return (f"{s.name}: backward, S_q={s.seq_len} S_k={s.seq_len_k} H={s.heads} over H_kv={s.kv_heads}, "
            f"D={s.head_dim} {s.dtype}, {'causal' if s.causal else 'non-causal'}, {BLOCK_N}-key CTAs over "
            f"{plan.block_m}-query blocks, {s.stages} stages")


def _descs(read) -> tuple[list[int], str]:
    values = read.descriptors()
    return values, describe_descriptors(values)


def _ds_store_bases(plan: Plan) -> tuple[tuple[int, int, int], ...]:
    """dS^T's 32-bit stores (value pairs i, i + 1 of the 64 x block_m accumulator at ds_offset, the tile's
    rendered formula) as bases plus immediates (fragments.address_bases)."""
    acc = fragments.wgmma_accumulator(plan.block_m)
    offset = compile_c_expr(plan.ds.formula_c, ("n", "k"))
    lane, warp = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), indexing="ij"))

    def offsets(i: int):
        at = acc.apply({"lane": lane, "warp": warp, "reg": np.full(lane.shape, i)})
        return offset({"n": np.asarray(at["row"]), "k": np.asarray(at["col"])})

    return fragments.address_bases(offsets, range(0, plan.block_m // 2, 2))


def _split_context(split) -> dict:
    return {"by": split.by, "cols": split.cols, "row0": split.row0, "col0": split.col0, "shared_a": split.shared_a,
            "a": [r.descriptors() for r in split.a], "a_fields": describe_descriptors(split.a[0].descriptors()),
            "b": [r.descriptors() for r in split.b], "b_fields": describe_descriptors(split.b[0].descriptors())}


def common_context(plan, verbs: tuple[str, ...] = ("load",)) -> dict:
    """The template values both backward families (this and bwd_sm90_wide) take alike: the spec's numbers, the row
    kernels', the launch's, the dQ accumulator's column swizzle, the accumulator fragment, the Q and K tiles' TMA
    loads (`verbs`) and the ABIs."""
    import codegen

    s = plan.spec
    staging.check_column_swizzle_c(s.head_dim)  # the dQ accumulator's column swizzle, as rendered (_post reads it)
    tma_tiles = [{"name": name, "verbs": verbs, "rank": op.tensor_map.rank,
                  "params": ", ".join(f"int {p}" for p in TMA_COORD_PARAMS),
                  "coords": plan.origin_c(op, TMA_COORD_PARAMS, seq_len)}
                 for name, op, seq_len in (("q", plan.q, s.seq_len), ("k", plan.k, s.seq_len_k))]
    (tma_rank,) = {t["rank"] for t in tma_tiles}
    left, right = plan.window_bounds
    return {
        "version": codegen.__version__,
        "regenerate": regenerate_command(s),
        "kernel_name": s.name,
        "pre_name": pre_name(s),
        "post_name": post_name(s),
        "ptx_type": s.dtype,
        "seq_len": s.seq_len,
        "seq_len_k": s.seq_len_k,
        "heads": s.heads,
        "group": s.group,
        "head_dim": s.head_dim,
        "block_m": plan.block_m,
        "block_n": plan.block_n,
        "stages": s.stages,
        "padded_rows": plan.padded_rows,
        "n_blocks": plan.n_blocks,
        "splits_tail": plan.splits_tail,
        "varlen": s.varlen,
        "tail_counters": plan.tail_counters,
        "warpgroup_threads": THREADS_PER_WARPGROUP,
        "warpgroup_warps": WARPS_PER_WARPGROUP,
        "window_left": left,
        "window_right": right,
        "softcap_c": f"{float(s.softcap)!r}f",
        "log2e": repr(LOG2E),
        "elem_bytes": s.elem_bytes,
        "threads": plan.threads,
        "row_threads": ROW_THREADS,
        "row_warps": ROW_WARPS,
        "row_lanes": plan.row_lanes,
        "row_vector": plan.row_vector,
        "smem": plan.smem,
        "smem_align": plan.smem_align,
        "desc_address_shift": plan.desc_address_shift,
        "dq_col_c": staging.column_swizzle_c(s.head_dim),
        "dq_chunk_cols": staging.CHUNK_COLS,
        "acc": fragments.wgmma_accumulator_c(),
        "tma_rank": tma_rank,
        "tma_tiles": tma_tiles,
        "abi": plan.abi,
        "pre_abi": plan.pre_abi,
        "post_abi": plan.post_abi,
        "mbarrier_bytes": MBARRIER_BYTES,
    }


def context(plan: Plan) -> dict:
    s, split, block_m = plan.spec, plan.dq_split, plan.block_m
    for n in (block_m, s.head_dim) + tuple(c.cols for c in plan.dq_chunks) + ((split.cols,) if split else ()):
        fragments.check_accumulator_prefix(n)
    fragments.check_separable(block_m)  # the mask adds a per-register offset to a thread's value 0 (mainloop.j2)
    fragments.s_slice_is_a_operand(block_m)  # P^T and dS^T accumulators are the A of dV and dK, slice by slice
    stores = ()
    if split:  # consumer c stages its 64 x cols part at its origin: every paired store at 2 wavefronts
        staging.check_fragment_stores(s.head_dim, split.cols, split.origins)
        stores = staging.fragment_store_bases(s.head_dim, split.cols, split.origins)
    bases = sorted({base for _, base, _ in stores})
    ds_stores = _ds_store_bases(plan)
    ds_bases = sorted({base for _, base, _ in ds_stores})
    if not plan.ds_pair_contiguous:
        raise AssertionError("the dS^T tile must keep adjacent queries contiguous for its 32-bit stores")
    q_as_b, q_as_b_fields = _descs(plan.q_as_b)
    q_as_b_mn, q_as_b_mn_fields = _descs(plan.q_as_b_mn)
    ds_as_a, ds_as_a_fields = _descs(plan.ds_as_a)
    kv_as_a = [r.descriptors() for r in plan.kv_as_a]
    transposes = {r.transpose for c in plan.dq_chunks for r in c.reads} | {r.transpose for r in (split.b if split else ())}
    (dq_trans,) = transposes
    (ds_as_a_trans,) = {plan.ds_as_a.transpose} | {r.transpose for r in (split.a if split else ())}  # one dq wgmma
    (kv_as_a_trans,) = {r.transpose for r in plan.kv_as_a}
    return {
        **common_context(plan),
        "summary": summary(plan),
        "keys_per_consumer": KEYS_PER_CONSUMER,
        "kv_as_a": kv_as_a,
        "kv_as_a_fields": describe_descriptors(kv_as_a[0]) + "; window c starts "
                          f"{plan.kv_as_a[1].descriptor_objects()[0].start_address} B further per c",
        "kv_as_a_trans": kv_as_a_trans,
        "q_as_b": q_as_b,
        "q_as_b_fields": q_as_b_fields,
        "q_as_b_trans": plan.q_as_b.transpose,
        "q_as_b_mn": q_as_b_mn,
        "q_as_b_mn_fields": q_as_b_mn_fields,
        "q_as_b_mn_trans": plan.q_as_b_mn.transpose,
        "ds_as_a": ds_as_a,
        "ds_as_a_fields": ds_as_a_fields,
        "ds_as_a_trans": ds_as_a_trans,
        "ds_offset_c": plan.ds.formula_c,
        "dq_store_bases": bases,
        "ds_store_bases": ds_bases,
        "ds_stores": [{"base": ds_bases.index(base), "imm": imm} for _, base, imm in ds_stores],
        "dq_stores": [{"base": bases.index(base), "imm": imm} for _, base, imm in stores],
        "dq_trans": dq_trans,
        "dq_widths": sorted({c.cols for c in plan.dq_chunks} | ({split.cols} if split else set())),
        "dq_split": _split_context(split) if split else None,
        "ds_buffers": plan.ds_buffers,
        "dq_stage_bytes": plan.dq_stage_bytes,
        "deterministic": s.deterministic,
        "stage_under_st": plan.stage_under_st,
        "dq_chunks": [{"first": c.first, "cols": c.cols, "descs": [r.descriptors() for r in c.reads],
                       "fields": describe_descriptors(c.reads[0].descriptors())} for c in plan.dq_chunks],
        "family_barriers": bwd_abi.BARRIER_NAMES,
        "producer_regs": PRODUCER_REGS,
        "consumer_regs": CONSUMER_REGS,
    }


FAMILY = Family(name="bwd_sm90", template="bwd_sm90/kernel.cu.j2", resolve=resolve, make_plan=make_plan,
                context=context, kernel_name=lambda spec: spec.name)
