"""The decode attention kernel for sm_90a: a few new query tokens per sequence over a KV cache, with the query
heads of a K/V head packed into one tile's rows, split-KV merged in the kernel, and an append kernel that
writes the step's new keys and values into the cache (templates/decode_sm90/, plan.py, abi.py)."""

from __future__ import annotations

from layouts import fragments
from layouts.operands import WGMMA_M
from layouts.paged import load_origin

from codegen.abi import MBARRIER_BYTES

from .. import Family
from ..fwd_sm90 import mma_operands
from . import abi as decode_abi
from codegen.spec import ROWS_PER_CONSUMER

from .plan import APPEND_SUFFIX, THREADS_PER_WARPGROUP, WARPS_PER_WARPGROUP, DecodeSpec, Plan, make_plan, resolve

__all__ = ["DecodeSpec", "Plan", "FAMILY", "make_plan", "resolve"]

TMA_COORD_PARAMS = ("row", "head", "batch")
# The C names load_{k,v}_pages computes a paged load's coordinates in (layouts.paged.load_origin).
PAGED_LOAD_NAMES = dict(page="pages.page[n]", token="key % cfg::kPageRowsOr1", col_block="c", head="head")


def append_name(spec: DecodeSpec) -> str:
    return spec.name + APPEND_SUFFIX


def regenerate_command(spec: DecodeSpec) -> str:
    s = spec
    args = ["flashgen", "--shape", f"<S_max>,{s.heads},{s.head_dim}", "--kv-heads", str(s.kv_heads), "--decode",
            str(s.q_len), "--dtype", s.dtype, "--block-n", str(s.block_n), "--stages", str(s.stages)]
    if s.causal:
        args.append("--causal")
    if s.window != (-1, -1):
        args += ["--window", ",".join(map(str, s.window))]
    if s.softcap:
        args += ["--softcap", repr(float(s.softcap))]
    if s.page_size:
        args += ["--page-size", str(s.page_size)]
    if s.ctas_per_sm > 1:
        args += ["--ctas-per-sm", str(s.ctas_per_sm)]
    if s.head_pack > 1:
        args += ["--head-pack", str(s.head_pack)]
    return " ".join(args) + "  (S_max, the batch, lengths and splits are run-time values)"


def summary(plan: Plan) -> str:
    s = plan.spec
    return (f"{s.name}: decode, H={s.heads} over H_kv={s.kv_heads}, D={s.head_dim} {s.dtype}, S_q={s.q_len} "
            f"({s.rows} packed rows{f' of {s.head_pack} K/V heads' if s.head_pack > 1 else ''}, {plan.tiles_m} "
            f"tile(s) of {plan.block_m}), "
            f"{'causal' if s.causal else 'non-causal'}, {s.block_n}-key blocks, {s.stages} stages, "
            + (f"{s.page_size}-row pages" if s.page_size else "dense cache")
            + (f", {s.ctas_per_sm} CTAs per SM" if s.ctas_per_sm > 1 else ""))


def swapped_products(plan: Plan) -> dict | None:
    """The swapped consumer's template values (None where the plan is plain): N, each verified read's descriptors
    and transpose bit, the P^T tile's offset formula and its shared-memory region."""
    if not plan.spec.swap:
        return None
    fragments.check_accumulator_prefix(plan.swap_n)
    return {"m": WGMMA_M, "n": plan.swap_n, "warps": WARPS_PER_WARPGROUP, "region": plan.swap_region,
            "pt_offset_c": plan.pt.formula_c,
            "k_desc": [r.descriptors() for r in plan.k_as_a], "v_desc": [r.descriptors() for r in plan.v_as_a],
            "q_desc": plan.q_as_b.descriptors(), "pt_desc": plan.pt_as_b.descriptors(),
            "k_trans": plan.k_as_a[0].transpose, "v_trans": plan.v_as_a[0].transpose,
            "q_trans": plan.q_as_b.transpose, "pt_trans": plan.pt_as_b.transpose}


