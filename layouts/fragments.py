"""Register fragments of wgmma (sm_90a) as linear layouts, and the C expressions templates index them with.

PTX ISA, "Register Fragments and Shared Memory Matrix Layouts" for wgmma .m64nNk16:

* accumulator D (64 x N, f32): thread t of the warpgroup (warp = t / 32, lane = t % 32) holds N/2 values;
  value i sits at  row = 16*warp + 8*((i >> 1) & 1) + lane / 4,   col = 8*(i >> 2) + 2*(lane % 4) + (i & 1).
* A from registers (64 x 16, 16-bit): four 32-bit registers of two values each; value r (0..7) sits at
  row = 16*warp + 8*((r >> 1) & 1) + lane / 4,   k = 8*(r >> 2) + 2*(lane % 4) + (r & 1).

Bit diagram of the accumulator map (input bits on the left, the output bit each one sets):

    lane: b0 -> col 2   b1 -> col 4   b2 -> row 1   b3 -> row 2   b4 -> row 4
    warp: b0 -> row 16  b1 -> row 32
    reg : b0 -> col 1   b1 -> row 8   b2.. -> col 8, 16, 32, ...

The A layout is the same diagram with N = 16, which is why a 16-column slice of the S accumulator is, value
for value, the A operand of P V: `s_slice_is_a_operand` proves it for every slice before a template relies on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import LayoutError
from .linear import LinearLayout, log2_exact


def _accumulator_bases(n: int) -> dict[str, list[dict[str, int]]]:
    reg_bits = log2_exact(n // 2, f"wgmma accumulator registers for N={n}")
    reg = [{"row": 0, "col": 1}, {"row": 8, "col": 0}] + [{"row": 0, "col": 8 << b} for b in range(reg_bits - 2)]
    return {
        "lane": [{"row": 0, "col": 2}, {"row": 0, "col": 4}, {"row": 1, "col": 0}, {"row": 2, "col": 0},
                 {"row": 4, "col": 0}],
        "warp": [{"row": 16, "col": 0}, {"row": 32, "col": 0}],
        "reg": reg[:reg_bits],
    }


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


def wgmma_accumulator(n: int) -> LinearLayout:
    """(lane, warp, reg) -> (row, col) of the 64 x n f32 accumulator of one warpgroup.

    For n not a power of two (96, 192) this is the map of the next power of two: the PTX table gives one
    formula for every N, and an N = n accumulator is its first n/2 values (`check_accumulator_prefix`).
    """
    if not 8 <= n <= 256 or n % 8:
        raise LayoutError(f"wgmma N must be a multiple of 8 in 8..256, got {n}")
    p = _pow2_at_least(n)
    return LinearLayout(_accumulator_bases(p), {"lane": 32, "warp": 4, "reg": p // 2}, {"row": 64, "col": p})


def check_accumulator_prefix(n: int, full: int = 256) -> None:
    """Values 0..n/2-1 of each thread under the N = `full` map cover the 64 x n tile, every element once.

    The template indexes every accumulator (S with N = block_n, O with N = head_dim) through the N = 256
    expressions of `wgmma_accumulator_c`; this is what makes that right for any smaller N.
    """
    acc = wgmma_accumulator(full)
    if not 8 <= n <= full or n % 8:
        raise LayoutError(f"accumulator N = {n}: must be a multiple of 8 in 8..{full}")
    lane, warp, reg = np.meshgrid(np.arange(32), np.arange(4), np.arange(n // 2), indexing="ij")
    at = acc.apply({"lane": lane.ravel(), "warp": warp.ravel(), "reg": reg.ravel()})
    row, col = np.asarray(at["row"]), np.asarray(at["col"])
    outside = np.nonzero(col >= n)[0]
    if outside.size:
        i = outside[0]
        raise LayoutError(f"N = {n}: value {int(reg.ravel()[i])} of lane {int(lane.ravel()[i])}, warp "
                          f"{int(warp.ravel()[i])} lands in column {int(col[i])}, outside the tile")
    if np.unique(row * n + col).size != 64 * n:
        raise LayoutError(f"N = {n}: the first {n // 2} values of each thread do not cover the 64 x {n} tile once each")


def check_separable(n: int) -> None:
    """Row and column of accumulator value i are a thread part plus a register part: (row, col)(lane, warp, i) =
    (row, col)(lane, warp, 0) + (row, col)(0, 0, i) for every thread and value of the 64 x n map, so a kernel
    may compute a thread's coordinates once and add per-register constants."""
    acc = wgmma_accumulator(n)
    lane, warp, reg = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), np.arange(n // 2), indexing="ij"))
    zero = np.zeros_like(lane)
    full = acc.apply({"lane": lane, "warp": warp, "reg": reg})
    thread = acc.apply({"lane": lane, "warp": warp, "reg": zero})
    register = acc.apply({"lane": zero, "warp": zero, "reg": reg})
    for dim in ("row", "col"):
        bad = np.nonzero(np.asarray(full[dim]) != np.asarray(thread[dim]) + np.asarray(register[dim]))[0]
        if bad.size:
            i = bad[0]
            raise LayoutError(f"N = {n}: the {dim} of value {reg[i]} of lane {lane[i]}, warp {warp[i]} is not its "
                              "thread part plus its register part")


def wgmma_a_registers() -> LinearLayout:
    """(lane, warp, reg) -> (row, k) of the 64 x 16 A operand held in registers (16-bit types, 8 values).

    Written from the PTX ISA's A-fragment table on its own, not derived from the accumulator's bases, so that
    `s_slice_is_a_operand` compares two independent statements of the hardware.
    """
    bases = {
        "lane": [{"row": 0, "k": 2}, {"row": 0, "k": 4}, {"row": 1, "k": 0}, {"row": 2, "k": 0}, {"row": 4, "k": 0}],
        "warp": [{"row": 16, "k": 0}, {"row": 32, "k": 0}],
        "reg": [{"row": 0, "k": 1}, {"row": 8, "k": 0}, {"row": 0, "k": 8}],
    }
    return LinearLayout(bases, {"lane": 32, "warp": 4, "reg": 8}, {"row": 64, "k": 16})


def s_slice_is_a_operand(n: int) -> None:
    """Check that accumulator values 8j..8j+7 of a 64 x n S tile are, in order, the A operand of slice j."""
    acc, a = wgmma_accumulator(n), wgmma_a_registers()
    j, lane, warp, r = (g.ravel() for g in np.meshgrid(np.arange(n // 16), np.arange(32), np.arange(4), np.arange(8),
                                                       indexing="ij"))
    s = acc.apply({"lane": lane, "warp": warp, "reg": 8 * j + r})
    p = a.apply({"lane": lane, "warp": warp, "reg": r})
    bad = np.nonzero((s["row"] != p["row"]) | (s["col"] - 16 * j != p["k"]))[0]
    if bad.size:
        i = bad[0]
        raise LayoutError(
            f"S value {8 * j[i] + r[i]} of lane {lane[i]}, warp {warp[i]} is ({s['row'][i]}, {s['col'][i]}), but A "
            f"register value {r[i]} of slice {j[i]} is (row {p['row'][i]}, k {16 * j[i] + p['k'][i]})")


@dataclass(frozen=True)
class FragmentC:
    row_c: str  # over `warp`, `lane`, `i`
    col_c: str
    row_half_c: str  # over `i`: 0 or 1, which of a thread's two rows value i belongs to
    row_half_stride: int  # the register index step from a thread's first row to its second
    row_lane_masks: tuple[int, ...]  # lane XOR masks that reach every lane holding the same rows (a row reduction)
    col_lane_masks: tuple[int, ...] = ()  # ... the same columns (a column reduction: the swapped decode's softmax)


def bit_gather_c(layout: LinearLayout, out_dim: str, names: dict[str, str]) -> str:
    """C expression for one output dim of a layout whose basis images are single bits (no XOR mixing).

    Runs of consecutive input bits that land on consecutive output bits become one `((x >> a) & m) << b`.
    """
    terms = []
    for in_dim, images in layout.bases.items():
        bits = [(i, img.get(out_dim, 0)) for i, img in enumerate(images) if img.get(out_dim, 0)]
        for i, value in bits:
            if value & (value - 1):
                raise LayoutError(f"{out_dim} image of {in_dim} bit {i} is {value}, not a single bit")
        run_start = None
        for idx, (i, value) in enumerate(bits):
            if run_start is None:
                run_start = idx
            nxt = bits[idx + 1] if idx + 1 < len(bits) else None
            if nxt is None or nxt[0] != i + 1 or nxt[1] != value * 2:
                first_in, first_out = bits[run_start]
                width = idx - run_start + 1
                source = f"({names[in_dim]} >> {first_in})" if first_in else names[in_dim]
                term = f"({source} & {(1 << width) - 1})"
                shift = first_out.bit_length() - 1
                terms.append(f"({term} << {shift})" if shift else term)
                run_start = None
    return " | ".join(terms) if terms else "0"


def wgmma_accumulator_c(n: int = 256) -> FragmentC:
    """Row and column of accumulator value `i` of thread (warp, lane), for any N (the high reg bits only add
    columns, so the N=256 expression serves every smaller N: `check_accumulator_prefix` proves it per N)."""
    acc = wgmma_accumulator(n)
    names = {"lane": "lane", "warp": "warp", "reg": "i"}
    # A thread's values cover two rows: the one register bit that moves the row picks between them.
    row_bits = [b for b, image in enumerate(acc.bases["reg"]) if image["row"]]
    if len(row_bits) != 1:
        raise LayoutError(f"expected one register bit to select a thread's row, found bits {row_bits}")
    (bit,) = row_bits
    # Lanes whose index differs only in bits that move the column (never the row) hold the same rows.
    lane_masks = tuple(1 << b for b, image in enumerate(acc.bases["lane"]) if not image["row"])
    col_masks = tuple(1 << b for b, image in enumerate(acc.bases["lane"]) if not image["col"])
    return FragmentC(row_c=bit_gather_c(acc, "row", names), col_c=bit_gather_c(acc, "col", names),
                     row_half_c=f"((i >> {bit}) & 1)", row_half_stride=1 << bit, row_lane_masks=lane_masks,
                     col_lane_masks=col_masks)


def address_bases(offsets_of, values) -> tuple[tuple[int, int, int], ...]:
    """Split per-thread addresses into a few bases plus immediates: (i, base, imm) for each value i, in order, with
    offsets_of(i) == offsets_of(base) + imm for every thread (offsets_of returns one offset per thread, any shape).

    A swizzle XORs some register bits into address bits a thread's own index also sets; those values need a base
    of their own, every other register bit only adds. A kernel that computes the bases once and addresses each
    store as base + immediate holds a few address registers where the compiler would otherwise hoist one per store.
    """
    bases: list[int] = []
    out = []
    for i in values:
        here = np.asarray(offsets_of(i))
        for b in bases:
            diff = here - np.asarray(offsets_of(b))
            if np.all(diff == diff.flat[0]):
                out.append((i, b, int(diff.flat[0])))
                break
        else:
            bases.append(i)
            out.append((i, i, 0))
    return tuple(out)
