"""A CPU functional model of one Blackwell attention tile's dataflow, built from the layout objects the kernels
are rendered from (`gen.py simulate --shape S,H,D --arch sm_103a`).

No Blackwell GPU is lent here, so this is how the sm_100a/sm_103a data path is checked end to end before
silicon: random Q, K, V sit in a byte-addressed global memory; the TMA model (layouts.tma.place_box) writes
each tile into shared-memory bytes through the derived tensor maps (V by the seed's 5-D key-group map); the
descriptor model (layouts.mma.mma_read_byte) reads every operand element as tcgen05.mma would, through the
derived descriptors; a TMEM model (128 lanes x 512 columns of 32-bit cells) holds S, P packed over S and O at the
derived column plan (layouts.tcgen05); the online softmax, the conditional rescale of O and the buffer order follow
the Blackwell forward kernel (codegen/families/fwd_sm100: the tile's key blocks from the plan's kv_range, ring
slot G % stages and TMEM S buffer G % 2 for its G-th block, the band mask of causal and sliding windows, the
soft cap with the row max capped once). One query tile is simulated, by default the last (the one a left window
starts latest).

Varlen (`--varlen 100,300:77,...`: query lengths, each with its key length after a colon, else the same): the
sequences are packed back to back in global memory as the API packs them, the tensor maps see one batch entry of
total rows, and each sequence's every tile is simulated as the varlen kernel runs it: its lengths from the
offsets, Q from the sequence's first packed row (rows past its end are the next sequence's, computed and never
compared), key blocks from its first key rounded down to the V map's groups of 8 (the keys before it and past
its end are the neighbours' and must be masked), tiles_m of the longest sequence with the tiles past a
sequence's end skipped. The output is compared with float64 attention, within twice the error of the same
computation done directly in the inputs' dtype (no layouts): a layout, descriptor, box or TMEM column that is
wrong moves elements and fails by far more.

Injected faults show the model can fail: the seed's wrong V formula (`n_vec ^ (k & 6)`, V staged by it instead
of by TMA), P written one 16-key slice off in TMEM, the seed's 4-D V box, a window's left bound one key too
wide, and (varlen) the band not shifted by a sequence's first key mod 8 (its blocks start at the key group).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from layouts import seed
from layouts.cexpr import compile_c_expr
from layouts.mma import mma_read_byte
from layouts.tma import TensorMapParams, place_box

from .families import fwd_sm100
from .spec import MMA_K, KernelSpec

FAULTS = ("seed_v_formula", "p_column", "v_box_4d", "window_off_by_one", "varlen_key_shift")
LOG2E = 1.4426950408889634


def to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> the 16-bit patterns of f16 or bf16 (round to nearest even)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16).view(np.uint16)
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    bits = np.asarray(bits, dtype=np.uint16)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass
class Machine:
    """Byte-addressed global and shared memory, and tensor memory, for one CTA."""
    gmem: np.ndarray
    smem: np.ndarray
    tmem: np.ndarray  # (128, 512) uint32

    def tma_load(self, params: TensorMapParams, origin, smem_address: int) -> None:
        placed = place_box(params, origin, smem_address)
        e = params.elem_bytes
        for b in range(e):
            src = np.where(placed.global_address >= 0, self.gmem[np.maximum(placed.global_address, 0) + b], 0)
            self.smem[smem_address + placed.smem_offset + b] = src  # out of bounds: zero-filled

    def read16(self, address) -> np.ndarray:
        address = np.asarray(address, dtype=np.int64)
        return self.smem[address].astype(np.uint16) | (self.smem[address + 1].astype(np.uint16) << 8)


@dataclass(frozen=True)
class SimResult:
    spec: KernelSpec
    rel_err: float
    yardstick: float  # the same computation in the inputs' dtype, no layouts
    worst_row_err: float
    worst_row_yardstick: float
    fault: str | None
    tile: int = 0
    sequence: tuple | None = None  # varlen: (index, seq_q, seq_k, q_start, k_start)

    @property
    def ok(self) -> bool:
        return (math.isfinite(self.rel_err) and self.rel_err <= 2 * max(self.yardstick, 1e-7)
                and self.worst_row_err <= 2 * max(self.worst_row_yardstick, 1e-7))

    def summary(self) -> str:
        s = self.spec
        fault = f", fault injected: {self.fault}" if self.fault else ""
        mask = "".join((" causal" if s.causal else "", f" window={s.window}" if s.window != (-1, -1) else "",
                        f" softcap={s.softcap:g}" if s.softcap else ""))
        where = (f"S_k={s.keys}" if self.sequence is None else
                 "varlen sequence {} (S_q={}, S_k={}, rows from {}, keys from {})".format(*self.sequence))
        return (f"simulate {s.arch} {where} D={s.head_dim} {s.dtype} block_n={s.block_n}{mask} tile {self.tile}"
                f"{fault}: rel err "
                f"{self.rel_err:.3e} (same-dtype computation {self.yardstick:.3e}), worst row {self.worst_row_err:.3e} "
                f"({self.worst_row_yardstick:.3e}): {'PASS' if self.ok else 'FAIL'}")


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _worst_row(a, b) -> float:
    return float(np.max(np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-30)))


def _operand(machine: Machine, derivation, tile: int, kk: int, rows: int) -> np.ndarray:
    """(rows x 16) float32: slice kk of the operand tile at shared address `tile`, as tcgen05.mma reads it."""
    desc = derivation.descriptor_objects()[kk]
    desc = dataclasses.replace(desc, start_address=desc.start_address + tile)
    r, k = np.meshgrid(np.arange(rows), np.arange(MMA_K), indexing="ij")
    address = mma_read_byte(desc, major=derivation.mma_major, elem_bytes=derivation.elem_bytes, row=r, k=k)
    return from_bits(machine.read16(address), derivation.dtype)


def _place_by_formula(machine: Machine, c_formula: str, values_bits: np.ndarray, tile: int) -> None:
    """Stage a (keys x head dim) V tile at the byte offsets a C formula over (k, n) gives (the seed's V46)."""
    keys, dim = values_bits.shape
    formula = compile_c_expr(c_formula, ("k", "n"))
    k, n = np.meshgrid(np.arange(keys), np.arange(dim), indexing="ij")
    offset = tile + np.asarray(formula({"k": k, "n": n}), dtype=np.int64)
    machine.smem[offset] = (values_bits & 0xFF).astype(np.uint8)
    machine.smem[offset + 1] = (values_bits >> 8).astype(np.uint8)


def band_keep(queries: int, keys: int, bounds: tuple[int, int]) -> np.ndarray:
    """(queries, keys) bool: the keys each query sees, bottom-right aligned, from the window's definition
    (codegen.check.band_mask's rule; not the kernel's kv_range or its per-row band)."""
    left, right = bounds
    offset = np.arange(keys)[None, :] - np.arange(queries)[:, None] - (keys - queries)
    keep = np.ones((queries, keys), dtype=bool)
    if right >= 0:
        keep &= offset <= right
    if left >= 0:
        keep &= offset >= -left
    return keep


def _reference(q, k, v, scale, keep, softcap):
    if not k.shape[0]:  # a sequence without keys: every row outputs 0
        return np.zeros((q.shape[0], v.shape[1]))
    scores = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    scores = np.where(keep, scores, -np.inf)
    top = scores.max(axis=1, keepdims=True)
    p = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = p.sum(axis=1, keepdims=True)
    return (p / np.where(total > 0, total, 1)) @ v.astype(np.float64)  # a row that sees no key: 0


def _same_dtype(q, k, v, scale, keep, softcap, dtype):
    """The flash computation with no layouts: f32 products, P rounded to the dtype before PV."""
    if not k.shape[0]:
        return np.zeros((q.shape[0], v.shape[1]), dtype=np.float32)
    s = (q @ k.T).astype(np.float32) * np.float32(scale)
    if softcap:
        s = (np.float32(softcap) * np.tanh(s / np.float32(softcap))).astype(np.float32)
    s = np.where(keep, s, -np.inf).astype(np.float32)
    m = s.max(axis=1, keepdims=True)
    p = np.exp2((s - np.where(np.isfinite(m), m, 0)) * np.float32(LOG2E)).astype(np.float32)
    pr = from_bits(to_bits(p, dtype), dtype)
    total = p.sum(axis=1, keepdims=True)
    return (pr @ v) / np.where(total > 0, total, 1)


def simulate(spec: KernelSpec, *, seed_value: int = 0, fault: str | None = None, tile: int = -1,
             lengths=None, sequence: int = 0) -> SimResult:
    """One 128-row query tile of `spec` (batch 1, one head; `tile` counts from the end when negative) over the
    key blocks the kernel visits for it. `lengths`: a varlen batch, (seq_q, seq_k) per sequence, packed back to
    back; the tile is one of sequence `sequence`'s (simulate_varlen runs them all)."""
    with np.errstate(invalid="ignore", over="ignore"):  # an injected fault may turn P's bits into NaN
        return _simulate(spec, seed_value, fault, tile, lengths, sequence)


def varlen_spec(spec: KernelSpec, lengths) -> KernelSpec:
    """The varlen kernel's spec for a batch of (seq_q, seq_k) lengths: the max lengths' buckets (codegen.api)."""
    from .api import _length_bucket

    return spec.replace(varlen=True, seq_len=_length_bucket(max(max(q for q, _ in lengths), 1)),
                        seq_len_k=_length_bucket(max(max(k for _, k in lengths), 1)))


def simulate_varlen(spec: KernelSpec, lengths, *, seed_value: int = 0, fault: str | None = None) -> list[SimResult]:
    """Every tile the varlen kernel computes for the batch `lengths`, (seq_q, seq_k) per sequence: per
    sequence, the tiles inside its queries (the kernel skips the rest)."""
    results = []
    for b, (seq_q, _) in enumerate(lengths):
        for m_block in range(-(-seq_q // fwd_sm100.TILE_M)):
            results.append(simulate(spec, seed_value=seed_value, fault=fault, tile=m_block, lengths=lengths, sequence=b))
    return results


def _simulate(spec: KernelSpec, seed_value: int, fault: str | None, tile: int, lengths, sequence: int) -> SimResult:
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
    if lengths is None:
        plan = fwd_sm100.Plan(fwd_sm100.resolve(spec.replace(seq_len=max(spec.seq_len, fwd_sm100.TILE_M))))
        lengths, sequence = [(plan.spec.seq_len, plan.spec.keys)], 0
        varlen = False
        if fault == "varlen_key_shift":
            raise ValueError("the varlen_key_shift fault needs a varlen batch (--varlen)")
    else:
        lengths = [(int(q), int(k)) for q, k in lengths]
        if min(min(q, k) for q, k in lengths) < 0 or not 0 <= sequence < len(lengths):
            raise ValueError(f"varlen lengths {lengths}, sequence {sequence}: lengths >= 0, a sequence of them")
        plan = fwd_sm100.Plan(fwd_sm100.resolve(varlen_spec(spec, lengths)))
        varlen = True
    s = plan.spec
    d, bn, dtype, e = s.head_dim, s.block_n, s.dtype, s.elem_bytes
    rows = fwd_sm100.TILE_M
    # The packed batch: sequence b's queries are rows [cu_q[b], cu_q[b + 1]), its keys [cu_k[b], cu_k[b + 1]).
    cu_q, cu_k = np.cumsum([0] + [q for q, _ in lengths]), np.cumsum([0] + [k for _, k in lengths])
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    queries, keys = lengths[sequence]
    q_start, k_start = int(cu_q[sequence]), int(cu_k[sequence])
    if total_k % fwd_sm100.KEY_GROUP:
        raise ValueError(f"{total_k} packed keys: the V map walks keys in groups of {fwd_sm100.KEY_GROUP}")
    m_blocks = -(-queries // rows)
    if not -m_blocks <= tile < m_blocks:
        raise ValueError(f"tile {tile}: the queries make {m_blocks} tiles of {rows} rows")
    m_block = tile % m_blocks
    # The varlen tile's keys: blocks from the sequence's first key rounded down to a key group, the band shifted
    # by the keys of the previous sequence before it (the kernel's Tile::key_shift).
    key_shift = k_start % fwd_sm100.KEY_GROUP if varlen else 0
    k_base = k_start - key_shift
    band_shift = 0 if fault == "varlen_key_shift" else key_shift
    rng = np.random.default_rng(seed_value)
    tensors = {name: from_bits(to_bits(rng.standard_normal((n, d)).astype(np.float32), dtype), dtype)
               for name, n in (("q", total_q), ("k", total_k), ("v", total_k))}
    # Global memory: q, k, v back to back, (total, 1 head, D) contiguous, 16-byte aligned.
    base, offset = {}, 0
    for name, t in tensors.items():
        base[name] = offset
        offset += -(-max(t.size, 1) * e // 1024) * 1024
    gmem = np.zeros(offset, dtype=np.uint8)
    for name, t in tensors.items():
        bits = to_bits(t, dtype).ravel()
        gmem[base[name]:base[name] + 2 * bits.size:2] = (bits & 0xFF).astype(np.uint8)
        gmem[base[name] + 1:base[name] + 2 * bits.size:2] = (bits >> 8).astype(np.uint8)
    machine = Machine(gmem, np.zeros(plan.smem.total + 4096, dtype=np.uint8),
                      np.zeros((fwd_sm100.TILE_M, 512), dtype=np.uint32))
    smem_base = -(-1024 // plan.smem_align) * plan.smem_align  # any 1024-aligned dynamic base
    q_tile = smem_base + plan.smem.q

    def params(op, seq):
        return getattr(plan, op).tensor_map.instantiate(batch=1, seq_len=seq, heads=1, stride_b=seq * d, stride_s=d,
                                                       stride_h=d, base_address=base[op])

    machine.tma_load(params("q", total_q), plan.q.tensor_map.box_origin(batch_index=0,
                                                                        seq_start=q_start + m_block * rows,
                                                                        head=0, seq_len=total_q), q_tile)
    tm = plan.tmem
    o_col = tm.regions[-1].first_column
    p_shift = MMA_K * e // 4 if fault == "p_column" else 0  # the fault: P written one slice past where it is read
    scale_log2 = np.float32(LOG2E / math.sqrt(d))
    # The soft cap's factors in and out of the tanh, in units of s (the kernel's Softcap).
    cap_in = np.float32(scale_log2 * np.float32(math.log(2)) / np.float32(s.softcap)) if s.softcap else None
    cap_out = np.float32(1) / cap_in if s.softcap else None
    # Each row's band [lo, hi] (the kernel's Band): the window's bounds from the row's diagonal, cut to the keys,
    # in tile key positions (a sequence key plus the shift).
    left, right = plan.window_bounds
    diagonal = m_block * rows + np.arange(rows) + keys - queries
    band_lo = band_shift + (np.maximum(0, diagonal - left - (fault == "window_off_by_one")) if left >= 0
                            else np.zeros(rows, dtype=np.int64))
    band_hi = band_shift + (np.minimum(keys - 1, diagonal + right) if right >= 0 else np.full(rows, keys - 1))
    row_max = np.full(rows, -np.inf, dtype=np.float32)
    row_sum = np.zeros(rows, dtype=np.float32)
    machine.tmem[:, o_col:o_col + d] = 0x7FC00000  # NaN, as if a previous tile's O were there: the first PV overwrites
    packed_per_slice = MMA_K * e // 4
    kv_first, n_kv = plan.kv_range(m_block, queries, keys, key_shift)
    for G, j in enumerate(range(kv_first, kv_first + n_kv)):
        # The forward kernel's buffers for its G-th block: ring slot G % stages, TMEM S buffer G % 2 (P over it).
        k_tile = smem_base + plan.smem.k + (G % s.stages) * plan.k.smem_bytes
        v_tile = smem_base + plan.smem.v + (G % s.stages) * plan.v.smem_bytes
        s_col = p_col = tm.regions[G % 2].first_column
        p_write_col = p_col + p_shift
        row0 = k_base + j * bn  # the block's first packed key row
        machine.tma_load(params("k", total_k), plan.k.tensor_map.box_origin(batch_index=0, seq_start=row0, head=0,
                                                                            seq_len=total_k), k_tile)
        if fault == "seed_v_formula":  # the seed's V46: V staged by its wrong formula, not by the tensor map
            v_block = np.zeros((bn, d), dtype=np.float32)
            hi = min(total_k, row0 + bn)
            v_block[:hi - row0] = tensors["v"][row0:hi]
            _place_by_formula(machine, seed.WRONG_N_VEC_C, to_bits(v_block, dtype), v_tile)
        elif fault == "v_box_4d":  # the seed's 4-D map walks the two atoms side by side in each row
            four_d = seed.four_d_box(heads=1, seq_len=total_k)
            four_d = dataclasses.replace(four_d, global_address=base["v"], dtype=dtype)
            machine.tma_load(four_d, (0, 0, 0, row0), v_tile)
        else:
            machine.tma_load(params("v", total_k), plan.v.tensor_map.box_origin(batch_index=0, seq_start=row0, head=0,
                                                                                seq_len=total_k), v_tile)
        # S = Q K^T, one tcgen05.mma per 16-wide slice of the head dim, accumulated in TMEM (f32).
        s_block = np.zeros((rows, bn), dtype=np.float32)
        for kk in range(d // MMA_K):
            s_block += _operand(machine, plan.q, q_tile, kk, rows) @ _operand(machine, plan.k, k_tile, kk, bn).T
        machine.tmem[:, s_col:s_col + bn] = s_block.view(np.uint32)
        # Softmax warps: S from TMEM, keys outside the row's band masked, the new max (the cap of the raw max),
        # the conditional rescale of O (not before the tile's first PV), P over S.
        s_read = machine.tmem[:, s_col:s_col + bn].view(np.float32).copy()
        key = j * bn + np.arange(bn)
        inside = (key[None, :] >= band_lo[:, None]) & (key[None, :] <= band_hi[:, None])
        block_max = np.where(inside, s_read, -np.inf).max(axis=1)
        if s.softcap:
            block_max = np.where(block_max == -np.inf, block_max, cap_out * np.tanh(block_max * cap_in))
            s_read = (cap_out * np.tanh(s_read * cap_in)).astype(np.float32)
        new_max = np.maximum(row_max, block_max).astype(np.float32)
        scaled_max = np.where(new_max == -np.inf, 0, new_max * scale_log2).astype(np.float32)
        alpha = np.exp2(row_max * scale_log2 - scaled_max).astype(np.float32)
        if G > 0 and np.any(alpha != 1.0):  # the seed rescales O only when some row's max grew
            o = machine.tmem[:, o_col:o_col + d].view(np.float32) * alpha[:, None]
            machine.tmem[:, o_col:o_col + d] = o.astype(np.float32).view(np.uint32)
        row_max = new_max
        p = np.where(inside, np.exp2(s_read * scale_log2 - scaled_max[:, None]), 0).astype(np.float32)
        row_sum = row_sum * alpha + p.sum(axis=1, dtype=np.float32)
        p_bits = to_bits(p, dtype).astype(np.uint32)
        packed = p_bits[:, 0::2] | (p_bits[:, 1::2] << 16)  # key 2c in the low half, 2c + 1 in the high
        machine.tmem[:, p_write_col:p_write_col + bn // 2] = packed[:, :machine.tmem.shape[1] - p_write_col]
        # O += P V, TS form: A = P from TMEM (K-major, 16 keys = packed_per_slice columns), B = V by descriptor.
        o = machine.tmem[:, o_col:o_col + d].view(np.float32).copy() if G > 0 else np.zeros((rows, d), np.float32)
        for kk in range(bn // MMA_K):
            cols = machine.tmem[:, p_col + kk * packed_per_slice:p_col + (kk + 1) * packed_per_slice]
            a = np.empty((rows, MMA_K), dtype=np.float32)
            a[:, 0::2] = from_bits((cols & 0xFFFF).astype(np.uint16), dtype)
            a[:, 1::2] = from_bits((cols >> 16).astype(np.uint16), dtype)
            b = _operand(machine, plan.v, v_tile, kk, d)  # (n, k): element (head col n, key k)
            o += a @ b.T
        machine.tmem[:, o_col:o_col + d] = o.view(np.uint32)
    # O / sum, 0 for a row that saw no key (and for a tile without key blocks, whose O the kernel never reads).
    o = machine.tmem[:, o_col:o_col + d].view(np.float32) if n_kv else np.zeros((rows, d), np.float32)
    out = o * np.where(row_sum > 0, 1 / np.where(row_sum > 0, row_sum, 1), 0)[:, None]
    valid = slice(m_block * rows, min((m_block + 1) * rows, queries))  # rows past S_q are computed, never stored
    q = tensors["q"][q_start + valid.start:q_start + valid.stop]
    k, v = tensors["k"][k_start:k_start + keys], tensors["v"][k_start:k_start + keys]
    keep = band_keep(queries, keys, plan.window_bounds)[valid]
    ref = _reference(q, k, v, 1 / math.sqrt(d), keep, s.softcap)
    same = _same_dtype(q, k, v, 1 / math.sqrt(d), keep, s.softcap, dtype)
    out = out[:valid.stop - valid.start]
    where = (sequence, queries, keys, q_start, k_start) if varlen else None
    return SimResult(s, _rel(out, ref), _rel(same, ref), _worst_row(out, ref), _worst_row(same, ref), fault, m_block,
                     where)


def simulate_main(argv: list[str]) -> int:
    """`gen.py simulate`: the CPU model of a Blackwell tile; the last line says PASS (exit 0) or FAIL (exit 1)."""
    import argparse
    import sys

    from layouts.dtypes import DTYPE_NAMES

    from .cli import join_signed_values, parse_window, window_arguments

    parser = argparse.ArgumentParser(prog="gen.py simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1024,1,128", metavar="S,H,D",
                        help="key length, heads (one is simulated), head dim")
    parser.add_argument("--arch", default="sm_103a", choices=fwd_sm100.ARCHS)
    parser.add_argument("--dtype", default="f16", choices=DTYPE_NAMES)
    parser.add_argument("--block-n", type=int, default=0, help="keys per block (default: the policy's)")
    parser.add_argument("--causal", action="store_true")
    window_arguments(parser)
    parser.add_argument("--tile", type=int, default=-1,
                        help="the query tile to simulate, negative from the end (default -1: the last)")
    parser.add_argument("--varlen", default="", metavar="Q[:K],...",
                        help="a varlen batch: each sequence's query length, with its key length after a colon (else "
                             "the same), packed back to back; every tile of every sequence is simulated (--shape's S "
                             "and --tile are not used)")
    parser.add_argument("--seed", type=int, default=0, help="random inputs' seed")
    parser.add_argument("--inject-seed-bug", action="store_true",
                        help="stage V by the seed's wrong formula (n_vec ^ (k & 6)); must end in FAIL")
    parser.add_argument("--fault", choices=FAULTS, help="inject one fault by name (seed_v_formula is --inject-seed-bug)")
    args = parser.parse_args(join_signed_values(argv))
    try:
        s, h, d = (int(x) for x in args.shape.split(","))
        spec = KernelSpec(seq_len=s, heads=h, head_dim=d, dtype=args.dtype, arch=args.arch, block_n=args.block_n,
                          causal=args.causal, window=parse_window(args.window), softcap=args.softcap)
        fault = "seed_v_formula" if args.inject_seed_bug else args.fault
        if args.varlen:
            lengths = parse_varlen_lengths(args.varlen)
            results = simulate_varlen(spec, lengths, seed_value=args.seed, fault=fault)
        else:
            results = [simulate(spec, seed_value=args.seed, fault=fault, tile=args.tile)]
    except ValueError as e:  # SpecError, LayoutError, a malformed --shape or --varlen
        print(f"error: {e}", file=sys.stderr)
        return 2
    for result in results:
        print(result.summary())
    ok = all(r.ok for r in results)
    if args.varlen:
        print(f"varlen: {len(results)} tiles of {len(lengths)} sequences {lengths}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def parse_varlen_lengths(text: str) -> list[tuple[int, int]]:
    """--varlen's Q[:K],... -> [(seq_q, seq_k), ...]."""
    try:
        lengths = [tuple(int(x) for x in item.split(":")) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"--varlen expects Q[:K],... (integers), got {text!r}") from None
    if any(len(n) not in (1, 2) or min(n) < 0 for n in lengths):
        raise ValueError(f"--varlen expects Q[:K],... of lengths >= 0, got {text!r}")
    return [(n[0], n[-1]) for n in lengths]
