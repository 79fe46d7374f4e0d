"""The backward sm_90a family's ABI: the three kernels' parameters, the main kernel's mbarriers, the grids."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.abi import Barrier, BarrierMap, KernelABI, Pack, Param, strided_tensor

_WS_ROWS = "(B, H, padded S_q)"
_LSE_LOG2 = Param("lse_log2", "float* __restrict__", Pack.POINTER,
                  f"float {_WS_ROWS}: each row's logsumexp times log2(e), +inf where the row saw no key or is padding",
                  "lse_log2")
_DELTA = Param("delta", "float* __restrict__", Pack.POINTER, f"float {_WS_ROWS}: rowsum(dO * O), 0 in padding rows",
               "delta")
_DQ_ACCUM = Param("dq_accum", "float* __restrict__", Pack.POINTER,
                  "float (B, H, padded S_q, D): dS K summed over every key block, times the scale where the main kernel "
                  "applies it (Plan.stage_under_st; zeroed by _pre)", "dq_accum")
_DQ_TURNS = Param("dq_turns", "int* __restrict__", Pack.POINTER,
                  "int (B, H, query blocks), zeroed by _pre: deterministic mode, the key blocks that have added into "
                  "each query block's dQ rows (each adds in its turn); null otherwise", "dq_turns")
_BATCH = Param("batch", "int", Pack.I32, "sequences in the batch", "batch")
_CU_Q = Param("cu_seqlens_q", "const int* __restrict__", Pack.POINTER,
              "int (B + 1), varlen: sequence b's queries are packed rows [cu[b], cu[b + 1]); null for fixed lengths",
              "cu_seqlens_q")
_CU_K = Param("cu_seqlens_k", "const int* __restrict__", Pack.POINTER,
              "int (B + 1), varlen: the same for keys and values; null for fixed lengths", "cu_seqlens_k")

PRE_PARAMS = (
    *strided_tensor("o", "the forward's o", "(B, S_q, H, D)"),
    *strided_tensor("do", "dO, the gradient of o", "(B, S_q, H, D)"),
    Param("lse", "const float* __restrict__", Pack.POINTER, "float (B, H, S_q) contiguous (varlen: (H, total_q)): the "
          "forward's natural-log logsumexp", "lse"),
    _LSE_LOG2, _DELTA, _DQ_ACCUM, _DQ_TURNS, _BATCH, _CU_Q,
)

MAIN_PARAMS = (
    *(Param(f"tmap_{op}", "TmaDesc", Pack.TENSOR_MAP,
            f"CUtensorMap of {op} (by value, __grid_constant__; layouts/ derives its dims, strides and box)", f"maps[{i}]")
      for i, op in enumerate(("q", "k", "v", "do"))),
    _LSE_LOG2, _DELTA, _DQ_ACCUM, _DQ_TURNS,
    *strided_tensor("dk", "dk", "(B, S_k, H_kv, D)"),
    *strided_tensor("dv", "dv", "(B, S_k, H_kv, D)"),
    Param("scale_log2", "float", Pack.F32, "the softmax scale times log2(e)", "scale_log2"),
    Param("scale", "float", Pack.F32, "the softmax scale (dK's factor)", "scale"),
    _BATCH, _CU_Q, _CU_K,
    Param("section", "int", Pack.I32, "(K/V head, sequence) pairs per section of the launch order: the CTAs walk the "
          "key blocks slowest within a section (a banded mask's long CTAs first), the sections one after another "
          "(sharing their Q and dO in L2); 1: a pair's CTAs together", "section"),
    Param("tail_units", "int", Pack.I32, "the last CTAs of the launch order split into pieces over their query "
          "blocks (Plan.tail_split: the last wave's few CTAs would run alone); 0: none", "tail_units"),
    Param("tail_pieces", "int", Pack.I32, "CTAs per split unit, each a contiguous run of its query blocks",
          "tail_pieces"),
    Param("dkv_tail", "float* __restrict__", Pack.POINTER,
          "float (tail units, 2, block keys, D), zeroed: a split unit's dK (unscaled) and dV summed over its pieces; "
          "null without a split", "dkv_tail"),
    Param("tail_count", "int* __restrict__", Pack.POINTER,
          "int (tail units, consumer warps), zeroed: the pieces that have added a warp's rows of dK and dV (the last "
          "one stores them); null without a split", "tail_count"),
)

POST_PARAMS = (
    _DQ_ACCUM,
    *strided_tensor("dq", "dq", "(B, S_q, H, D)"),
    Param("scale", "float", Pack.F32, "the softmax scale: dQ's factor, where the main kernel has not applied it",
          "scale"),
    _BATCH, _CU_Q,
)

# Every mbarrier the main kernel has.
BARRIER_NAMES = ("KvFull", "QFull", "QEmpty", "DqFull", "DqEmpty")


@dataclass(frozen=True)
class KeyBlockGrid:
    """One CTA per (key block, K/V head, sequence), in one grid dimension whose order the kernel's section argument
    picks (Plan.section: sections of (head, sequence) pairs, the key block slowest within one). Either way key block
    n of a (head, sequence) launches before n + 1, which deterministic mode's turns rely on."""

    kv_heads: int
    n_blocks: int

    def dims(self, *, batch: int, tail_units: int = 0, tail_pieces: int = 1) -> tuple[int, int, int]:
        """The grid, where the last `tail_units` CTAs of the order are `tail_pieces` CTAs each (Plan.tail_split)."""
        return (self.n_blocks * self.kv_heads * batch + tail_units * (tail_pieces - 1), 1, 1)

    def c_launch(self) -> tuple[str, str]:
        return "", f"dim3({self.n_blocks * self.kv_heads} * batch)"

    def describe(self, tiles_m: str, batches: str) -> dict:
        return {"x": f"key blocks x K/V heads x {batches} = {self.n_blocks} x {self.kv_heads} x {batches}", "y": "1",
                "z": "1"}


