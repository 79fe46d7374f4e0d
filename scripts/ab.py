#!/usr/bin/env python3
"""A/B of flashgen tuning knobs against cuDNN, every variant and cuDNN timed in the same run.

    python3 scripts/ab.py --matrix default --variant base: --variant persist:persistent=1
    python3 scripts/ab.py --shape 1,1024,64,128 --dtype f16 --variant st2:stages=2 --variant st3:stages=3
    python3 scripts/ab.py --matrix varlen --variant tile:persistent=0 --variant persist:persistent=1
    python3 scripts/ab.py --matrix fa4 --peer fa4 --variant base: --variant n128:block_n=128
    python3 scripts/ab.py --shape 4,1024,32,128:8 --seq-k 8192 --causal --variant base: --variant n176:block_n=176

A variant is NAME:KNOB=VALUE,KNOB=VALUE with the knobs of codegen.prepare: pv_split=96+32 and those of
codegen.api.KNOB_TYPES (block_n, stages, pingpong, persistent, ..., 0/1 for yes/no); `NAME:` alone is the defaults. `--peer NAME` (bench.peers, e.g. fa4)
times another implementation in the same rounds, as one more column. It prints each variant's ratio to cuDNN per
shape and the geomean; bench/LOG.md records what such runs decided. Uses the benchmark's inputs, timing and error
measurement (the bench/ package), so the numbers are comparable with `gen.py bench`.

Its slots are short (tens of ms), so each runs partly at the clock the slot before left: a variant that takes fewer
cycles but draws more power can win here and lose once the board sits at its power cap. Time such a change with
`scripts/clocks.py --variant ...` too, which runs each for seconds and reports energy a call (bench/LOG.md v39).

`--placements N` times each case N times, each over inputs allocated anew behind a spacer kept alive (so they sit
on other memory): a ratio that moves between placements more than between rounds is the placement's, not the kernel's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.cases import MATRICES, case_from, parse_shape
from bench.config import DEFAULT_ITERS, MIN_ROUNDS, BenchConfig
from bench.gpu_run import measure_together
from bench.inputs import make_inputs
from bench.peers import PEERS, VARLEN_PEER_IMPLS, Peer
from bench.report import geomean
from codegen.api import InputError, parse_knob
from layouts.dtypes import DTYPE_NAMES


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, knobs = text.partition(":")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME:KNOB=VALUE,...")
    try:
        return name, dict(parse_knob(item) for item in filter(None, knobs.split(",")))
    except InputError as e:
        raise SystemExit(f"--variant {text!r}: {e}") from None


def flashgen_peer(name: str, kwargs: dict) -> Peer:
    def make(torch, inputs, case):
        from codegen.api import prepare

        if case.varlen:  # packed sets, one cu_seqlens for q and k (as gen.py bench --varlen)
            cu = inputs.cu_seqlens
            kwargs_all = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=case.seq, max_seqlen_k=case.seq, **kwargs)
        else:
            kwargs_all = kwargs
        return [prepare(q, k, v, causal=case.causal, **kwargs_all).__call__ for q, k, v in inputs.sets]

    return Peer(name, make)


SPACER_STEP_BYTES = 34 * 2**20  # placement i allocates i of these first: 17 of the allocator's 2 MiB pages each


def time_case(torch, case, variants, peers, config, label: str) -> dict:
    """cuDNN, the variants and the peers on fresh inputs in one set of rounds; one printed line of ratios."""
    inputs = make_inputs(torch, case)
    # On a varlen case "cudnn" is the zero-padded yardstick, as in gen.py bench.
    yardstick = (VARLEN_PEER_IMPLS if case.varlen else PEERS)["cudnn"]
    # cuDNN, every variant and every peer are timed in interleaved rounds (bench.gpu_run.measure_together).
    cudnn, *rows = measure_together(
        torch, [(yardstick, None)] + [(flashgen_peer(name, kwargs), None) for name, kwargs in variants]
        + [(peer, None) for _, peer in peers], case, inputs, config)
    line = {"shape": label, "cudnn_ms": cudnn.ms, "cudnn_rounds": cudnn.round_ms}
    for name, row in zip([n for n, _ in variants] + [n for n, _ in peers], rows):
        line[name] = (cudnn.ms / row.ms) if row.ms and cudnn.ms else None
        line[name + "_err"] = row.rel_err if row.ms else row.error
        line[name + "_rounds"] = row.round_ms  # each round's median ms (scripts/round_spread.py reads them so)
    print(json.dumps(line), flush=True)
    del inputs
    torch.cuda.empty_cache()
    return line


def shape_cases(shapes: list[str], dtype: str, causal: bool, seq_k: int | None) -> list:
    """The --shape cases; seq_k (None: each S) makes them chunked prefills as the fa4 matrix's last rows."""
    return [dataclasses.replace(case_from(parse_shape(s), dtype, causal), seq_k=seq_k) for s in shapes]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", choices=sorted(MATRICES))
    parser.add_argument("--shape", action="append", default=[], metavar="B,S,H,D[:KV]")
    parser.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--seq-k", type=int, default=None, metavar="S_K",
                        help="keys of every --shape (a chunked prefill where longer than S; causal aligns bottom right)")
    parser.add_argument("--variant", action="append", required=True, metavar="NAME:KNOB=VALUE,...")
    parser.add_argument("--peer", action="append", default=[], choices=sorted(set(PEERS) - {"cudnn"}),
                        help="another implementation timed in the same rounds (a skipped one says why)")
    parser.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                        help=f"interleaved timing rounds (gen.py bench --rounds; default {MIN_ROUNDS})")
    parser.add_argument("--placements", type=int, default=1, metavar="N",
                        help="time each case over N input allocations, each behind a larger spacer (default 1)")
    args = parser.parse_args(argv)

    import torch

    cases = list(MATRICES[args.matrix]) if args.matrix else []
    cases += shape_cases(args.shape, args.dtype, args.causal, args.seq_k)
    if not cases:
        raise SystemExit("give --matrix or --shape")
    if args.placements < 1:
        raise SystemExit("--placements must be at least 1")
    variants = [parse_variant(v) for v in args.variant]
    if len({n for n, _ in variants} | set(args.peer)) != len(variants) + len(args.peer):
        raise SystemExit("variant and peer names must differ")
    peers = [(name, PEERS[name]) for name in args.peer]
    config = BenchConfig(mode="matrix", cases=tuple(cases), peers=("cudnn",), splits=(), iters=args.iters,
                         warmup=args.warmup, seed=0, out=None, command="ab", rounds=args.rounds)
    torch.manual_seed(0)
    table = []
    for case in cases:
        spacers = []
        for placement in range(args.placements):
            if placement:  # the freed inputs' memory goes to the spacer; the new inputs land past it
                spacers.append(torch.empty(placement * SPACER_STEP_BYTES, dtype=torch.uint8, device="cuda"))
            table.append(time_case(torch, case, variants, peers, config,
                                   case.label + (f" @{placement}" if args.placements > 1 else "")))
        del spacers
        torch.cuda.empty_cache()

    names = [n for n, _ in variants] + args.peer
    print("\nratio to cuDNN, same run (> 1 is faster)")
    print(f"{'shape':34s} {'cuDNN ms':>9s} " + " ".join(f"{n:>10s}" for n in names))
    for line in table:
        cells = " ".join(f"{line[n]:10.3f}" if isinstance(line[n], float) else f"{'-':>10s}" for n in names)
        print(f"{line['shape']:34s} {line['cudnn_ms'] or 0:9.4f} {cells}")
    geo = [geomean(line[n] for line in table if isinstance(line[n], float)) for n in names]
    print(f"{'geomean':34s} {'':9s} " + " ".join(f"{g:10.3f}" if g else f"{'-':>10s}" for g in geo))
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, "ab.json").write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
