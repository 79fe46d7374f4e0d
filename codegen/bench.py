"""`gen.py bench`: flashgen against its peers in one run, and the compile-time report.

  gen.py bench --shape B,S,H,D[:KV] [--dtype f16|bf16] [--causal] [--iters N] [--out bench/results]
      the closing table for one shape: flashgen (each PV split), SDPA (auto, cuDNN, flash, mem_efficient,
      math), flex_attention (compiled) and an unfused matmul-softmax-matmul. `:KV` gives k and v KV heads
      (grouped-query attention; H a multiple of KV), e.g. 4,4096,32,128:8.
  gen.py bench --varlen LENS [--heads H] [--head-dim D] [--kv-heads KV] [--dtype bf16] [--causal]
      a variable-length batch: packed (total, H, D) tensors cut by cu_seqlens, q lengths = k lengths. LENS is
      the per-sequence lengths (1000,4096,2311) or COUNTxMAX[=TOTAL]: COUNT ragged lengths drawn with a fixed
      seed between MAX/4 and MAX, the longest MAX, adjusted to sum to TOTAL tokens (16x4096=40960).
      Peers: flashgen's varlen API; cudnn = cuDNN SDPA on the zero-padded (B, MAX, H, D) batch (the
      yardstick, `cudnn-padded`: what a user without varlen runs; is_causal for causal cases, an additive
      key-padding mask otherwise); cudnn_varlen and flash_varlen = torch's own ragged cuDNN and FlashAttention-2
      kernels (skipped, with the reason, where this torch lacks them); flex = flex_attention on the packed
      batch with a document mask.
  gen.py bench --matrix [NAME]
      many shapes in one run: each kernel's ratio to cuDNN measured in the same run, and their geomean
      (`--matrix varlen` for the variable-length set; `coverage` holds two of them too).
  gen.py bench --compile [--shape B,S,H,D[:KV] ...] [--varlen LENS ...]
      cold (render + NVRTC into an empty cache) and warm (disk-cache hit) build times; no GPU needed.

The figure of merit is the ratio to cuDNN in the same run (DESIGN.md section 7). Nothing here imports torch
until a GPU mode runs, so `--compile` and the unit tests work on a machine without it.

FLOPs: 4 * B * H * S^2 * D for a dense case, and the sum over sequences of 4 * H * L_i^2 * D for a varlen one
(S_q = S_k = L_i), halved for causal in both: half of each full square, diagonal not counted apart, the
convention FlashAttention's own benchmarks use. TFLOPS always count this useful work, so the padded cuDNN
yardstick's TFLOPS of a varlen row are effective ones (its padded batch does 1 / padding_efficiency as much).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .check import reference, time_gpu, torch_dtype

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"

ALL_PEERS = ("flashgen", "cudnn", "sdpa", "flash", "mem_efficient", "math", "flex", "unfused", "cudnn_varlen",
             "flash_varlen")
MATRIX_PEERS = ("flashgen", "cudnn", "flash", "flex", "cudnn_varlen", "flash_varlen")
# What runs on a varlen case (the others have no ragged form and give no row there); cudnn_varlen and
# flash_varlen run on varlen cases only.
VARLEN_PEERS = ("flashgen", "cudnn", "flex", "cudnn_varlen", "flash_varlen")
VARLEN_ONLY_PEERS = ("cudnn_varlen", "flash_varlen")
VARLEN_SEED = 0  # the ragged lengths of COUNTxMAX: one fixed draw, so the same command benchmarks the same batch
# Candidate PV splits; a shape gets those that add up to its block_n (codegen.plan decides block_n).
CANDIDATE_SPLITS = ((96, 32), (64, 64), (32, 32), (64,))

MATH_MAX_SCORES = 2**28  # B*H*S*S above this: the math backend's S x S float scores take minutes and GBs
UNFUSED_MAX_SCORES = 2**33  # unfused keeps scores and probabilities (2 bytes each) alive at once
ROTATE_BELOW_BYTES = 200 * 2**20  # rotate input copies until the working set is past L2 (50 MB) by far
MAX_INPUT_SETS = 8
TIME_BUDGET_MS = 3000.0  # per implementation and shape: caps iterations for the slow peers

COLD_TARGET_S = 1.5
WARM_TARGET_S = 0.050


class BenchUsageError(ValueError):
    """A command line the benchmark cannot run."""


# --------------------------------------------------------------------------------------------------
# shapes and configuration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: q of shape (batch, seq, heads, dim), k and v (batch, seq, kv_heads, dim).

    A varlen case has `lens`, the per-sequence lengths (q and k alike): q is packed (sum(lens), heads, dim),
    k and v (sum(lens), kv_heads, dim); batch is then len(lens) and seq max(lens) (build it with varlen_case).
    """

    batch: int
    seq: int
    heads: int
    dim: int
    dtype: str = "f16"
    causal: bool = False
    kv_heads: int | None = None  # None: as many as heads. Normalized here so equal problems compare equal.
    lens: tuple[int, ...] | None = None  # varlen: the sequences' lengths, in batch order

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        problem = kv_heads_problem(self.heads, self.kv_heads)
        if problem:
            raise BenchUsageError(problem)
        if self.lens is not None:
            lens = tuple(self.lens)
            if not lens or min(lens) < 1:
                raise BenchUsageError(f"a varlen batch needs at least one sequence, each of length >= 1, got {lens}")
            if (self.batch, self.seq) != (len(lens), max(lens)):
                raise BenchUsageError(f"a varlen case has batch = {len(lens)} sequences and seq = the longest, "
                                      f"{max(lens)}; got batch {self.batch}, seq {self.seq}")
            object.__setattr__(self, "lens", lens)

    @property
    def varlen(self) -> bool:
        return self.lens is not None

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    @property
    def seq_lens(self) -> tuple[int, ...]:
        """Every sequence's length: lens, or seq repeated batch times for a dense case."""
        return self.lens if self.lens is not None else (self.seq,) * self.batch

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def flops(self) -> float:
        """Sum over sequences of 4 * H * L^2 * D (QK^T and PV, 2 flops a multiply-add), halved for causal.

        K/V heads do not change the arithmetic: every query head still meets all its keys."""
        flops = sum(4.0 * self.heads * n * n * self.dim for n in self.seq_lens)
        return flops / 2 if self.causal else flops

    @property
    def padded_flops(self) -> float:
        """The FLOPs of the dense (batch, seq) problem: what a padded batch computes."""
        flops = 4.0 * self.batch * self.heads * self.seq * self.seq * self.dim
        return flops / 2 if self.causal else flops

    @property
    def padding_efficiency(self) -> float:
        """Useful FLOPs over padded FLOPs: 1 for a dense case."""
        return self.flops / self.padded_flops

    @property
    def scores(self) -> int:
        """Entries of the full S x S score matrices over all sequences and heads."""
        return sum(self.heads * n * n for n in self.seq_lens)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of q (and of o)."""
        return self.total_tokens * self.heads * self.dim * 2  # f16 and bf16 alike

    @property
    def set_bytes(self) -> int:
        """Bytes of one input set with its output: q, o, and the smaller k and v under GQA."""
        return 2 * self.tensor_bytes + 2 * self.tensor_bytes // self.group

    @property
    def yardstick(self) -> str:
        """What ratio_to_cudnn divides: cuDNN on the problem itself, or on the zero-padded batch (varlen)."""
        return "cudnn-padded" if self.varlen else "cudnn"

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "non-causal"
        kv = f" kv{self.kv_heads}" if self.gqa else ""
        if self.varlen:
            return (f"varlen({self.batch} seqs, {self.total_tokens} tok, max {self.seq}; {self.heads},{self.dim})"
                    f"{kv} {self.dtype} {mask}")
        return f"({self.batch},{self.seq},{self.heads},{self.dim}){kv} {self.dtype} {mask}"


def varlen_case(lens: Sequence[int], heads: int, dim: int, dtype: str = "bf16", causal: bool = False,
                kv_heads: int | None = None) -> Case:
    """A variable-length batch of these sequence lengths (q lengths = k lengths)."""
    lens = tuple(int(n) for n in lens)
    if not lens:
        raise BenchUsageError("a varlen batch needs at least one sequence")
    return Case(len(lens), max(lens), heads, dim, dtype, causal, kv_heads, lens=lens)


def ragged_lengths(count: int, max_len: int, total: int | None = None, *, seed: int = VARLEN_SEED,
                   min_len: int | None = None) -> tuple[int, ...]:
    """COUNT sequence lengths, deterministic for a seed: one of max_len, the others drawn uniformly from
    [min_len, max_len] (min_len defaults to max_len / 4), then, when total is given, moved evenly toward it
    (never out of that range) so that they sum to exactly total; finally shuffled, so the longest is not
    always first. Python's own Mersenne Twister: the same lengths on every machine and version."""
    lo = max(1, max_len // 4) if min_len is None else min_len
    if count < 1 or max_len < 1 or not 1 <= lo <= max_len:
        raise BenchUsageError(f"ragged lengths need count >= 1 and 1 <= min <= max, got count {count}, "
                              f"min {lo}, max {max_len}")
    least, most = max_len + (count - 1) * lo, count * max_len
    if total is not None and not least <= total <= most:
        raise BenchUsageError(f"{count} sequences of {lo}..{max_len} tokens with the longest {max_len} sum to "
                              f"{least}..{most} tokens, not {total}")
    rng = random.Random(seed)
    lens = [max_len] + [rng.randint(lo, max_len) for _ in range(count - 1)]
    diff = 0 if total is None else total - sum(lens)
    while diff:
        up = diff > 0
        movable = [i for i in range(1, count) if (lens[i] < max_len if up else lens[i] > lo)]
        share = max(1, abs(diff) // len(movable))
        for i in rng.sample(movable, len(movable)):
            step = min(share, abs(diff), max_len - lens[i] if up else lens[i] - lo)
            lens[i] += step if up else -step
            diff -= step if up else -step
            if not diff:
                break
    rng.shuffle(lens)
    return tuple(lens)


VARLEN_USAGE = ("--varlen expects the sequence lengths L1,L2,... (e.g. 1000,4096,2311) or COUNTxMAX[=TOTAL] "
                "(COUNT ragged lengths between MAX/4 and MAX, the longest MAX, summing to TOTAL; e.g. 16x4096=40960)")


def parse_varlen(text: str) -> tuple[int, ...]:
    """'1000,4096,2311' -> those lengths; '16x4096' or '16x4096=40960' -> ragged_lengths(16, 4096[, 40960])."""
    spec = text.strip().lower()
    m = re.fullmatch(r"\s*(\d+)\s*[x*]\s*(\d+)\s*(?:=\s*(\d+)\s*)?", spec)
    if m:
        count, max_len = int(m[1]), int(m[2])
        if count < 1 or max_len < 1:
            raise BenchUsageError(f"{VARLEN_USAGE}; COUNT and MAX must be at least 1, got {text!r}")
        try:
            return ragged_lengths(count, max_len, int(m[3]) if m[3] else None)
        except BenchUsageError as e:
            raise BenchUsageError(f"--varlen {text!r}: {e}") from None
    parts = [p.strip() for p in spec.split(",")]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise BenchUsageError(f"{VARLEN_USAGE}; got {text!r}")
    lens = tuple(int(p) for p in parts)
    if min(lens) < 1:
        raise BenchUsageError(f"--varlen {text!r}: every sequence length must be at least 1")
    return lens


def kv_heads_problem(heads: int, kv_heads: int) -> str | None:
    """Why heads and kv_heads cannot be a grouped-query problem, or None when they can."""
    if kv_heads < 1:
        return f"K/V heads must be at least 1, got {kv_heads}"
    if heads % kv_heads:
        return f"heads {heads} must be a multiple of K/V heads {kv_heads} (grouped-query attention)"
    return None


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """'4,4096,32,128' (or 4x4096x32x128) -> (4, 4096, 32, 128, 32); '4,4096,32,128:8' -> (4, 4096, 32, 128, 8).

    The fifth number is the K/V heads, the same as H when ':KV' is left out."""
    dims, colon, kv_text = text.strip().partition(":")
    parts = [p.strip() for p in re.split(r"[,x]", dims)]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise BenchUsageError(f"--shape expects four integers B,S,H,D, then optionally :KV, got {text!r}") from None
    if len(values) != 4:
        raise BenchUsageError(f"--shape expects four numbers B,S,H,D before any ':KV', got {len(values)} in {text!r}")
    if min(values) < 1:
        raise BenchUsageError(f"every dimension of --shape must be at least 1, got {text!r}")
    if not colon:
        return (*values, values[2])
    try:
        kv_heads = int(kv_text)
    except ValueError:
        raise BenchUsageError(f"--shape expects the K/V heads after ':' as one integer (B,S,H,D:KV), "
                              f"got {text!r}") from None
    problem = kv_heads_problem(values[2], kv_heads)
    if problem:
        raise BenchUsageError(f"--shape {text!r}: {problem}")
    return (*values, kv_heads)


def case_from(shape: Sequence[int], dtype: str, causal: bool) -> Case:
    """A Case from parse_shape's (B, S, H, D, KV)."""
    b, s, h, d, kv = shape
    return Case(b, s, h, d, dtype, causal, kv)


def _bf16(b, s, h, d, causal=False, kv_heads=None) -> Case:
    return Case(b, s, h, d, "bf16", causal, kv_heads)


def _ragged_bf16(count, max_len, total, h, d, causal=False, kv_heads=None) -> Case:
    return varlen_case(ragged_lengths(count, max_len, total), h, d, "bf16", causal, kv_heads)


# Issue 5's variable-length batches: 16 sequences of 1024..4096 tokens (40960 in all, about what 10 full
# 4096-token sequences hold) and 8 of 4096..16384 (65536 in all), as packed pretraining and long-context
# fine-tuning batches look.
VARLEN_4K = dict(count=16, max_len=4096, total=40960)
VARLEN_16K = dict(count=8, max_len=16384, total=65536)


MATRICES: dict[str, tuple[Case, ...]] = {
    # The targets: the seed's shape, the bf16 geomean set, and two causal shapes.
    "default": (
        Case(1, 1024, 64, 128, "f16"),
        _bf16(4, 4096, 32, 128), _bf16(1, 16384, 16, 128), _bf16(16, 1024, 32, 64),
        _bf16(2, 4096, 16, 256), _bf16(8, 512, 32, 128),
        _bf16(4, 4096, 32, 128, causal=True), _bf16(1, 16384, 16, 128, causal=True),
    ),
    # A smoke run: one short and one long shape.
    "quick": (Case(1, 1024, 64, 128, "f16"), _bf16(4, 4096, 32, 128)),
    # Issue 5: causal and grouped-query shapes (8 and 2 K/V heads) against cuDNN.
    "coverage": (
        _bf16(4, 4096, 32, 128, causal=True),
        _bf16(4, 4096, 32, 128, kv_heads=8), _bf16(4, 4096, 32, 128, causal=True, kv_heads=8),
        _bf16(1, 16384, 16, 128, causal=True, kv_heads=2),
        _bf16(16, 1024, 32, 64, kv_heads=8),
        _ragged_bf16(**VARLEN_4K, h=32, d=128),
        _ragged_bf16(**VARLEN_4K, h=32, d=128, causal=True, kv_heads=8),
    ),
    # Issue 5: variable-length batches, against cuDNN on the padded batch and torch's own ragged kernels.
    "varlen": (
        _ragged_bf16(**VARLEN_4K, h=32, d=128),
        _ragged_bf16(**VARLEN_4K, h=32, d=128, causal=True),
        _ragged_bf16(**VARLEN_4K, h=32, d=128, causal=True, kv_heads=8),
        _ragged_bf16(**VARLEN_16K, h=16, d=128),
        _ragged_bf16(**VARLEN_16K, h=16, d=128, causal=True),
    ),
}


@dataclass(frozen=True)
class BenchConfig:
    mode: str  # "table", "matrix" or "compile"
    cases: tuple[Case, ...]
    peers: tuple[str, ...]
    splits: tuple[tuple[int, ...], ...]  # () : every candidate split valid for the shape
    iters: int
    warmup: int
    seed: int
    out: Path | None  # None: print only
    command: str
    matrix: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gen.py bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--matrix", nargs="?", const="default", choices=sorted(MATRICES), metavar="NAME",
                      help=f"run a built-in shape matrix ({', '.join(sorted(MATRICES))}; default: default)")
    mode.add_argument("--compile", action="store_true", help="report cold and warm build times (no GPU)")
    parser.add_argument("--shape", action="append", default=[], metavar="B,S,H,D[:KV]",
                        help="batch, sequence, heads, head dim, and after ':' the K/V heads for grouped-query "
                             "attention (default: H); repeatable")
    parser.add_argument("--varlen", action="append", default=[], metavar="LENS",
                        help="a variable-length batch: the sequence lengths L1,L2,... or COUNTxMAX[=TOTAL] (COUNT "
                             "lengths drawn with a fixed seed between MAX/4 and MAX, the longest MAX, summing to "
                             "TOTAL), e.g. 16x4096=40960; with --heads, --head-dim, --kv-heads; repeatable")
    parser.add_argument("--heads", type=int, metavar="H", help="query heads of the --varlen cases (default 32)")
    parser.add_argument("--head-dim", type=int, metavar="D", help="head dim of the --varlen cases (default 128)")
    parser.add_argument("--kv-heads", type=int, metavar="KV",
                        help="K/V heads of the --varlen cases (grouped-query; default: as many as --heads)")
    parser.add_argument("--dtype", default="f16", choices=("f16", "bf16"))
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--iters", type=int, default=100, help="timed iterations (median is reported)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--split", action="append", default=[], metavar="96,32",
                        help="flashgen PV split to time (repeatable; default: every split valid for the shape)")
    parser.add_argument("--peers", metavar="LIST",
                        help=f"comma-separated implementations out of {','.join(ALL_PEERS)} "
                             f"(default: all for one shape, {','.join(MATRIX_PEERS)} for --matrix; "
                             "cudnn is always added, being the yardstick). A varlen case runs only "
                             f"{','.join(VARLEN_PEERS)} (cudnn on the zero-padded batch); "
                             f"{' and '.join(VARLEN_ONLY_PEERS)} run on varlen cases only")
    parser.add_argument("--all-peers", action="store_true", help="every implementation, also in --matrix")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the random inputs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder (default bench/results)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no result files")
    return parser


