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
                  "float (B, H, padded S_q, D): dS K summed over every key block (zeroed by _pre)", "dq_accum")
_DQ_TURNS = Param("dq_turns", "int* __restrict__", Pack.POINTER,
                  "int (B, H, query blocks), zeroed by _pre: deterministic mode, the key blocks that have added into "
                  "each query block's dQ rows (each adds in its turn); null otherwise", "dq_turns")
_BATCH = Param("batch", "int", Pack.I32, "sequences in the batch", "batch")

PRE_PARAMS = (
    *strided_tensor("o", "the forward's o", "(B, S_q, H, D)"),
    *strided_tensor("do", "dO, the gradient of o", "(B, S_q, H, D)"),
    Param("lse", "const float* __restrict__", Pack.POINTER, "float (B, H, S_q) contiguous: the forward's natural-log "
          "logsumexp", "lse"),
    _LSE_LOG2, _DELTA, _DQ_ACCUM, _DQ_TURNS, _BATCH,
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
)

POST_PARAMS = (
    _DQ_ACCUM,
    *strided_tensor("dq", "dq", "(B, S_q, H, D)"),
    Param("scale", "float", Pack.F32, "the softmax scale (dQ's factor)", "scale"),
    _BATCH,
)

# Every mbarrier the main kernel has.
BARRIER_NAMES = ("KvFull", "QFull", "QEmpty", "DqFull", "DqEmpty")


@dataclass(frozen=True)
class KeyBlockGrid:
    """One CTA per (K/V head, sequence, key block), the key block slowest: CTAs launch in that order, so under a
    causal mask the long ones (the first key blocks see every query) all start first and the short ones fill the
    tail; and key block n of a (head, sequence) always launches before n + 1 (deterministic mode's turns)."""

    kv_heads: int
    n_blocks: int

    def dims(self, *, batch: int) -> tuple[int, int, int]:
        return (self.kv_heads, batch, self.n_blocks)

    def c_launch(self) -> tuple[str, str]:
        return "", f"dim3({self.kv_heads}, batch, {self.n_blocks})"

    def describe(self, tiles_m: str, batches: str) -> dict:
        return {"x": f"K/V heads = {self.kv_heads}", "y": batches, "z": f"key blocks = {self.n_blocks}"}


@dataclass(frozen=True)
class RowGrid:
    """A warp per (sequence, head, padded query row), `rows_per_block` warps a CTA."""

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
