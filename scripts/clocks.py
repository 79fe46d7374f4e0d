#!/usr/bin/env python3
"""SM clock, board power and energy per call while cuDNN and flashgen each run back to back (GPU machine).

    python3 scripts/clocks.py [--shape 1,1024,64,128] [--dtype f16] [--seconds 1.5] [--rounds 2] [--gap 0.3]
                                           [--variant NAME:KNOB=VALUE,...] [--peer fa4] [--json FILE]
    python3 scripts/clocks.py --backward [--causal] --shape 4,4096,32,128 --dtype bf16

Each implementation runs for --seconds in turn (--gap seconds idle between them), for --rounds rounds in the
benchmark's orders (bench.gpu_run.round_orders: with three implementations, six rounds have each directly follow
each other twice), while nvidia-smi samples the clock every 20 ms (bench/clocks.py says why this matters:
under the board's power cap, time follows energy per call, not cycles). Each row also has the clock at its window's first sample ("from
MHz", what the previous load or the idle gap left) and how long the clock took to settle: with --gap 0 that is
how long a benchmark slot runs at its predecessor's clock. Variants take scripts/ab.py's knobs; `base:`
(flashgen's defaults) is always run. --backward runs the backward instead (flashgen's kernels on a saved o and
lse, cuDNN's .backward(), as the backward matrix times them; no variants). Reads clocks only: nothing on the GPU is
changed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import clocks
from bench.cases import case_from, parse_shape
from bench.gpu_run import round_orders
from bench.inputs import make_inputs
from bench.peers import PEERS, Unavailable, _no_context, _sdpa_backend
from scripts.ab import flashgen_peer, parse_variant
from layouts.dtypes import DTYPE_NAMES


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1,1024,64,128", metavar="B,S,H,D")
    parser.add_argument("--dtype", default="f16", choices=DTYPE_NAMES)
    parser.add_argument("--seconds", type=float, default=1.5, help="each implementation's run, per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KNOB=VALUE,...")
    parser.add_argument("--peer", action="append", default=[], choices=sorted(set(PEERS) - {"cudnn"}),
                        help="also run this peer of bench/peers.py (forward only), e.g. fa4")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--backward", action="store_true", help="the backward pass (flashgen's and cuDNN's)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--gap", type=float, default=0.3,
                        help="seconds idle between windows; 0 runs them back to back, as the benchmark's slots are")
    args = parser.parse_args(argv)
    if args.backward and (args.variant or args.peer):
        parser.error("--backward takes no --variant or --peer")
    if args.gap < 0:
        parser.error("--gap must be >= 0 seconds")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.seconds <= clocks.SETTLE_S:
        parser.error(f"--seconds must exceed the {clocks.SETTLE_S} s the clock is given to settle")

    import torch

    case = case_from(parse_shape(args.shape), args.dtype, args.causal)
    torch.manual_seed(0)
    if args.backward:
        from bench import backward

        inputs, _ = backward.make_backward_inputs(torch, case)
        cudnn_context = _sdpa_backend("CUDNN_ATTENTION")
        with cudnn_context(torch):
            cudnn_call = backward._sdpa_backward_calls(torch, inputs, case)[0]
        impls = {"cudnn": (cudnn_call, cudnn_context),
                 "flashgen": (backward._flashgen_backward_calls(torch, inputs, case)[0], _no_context)}
        flops = backward.backward_flops(case)
    else:
        inputs = make_inputs(torch, case)
        cudnn = PEERS["cudnn"]
        impls = {"cudnn": (cudnn.make(torch, inputs, case)[0], cudnn.context)}
        for name, kwargs in [("flashgen", {})] + [parse_variant(v) for v in args.variant]:
            impls[name] = (flashgen_peer(name, kwargs).make(torch, inputs, case)[0], _no_context)
        for name in args.peer:
            try:
                impls[name] = (PEERS[name].make(torch, inputs, case)[0], PEERS[name].context)
            except Unavailable as e:
                print(f"{name}: skipped ({e})", flush=True)
        flops = case.flops

    windows = []
    with clocks.Sampler() as sampler:
        print(f"nvidia-smi fields: {','.join(sampler.query)}", flush=True)
        names = list(impls)
        for rnd, order in enumerate(round_orders(len(names), args.rounds)[:args.rounds]):
            for name in (names[i] for i in order):
                call, context = impls[name]
                with context(torch):
                    for _ in range(20):
                        call()
                    torch.cuda.synchronize()
                    start, calls = time.time(), 0
                    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    first.record()
                    while time.time() - start < args.seconds:
                        for _ in range(100):
                            call()
                        calls += 100
                        torch.cuda.synchronize()
                    last.record()
                    torch.cuda.synchronize()
                windows.append((rnd, clocks.Window(name, start, time.time(), first.elapsed_time(last) / calls, flops)))
                time.sleep(args.gap)
    samples = sampler.samples()
    rows = [dict(clocks.summarize(w, samples), round=rnd) for rnd, w in windows]
    print(f"{case.label}: each implementation {args.seconds} s back to back, {args.rounds} rounds; "
          f"{len(samples)} samples")
    print(clocks.table(rows))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"case": case.label, "seconds": args.seconds,
                                                       "query": list(sampler.query), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