@dataclass(frozen=True)
class RowGrid:
    """One CTA per `rows_per_block` (sequence, head, padded query row)s."""

    heads: int
    padded_rows: int
    rows_per_block: int

    def dims(self, *, batch: int) -> tuple[int, int, int]:
        return (-(-batch * self.heads * self.padded_rows // self.rows_per_block), 1, 1)

    def c_launch(self) -> tuple[str, str]:
        return "", (f"dim3((unsigned)(((long long)batch * {self.heads * self.padded_rows} + {self.rows_per_block - 1}) / "
                    f"{self.rows_per_block}))")

    def describe(self, tiles_m: str, batches: str) -> dict:
        return {"x": f"ceil({batches} x {self.heads} heads x {self.padded_rows} rows / {self.rows_per_block})",
                "y": "1", "z": "1"}


def kernel_abi(*, stages: int, consumer_warps: int, kv_heads: int, n_blocks: int, split_dq: bool) -> KernelABI:
    staged = (
        Barrier("DqFull", 1, consumer_warps, "every consumer warp has staged its part of a query block's dQ tile"),
        Barrier("DqEmpty", 1, 1, "the dQ writer's bulk add has read the staged tile"),
    ) if split_dq else ()
    barriers = BarrierMap((
        Barrier("KvFull", 1, 1, "the key block's K and V have landed"),
        Barrier("QFull", stages, 1, "a ring slot's Q, dO, log2 logsumexps and deltas have landed"),
        Barrier("QEmpty", stages, consumer_warps, "every consumer warp is done with the ring slot"),
    ) + staged)
    return KernelABI(MAIN_PARAMS, barriers, KeyBlockGrid(kv_heads, n_blocks))


def row_abi(params: tuple[Param, ...], *, heads: int, padded_rows: int, rows_per_block: int) -> KernelABI:
    return KernelABI(params, BarrierMap(()), RowGrid(heads, padded_rows, rows_per_block))