def parse_config(argv: Sequence[str]) -> BenchConfig:
    args = build_parser().parse_args(list(argv))
    if args.iters < 1 or args.warmup < 0:
        raise BenchUsageError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    shapes = [parse_shape(s) for s in args.shape]
    if args.matrix and (shapes or args.varlen):
        raise BenchUsageError("--matrix runs its own shapes; drop --shape and --varlen (or run without --matrix)")
    cases = tuple(case_from(s, args.dtype, args.causal) for s in shapes) + _varlen_cases(args)
    if args.matrix:
        mode, cases = "matrix", MATRICES[args.matrix]
    elif args.compile:
        mode = "compile"
        cases = cases or (Case(1, 1024, 64, 128, args.dtype, args.causal),)
    elif cases:
        mode = "table"
    else:
        raise BenchUsageError("give --shape B,S,H,D[:KV], --varlen LENS, --matrix [NAME] or --compile")
    return BenchConfig(mode=mode, cases=cases, peers=_peers_from(args, mode),
                       splits=tuple(_parse_split(s) for s in args.split), iters=args.iters, warmup=args.warmup,
                       seed=args.seed, out=None if args.no_save else args.out,
                       command=" ".join(["gen.py", "bench", *argv]), matrix=args.matrix)


def _varlen_cases(args) -> tuple[Case, ...]:
    """The --varlen cases, with --heads, --head-dim and --kv-heads (which describe nothing else)."""
    given = [f"--{n.replace('_', '-')}" for n in ("heads", "head_dim", "kv_heads") if getattr(args, n) is not None]
    if not args.varlen:
        if given:
            raise BenchUsageError(f"{', '.join(given)} describe(s) --varlen cases; --shape carries its own "
                                  "B,S,H,D[:KV]")
        return ()
    heads = 32 if args.heads is None else args.heads
    dim = 128 if args.head_dim is None else args.head_dim
    if heads < 1 or dim < 1:
        raise BenchUsageError(f"--heads and --head-dim must be at least 1, got {heads} and {dim}")
    if args.kv_heads is not None:
        problem = kv_heads_problem(heads, args.kv_heads)
        if problem:
            raise BenchUsageError(f"--kv-heads {args.kv_heads}: {problem}")
    return tuple(varlen_case(parse_varlen(text), heads, dim, args.dtype, args.causal, args.kv_heads)
                 for text in args.varlen)


