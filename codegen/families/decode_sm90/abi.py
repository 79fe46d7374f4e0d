"""The decode sm_90a family's ABI: the attention kernel's and the append kernel's parameters, mbarriers and grids."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.abi import Barrier, BarrierMap, KernelABI, Pack, Param
from codegen.abi import strided_tensor as _tensor


_PAGES = (
    Param("page_table", "const int* __restrict__", Pack.POINTER,
          "int (B, max_pages): the cache page holding each sequence's keys [p * page, (p + 1) * page); null: dense",
          "page_table"),
    Param("page_table_stride", "long long", Pack.I64, "entries between two sequences' rows of page_table",
          "page_table_stride"),
)

_PARAMS = (
    Param("tmap_k", "TmaDesc", Pack.TENSOR_MAP, "CUtensorMap of the K cache (B_cache, S_max, H_kv, D)", "maps[0]"),
    Param("tmap_v", "TmaDesc", Pack.TENSOR_MAP, "CUtensorMap of the V cache", "maps[1]"),
    *_tensor("q", "q", "(B, S_q, H, D)"),
    *_tensor("o", "o", "(B, S_q, H, D)"),
    Param("lse_out", "float* __restrict__", Pack.POINTER,
          "float (B, H, S_q) natural-log logsumexp (the sinks included); null: not written", "lse"),
    Param("cache_seqlens", "const int* __restrict__", Pack.POINTER,
          "int (B,): keys in each sequence's cache before this step's new tokens", "cache_seqlens"),
    Param("new_tokens", "int", Pack.I32, "keys appended this step (S_q with k_new, else 0): sequence b attends "
          "cache_seqlens[b] + new_tokens keys", "new_tokens"),
    Param("sinks", "const float* __restrict__", Pack.POINTER,
          "float (H,): a logit per query head joining every row's softmax denominator; null: none", "sinks"),
    *_PAGES,
    Param("page_table_cols", "int", Pack.I32, "entries in a row of page_table (max_pages; 0: dense): the bound of "
          "the first block's page reads, made before the sequence's length is known (plan.early_load)",
          "page_table_cols"),
    Param("splits", "int", Pack.I32, "CTAs sharing each tile's key blocks (1: no merge)", "splits"),
    Param("ws_o", "float* __restrict__", Pack.POINTER,
          "float (B, grid.y, splits, block_m, D): each split's normalized O (splits > 1)", "ws_o"),
    Param("ws_lse", "float* __restrict__", Pack.POINTER, "float (B, grid.y, splits, block_m): each split's logsumexp",
          "ws_lse"),
    Param("split_counter", "int* __restrict__", Pack.POINTER,
          "int (B, grid.y), zero before the launch and left zero: splits finished per tile", "split_counter"),
    Param("scale_log2", "float", Pack.F32, "the softmax scale times log2(e)", "scale_log2"),
)

# A gathering kernel's (DecodeSpec.gather) own: the caches' addresses and strides, which its cp.async reads by;
# the other kernels read the caches through the tensor maps alone.
_GATHER_PARAMS = (
    *_tensor("k_cache", "the K cache", "(pages, page, H_kv, D)"),
    *_tensor("v_cache", "the V cache", "(pages, page, H_kv, D)"),
)

_APPEND_PARAMS = (
    *_tensor("k_new", "k_new", "(B, S_q, H_kv, D)"),
    *_tensor("v_new", "v_new", "(B, S_q, H_kv, D)"),
    *_tensor("k_cache", "the K cache", "(B_cache, S_max, H_kv, D)"),
    *_tensor("v_cache", "the V cache", "(B_cache, S_max, H_kv, D)"),
    Param("cache_seqlens", "const int* __restrict__", Pack.POINTER,
          "int (B,): new token t of sequence b goes to key cache_seqlens[b] + t of its cache", "cache_seqlens"),
    *_PAGES,
)

# Every mbarrier the family's kernels can have.
BARRIER_NAMES = ("KFull", "VFull", "KEmpty", "VEmpty", "MergeFull", "MergeDone")


@dataclass(frozen=True)
class DecodeGrid:
    """One CTA per (split, K/V head pack x row tile, sequence): a pack is head_pack adjacent K/V heads."""

    kv_heads: int
    tiles_m: int
    head_pack: int = 1

    @property
    def packs(self) -> int:
        return self.kv_heads // self.head_pack

    def dims(self, *, tiles_m: int, batch: int, sms: int = 0) -> tuple[int, int, int]:
        del sms
        return (tiles_m, self.packs * self.tiles_m, batch)  # tiles_m: the splits (the launch's x)

    def c_launch(self) -> tuple[str, str]:
        return "", f"dim3(splits, {self.packs * self.tiles_m}, batch)"

    def describe(self, tiles_m: str, batches: str) -> dict:
        heads = "K/V heads" if self.head_pack == 1 else f"packs of {self.head_pack} K/V heads"
        return {"x": "splits", "y": f"{heads} x row tiles = {self.packs} x {self.tiles_m}", "z": batches}


@dataclass(frozen=True)
class AppendGrid:
    kv_heads: int

    def describe(self, tiles_m: str, batches: str) -> dict:
        return {"x": "S_q (new tokens)", "y": f"K/V heads = {self.kv_heads}", "z": batches}


def kernel_abi(*, stages: int, consumer_warps: int, kv_heads: int, tiles_m: int, gather_threads: int = 0,
               head_pack: int = 1, push_merge: bool = False) -> KernelABI:
    """`gather_threads`: 0 for a kernel whose loads are TMA copies (a full barrier completes on the one arrival
    that arms it with the copies' bytes), else the producer threads that gather, each arriving as its copies land.
    `push_merge`: a cluster's splits copy their rows into the first split's shared memory (Plan.push_merge)."""
    full_arrivals = gather_threads or 1
    merge = (Barrier("MergeFull", 1, 1, "the cluster's other splits' rows have landed (armed by split 0)"),
             Barrier("MergeDone", 1, 1, "split 0 holds this split's rows: its copy has read them")) if push_merge else ()
    barriers = BarrierMap(merge + (
        Barrier("KFull", stages, full_arrivals, "K of a ring slot has landed"),
        Barrier("VFull", stages, full_arrivals, "V of a ring slot has landed"),
        Barrier("KEmpty", stages, consumer_warps, "every consumer warp's QK has read the K slot"),
        Barrier("VEmpty", stages, consumer_warps, "every consumer warp's PV has read the V slot"),
    ))
    return KernelABI(_PARAMS + (_GATHER_PARAMS if gather_threads else ()), barriers,
                     DecodeGrid(kv_heads, tiles_m, head_pack))


def append_abi(*, kv_heads: int) -> KernelABI:
    return KernelABI(_APPEND_PARAMS, BarrierMap(()), AppendGrid(kv_heads))
