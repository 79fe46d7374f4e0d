"""The forward attention kernel for Blackwell (sm_100a, sm_103a): the seed's structure, first version.

Persistent CTAs (one per SM, no 2-CTA cluster) walk the 128-row query tiles round robin. Warp 0 issues TMA loads of Q and of K/V into a ring; warp 1
allocates tensor memory and one of its threads issues every tcgen05.mma: S = Q K^T (SS) into one of two TMEM S
buffers, then O += P V (TS: A = P from TMEM over that S, B = V MN-major by the seed's 5-D map); warps 2-5 are the
softmax warps, one thread per row (TMEM lane), reading S with tcgen05.ld from their own lane quarter (the row
max from loads issued together and waited for once, the exponentials with the next chunk's load in flight: the
seed's V50), rescaling O in TMEM only when the row max grew, writing P over S and, at the end, normalizing O into
global memory.
The barrier protocol is `protocol()` (checked for deadlock on the CPU, tests/test_fwd_sm100.py).

Status: compiled for both architectures and checked by SASS, the layout models and codegen/simulate.py (the
same dataflow on the CPU). It has not run on a GPU: no Blackwell is lent here. PV runs in the spec's split,
each chunk once its part of P is written; causal, sliding windows (left and right, bottom-right aligned, the
key blocks outside a tile's band skipped) and softcap as the Hopper kernel has them, and variable-length
batches with the Hopper family's semantics (packed (total, H, D) tensors, cu_seqlens_q/k, the kernel specialized
on the max lengths; every role skips the tiles past their sequence's query end, so the barrier phases stay in
step; loads that run into the next sequence are masked, rows past the end never stored, lse (H, total_q)).
Not yet: a dynamic tile scheduler; `resolve` refuses it with the reason.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import layouts
from layouts import tcgen05

from codegen import policy
from codegen.abi import MBARRIER_BYTES, Barrier, BarrierMap, Grid, GridError, KernelABI, Pack, Param
from codegen.spec import MMA_K, KernelSpec, SpecError

from .. import Family
from ..common import descriptor_address_shift, normalized_window, tma_origin_c, window_bounds
from ..fwd_sm90 import tma_tiles
from ..fwd_sm90.abi import CU_SEQLENS, LOG2E, TILES_M

ARCHS = ("sm_100a", "sm_103a")
TILE_M = 128
WARPS = 6  # TMA, MMA, four softmax warps
SOFTMAX_WARP0 = 2
THREADS = 32 * WARPS
SMEM_LIMIT = 227 * 1024
SMEM_ALIGN_SLACK = 1024
MAX_STAGES = 6  # the seed's ring depth, where shared memory allows (codegen.spec.MAX_STAGES_BY_ARCH)
TMEM_CHUNK = 32
# The most S columns a softmax thread loads before one tcgen05.wait::ld in the row-max pass, a register each.
# Measured (NVRTC 13.0, both archs): the whole row fits at every block_n KernelSpec allows here, up to 224 at
# D=64 (255 registers, no spills; block_n 128 takes 175).
MAX_PASS_COLUMNS = 224
O_VECTOR_BYTES = 16  # one st.global.v4 of a row's O
# Key blocks per head dim: never measured here (no Blackwell is lent), so not codegen.policy's sm_90a table, which
# moves with H200 measurements (D=192's 112 there is not a TMEM_CHUNK multiple). The values are that table's
# before v23.
DEFAULT_BLOCK_N = {64: 128, 96: 128, 128: 128, 192: 64, 256: 64}

_MAPS = tuple(Param(f"tmap_{op}", "TmaDesc", Pack.TENSOR_MAP, f"CUtensorMap of {op} (layouts/ derives it)",
                    f"maps[{i}]") for i, op in enumerate("qkv"))
_O_GMEM = Param("o_gmem", "unsigned char* __restrict__", Pack.POINTER,
                "o's base address: (B, S, H, D), or (total_q, H, D) packed when varlen", "static_cast<unsigned char*>(o)")
_O_BATCH = Param("o_batch_bytes", "long long", Pack.I64, "o's batch stride in bytes", "o_batch_bytes")
_O_ROWS = (Param("o_row_bytes", "long long", Pack.I64, "o's sequence stride in bytes (varlen: between packed rows)",
                 "o_row_bytes"),
           Param("o_head_bytes", "long long", Pack.I64, "o's head stride in bytes", "o_head_bytes"))
_LSE = Param("lse_out", "float* __restrict__", Pack.POINTER,
             "float (B, H, S) logsumexp (varlen: (H, total_q)); null: not written", "lse")
_BATCHES = Param("batches", "int", Pack.I32, "batch entries, sequences when varlen (the CTAs walk tiles_m x heads x "
                 "batches tiles)", "batch")
_SCALE = Param("scale_log2", "float", Pack.F32, "the softmax scale times log2(e)", "scale_log2")

# Every parameter the family's kernels take, in order (the device-side Params has them all); a kernel takes
# those of its mode. Varlen reads the sequences' offsets (the Hopper family's parameters) and walks the query
# tiles of the longest query sequence (tiles_m); fixed lengths step O by the batch stride instead.
FAMILY_PARAMS = _MAPS + CU_SEQLENS + (_O_GMEM, _O_BATCH) + _O_ROWS + (_LSE, TILES_M, _BATCHES, _SCALE)
_FIXED_PARAMS = _MAPS + (_O_GMEM, _O_BATCH) + _O_ROWS + (_LSE, _BATCHES, _SCALE)
_VARLEN_PARAMS = _MAPS + CU_SEQLENS + (_O_GMEM,) + _O_ROWS + (_LSE, TILES_M, _BATCHES, _SCALE)
# The V map walks keys in groups of 8 (the seed's 5-D map): a varlen sequence's key blocks start at its first
# packed key rounded down to 8, the keys before it (the previous sequence's) masked.
KEY_GROUP = 8


def resolve(spec: KernelSpec) -> KernelSpec:
    if spec.arch not in ARCHS:
        raise SpecError(f"the Blackwell forward family is for {ARCHS}, not {spec.arch}")
    unsupported = [name for name, on in (("one CTA per tile", spec.persistent is False), ("trace", spec.trace)) if on]
    if unsupported:
        raise SpecError(f"the first Blackwell forward kernel has no {', '.join(unsupported)} yet (issue 20)")
    if spec.sinks:
        raise SpecError(f"attention sinks are not in the Blackwell forward kernel ({spec.arch}) yet: they run on sm_90a "
                        "(H100, H200) only")
    keys = spec.keys
    if keys % 8:
        raise SpecError(f"S_k = {keys}: the 5-D V map walks keys in groups of 8; pad the keys to a multiple of 8")
    block_n = spec.block_n or DEFAULT_BLOCK_N[spec.head_dim]
    if block_n % TMEM_CHUNK:
        raise SpecError(f"block_n {block_n}: S is read from TMEM in {TMEM_CHUNK}-column chunks")
    split = spec.pv_split or policy.default_pv_split(block_n)
    if sum(split) != block_n or any(c % TMEM_CHUNK for c in split):
        raise SpecError(f"pv_split {split}: the chunks must add up to block_n {block_n} and be multiples of "
                        f"{TMEM_CHUNK} keys (the softmax writes P {TMEM_CHUNK} keys at a time)")
    spec = spec.replace(block_n=block_n, pv_split=tuple(split), seq_len_k=keys, kv_heads=spec.kv_heads or spec.heads,
                        window=normalized_window(spec), persistent=True, tile_overlap=None)
    if not spec.stages:
        fitting = [n for n in range(2, MAX_STAGES + 1) if Plan(spec.replace(stages=n)).smem_total <= SMEM_LIMIT]
        spec = spec.replace(stages=max(fitting, default=2))
    return spec


@functools.lru_cache(maxsize=128)
def _derive(operand, arch, head_dim, rows, dtype):
    return layouts.derive_operand(operand, arch=arch, head_dim=head_dim, block_rows=rows, dtype=dtype)


@dataclass(frozen=True)
class SmemMap:
    q: int  # offsets of the Q tile and of the K and V rings
    k: int
    v: int
    bar: int
    slot: int  # where tcgen05.alloc writes the TMEM address
    total: int  # dynamic shared memory to request, alignment slack included


@dataclass(frozen=True)
class Plan:
    spec: KernelSpec
    threads = THREADS

    @cached_property
    def q(self):
        return _derive("q", self.spec.arch, self.spec.head_dim, TILE_M, self.spec.dtype)

    @cached_property
    def k(self):
        return _derive("k", self.spec.arch, self.spec.head_dim, self.spec.block_n, self.spec.dtype)

    @cached_property
    def v(self):
        return _derive("v", self.spec.arch, self.spec.head_dim, self.spec.block_n, self.spec.dtype)

    @cached_property
    def tmem(self) -> tcgen05.TmemPlan:
        return tcgen05.tmem_plan(self.spec.block_n, self.spec.head_dim, self.spec.dtype, buffers=2)

    @cached_property
    def abi(self) -> KernelABI:
        st = self.spec.stages
        barriers = (
            Barrier("QFull", 1, 1, "Q has landed"),
            Barrier("KFull", st, 1, "K of a ring slot has landed"),
            Barrier("VFull", st, 1, "V of a ring slot has landed"),
            Barrier("KEmpty", st, 1, "the QK that read a K slot is done (tcgen05.commit)"),
            Barrier("VEmpty", st, 1, "the PV that read a V slot is done (tcgen05.commit)"),
            Barrier("SFull0", 1, 1, "S buffer 0 holds QK (tcgen05.commit)"),
            Barrier("SFull1", 1, 1, "S buffer 1 holds QK (tcgen05.commit)"),
            *(Barrier(f"PFull{b}{c}", 1, 4, f"every softmax warp wrote PV chunk {c} of P over S buffer {b}")
              for b in range(2) for c in range(len(self.spec.pv_split))),
            Barrier("PvDone", 1, 1, "the last PV issued is done (tcgen05.commit)"),
            Barrier("QEmpty", 1, 1, "the tile's last QK has read Q (tcgen05.commit)"),
        )
        params = _VARLEN_PARAMS if self.spec.varlen else _FIXED_PARAMS
        return KernelABI(params, BarrierMap(barriers), Grid(persistent=True, heads=self.spec.heads))

    @property
    def m_blocks(self) -> int:
        return -(-self.spec.seq_len // TILE_M)

    @cached_property
    def smem(self) -> "SmemMap":
        offset, placed = 0, {}
        for name, op, count in (("q", self.q, 1), ("k", self.k, self.spec.stages), ("v", self.v, self.spec.stages)):
            offset = -(-offset // op.smem_align) * op.smem_align
            placed[name] = offset
            offset += count * op.smem_bytes
        bar = -(-offset // MBARRIER_BYTES) * MBARRIER_BYTES
        slot = bar + self.abi.barriers.bytes
        return SmemMap(placed["q"], placed["k"], placed["v"], bar, slot, slot + 4 + SMEM_ALIGN_SLACK)

    @property
    def smem_total(self) -> int:
        return self.smem.total

    @property
    def smem_align(self) -> int:
        return max(op.smem_align for op in (self.q, self.k, self.v))

    def tiles_m(self, max_seqlen_q: int | None = None) -> int:
        """Query tiles per (head, sequence); a varlen batch passes its longest query sequence."""
        return self.m_blocks if max_seqlen_q is None else -(-max_seqlen_q // TILE_M)

    def grid(self, batch: int, max_seqlen_q: int | None = None, sms: int = 0) -> tuple[int, int, int]:
        """The launch grid (the ABI's rule: one CTA per SM, at most one per tile) for `batch` entries
        (sequences when varlen) on `sms` SMs."""
        try:
            return self.abi.grid.dims(tiles_m=self.tiles_m(max_seqlen_q), batch=batch, sms=sms)
        except GridError as e:
            raise SpecError(str(e)) from None

    @property
    def window_bounds(self) -> tuple[int, int]:
        return window_bounds(self.spec)

    def kv_range(self, m_block: int, seq_q: int | None = None, seq_k: int | None = None,
                 key_shift: int = 0) -> tuple[int, int]:
        """The key blocks query tile m_block visits, (first, count), as the kernel's kv_range computes them:
        from the block of the tile's first row's left bound to that of its last row's right bound; count 0 where
        no row of the tile sees a key. A varlen tile passes its sequence's lengths and `key_shift`, the keys of
        the previous sequence its blocks start with (its first packed key mod 8, KEY_GROUP): blocks are counted
        in key positions shifted by it."""
        s, (left, right) = self.spec, self.window_bounds
        seq_q = s.seq_len if seq_q is None else seq_q
        seq_k = s.keys if seq_k is None else seq_k
        row_lo, row_hi = m_block * TILE_M, min((m_block + 1) * TILE_M, seq_q) - 1
        diagonal = seq_k - seq_q
        key_lo = key_shift + (0 if left < 0 else max(0, row_lo + diagonal - left))
        key_hi = key_shift + (seq_k - 1 if right < 0 else min(seq_k - 1, row_hi + diagonal + right))
        first = key_lo // s.block_n
        return first, 0 if key_hi < key_lo else key_hi // s.block_n + 1 - first

    def walk(self, cu_seqlens_q=None, cu_seqlens_k=None, *, batch: int = 1, ctas: int = 1,
             max_seqlen_q: int | None = None) -> list[list]:
        """Each CTA's tiles in the order the kernel's Tiles::take walks them: (m_block, head, batch, kv_first,
        n_kv) per tile, None for a varlen tile past its sequence's query end (which every role skips). Fixed
        lengths take `batch`; varlen the offsets (lists) and tiles_m of max_seqlen_q (default: the longest)."""
        heads, varlen = self.spec.heads, cu_seqlens_q is not None
        if varlen:
            batch = len(cu_seqlens_q) - 1
            longest = max(b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:]))
            tiles_m = self.tiles_m(max(longest, 1) if max_seqlen_q is None else max_seqlen_q)
        else:
            tiles_m = self.m_blocks
        out = [[] for _ in range(ctas)]
        for idx in range(tiles_m * heads * batch):
            m_block, head, b = tiles_m - 1 - idx % tiles_m, idx // tiles_m % heads, idx // tiles_m // heads
            if not varlen:
                tile = (m_block, head, b, *self.kv_range(m_block))
            elif m_block * TILE_M >= cu_seqlens_q[b + 1] - cu_seqlens_q[b]:
                tile = None
            else:
                tile = (m_block, head, b, *self.kv_range(m_block, cu_seqlens_q[b + 1] - cu_seqlens_q[b],
                                                          cu_seqlens_k[b + 1] - cu_seqlens_k[b],
                                                          cu_seqlens_k[b] % KEY_GROUP))
            out[idx % ctas].append(tile)
        return out

    @property
    def max_pass_chunks(self) -> int:
        """S chunks the row-max pass loads before one wait: the most that divide the row within MAX_PASS_COLUMNS."""
        chunks = self.spec.block_n // TMEM_CHUNK
        return max(g for g in range(1, chunks + 1) if chunks % g == 0 and g * TMEM_CHUNK <= MAX_PASS_COLUMNS)

    def origin_c(self, operand, names):
        return tma_origin_c(operand, names, self.spec.keys if operand.operand in ("k", "v") else self.spec.seq_len)


def context(plan: Plan) -> dict:
    s = plan.spec
    tm = plan.tmem
    s0, s1, o = tm.regions
    qk = tcgen05.InstrDescriptor(m=TILE_M, n=s.block_n, ab_type=s.dtype, a_major=plan.q.mma_major,
                                 b_major=plan.k.mma_major)
    pv = tcgen05.InstrDescriptor(m=TILE_M, n=s.head_dim, ab_type=s.dtype, a_major="K", b_major=plan.v.mma_major)
    return {
        "summary": (f"{s.name}: S={s.seq_len} S_k={s.keys} H={s.heads} H_kv={s.kv_heads} D={s.head_dim} {s.dtype} "
                    f"{'causal' if s.causal else 'non-causal'}"
                    + (f", window {s.window}" if s.window != (-1, -1) else "")
                    + (f", softcap {s.softcap:g}" if s.softcap else "")
                    + (", varlen (S, S_k: the longest sequences' bucket)" if s.varlen else "")
                    + f", block {TILE_M}x{s.block_n}, {s.stages} stages"),
        "kernel_name": s.name,
        "arch": s.arch,
        "ptx_type": s.dtype,
        "seq_len": s.seq_len, "seq_len_k": s.keys, "heads": s.heads, "group": s.group,
        "head_dim": s.head_dim, "block_m": TILE_M, "block_n": s.block_n, "stages": s.stages,
        "window_left": plan.window_bounds[0], "window_right": plan.window_bounds[1],
        "softcap_c": f"{float(s.softcap)!r}f",
        "threads": THREADS, "softmax_warp0": SOFTMAX_WARP0,
        "smem": plan.smem, "smem_align": plan.smem_align,
        "q_bytes": plan.q.smem_bytes, "k_bytes": plan.k.smem_bytes, "v_bytes": plan.v.smem_bytes,
        "q_desc": plan.q.descriptors(), "k_desc": plan.k.descriptors(), "v_desc": plan.v.descriptors(),
        "desc_address_shift": descriptor_address_shift((plan.q, plan.k, plan.v)),
        "qk_idesc": qk, "pv_idesc": pv,
        "tmem_alloc": tm.alloc_columns, "s_columns": (s0.first_column, s1.first_column), "o_column": o.first_column,
        "packed_per_slice": MMA_K * s.elem_bytes // 4,
        # PV in the split's chunks, [first, end) in 16-key slices: each waits for its part of P only, so the
        # MMA starts on the first chunk while the softmax still converts the rest.
        "pv_chunks": [(sum(s.pv_split[:c]) // MMA_K, sum(s.pv_split[:c + 1]) // MMA_K) for c in range(len(s.pv_split))],
        "tmem_chunk": TMEM_CHUNK,
        "max_pass_chunks": plan.max_pass_chunks,
        "o_vector_elems": O_VECTOR_BYTES // s.elem_bytes,
        "elem_bytes": s.elem_bytes,
        "varlen": s.varlen, "key_group": KEY_GROUP,
        "abi": plan.abi, "family_params": FAMILY_PARAMS, "mbarrier_bytes": MBARRIER_BYTES,
        "tma_ranks": sorted({op.tensor_map.rank for op in (plan.q, plan.k, plan.v)}),
        "tma_tiles": tma_tiles(plan, {"q": ("load",), "k": ("load",), "v": ("load",)}),
        "log2e": LOG2E,
    }


FAMILY = Family(name="fwd_sm100", template="fwd_sm100/kernel.cu.j2", resolve=resolve, make_plan=Plan,
                context=context, kernel_name=lambda spec: spec.name)