def _peers_from(args, mode: str) -> tuple[str, ...]:
    if args.all_peers:
        return ALL_PEERS
    if not args.peers:
        return MATRIX_PEERS if mode == "matrix" else ALL_PEERS
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_PEERS]
    if unknown:
        raise BenchUsageError(f"unknown implementation(s) {unknown} in --peers; choose from {', '.join(ALL_PEERS)}")
    chosen = set(names) | {"cudnn"}
    return tuple(n for n in ALL_PEERS if n in chosen)


def _parse_split(text: str) -> tuple[int, ...]:
    try:
        split = tuple(int(p) for p in text.replace("+", ",").split(",") if p.strip())
    except ValueError:
        raise BenchUsageError(f"--split expects chunk sizes like 96,32; got {text!r}") from None
    if not split or min(split) < 1:
        raise BenchUsageError(f"--split expects positive chunk sizes like 96,32; got {text!r}")
    return split


def splits_for(block_n: int, requested: Iterable[tuple[int, ...]] = ()) -> tuple[tuple[int, ...], ...]:
    """The PV splits to time for a kernel with this block_n: the requested ones, else every valid candidate,
    else the plan's default split for it (block_n 176 has no candidate)."""
    from codegen.plan import default_pv_split

    return (tuple(requested) or tuple(s for s in CANDIDATE_SPLITS if sum(s) == block_n)
            or (tuple(default_pv_split(block_n)),))


def kernel_spec(case: Case):
    """The KernelSpec of a case (unresolved). A varlen case asks for the varlen kernel where KernelSpec has that
    field, specialized as the API does on the longest sequence (rounded up to the API's length bucket where it
    has one), and for the dense kernel of its longest sequence where it has not: both have the block_n the
    bench's PV splits need."""
    from codegen.spec import KernelSpec

    seq, extra = case.seq, {}
    if case.varlen and "varlen" in {f.name for f in dataclasses.fields(KernelSpec)}:
        try:
            from codegen.api import _length_bucket
        except ImportError:
            _length_bucket = None
        seq, extra = (_length_bucket(case.seq) if _length_bucket else case.seq), {"varlen": True}
    return KernelSpec(seq_len=seq, heads=case.heads, head_dim=case.dim, dtype=case.dtype, causal=case.causal,
                      kv_heads=case.kv_heads, **extra)


def block_n_for(case: Case) -> int:
    """The block_n codegen.plan resolves for this shape (so the bench follows the generator's choice)."""
    from codegen.plan import resolve

    return resolve(kernel_spec(case)).block_n


def split_name(split: Sequence[int]) -> str:
    return "+".join(str(c) for c in split)


