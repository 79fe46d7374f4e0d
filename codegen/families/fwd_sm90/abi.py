"""The forward sm_90a family's ABI: its kernel parameters, its mbarriers and its grid, declared once.

The kernel signature, the device-side `Params`, the barrier enum and initialization, the API's argument
packing (`codegen.api`), the manifest and the export launcher are generated from `kernel_abi(plan)`.
"""

from __future__ import annotations

from codegen.abi import Barrier, BarrierMap, Grid, KernelABI, Pack, Param

LOG2E = 1.4426950408889634

_MAPS = tuple(Param(f"tmap_{op}", "TmaDesc", Pack.TENSOR_MAP,
                    f"CUtensorMap of {op} (by value, __grid_constant__; layouts/ derives its dims, strides and box)",
                    f"maps[{i}]") for i, op in enumerate("qkvo"))
_LSE = Param("lse_out", "float* __restrict__", Pack.POINTER,
             "float (B, H, S) contiguous (varlen: (H, total_q)), the natural-log logsumexp of each row; null: "
             "not written", "lse")
_SINKS = Param("sinks", "const float* __restrict__", Pack.POINTER,
               "float (H,): each query head's learned logit (natural log) joining its rows' softmax denominator "
               "and logsumexp", "sinks")
_VARLEN = (
    Param("cu_seqlens_q", "const int* __restrict__", Pack.POINTER,
          "int (B + 1): sequence b's queries are packed rows [cu[b], cu[b + 1])", "cu_seqlens_q"),
    Param("cu_seqlens_k", "const int* __restrict__", Pack.POINTER, "int (B + 1): the same for keys and values",
          "cu_seqlens_k"),
    Param("o_gmem", "unsigned char* __restrict__", Pack.POINTER,
          "o's base address, for tiles that end inside a sequence (stored without TMA)",
          "static_cast<unsigned char*>(o)"),
    Param("o_row_bytes", "long long", Pack.I64, "o's stride between packed rows, in bytes", "o_row_bytes"),
    Param("o_head_bytes", "long long", Pack.I64, "o's stride between heads, in bytes", "o_head_bytes"),
)
_TILE_COUNTER = Param("tile_counter", "int* __restrict__", Pack.POINTER,
                      "int, zero before the launch (the launch leaves it zero); CTAs take tiles from it", "tile_counter")
_TILE_LOOP = (  # a persistent CTA's tiles
    Param("tiles_m", "int", Pack.I32, "query tiles per (head, sequence): ceil(S / block_m), or of max_seqlen_q "
          "when varlen", "tiles_m"),
    Param("batches", "int", Pack.I32, "batch entries (sequences when varlen)", "batch"),
)
_SCALE = Param("scale_log2", "float", Pack.F32, "the softmax scale times log2(e)", "scale_log2")

# What the Blackwell forward family (codegen/families/fwd_sm100) takes as this family does: the varlen offsets
# and tiles_m.
CU_SEQLENS = _VARLEN[:2]
TILES_M = _TILE_LOOP[0]

# Every parameter the family's kernels can take, in order; a spec's kernel takes the ones of its modes.
ALL_PARAMS = _MAPS + (_LSE, _SINKS) + _VARLEN + (_TILE_COUNTER,) + _TILE_LOOP + (_SCALE,)


# Every mbarrier the family's kernels can have; a spec's kernel has those of its modes.
BARRIER_NAMES = ("QFull", "KFull", "VFull", "KEmpty", "VEmpty", "QEmpty")


def kernel_abi(*, stages: int, persistent: bool, varlen: bool, consumer_warps: int, heads: int,
               sinks: bool = False, cluster: int = 1) -> KernelABI:
    """`cluster` > 1 (multicast): that many CTAs share each K/V slot's loads, so a slot is free once every consumer
    warp of every one of them has read it. A persistent grid of clusters takes its tiles at a fixed stride, without
    the counter (the grid's rule)."""
    grid = Grid(persistent=persistent, heads=heads, cluster=cluster)
    tiling = ((_TILE_COUNTER,) if grid.counter else ()) + _TILE_LOOP if persistent else ()
    params = _MAPS + (_LSE,) + ((_SINKS,) if sinks else ()) + (_VARLEN if varlen else ()) + tiling + (_SCALE,)
    # K and V slots are released separately: K once QK has read it, V once PV has, so with two stages the
    # next K load starts a whole PV earlier than a shared K/V release would let it.
    barriers = [
        Barrier("QFull", 1, 1, "the tile's Q has landed (persistent: and its index is published)"),
        Barrier("KFull", stages, 1, "K of a ring slot has landed"),
        Barrier("VFull", stages, 1, "V of a ring slot has landed"),
        Barrier("KEmpty", stages, consumer_warps * cluster, "every consumer warp's QK has read the K slot"
                + (" (in both CTAs of the pair)" if cluster > 1 else "")),
        Barrier("VEmpty", stages, consumer_warps * cluster, "every consumer warp's PV has read the V slot"
                + (" (in both CTAs of the pair)" if cluster > 1 else "")),
    ]
    if persistent:
        barriers.append(Barrier("QEmpty", 1, consumer_warps, "every consumer warp's last QK has read Q"
                                + (" (its own CTA's: each loads its own Q)" if cluster > 1 else "")))
    assert {b.name for b in barriers} <= set(BARRIER_NAMES)
    return KernelABI(params, BarrierMap(tuple(barriers)), grid)
