"""The command line: the implementation names, BenchConfig, the argparse parser (its help text is USAGE) and
parse_config, which turns `gen.py bench` arguments into a BenchConfig."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .cases import MATRICES, BenchUsageError, Case, case_from, kv_heads_problem, parse_shape, parse_varlen, varlen_case
from .report import DEFAULT_OUT
from layouts.dtypes import DTYPE_NAMES

USAGE = """`gen.py bench`: flashgen against its peers in one run, and the compile-time report.

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
  gen.py bench --matrix fa4 [--peers flashgen,fa4,cudnn]
      flashgen against FlashAttention-4 (`fa4`: flash_attn.cute.flash_attn_func, the flash-attn-4 package, when
      it imports; otherwise its rows are skipped with the import's error) and cuDNN, on the default matrix's
      shapes plus grouped-query, D 96 and 192, short and chunked-prefill (S_q over a longer S_k, causal
      bottom-right) shapes; files *-fa4.json and .md (bench/README.md: carrying the wheels to the GPU machine).
  gen.py bench --matrix decode [--iters N] [--out bench/results]
      codegen.attention_with_kvcache (decode over a KV cache) against SDPA's cuDNN, flash and efficient backends
      on full caches, no mask (bench/decode.py; files *-decode.json and .md).
  gen.py bench --matrix backward [--peers flashgen,cudnn,flash] [--iters N] [--out bench/results]
      the backward pass: codegen.backward.attention_backward on a saved o and lse (ms), o.backward(do) through
      autograd (call ms) and forward + backward, against SDPA's cuDNN and flash backends (bench/backward.py; files
      *-backward.json and .md).
  gen.py bench --compile [--shape B,S,H,D[:KV] ...] [--varlen LENS ...]
      cold (render + NVRTC into an empty cache) and warm (disk-cache hit) build times; no GPU needed.

Every mode also takes --iters N (timed calls, median reported), --warmup N, --rounds N (interleaved timing rounds,
at the least; the --iters are spread over them), --seed N, --out DIR and --no-save.

The figure of merit is the ratio to cuDNN in the same run (DESIGN.md section 7). flashgen has two: `ms` and
`vs cuDNN` time its kernel (codegen.api.prepare() once, then launches), `call ms` and `call vs cuDNN` (summary
column `flashgen call`) what users call, codegen.attention(q, k, v, ...) with the same arguments, host time
included, against cuDNN's own SDPA call timed the same way; both in the same interleaved rounds. Nothing here
imports torch until a GPU mode runs, so `--compile` and the unit tests work on a machine without it.