# --------------------------------------------------------------------------------------------------
# rows and the numbers derived from them
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    impl: str
    case: Case
    ms: float | None = None
    rel_err: float | None = None
    snr_db: float | None = None
    pv_split: tuple[int, ...] | None = None
    iters: int | None = None
    error: str | None = None
    skipped: str | None = None
    ratio_to_cudnn: float | None = None  # cuDNN ms / this ms: > 1 is faster than cuDNN
    err_vs_ours: float | None = None  # rel_err / flashgen's best rel_err

    @property
    def tflops(self) -> float | None:
        return self.case.flops / self.ms / 1e9 if self.ms else None

    @property
    def ok(self) -> bool:
        return self.ms is not None and self.error is None and self.skipped is None

    def to_json(self) -> dict:
        c = self.case
        return {
            "impl": self.impl, "B": c.batch, "S": c.seq, "H": c.heads, "H_kv": c.kv_heads, "D": c.dim,
            "causal": c.causal, "dtype": c.dtype, "ms": _finite(self.ms), "tflops": _finite(self.tflops),
            "snr_db": _finite(self.snr_db), "rel_err": _finite(self.rel_err),
            "err_vs_ours": _finite(self.err_vs_ours), "ratio_to_cudnn": _finite(self.ratio_to_cudnn),
            "pv_split": list(self.pv_split) if self.pv_split else None, "iters": self.iters,
            "error": self.error, "skipped": self.skipped,
            # ratio_to_cudnn divides this implementation's time into the yardstick's: "cudnn" on the problem
            # itself, or "cudnn-padded" (cuDNN on the zero-padded batch) for a varlen case, where B is the
            # number of sequences, S the longest, and seqlens every length.
            "yardstick": c.yardstick, "varlen": c.varlen, "seqlens": list(c.lens) if c.varlen else None,
            "total_tokens": c.total_tokens, "flops": c.flops, "padding_efficiency": c.padding_efficiency,
        }


def _finite(x: float | None) -> float | None:
    """JSON has no inf or NaN; a non-finite number is written as null (the row's error says why)."""
    return x if x is not None and math.isfinite(x) else None


def split_impl(split: Sequence[int]) -> str:
    return f"flashgen[{split_name(split)}]"


def finalize(rows: Sequence[Row]) -> list[Row]:
    """Add each case's best-split `flashgen` row, the ratio to cuDNN and the error relative to ours."""
    out: list[Row] = []
    for case in _unique(r.case for r in rows):
        group = [r for r in rows if r.case == case and not (r.impl == "flashgen" and r.ok)]
        tried = [r for r in group if r.impl.startswith("flashgen[")]
        splits = [r for r in tried if r.ok]
        if splits:
            group.insert(0, dataclasses.replace(min(splits, key=lambda r: r.ms), impl="flashgen"))
        elif tried:
            group.insert(0, Row("flashgen", case, error="no PV split ran; see the flashgen[...] rows"))
        cudnn = next((r for r in group if r.impl == "cudnn" and r.ok), None)
        ours = min((r.rel_err for r in splits if r.rel_err is not None and math.isfinite(r.rel_err)), default=None)
        for r in group:
            ratio = cudnn.ms / r.ms if cudnn and r.ok else None
            vs_ours = r.rel_err / ours if ours and r.rel_err is not None else None
            out.append(dataclasses.replace(r, ratio_to_cudnn=ratio, err_vs_ours=vs_ours))
    return out


def _unique(items: Iterable) -> list:
    return list(dict.fromkeys(items))


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


@dataclass(frozen=True)
class RatioSummary:
    impl: str
    ratios: tuple[float | None, ...]  # one per case, in case order
    geomean: float | None
    measured: int  # cases with a ratio


def ratio_summaries(rows: Sequence[Row]) -> list[RatioSummary]:
    """Per implementation (split rows left out): its ratio to cuDNN in each case, and their geomean."""
    cases = _unique(r.case for r in rows)
    impls = _unique(r.impl for r in rows if not r.impl.startswith("flashgen["))
    out = []
    for impl in impls:
        by_case = {r.case: r.ratio_to_cudnn for r in rows if r.impl == impl}
        ratios = tuple(by_case.get(c) for c in cases)
        out.append(RatioSummary(impl, ratios, geomean(ratios), sum(r is not None for r in ratios)))
    return out


# --------------------------------------------------------------------------------------------------
# text and Markdown
# --------------------------------------------------------------------------------------------------

TABLE_HEADER = ("impl", "ms", "TFLOPS", "SNR dB", "rel err", "err vs ours", "vs cuDNN")


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return format(x, spec) + suffix


def display_name(row: Row) -> str:
    if row.impl == "flashgen" and row.pv_split:
        return f"flashgen (best: {split_name(row.pv_split)})"
    if row.impl == "cudnn" and row.case.varlen:
        return "cudnn (padded" + ("" if row.case.causal else ", key-padding mask") + ")"
    return row.impl


def row_cells(row: Row) -> list[str]:
    name = display_name(row)
    if row.skipped:
        return [name, f"skipped: {row.skipped}", "", "", "", "", ""]
    if row.error and row.ms is None:
        return [name, f"error: {_short(row.error)}", "", "", "", "", ""]
    cells = [name, _fmt(row.ms, ".4f"), _fmt(row.tflops, ".1f"), _fmt(row.snr_db, ".1f"), _fmt(row.rel_err, ".2e"),
             _fmt(row.err_vs_ours, ".2f"), _fmt(row.ratio_to_cudnn, ".3f", "x")]
    if row.error:
        cells[0] += f" (error: {_short(row.error)})"
    return cells


def _short(text: str, limit: int = 90) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def case_table(rows: Sequence[Row]) -> list[list[str]]:
    return [list(TABLE_HEADER)] + [row_cells(r) for r in rows]


def summary_table(rows: Sequence[Row]) -> list[list[str]]:
    """Shapes down, implementations across: each cell the ratio to cuDNN; the last line the geomean."""
    cases = _unique(r.case for r in rows)
    summaries = [s for s in ratio_summaries(rows) if s.impl != "cudnn"]
    cudnn = {r.case: r for r in rows if r.impl == "cudnn"}
    best = {r.case: r for r in rows if r.impl == "flashgen"}
    table = [["shape", "cuDNN ms", "cuDNN TFLOPS"] + [s.impl for s in summaries]]
    for i, case in enumerate(cases):
        ref = cudnn.get(case)
        shape = f"{case.label} (vs {case.yardstick})" if case.varlen else case.label
        line = [shape, _fmt(ref.ms if ref else None, ".4f"), _fmt(ref.tflops if ref else None, ".1f")]
        for s in summaries:
            cell = _fmt(s.ratios[i], ".3f", "x")
            if s.impl == "flashgen" and case in best and best[case].pv_split:
                cell += f" ({split_name(best[case].pv_split)})"
            line.append(cell)
        table.append(line)
    # One geomean per yardstick: ratios to cuDNN on the problem itself and ratios to cuDNN on a padded batch
    # (varlen: the padding is part of what they measure) are not averaged together.
    for name, varlen in (("geomean", False), ("geomean varlen (vs cudnn-padded)", True)):
        picked = [i for i, c in enumerate(cases) if c.varlen == varlen]
        if not picked:
            continue
        cells = []
        for s in summaries:
            ratios = [s.ratios[i] for i in picked]
            measured = sum(r is not None for r in ratios)
            cells.append(f"{_fmt(geomean(ratios), '.3f', 'x')} ({measured}/{len(picked)})")
        table.append([name, "", ""] + cells)
    return table


