"""The wide backward kernels for sm_90a (head dims 192 and 256): dK and dV kept transposed, M = the head dim
(templates/bwd_sm90_wide/, the plan in plan.py). The spec, the ABI, the row kernels and the host path are bwd_sm90's:
BackwardSpec.family picks this family by head dim."""

from __future__ import annotations

import numpy as np

from layouts import fragments
from layouts.cexpr import compile_c_expr

from .. import Family
from ..bwd_sm90 import common_context
from ..bwd_sm90.plan import THREADS_PER_WARPGROUP
from ..fwd_sm90 import describe_descriptors
from . import abi as wide_abi
from .plan import DQ_CHUNK_COLS, PD_BUFFERS, PRODUCER_REGS, WGMMA_M, WidePlan, make_plan, resolve

__all__ = ["FAMILY", "WidePlan"]


def summary(plan: WidePlan) -> str:
    s = plan.spec
    return (f"{s.name}: backward (wide), S_q={s.seq_len} S_k={s.seq_len_k} H={s.heads} over H_kv={s.kv_heads}, "
            f"D={s.head_dim} {s.dtype}, {'causal' if s.causal else 'non-causal'}, {plan.block_n}-key CTAs over "
            f"{plan.block_m}-query blocks, dK and dV transposed, {s.stages} stages")


def _pd_store_bases(plan: WidePlan) -> tuple[tuple[int, int, int], ...]:
    """P^T's and dS^T's 16-bit stores (value i of a consumer's 64 x keys S accumulator, consumer c's keys from row
    c * keys of the keys x queries tile, at its rendered formula) as bases plus immediates, one table for all."""
    keys = plan.keys_per_consumer
    acc = fragments.wgmma_accumulator(keys)
    offset = compile_c_expr(plan.pd.formula_c, ("n", "k"))
    lane, warp, c = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), np.arange(plan.consumers), indexing="ij"))

    def offsets(i: int):
        at = acc.apply({"lane": lane, "warp": warp, "reg": np.full(lane.shape, i)})
        return offset({"n": np.asarray(at["col"]) + keys * c, "k": np.asarray(at["row"])})

    return fragments.address_bases(offsets, range(keys // 2))


def _dkv_store_bases(plan: WidePlan) -> tuple[tuple[int, int, int], ...]:
    """The epilogue's 16-bit stores of dK^T (dV^T): value i of m64 tile j, flattened as j * block_n / 2 + i, is
    (key acc_col, head-dim row c * head_rows + 64j + acc_row), stored at (key, row) of the stage tile."""
    acc = fragments.wgmma_accumulator(plan.block_n)
    offset = compile_c_expr(plan.dkv_stage.formula_c, ("m", "n"))
    lane, warp, c = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), np.arange(plan.consumers), indexing="ij"))
    per_tile = plan.block_n // 2

    def offsets(v: int):
        j, i = divmod(v, per_tile)
        at = acc.apply({"lane": lane, "warp": warp, "reg": np.full(lane.shape, i)})
        rows = plan.head_rows * c + WGMMA_M * j + np.asarray(at["row"])
        return offset({"m": np.asarray(at["col"]), "n": rows})

    return fragments.address_bases(offsets, range(plan.head_tiles * per_tile))


def context(plan: WidePlan) -> dict:
    for n in (plan.keys_per_consumer, plan.block_n, DQ_CHUNK_COLS):
        fragments.check_accumulator_prefix(n)
    fragments.check_separable(plan.keys_per_consumer)  # the mask adds a per-register offset to a thread's value 0
    stores = _pd_store_bases(plan)
    bases = sorted({base for _, base, _ in stores})
    dkv_stores = _dkv_store_bases(plan)
    dkv_bases = sorted({base for _, base, _ in dkv_stores})
    tables = {}
    for name, read in (("q_as_a", plan.q_as_a), ("kv_as_b", plan.kv_as_b.first), ("q_as_a_mn", plan.q_as_a_mn.first),
                       ("pd_as_b", plan.pd_as_b), ("ds_as_a", plan.ds_as_a), ("k_as_b_mn", plan.k_as_b_mn.first)):
        values = read.descriptors()
        tables.update({name: values, name + "_fields": describe_descriptors(values), name + "_trans": read.transpose})
    return {
        **common_context(plan),
        **tables,
        "kv_as_b_step": plan.kv_as_b.step,
        "q_as_a_mn_step": plan.q_as_a_mn.step,
        "k_as_b_mn_step": plan.k_as_b_mn.step,
        "summary": summary(plan),
        "keys_per_consumer": plan.keys_per_consumer,
        "warpgroup_threads": THREADS_PER_WARPGROUP,
        "consumer_threads": plan.consumers * THREADS_PER_WARPGROUP,
        "head_tiles": plan.head_tiles,
        "head_rows": plan.head_rows,
        "tile_rows": WGMMA_M,
        "dq_cols": plan.dq_cols,
        "dq_chunks": plan.dq_chunks,
        "dq_chunk_n": DQ_CHUNK_COLS,
        "pd_offset_c": plan.pd.formula_c,
        "pd_buffers": PD_BUFFERS,
        "pd_store_bases": bases,
        "pd_stores": [{"base": bases.index(base), "imm": imm} for _, base, imm in stores],
        "dkv_offset_c": plan.dkv_stage.formula_c,
        "dkv_run": plan.dkv_run,
        "dkv_store_bases": dkv_bases,
        "dkv_stores": [{"base": dkv_bases.index(base), "imm": imm} for _, base, imm in dkv_stores],
        "family_barriers": wide_abi.BARRIER_NAMES,
        "producer_regs": PRODUCER_REGS,
        "consumer_regs": plan.consumer_regs,
    }


FAMILY = Family(name="bwd_sm90_wide", template="bwd_sm90_wide/kernel.cu.j2", resolve=resolve, make_plan=make_plan,
                context=context, kernel_name=lambda spec: spec.name)
