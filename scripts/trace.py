#!/usr/bin/env python3
"""Where a consumer's key-block step spends its cycles: run a traced build (KernelSpec.trace) and print them.

    python3 scripts/trace.py --shape 1,1024,64,128 --dtype f16 [--knob block_n=128] [--json F]

For the traced CTAs' two consumers (their first warps), the median cycles of each phase of a steady-state step
(from one 'packed' event to the next; codegen/trace.py), the tile's length, and the tensor pipe's own time per
step at the H200's dense rate for comparison. Then each consumer's four warps, pooled over the traced CTAs: their
phases (each within its own warp: clocks of different warps do not compare). Also times the traced and the plain
kernel, to show what the instrumentation costs.
"""

from __future__ import annotations

import pathlib
import argparse
import json
import sys

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen import trace
from codegen.api import prepare
from scripts.profile_one import random_inputs, shape_arguments

# Dense f16/bf16 wgmma rate of one H100/H200 SM: 989.4 TFLOPS over 132 SMs at 1.83 GHz.
FLOPS_PER_SM_CYCLE = 4096


def time_ms(torch, call, iters: int = 50) -> float:
    for _ in range(5):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(parser)
    parser.add_argument("--json", help="write the decoded events and phases here")
    args = parser.parse_args(argv)

    import torch

    (q, k, v), knobs = random_inputs(args)
    plain = prepare(q, k, v, causal=args.causal, **knobs)
    traced = prepare(q, k, v, causal=args.causal, trace=True, **knobs)
    plain_ms, traced_ms = time_ms(torch, plain), time_ms(torch, traced)
    trace.clear(traced)
    traced()
    torch.cuda.synchronize()
    rows = trace.read(traced)

    spec = traced.built.spec
    print(f"{traced.built.rendered.kernel_name}: plain {plain_ms:.4f} ms, traced {traced_ms:.4f} ms "
          f"({100 * (traced_ms / plain_ms - 1):+.1f}%)")
    mma = 2 * 2 * 64 * spec.block_n * spec.head_dim / FLOPS_PER_SM_CYCLE  # QK + PV of one consumer, one block
    print(f"tensor pipe per consumer step at the dense rate: {mma:.0f} cycles (both consumers: {2 * mma:.0f})")
    summary = {(c, g): trace.phases(rows[(c, g, 0)]) for c in range(trace.TRACE_CTAS) for g in (0, 1)}
    print_phases("phase (median cycles)", {f"cta{c}/c{g}": ph for (c, g), ph in summary.items()}, width=10)
    cells = "".join(f"{trace.median(trace.tiles(rows[key + (0,)])):10.0f}" for key in summary)
    print(f"{'tile (q_ready to q_ready)':28s}{cells}")
    cells = "".join(f"{len(summary[key]['step']):10d}" for key in summary)
    print(f"{'steady steps seen':28s}{cells}")
    warps = print_warps(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": traced.built.rendered.kernel_name, "plain_ms": plain_ms, "traced_ms": traced_ms,
                       "events": {f"{c},{g},{w}": [(e.name, e.step, e.clock) for e in rows[(c, g, w)]]
                                  for c, g, w in rows},
                       "phases": {f"{c},{g}": ph for (c, g), ph in summary.items()},
                       "warps": warps}, f)
    return 0


def print_phases(title: str, columns: dict[str, dict[str, list[int]]], width: int) -> None:
    """A table: one row per phase (and the whole step), one column of median cycles per named phases dict."""
    labels = dict(trace.STEP_PHASES)
    print(f"{title:28s}" + "".join(f"{name:>{width}s}" for name in columns))
    for name in trace.PHASE_NAMES + ("step",):
        cells = "".join(f"{trace.median(column[name]):{width}.0f}" for column in columns.values())
        print(f"{labels.get(name, 'whole step'):28s}{cells}")


def print_warps(rows) -> dict:
    """Each consumer warp's phases, pooled over the traced CTAs: "consumer,warp" -> phase -> cycles per step.
    Only differences within one warp's row: clocks of different warps do not compare (codegen/trace.py)."""
    pooled = {}
    for g in (0, 1):
        for w in range(trace.TRACE_WARPS):
            pooled[f"{g},{w}"] = {name: [] for name in trace.PHASE_NAMES + ("step",)}
            for c in range(trace.TRACE_CTAS):
                for name, cycles in trace.phases(rows[(c, g, w)]).items():
                    pooled[f"{g},{w}"][name] += cycles
    print()
    print_phases("each warp, pooled over CTAs", {"c%s/w%s" % tuple(k.split(",")): v for k, v in pooled.items()},
                 width=9)
    return pooled


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
