#!/usr/bin/env python3
"""A/B of backward kernels from several source trees against cuDNN's backward, in interleaved rounds.

    python3 scripts/bwd_ab.py --tree base=. --tree swz=.scratch/pA [--case 4,4096,32,128] [--case 4,4096,32,128,c]

A tree is NAME=PATH, a checkout (or a patched copy of one, e.g. with a bench/wip patch applied): two trees' codegen
cannot share a process, so each round runs one worker process per tree (PYTHONPATH=PATH), in turn. A worker
measures each case as `gen.py bench --matrix backward` does (bench.backward.bench_backward_case, flashgen and
cuDNN only: the backward kernels on a saved o and lse, and o.backward() as users call it, in interleaved rounds;
dq, dk, dv against float64), with the tree's own bench and codegen. Printed: per case and tree, the medians over
rounds of flashgen's ms, its ratio to the cuDNN of the same process, the ratio of the two .backward() calls, and
the worst relative errors of both. A case is B,S,H,D[,c] (c: causal), bf16, H_kv = H.
`--kernels` adds where each tree's time goes: the CUDA time of each of its kernels (_pre, the main kernel, _post)
per call, from torch.profiler over --iters calls, beside cuDNN's kernels summed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_CASES = ("4,4096,32,128", "4,4096,32,128,c", "1,16384,16,128,c", "16,1024,32,64")


def parse_case(text: str) -> tuple[int, int, int, int, bool]:
    parts = text.split(",")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "c"):
        raise SystemExit(f"--case {text!r}: expected B,S,H,D or B,S,H,D,c")
    b, s, h, d = (int(x) for x in parts[:4])
    return b, s, h, d, len(parts) == 5


def parse_tree(text: str) -> tuple[str, pathlib.Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not all((pathlib.Path(path) / d).is_dir() for d in ("codegen", "bench")):
        raise SystemExit(f"--tree {text!r}: expected NAME=PATH of a tree with codegen/ and bench/")
    return name, pathlib.Path(path).resolve()


def kernel_times(fn, iters: int, torch) -> dict[str, float]:
    """CUDA ms per call of each kernel `fn` launches, by name, from torch.profiler over `iters` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        # Self time: a kernel's own; an operator's children carry its time, so summing stays a sum of kernels.
        cuda_us = getattr(event, "self_device_time_total", None)
        if cuda_us is None:
            cuda_us = getattr(event, "self_cuda_time_total", 0.0)
        if cuda_us and event.count:
            times[event.key] = times.get(event.key, 0.0) + cuda_us / 1e3 / iters
    return times


def worker(cases: list[str], iters: int, kernels: bool = False, torch=None) -> None:
    """Each case through `gen.py bench --matrix backward`'s own measurement (bench.backward.bench_backward_case:
    interleaved rounds, the o.backward() call users make, errors against float64), flashgen and cuDNN only; one
    JSON line per case. `torch`: the module (tests pass a CPU stand-in)."""
    if torch is None:
        import torch

    from bench.backward import (_flashgen_backward_calls, _sdpa_backward_calls, bench_backward_case,
                                finalize_backward, make_backward_inputs)
    from bench.cases import Case
    from bench.config import parse_config
    from bench.peers import _sdpa_backend

    config = parse_config(["--matrix", "backward", "--peers", "flashgen,cudnn", "--iters", str(iters), "--no-save"])
    for text in cases:
        b, s, h, d, causal = parse_case(text)
        case = Case(b, s, h, d, dtype="bf16", causal=causal)
        torch.manual_seed(0)
        rows, fault = bench_backward_case(torch, case, config, progress=lambda line: None)
        by = {r.impl: r for r in finalize_backward(rows)}
        ours, cudnn = by.get("flashgen"), by.get("cudnn")
        if fault or ours is None or ours.ms is None or cudnn is None or cudnn.ms is None:
            raise SystemExit(f"{text}: {fault or (ours and (ours.error or ours.skipped)) or 'no flashgen row'}")
        row = {"case": text, "ms": ours.ms, "cudnn_ms": cudnn.ms, "call_ms": ours.call_ms,
               "cudnn_call_ms": cudnn.call_ms, "err": ours.rel_err, "cudnn_err": cudnn.rel_err}
        if kernels:
            inputs, _ = make_backward_inputs(torch, case)
            mine = kernel_times(_flashgen_backward_calls(torch, inputs, case)[0], iters, torch)
            row["kernels"] = {_role(name): ms for name, ms in mine.items() if name.startswith("flashgen_bwd")}
            with _sdpa_backend("CUDNN_ATTENTION")(torch):
                theirs = _sdpa_backward_calls(torch, inputs, case)[0]
                row["cudnn_kernels_ms"] = sum(kernel_times(theirs, iters, torch).values())
        print(json.dumps(row), flush=True)


def _role(kernel: str) -> str:
    """The backward's three kernels by their names' suffixes (codegen.families.bwd_sm90: _pre, main, _post)."""
    return "pre" if kernel.endswith("_pre") else "post" if kernel.endswith("_post") else "main"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--case", action="append", default=[], metavar="B,S,H,D[,c]")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernels", action="store_true", help="also each kernel's CUDA time per call (torch.profiler)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = args.case or list(DEFAULT_CASES)
    for c in cases:
        parse_case(c)
    if args.worker:
        worker(cases, args.iters, args.kernels)
        return 0
    trees = [parse_tree(t) for t in args.tree] or [("base", ROOT)]
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for name, path in trees:
            cmd = [sys.executable, str(ROOT / "scripts" / "bwd_ab.py"), "--worker", "--iters", str(args.iters)]
            cmd += [x for c in cases for x in ("--case", c)] + (["--kernels"] if args.kernels else [])
            proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(path)), capture_output=True, text=True)
            if proc.returncode:
                print(f"round {r} {name}: worker failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    results.setdefault((row["case"], name), []).append(row)
                    # Progress, and the rounds so far if a time limit cuts the run short.
                    print(f"round {r} {name:<10} {row['case']:<20} {row['ms']:8.3f} ms, cuDNN {row['cudnn_ms']:8.3f} ms",
                          file=sys.stderr, flush=True)
    print(f"{'case':<20} {'tree':<10} {'ms':>8} {'cudnn ms':>9} {'ratio':>7} {'call':>7} {'rel err':>9} "
          f"{'cuDNN err':>9}")
    for c in cases:
        for name, _ in trees:
            rows = results.get((c, name), [])
            ms = statistics.median(x["ms"] for x in rows)
            ratio = statistics.median(x["cudnn_ms"] / x["ms"] for x in rows)
            calls = [x["cudnn_call_ms"] / x["call_ms"] for x in rows if x["call_ms"] and x["cudnn_call_ms"]]
            call = f"{statistics.median(calls):6.3f}x" if calls else f"{'-':>7}"
            print(f"{c:<20} {name:<10} {ms:8.3f} {statistics.median(x['cudnn_ms'] for x in rows):9.3f} "
                  f"{ratio:6.3f}x {call} {max(x['err'] for x in rows):9.2e} {max(x['cudnn_err'] for x in rows):9.2e}")
            if args.kernels:
                split = {k: statistics.median(x["kernels"].get(k, 0.0) for x in rows) for k in ("pre", "main", "post")}
                cudnn = statistics.median(x["cudnn_kernels_ms"] for x in rows)
                print(f"{'':<20} {'':<10} kernels: pre {split['pre']:.3f} main {split['main']:.3f} post "
                      f"{split['post']:.3f} ms; cuDNN's kernels {cudnn:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