def render_text(table: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(table: Sequence[Sequence[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(table[0]), "|" + "|".join("---" for _ in table[0]) + "|"] + [line(r) for r in table[1:]])


# --------------------------------------------------------------------------------------------------
# results on disk
# --------------------------------------------------------------------------------------------------


# The run facts repeated in every JSON row, so each row stands alone; the Markdown file lists them all.
RUN_KEYS = ("gpu", "driver_version", "torch", "cudnn", "triton", "date_utc", "flashgen_source_sha256", "command")


@dataclass(frozen=True)
class BenchResult:
    meta: dict
    rows: tuple[Row, ...]
    mode: str

    def to_json(self) -> list[dict]:
        """A list of rows (the issue's format); each row carries the run's GPU, driver, versions and date."""
        run = {key: self.meta.get(key) for key in RUN_KEYS}
        return [{**r.to_json(), **run} for r in self.rows]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def utc_stamp(now: _dt.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ")


def results_markdown(result: BenchResult) -> str:
    parts = [f"# flashgen bench ({result.mode})", ""]
    parts += [f"- {k}: {v}" for k, v in result.meta.items()]
    if result.mode == "matrix" or len(_unique(r.case for r in result.rows)) > 1:
        parts += ["", "## Ratio to cuDNN (same run; > 1 is faster)", "", render_markdown(summary_table(result.rows))]
    for case in _unique(r.case for r in result.rows):
        parts += ["", f"## {case.label}", ""]
        if case.varlen:
            parts += [varlen_note(case), ""]
        parts += [render_markdown(case_table([r for r in result.rows if r.case == case]))]
    return "\n".join(parts) + "\n"


def varlen_note(case: Case) -> str:
    """What a varlen case's table measures, in one paragraph."""
    mask = "is_causal" if case.causal else "an additive key-padding mask"
    return (f"Sequence lengths (q = k): {', '.join(map(str, case.lens))}. TFLOPS count the useful work, "
            f"{case.flops / 1e12:.2f} TFLOP (sum of 4*H*L^2*D{', halved (causal)' if case.causal else ''}). "
            f"The yardstick `cudnn-padded` is cuDNN SDPA on the zero-padded ({case.batch}, {case.seq}) batch with "
            f"{mask}, which computes {1 / case.padding_efficiency:.2f}x that work (padding efficiency "
            f"{case.padding_efficiency:.0%}); its error is taken over the valid rows only. cudnn_varlen and "
            "flash_varlen are torch's own ragged cuDNN and FlashAttention-2 kernels.")


def save_results(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write <gpu-slug>-<UTC stamp>.json and .md; also h200-latest.* when the GPU is an H200."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result.meta.get("date_utc_stamp") or utc_stamp(_dt.datetime.now(_dt.timezone.utc))
    stem = f"{slug(str(result.meta.get('gpu', 'unknown')))}-{stamp}"
    text_json = json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n"
    text_md = results_markdown(result)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(text_json)
    paths[1].write_text(text_md)
    if "h200" in str(result.meta.get("gpu", "")).lower():
        for src, suffix in zip(paths, (".json", ".md")):
            latest = out_dir / f"h200-latest{suffix}"
            shutil.copyfile(src, latest)
            paths.append(latest)
    return paths


def git_commit() -> str | None:
    """HEAD of the repository, '+dirty' when the tree has changes; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def source_sha256() -> str:
    """SHA-256 over the generator's sources and templates: names the kernel version where there is no .git
    (the GPU machine runs a copy of the working tree)."""
    import hashlib

    digest = hashlib.sha256()
    for folder in ("codegen", "layouts", "templates"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".j2", ".cuh", ".h"):
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def host_meta(command: str, now: _dt.datetime) -> dict:
    """What every result records, GPU or not."""
    meta = {
        "date_utc": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "date_utc_stamp": utc_stamp(now),
        "command": command,
        "flashgen_commit": git_commit(),
        "flashgen_source_sha256": source_sha256(),
        "python": platform.python_version(),
        "host_cpus": os.cpu_count(),
    }
    try:
        from codegen import cuda_env

        meta["nvrtc"] = ".".join(map(str, cuda_env.nvrtc_version()))
    except Exception as e:  # the report still stands without the toolchain version
        meta["nvrtc"] = f"unknown ({type(e).__name__})"
    return meta


def nvidia_smi_driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[0].strip() if res.returncode == 0 and lines else None


def gpu_meta(torch) -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver_version": nvidia_smi_driver(),
        "cuda_driver_api": _cuda_driver_api(),
        "cuda_runtime_torch": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    return meta


def _cuda_driver_api() -> str | None:
    """The driver's CUDA API version (e.g. 13.0), from cuda.bindings: what the installed driver supports."""
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        return f"{version // 1000}.{version % 1000 // 10}"
    except Exception:
        return None


# --------------------------------------------------------------------------------------------------
# the GPU run
# --------------------------------------------------------------------------------------------------


def input_set_count(case: Case) -> int:
    """Copies of (q, k, v, o) to rotate through so that a small problem is not timed out of L2."""
    return max(1, min(MAX_INPUT_SETS, -(-ROTATE_BELOW_BYTES // case.set_bytes)))


@dataclass(frozen=True)
class Inputs:
    sets: tuple  # ((q, k, v), ...): q (B, S, H, D), k and v (B, S, KV, D); varlen: packed (T, H, D), (T, KV, D)
    ref: object  # float64 o of sets[0] (varlen: packed (T, H, D))
    # varlen only:
    padded: tuple = ()  # the sets zero-padded to (B, S, H, D) and (B, S, KV, D), for the cudnn-padded yardstick
    cu_seqlens: object = None  # int32 (B + 1,) on the device: sequence b is packed rows cu[b]:cu[b + 1]
    valid: object = None  # int64 (T,): the row of the flattened padded (B * S) batch holding each packed token
    key_mask: object = None  # non-causal: (B, 1, 1, S) additive bias in q's dtype, 0 on tokens, -inf on padding
    doc_ids: object = None  # int32 (T,): each packed token's sequence


def make_inputs(torch, case: Case) -> Inputs:
    if case.varlen:
        return make_varlen_inputs(torch, case)
    dtype = torch_dtype(case.dtype)
    q_shape = (case.batch, case.seq, case.heads, case.dim)
    kv_shape = (case.batch, case.seq, case.kv_heads, case.dim)
    sets = tuple(tuple(torch.randn(shape, dtype=dtype, device="cuda") for shape in (q_shape, kv_shape, kv_shape))
                 for _ in range(input_set_count(case)))
    return Inputs(sets, reference(*sets[0], causal=case.causal)[0])


def cu_seqlens_of(lens: Sequence[int]) -> list[int]:
    """[0, L0, L0 + L1, ...]: where each sequence starts in the packed tensors, and the total last."""
    return [0, *itertools.accumulate(lens)]


def padded_rows(torch, lens: Sequence[int], max_len: int, device=None):
    """For each packed token, its row in the flattened zero-padded (len(lens) * max_len) batch."""
    return torch.cat([b * max_len + torch.arange(n, device=device) for b, n in enumerate(lens)])


def pad_packed(torch, packed, lens: Sequence[int], max_len: int, rows=None):
    """(T, ...) packed -> (len(lens), max_len, ...) with zeros after each sequence's tokens."""
    rows = padded_rows(torch, lens, max_len, packed.device) if rows is None else rows
    out = packed.new_zeros((len(lens) * max_len, *packed.shape[1:]))
    out[rows] = packed
    return out.view(len(lens), max_len, *packed.shape[1:])


def unpad(padded, rows):
    """(B, S, ...) -> the packed (T, ...) rows that hold tokens (a copy)."""
    return padded.reshape(padded.shape[0] * padded.shape[1], *padded.shape[2:])[rows]


def varlen_reference(q, k, v, lens: Sequence[int], *, causal: bool, lens_k: Sequence[int] | None = None):
    """Float64 o, packed (T_q, H, D), of attention over each sequence alone: codegen.check.reference on
    q[cu_q[b]:cu_q[b+1]] against k, v[cu_k[b]:cu_k[b+1]], with its bottom-right causal alignment."""
    import torch

    from .check import reference_varlen

    cu_q, cu_k = (torch.tensor(cu_seqlens_of(x), dtype=torch.int32) for x in (lens, lens if lens_k is None else lens_k))
    return reference_varlen(q, k, v, cu_q, cu_k, causal=causal)[0]


def key_padding_bias(torch, lens: Sequence[int], max_len: int, dtype, device=None):
    """(B, 1, 1, max_len) additive mask: 0 on each sequence's keys, -inf on its padding."""
    keep = torch.arange(max_len, device=device)[None, :] < torch.tensor(list(lens), device=device)[:, None]
    bias = torch.zeros(len(lens), max_len, dtype=dtype, device=device).masked_fill_(~keep, float("-inf"))
    return bias[:, None, None, :]


def make_varlen_inputs(torch, case: Case, device="cuda") -> Inputs:
    """Packed random q, k, v (rotated like the dense sets), their zero-padded twins for the padded yardstick,
    cu_seqlens, and the float64 reference computed one sequence at a time."""
    dtype = torch_dtype(case.dtype) if device == "cuda" else torch.float32
    total = case.total_tokens
    sets = tuple(tuple(torch.randn(shape, dtype=dtype, device=device)
                       for shape in ((total, case.heads, case.dim),) + ((total, case.kv_heads, case.dim),) * 2)
                 for _ in range(input_set_count(case)))
    rows = padded_rows(torch, case.lens, case.seq, device)
    padded = tuple(tuple(pad_packed(torch, t, case.lens, case.seq, rows) for t in qkv) for qkv in sets)
    cu = torch.tensor(cu_seqlens_of(case.lens), dtype=torch.int32, device=device)
    docs = torch.repeat_interleave(torch.arange(case.batch, dtype=torch.int32, device=device),
                                   torch.tensor(list(case.lens), device=device))
    mask = None if case.causal else key_padding_bias(torch, case.lens, case.seq, dtype, device)
    ref = varlen_reference(*sets[0], case.lens, causal=case.causal)
    return Inputs(sets, ref, padded=padded, cu_seqlens=cu, valid=rows, key_mask=mask, doc_ids=docs)


def _bhsd(qkv):
    return tuple(t.transpose(1, 2) for t in qkv)


def gqa_kwargs(case: Case) -> dict:
    """enable_gqa=True for a grouped-query case (SDPA and flex_attention, torch >= 2.5); nothing otherwise, so
    the equal-heads calls stay exactly what they were (and still run on an older torch)."""
    return {"enable_gqa": True} if case.gqa else {}


def sdpa_kwargs(case: Case) -> dict:
    """The keyword arguments of every scaled_dot_product_attention call the bench times."""
    return {"is_causal": case.causal, **gqa_kwargs(case)}


def _sdpa_calls(torch, inputs: Inputs, case: Case):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kwargs = sdpa_kwargs(case)

    def call(qkv):
        q, k, v = _bhsd(qkv)
        return lambda: sdpa(q, k, v, **kwargs).transpose(1, 2)

    return [call(s) for s in inputs.sets]


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _flex_calls(torch, inputs: Inputs, case: Case):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compile per shape: entries from earlier shapes must not count toward dynamo's recompile limit.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    device = inputs.sets[0][0].device
    mask = (create_block_mask(_causal_mask_mod, B=None, H=None, Q_LEN=case.seq, KV_LEN=case.seq, device=device)
            if case.causal else None)
    kwargs = gqa_kwargs(case)

    def call(qkv):
        q, k, v = _bhsd(qkv)
        return lambda: compiled(q, k, v, block_mask=mask, **kwargs).transpose(1, 2)

    return [call(s) for s in inputs.sets]


def _unfused_calls(torch, inputs: Inputs, case: Case):
    scale = 1.0 / math.sqrt(case.dim)
    device = inputs.sets[0][0].device
    masked = torch.ones(case.seq, case.seq, dtype=torch.bool, device=device).triu(1) if case.causal else None

    def run(q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        if masked is not None:
            scores.masked_fill_(masked, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)

    def call(qkv):
        q, k, v = _bhsd(qkv)
        # Under GQA, K/V heads are repeated here, once per input set and outside the timed calls: the row times
        # the attention arithmetic itself. (A model that repeats per call, as repeat_kv does, pays one K/V copy
        # more.) Query head h reads K/V head h // group, as in codegen.check.reference and SDPA's enable_gqa.
        if case.gqa:
            k, v = (t.repeat_interleave(case.group, dim=1) for t in (k, v))
        return lambda: run(q, k, v)

    return [call(s) for s in inputs.sets]


def _flashgen_calls(split: tuple[int, ...]):
    def make(torch, inputs: Inputs, case: Case):
        from codegen.api import prepare

        prepared = [prepare(q, k, v, causal=case.causal, pv_split=split) for q, k, v in inputs.sets]
        return [p.__call__ for p in prepared]

    return make


class Unavailable(RuntimeError):
    """An implementation this torch (or this flashgen) does not have: its row is skipped, with the reason."""


def _flashgen_varlen_calls(split: tuple[int, ...]):
    """flashgen's varlen API: prepare(q, k, v, cu_seqlens_q=..., cu_seqlens_k=..., max_seqlen_q=..., ...)."""

    def make(torch, inputs: Inputs, case: Case):
        from codegen.api import prepare

        cu = inputs.cu_seqlens
        prepared = [prepare(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=case.seq, max_seqlen_k=case.seq,
                            causal=case.causal, pv_split=split) for q, k, v in inputs.sets]
        return [p.__call__ for p in prepared]

    return make


def _cudnn_padded_calls(torch, inputs: Inputs, case: Case):
    """The varlen yardstick: cuDNN SDPA on the zero-padded (B, S, H, D) batch, what a user without varlen runs.
    Causal needs no mask (q and k lengths are equal, so no token's causal keys reach its sequence's padding);
    non-causal takes the additive key-padding mask, without which every token would also attend to the
    padding's zero keys. Output (B, S, H, D); its padding rows are garbage and dropped by _unpadded."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kwargs = sdpa_kwargs(case)
    if inputs.key_mask is not None:
        kwargs["attn_mask"] = inputs.key_mask

    def call(qkv):
        q, k, v = _bhsd(qkv)
        return lambda: sdpa(q, k, v, **kwargs).transpose(1, 2)

    return [call(s) for s in inputs.padded]


def _unpadded(out, inputs: Inputs):
    return unpad(out, inputs.valid)


def _same(out, inputs: Inputs):
    return out


def aten_op(torch, name: str, needs: Sequence[str] = ()):
    """torch.ops.aten.<name>.default, if this torch has it with the arguments `needs`; else Unavailable."""
    try:
        op = getattr(torch.ops.aten, name).default
        args = {a.name for a in op._schema.arguments}
    except (AttributeError, RuntimeError) as e:
        raise Unavailable(f"torch {torch.__version__} has no aten::{name} ({type(e).__name__})") from None
    missing = [n for n in needs if n not in args]
    if missing:
        raise Unavailable(f"torch {torch.__version__}'s aten::{name} takes no {', '.join(missing)}")
    return op


def _ragged_kwargs(inputs: Inputs, case: Case) -> dict:
    cu = inputs.cu_seqlens
    return {"cum_seq_q": cu, "cum_seq_k": cu, "max_q": case.seq, "max_k": case.seq, "dropout_p": 0.0,
            "is_causal": case.causal, "return_debug_mask": False}


def _cudnn_varlen_calls(torch, inputs: Inputs, case: Case):
    """cuDNN's ragged (THD) kernel: aten::_cudnn_attention_forward with cum_seq_q/k, the call SDPA makes on
    nested (jagged) tensors under the CUDNN_ATTENTION backend, here with cu_seqlens made once (no nested-tensor
    bookkeeping in the timed call). Output packed (T, H, D)."""
    kwargs = {"attn_bias": None, "compute_log_sumexp": False, **_ragged_kwargs(inputs, case)}
    op = aten_op(torch, "_cudnn_attention_forward", ("query", "key", "value", *kwargs))
    if not torch.backends.cudnn.is_available():
        raise Unavailable(f"torch {torch.__version__} has no cuDNN")

    def call(qkv):
        q, k, v = qkv
        return lambda: op(query=q, key=k, value=v, **kwargs)[0]

    return [call(s) for s in inputs.sets]


def _flash_varlen_calls(torch, inputs: Inputs, case: Case):
    """FlashAttention-2's varlen kernel as torch ships it: aten::_flash_attention_forward with cum_seq_q/k, which
    torch.nn.attention.varlen.varlen_attn calls (its Python signature changed between releases; the op's did
    not). K/V heads may divide H (the kernel reads them grouped). Output packed (T, H, D)."""
    kwargs = _ragged_kwargs(inputs, case)
    op = aten_op(torch, "_flash_attention_forward", ("query", "key", "value", *kwargs))

    def call(qkv):
        q, k, v = qkv
        return lambda: op(query=q, key=k, value=v, **kwargs)[0]

    return [call(s) for s in inputs.sets]


def _flex_varlen_calls(torch, inputs: Inputs, case: Case):
    """flex_attention on the packed batch as one sequence of T tokens, with a document mask (a token sees
    only its own sequence's keys, and under causal only the earlier ones): blocks across sequences are
    skipped. Output packed (T, H, D)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    docs, causal, total = inputs.doc_ids, case.causal, case.total_tokens

    def same_sequence(b, h, q_idx, kv_idx):
        same = docs[q_idx] == docs[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same

    mask = create_block_mask(same_sequence, B=None, H=None, Q_LEN=total, KV_LEN=total, device=docs.device)
    kwargs = gqa_kwargs(case)

    def call(qkv):
        q, k, v = (t.transpose(0, 1)[None] for t in qkv)  # (1, H, T, D)
        return lambda: compiled(q, k, v, block_mask=mask, **kwargs)[0].transpose(0, 1)

    return [call(s) for s in inputs.sets]


def _sdpa_backend(name: str):
    def context(torch):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, name)])

    return context


def _no_context(torch):
    return contextlib.nullcontext()


def _no_recompile(torch):
    """After the first (compiling) call, a recompilation is an error, so a storm cannot hide in the timing."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return set_stance("fail_on_recompile") if set_stance else contextlib.nullcontext()


@dataclass(frozen=True)
class Peer:
    name: str
    make: Callable  # (torch, inputs, case) -> [zero-argument call returning o as (B, S, H, D)], one per input set
    context: Callable = _no_context  # (torch) -> context around every call
    steady: Callable = _no_context  # (torch) -> context after the first call (which may compile)
    skip: Callable[[Case], str | None] = lambda case: None
    output: Callable = _same  # (o, inputs) -> o comparable with inputs.ref (the padded yardstick drops its padding)


def _math_skip(case: Case) -> str | None:
    return f"B*H*S*S = {case.scores} > 2^28" if case.scores > MATH_MAX_SCORES else None


def _unfused_skip(case: Case) -> str | None:
    return f"B*H*S*S = {case.scores} > 2^33" if case.scores > UNFUSED_MAX_SCORES else None


PEERS = {
    "cudnn": Peer("cudnn", _sdpa_calls, _sdpa_backend("CUDNN_ATTENTION")),
    "sdpa": Peer("sdpa", _sdpa_calls),
    "flash": Peer("flash", _sdpa_calls, _sdpa_backend("FLASH_ATTENTION")),
    "mem_efficient": Peer("mem_efficient", _sdpa_calls, _sdpa_backend("EFFICIENT_ATTENTION")),
    "math": Peer("math", _sdpa_calls, _sdpa_backend("MATH"), skip=_math_skip),
    "flex": Peer("flex", _flex_calls, steady=_no_recompile),
    "unfused": Peer("unfused", _unfused_calls, skip=_unfused_skip),
}

# The same names on a varlen case: "cudnn" is then the padded yardstick.
VARLEN_PEER_IMPLS = {
    "cudnn": Peer("cudnn", _cudnn_padded_calls, _sdpa_backend("CUDNN_ATTENTION"), output=_unpadded),
    "flex": Peer("flex", _flex_varlen_calls, steady=_no_recompile),
    "cudnn_varlen": Peer("cudnn_varlen", _cudnn_varlen_calls),
    "flash_varlen": Peer("flash_varlen", _flash_varlen_calls),
}


def peer_names(case: Case, names: Iterable[str]) -> list[str]:
    """The chosen implementations that have a form for this case (dense or varlen)."""
    if case.varlen:
        return [n for n in names if n in VARLEN_PEERS]
    return [n for n in names if n not in VARLEN_ONLY_PEERS]


def peers_for(case: Case, config: BenchConfig, block_n: int | None) -> list[tuple[Peer, tuple[int, ...] | None]]:
    """The implementations to run on one case, torch's first: if one of ours faults the CUDA context, the
    peers' rows are already measured."""
    table = VARLEN_PEER_IMPLS if case.varlen else PEERS
    names = peer_names(case, config.peers)
    out = [(table[name], None) for name in names if name != "flashgen"]
    if "flashgen" in names and block_n is not None:
        calls = _flashgen_varlen_calls if case.varlen else _flashgen_calls
        out += [(Peer(split_impl(s), calls(s)), s) for s in splits_for(block_n, config.splits)]
    return out


def iterations_within(budget_ms: float, estimate_ms: float, iters: int, floor: int = 10) -> int:
    """Iterations that fit the per-implementation budget, never fewer than floor nor more than asked."""
    if estimate_ms <= 0 or not math.isfinite(estimate_ms):
        return iters
    return max(min(floor, iters), min(iters, int(budget_ms / estimate_ms)))


def measure(torch, peer: Peer, split, case: Case, inputs: Inputs, config: BenchConfig) -> Row:
    """One row: error against float64 on the first input set, then the median time rotating over all sets."""
    from codegen.check import rel_err

    skip = peer.skip(case)
    if skip:
        return Row(peer.name, case, pv_split=split, skipped=skip)
    try:
        with peer.context(torch):
            calls = peer.make(torch, inputs, case)
            out = calls[0]()
            torch.cuda.synchronize()
            with peer.steady(torch):
                err = rel_err(peer.output(out, inputs), inputs.ref)
                del out
                rotate = itertools.cycle(calls).__next__
                estimate = time_gpu(torch, lambda: rotate()(), warmup=1, iters=3)
                iters = iterations_within(TIME_BUDGET_MS, estimate, config.iters)
                ms = time_gpu(torch, lambda: rotate()(), warmup=config.warmup, iters=iters)
    except Unavailable as e:
        return Row(peer.name, case, pv_split=split, skipped=str(e))
    except Exception as e:  # one failing peer is a row, never the end of the run
        return Row(peer.name, case, pv_split=split, error=f"{type(e).__name__}: {e}")
    note = None if math.isfinite(err) else "output holds NaN or inf"
    return Row(peer.name, case, ms=ms, rel_err=err, snr_db=snr_db_from(err), pv_split=split, iters=iters, error=note)


def snr_db_from(err: float) -> float:
    """-20 log10(rel err), as codegen.check.snr_db computes it, without a second pass over the tensors."""
    if err == 0:
        return float("inf")
    return -20.0 * math.log10(err) if math.isfinite(err) else float("-inf")


def cuda_fault(torch) -> str | None:
    """None while the CUDA context still works; else why it does not (a fault is sticky for the process)."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def bench_case(torch, case: Case, config: BenchConfig, progress) -> tuple[list[Row], str | None]:
    """Every implementation on one case; returns the rows and, if the CUDA context died, why."""
    block_n, plan_error = None, None
    if "flashgen" in config.peers:
        try:
            block_n = block_n_for(case)
        except Exception as e:
            plan_error = f"{type(e).__name__}: {e}"
    rows = [Row("flashgen", case, error=plan_error)] if plan_error else []
    try:
        inputs = make_inputs(torch, case)
    except Exception as e:
        return rows + [Row(name, case, error=f"inputs: {type(e).__name__}: {e}")
                       for name in peer_names(case, config.peers)], cuda_fault(torch)
    for peer, split in peers_for(case, config, block_n):
        row = measure(torch, peer, split, case, inputs, config)
        rows.append(row)
        progress(f"  {peer.name:<18} " + (f"{row.ms:.4f} ms, rel err {row.rel_err:.2e}" if row.ms is not None
                                          else row.skipped or _short(row.error or "")))
        fault = cuda_fault(torch)
        if fault:
            return rows, f"CUDA context lost after {peer.name} on {case.label}: {fault}"
    del inputs
    torch.cuda.empty_cache()
    return rows, None


def run_gpu(config: BenchConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> BenchResult:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"gen.py bench needs a CUDA GPU; torch {torch.__version__} sees none")
    now = _dt.datetime.now(_dt.timezone.utc)
    meta = {**gpu_meta(torch), **host_meta(config.command, now), "iters": config.iters, "warmup": config.warmup,
            "seed": config.seed, "matrix": config.matrix}
    torch.manual_seed(config.seed)
    rows: list[Row] = []
    fault = None
    for i, case in enumerate(config.cases):
        if fault:
            rows += [Row(name, case, error=fault) for name in peer_names(case, config.peers)]
            continue
        progress(f"[{i + 1}/{len(config.cases)}] {case.label}")
        if case.varlen:
            progress(f"  seqlens {list(case.lens)}; padding efficiency {case.padding_efficiency:.0%} "
                     f"(the cudnn yardstick runs the zero-padded ({case.batch}, {case.seq}) batch)")
        case_rows, fault = bench_case(torch, case, config, progress)
        rows += case_rows
    return BenchResult(meta, tuple(finalize(rows)), config.mode)


# --------------------------------------------------------------------------------------------------
# compile time
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildTiming:
    total_s: float
    render_s: float  # plan + layout derivations + Jinja
    compile_s: float  # NVRTC, or the disk-cache read on a hit
    cached: bool

    @property
    def other_s(self) -> float:
        return max(0.0, self.total_s - self.render_s - self.compile_s)


@dataclass(frozen=True)
class CompileTiming:
    kernel: str
    cold: BuildTiming
    warm: BuildTiming
    template_load_s: float  # Jinja's parse of the template, paid once per process (inside cold)

    @property
    def cold_ok(self) -> bool:
        return self.cold.total_s < COLD_TARGET_S

    @property
    def warm_ok(self) -> bool:
        return self.warm.total_s < WARM_TARGET_S and self.warm.cached

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "cold": _timing_json(self.cold), "warm": _timing_json(self.warm),
                "template_load_s": self.template_load_s, "cold_target_s": COLD_TARGET_S,
                "warm_target_s": WARM_TARGET_S, "cold_ok": self.cold_ok, "warm_ok": self.warm_ok}


def _timing_json(t: BuildTiming) -> dict:
    return {"total_s": t.total_s, "render_s": t.render_s, "compile_s": t.compile_s, "other_s": t.other_s,
            "cached": t.cached}


def _timed_build(spec) -> BuildTiming:
    from codegen.build import build

    t0 = time.perf_counter()
    built = build(spec)
    total = time.perf_counter() - t0
    return BuildTiming(total, built.render_seconds, built.compiled.compile_seconds, built.compiled.cached)


@contextlib.contextmanager
def fresh_cache_dir():
    """FLASHGEN_CACHE_DIR pointed at an empty temporary folder for the duration; restored after."""
    old = os.environ.get("FLASHGEN_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="flashgen-bench-cache-") as tmp:
        os.environ["FLASHGEN_CACHE_DIR"] = tmp
        try:
            yield Path(tmp)
        finally:
            if old is None:
                os.environ.pop("FLASHGEN_CACHE_DIR", None)
            else:
                os.environ["FLASHGEN_CACHE_DIR"] = old


def time_compile(spec) -> CompileTiming:
    """Cold: derive + render + NVRTC into an empty cache, with the in-memory derivation and template caches
    emptied first. Warm: the same spec built again (a new plan and render over cached derivations, the cubin
    read back from disk)."""
    from codegen import plan, render

    with fresh_cache_dir():
        plan.clear_caches()
        render.environment.cache_clear()
        t0 = time.perf_counter()
        render.environment().get_template(render.TEMPLATE_BY_ARCH[spec.arch])
        template_load = time.perf_counter() - t0
        render.environment.cache_clear()
        cold = _timed_build(spec)
        warm = _timed_build(spec)
    return CompileTiming(spec.name, cold, warm, template_load)


def import_seconds() -> float | None:
    """Seconds a fresh interpreter takes to import the generator (sympy, jinja2, cuda.bindings): part of a
    first compile in a new process, though not of `build` itself."""
    code = "import time; t = time.perf_counter(); import codegen.build; print(time.perf_counter() - t)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        return float(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def compile_specs(config: BenchConfig) -> list:
    from codegen.plan import resolve

    specs = []
    for case in config.cases:
        base = kernel_spec(case)
        for split in config.splits or ((),):
            specs.append(resolve(base.replace(pv_split=split)))
    return specs


def compile_table(timings: Sequence[CompileTiming]) -> list[list[str]]:
    def ms(x):
        return f"{x * 1e3:.1f}"

    table = [["kernel", "cold ms", "render", "NVRTC", "other", "warm ms", "render", "cache read", "other",
              "targets"]]
    for t in timings:
        verdict = (f"cold {'ok' if t.cold_ok else 'MISS'} (<{COLD_TARGET_S:g} s), "
                   f"warm {'ok' if t.warm_ok else 'MISS'} (<{WARM_TARGET_S * 1e3:g} ms)")
        if not t.warm.cached:
            verdict += ", warm build missed the cache"
        table.append([t.kernel, ms(t.cold.total_s), ms(t.cold.render_s), ms(t.cold.compile_s), ms(t.cold.other_s),
                      ms(t.warm.total_s), ms(t.warm.render_s), ms(t.warm.compile_s), ms(t.warm.other_s), verdict])
    return table


def run_compile(config: BenchConfig) -> tuple[dict, list[CompileTiming]]:
    now = _dt.datetime.now(_dt.timezone.utc)
    meta = {**host_meta(config.command, now), "import_s": import_seconds()}
    return meta, [time_compile(spec) for spec in compile_specs(config)]


def compile_markdown(meta: dict, timings: Sequence[CompileTiming]) -> str:
    lines = ["# flashgen bench (compile)", ""] + [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", render_markdown(compile_table(timings))]
    return "\n".join(lines) + "\n"


def save_compile(meta: dict, timings: Sequence[CompileTiming], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"compile-{slug(platform.node() or 'host')}-{meta['date_utc_stamp']}"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps({"meta": meta, "kernels": [t.to_json() for t in timings]}, indent=2) + "\n")
    paths[1].write_text(compile_markdown(meta, timings))
    return paths


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


def bench_main(argv: list[str]) -> int:
    try:
        config = parse_config(argv)
    except BenchUsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.mode == "compile":
        return _compile_main(config)
    try:
        result = run_gpu(config)
    except (ImportError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.out is not None:
        for path in save_results(result, config.out):
            print(f"wrote {path}", file=sys.stderr)
    print()
    if config.mode == "matrix" or len(config.cases) > 1:
        print("ratio to cuDNN, measured in this run (> 1 is faster):")
        print(render_text(summary_table(result.rows)))
    else:
        print(f"{config.cases[0].label}, on {result.meta.get('gpu')}:")
        print(render_text(case_table(result.rows)))
    return 0 if any(r.impl == "flashgen" and r.ok for r in result.rows) or "flashgen" not in config.peers else 1


def _compile_main(config: BenchConfig) -> int:
    from codegen.spec import SpecError

    try:
        meta, timings = run_compile(config)
    except (SpecError, RuntimeError, ImportError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if config.out is not None:
        for path in save_compile(meta, timings, config.out):
            print(f"wrote {path}", file=sys.stderr)
    imp = meta.get("import_s")
    print(f"import of the generator in a fresh interpreter: {imp * 1e3:.0f} ms" if imp is not None
          else "import time: could not be measured")
    print(f"template parse (part of cold): {', '.join(f'{t.template_load_s * 1e3:.1f} ms' for t in timings)}")
    print(render_text(compile_table(timings)))
    return 0
