"""The wide backward's main-kernel ABI: bwd_sm90's parameters and grid, with dO in a ring of its own (one slot: two
would not fit beside 80-key K and V at D=256), so it has its own full and empty mbarriers."""

from __future__ import annotations

from codegen.abi import Barrier, BarrierMap, KernelABI

from ..bwd_sm90.abi import MAIN_PARAMS, KeyBlockGrid

BARRIER_NAMES = ("KvFull", "QFull", "QEmpty", "DoFull", "DoEmpty")


def kernel_abi(*, stages: int, consumer_warps: int, kv_heads: int, n_blocks: int) -> KernelABI:
    barriers = BarrierMap((
        Barrier("KvFull", 1, 1, "the key block's K and V have landed"),
        Barrier("DoFull", 1, 1, "the dO slot's tile has landed"),
        Barrier("DoEmpty", 1, consumer_warps, "every consumer warp is done with the dO slot (dV^T read it)"),
        Barrier("QFull", stages, 1, "a ring slot's Q, log2 logsumexps and deltas have landed"),
        Barrier("QEmpty", stages, consumer_warps, "every consumer warp is done with the ring slot (dK^T read Q)"),
    ))
    return KernelABI(MAIN_PARAMS, barriers, KeyBlockGrid(kv_heads, n_blocks))