FLOPs: 4 * B * H * S^2 * D for a dense case, and the sum over sequences of 4 * H * L_i^2 * D for a varlen one
(S_q = S_k = L_i), halved for causal in both: half of each full square, diagonal not counted apart, the
convention FlashAttention's own benchmarks use. TFLOPS always count this useful work, so the padded cuDNN
yardstick's TFLOPS of a varlen row are effective ones (its padded batch does 1 / padding_efficiency as much).
"""

ALL_PEERS = ("flashgen", "cudnn", "sdpa", "flash", "mem_efficient", "math", "flex", "unfused", "fa4",
             "cudnn_varlen", "flash_varlen")
MATRIX_PEERS = ("flashgen", "cudnn", "flash", "flex", "cudnn_varlen", "flash_varlen")
# A matrix's own default implementations, where they are not MATRIX_PEERS (--peers and --all-peers still apply).
MATRIX_DEFAULT_PEERS = {"fa4": ("flashgen", "cudnn", "fa4")}
# What runs on a varlen case (the others have no ragged form and give no row there); cudnn_varlen and
# flash_varlen run on varlen cases only.
VARLEN_PEERS = ("flashgen", "cudnn", "flex", "cudnn_varlen", "flash_varlen")
VARLEN_ONLY_PEERS = ("cudnn_varlen", "flash_varlen")
# `--matrix decode`: codegen.decode.attention_with_kvcache against SDPA's backends (bench/decode.py holds its cases).
DECODE_MATRIX = "decode"
# BenchConfig.call_rounds, the default first (h5, bench/LOG.md: the calls' own rounds halve the kernels' round spread);
# the decode matrix times each call in the slot after its kernel's, always (DECODE_CALL_ROUNDS).
CALL_ROUNDS = ("apart", "shared")
DECODE_CALL_ROUNDS = "shared"
DECODE_IMPLS = ("flashgen", "cudnn", "flash", "efficient")
# `--matrix backward`: the backward pass against SDPA's cuDNN and flash backends (bench/backward.py holds its cases).
BACKWARD_MATRIX = "backward"
BACKWARD_IMPLS = ("flashgen", "cudnn", "flash")
# The matrices with cases, implementations and rows of their own: what their cases are, and their implementations.
OWN_MATRICES = {DECODE_MATRIX: ("bf16, full caches, no mask", DECODE_IMPLS),
                BACKWARD_MATRIX: ("bf16 and one f16, backward and forward + backward", BACKWARD_IMPLS)}


# Timing rounds a case's implementations take in turn, at the least (bench.gpu_run says why; --rounds raises it),
# and the timed calls spread over them (--iters).
MIN_ROUNDS = 5
DEFAULT_ITERS = 100


@dataclass(frozen=True)
class BenchConfig:
    mode: str  # "table", "matrix", "compile", "decode" or "backward" (cases: (); bench.decode.decode_cases(),
    # bench.backward.backward_cases())
    cases: tuple[Case, ...]
    peers: tuple[str, ...]
    splits: tuple[tuple[int, ...], ...]  # () : every candidate split valid for the shape
    iters: int
    warmup: int
    seed: int
    out: Path | None  # None: print only
    command: str
    matrix: str | None = None
    rounds: int = MIN_ROUNDS  # interleaved timing rounds, at the least; --iters are spread over them
    # Where the user calls are timed (bench.gpu_run.measure_together): "apart", rounds of their own after the
    # kernels' that replay them (h5, bench/LOG.md); "shared", each call slot right after its kernel's in the kernels'
    # rounds.
    call_rounds: str = CALL_ROUNDS[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gen.py bench", description=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    matrices = sorted([*MATRICES, *OWN_MATRICES])
    mode.add_argument("--matrix", nargs="?", const="default", choices=matrices, metavar="NAME",
                      help=f"run a built-in shape matrix ({', '.join(matrices)}; default: default; decode: "
                           "attention_with_kvcache against SDPA, bench/decode.py; backward: the backward pass "
                           "against SDPA's, bench/backward.py)")
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
    parser.add_argument("--dtype", choices=DTYPE_NAMES, help="default f16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--iters", type=int, default=DEFAULT_ITERS, help="timed iterations (median is reported)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                        help=f"interleaved timing rounds, at the least (default {MIN_ROUNDS}, rounded up to whole "
                             "order designs: 6 for two or three implementations). --iters are spread over the "
                             "rounds: raise both together to keep a slot's calls (the defaults time ~17 a slot)")
    parser.add_argument("--call-rounds", choices=CALL_ROUNDS,
                        help="where the user calls (call_ms) are timed: apart (default), in rounds of their own after "
                             "the kernels' that replay them, each call in its kernel's slot (bench/LOG.md h5); "
                             "shared, each in a slot right after its kernel's, in the kernels' rounds. Forward and "
                             "backward rows; the decode matrix times its own way")
    parser.add_argument("--split", action="append", default=[], metavar="96,32",
                        help="flashgen PV split to time (repeatable; default: every split valid for the shape)")
    parser.add_argument("--peers", metavar="LIST",
                        help=f"comma-separated implementations out of {','.join(ALL_PEERS)} "
                             f"(default: all for one shape, {','.join(MATRIX_PEERS)} for --matrix, "
                             f"{','.join(MATRIX_DEFAULT_PEERS['fa4'])} for --matrix fa4; "
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
    if args.rounds < 1:
        raise BenchUsageError(f"--rounds must be >= 1, got {args.rounds}")
    if args.matrix in OWN_MATRICES:
        return _own_matrix_config(args, argv)
    args.dtype = args.dtype or "f16"
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
    return BenchConfig(mode=mode, cases=cases, peers=_peers_from(args, mode, args.matrix),
                       splits=tuple(_parse_split(s) for s in args.split), iters=args.iters, warmup=args.warmup,
                       seed=args.seed, out=None if args.no_save else args.out,
                       command=" ".join(["gen.py", "bench", *argv]), matrix=args.matrix, rounds=args.rounds,
                       call_rounds=args.call_rounds or CALL_ROUNDS[0])


def _own_matrix_config(args, argv: Sequence[str]) -> BenchConfig:
    """`--matrix decode` and `--matrix backward`: their own cases, dtypes and implementations; only --iters,
    --warmup, --rounds, --seed, --out and --no-save apply, and for backward --peers, some of its implementations
    (cudnn, the yardstick, is always added), and --call-rounds."""
    matrix = args.matrix
    what, impls = OWN_MATRICES[matrix]
    takes_peers = matrix == BACKWARD_MATRIX
    given = [flag for flag, value in (("--shape", args.shape), ("--varlen", args.varlen), ("--heads", args.heads),
                                      ("--head-dim", args.head_dim), ("--kv-heads", args.kv_heads),
                                      ("--dtype", args.dtype), ("--causal", args.causal), ("--split", args.split),
                                      ("--peers", None if takes_peers else args.peers),
                                      ("--all-peers", args.all_peers),
                                      ("--call-rounds", args.call_rounds if matrix == DECODE_MATRIX else None))
             if value not in (None, False, [])]
    if given:
        raise BenchUsageError(f"--matrix {matrix} runs its own cases ({what}) with {', '.join(impls)}; "
                              f"drop {', '.join(given)}")
    peers = impls
    if args.peers:
        names = [n.strip() for n in args.peers.split(",") if n.strip()]
        unknown = [n for n in names if n not in impls]
        if unknown:
            raise BenchUsageError(f"unknown implementation(s) {unknown} in --peers for --matrix {matrix}; choose "
                                  f"from {', '.join(impls)}")
        peers = tuple(n for n in impls if n in {*names, "cudnn"})
    return BenchConfig(mode=matrix, cases=(), peers=peers, splits=(), iters=args.iters, warmup=args.warmup,
                       seed=args.seed, out=None if args.no_save else args.out,
                       command=" ".join(["gen.py", "bench", *argv]), matrix=matrix, rounds=args.rounds,
                       call_rounds=(DECODE_CALL_ROUNDS if matrix == DECODE_MATRIX
                                    else args.call_rounds or CALL_ROUNDS[0]))


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


def _peers_from(args, mode: str, matrix: str | None = None) -> tuple[str, ...]:
    if args.all_peers:
        return ALL_PEERS
    if not args.peers:
        if mode == "matrix":
            return MATRIX_DEFAULT_PEERS.get(matrix, MATRIX_PEERS)
        return ALL_PEERS
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