def context(plan: Plan) -> dict:
    s = plan.spec
    fragments.check_accumulator_prefix(s.block_n)
    fragments.check_accumulator_prefix(s.head_dim)
    fragments.s_slice_is_a_operand(s.block_n)
    import codegen

    tma_tiles = [{"name": name, "verbs": ("load",), "rank": getattr(plan, name).tensor_map.rank,
                  "params": ", ".join(f"int {p}" for p in TMA_COORD_PARAMS),
                  "coords": plan.origin_c(getattr(plan, name), TMA_COORD_PARAMS)} for name in ("k", "v")]
    (tma_rank,) = {t["rank"] for t in tma_tiles}
    # A dense cache's kernel has the paged loaders too (one whole-tile load), uncalled: its branch is if constexpr.
    paged_tiles = [{"name": name, "box": pages.box if pages else getattr(plan, name).tensor_map.box,
                    "pages": pages.pages if pages else 1, "cols": pages.cols if pages else 1,
                    "page_stride": pages.page_stride if pages else 0, "col_stride": pages.col_stride if pages else 0,
                    "coords": ", ".join(map(str, load_origin(getattr(plan, name).tensor_map, **PAGED_LOAD_NAMES)))}
                   for name, pages in (("k", plan.k_pages), ("v", plan.v_pages))]
    left, right = plan.window_bounds
    return {
        "version": codegen.__version__,
        "regenerate": regenerate_command(s),
        "summary": summary(plan),
        "kernel_name": s.name,
        "append_name": append_name(s),
        "ptx_type": s.dtype,
        "heads": s.heads,
        "group": s.group,
        "q_len": s.q_len,
        "rows": s.rows,
        "head_rows": s.head_rows,
        "head_pack": s.head_pack,
        "tile_rows": plan.tile_rows,
        "head_dim": s.head_dim,
        "block_n": s.block_n,
        "block_m": plan.block_m,
        "tiles_m": plan.tiles_m,
        "stages": s.stages,
        "consumers": plan.consumers,
        "row_groups": plan.row_groups,
        "rows_per_group": ROWS_PER_CONSUMER,
        "q_rows": plan.q_rows,
        "group_threads": THREADS_PER_WARPGROUP,
        "key_groups": plan.key_groups,
        "threads": plan.threads,
        "append_threads": plan.append_threads,
        "elem_bytes": s.elem_bytes,
        "window_left": left,
        "window_right": right,
        "softcap_c": f"{float(s.softcap)!r}f",
        "q_vector_elems": plan.q_vector_elems,
        "v_vector_elems": plan.v_row_vector_elems,
        "k_vector_elems": plan.k_row_vector_elems if s.gather else 0,
        "gather": s.gather,
        "producer_threads": plan.producer_threads,
        "early_load": plan.early_load,
        "push_merge": plan.push_merge,
        "merge_slot_bytes": plan.merge_slot_bytes,
        "smem": plan.smem,
        "smem_align": plan.smem_align,
        **mma_operands(plan),
        "q_offset_c": plan.q.formula_c,
        "q_coords": plan.q.coords_names,
        "k_offset_c": plan.k.formula_c,
        "v_offset_c": plan.v.formula_c,
        "acc": fragments.wgmma_accumulator_c(),
        "swap": swapped_products(plan),
        "tma_rank": tma_rank,
        "tma_tiles": tma_tiles,
        "paged_tiles": paged_tiles,
        "page_rows": s.page_size,
        "page_lanes": plan.page_lanes,
        "block_pages": plan.block_pages,
        "pages_per_lane": plan.pages_per_lane,
        "abi": plan.abi,
        "append_abi": plan.append_abi,
        "family_barriers": decode_abi.BARRIER_NAMES,
        "mbarrier_bytes": MBARRIER_BYTES,
        "producer_regs": plan.producer_regs,
        "moves_registers": plan.moves_registers,
        "ctas_per_sm": plan.spec.ctas_per_sm,
        "consumer_regs": plan.consumer_regs,
    }


FAMILY = Family(name="decode_sm90", template="decode_sm90/kernel.cu.j2", resolve=resolve, make_plan=make_plan,
                context=context, kernel_name=lambda spec: spec.name)
