#!/usr/bin/env python3
"""Where a consumer's key-block step spends its cycles: run a traced build (KernelSpec.trace) and print them.

    PYTHONPATH=. python3 scripts/trace.py --shape 1,1024,64,128 --dtype f16 [--knob block_n=128] [--json F]

For the traced CTAs' two consumers, the median cycles of each phase of a steady-state step (from one 'packed'
event to the next; codegen/trace.py), the tile's length, and the tensor pipe's own time per step at the H200's dense rate
for comparison. Also times the traced and the plain kernel, to show what the instrumentation costs.
"""

from __future__ import annotations

import argparse
import json
import sys

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
    print(f"{'phase (median cycles)':28s}" + "".join(f"{f'cta{c}/c{w}':>10s}" for c in range(trace.TRACE_CTAS)
                                                         for w in (0, 1)))
    summary = {}
    for c in range(trace.TRACE_CTAS):
        for w in (0, 1):
            summary[(c, w)] = trace.phases(rows[(c, w)])
    labels = dict(trace.STEP_PHASES)
    for name in trace.PHASE_NAMES + ("step",):
        cells = "".join(f"{trace.median(summary[key][name]):10.0f}" for key in summary)
        print(f"{labels.get(name, 'whole step'):28s}{cells}")
    cells = "".join(f"{trace.median(trace.tiles(rows[key])):10.0f}" for key in summary)
    print(f"{'tile (q_ready to q_ready)':28s}{cells}")
    cells = "".join(f"{len(summary[key]['step']):10d}" for key in summary)
    print(f"{'steady steps seen':28s}{cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": traced.built.rendered.kernel_name, "plain_ms": plain_ms, "traced_ms": traced_ms,
                       "events": {f"{c},{w}": [(e.name, e.step, e.clock) for e in rows[(c, w)]]
                                  for c, w in rows},
                       "phases": {f"{c},{w}": ph for (c, w), ph in summary.items()}}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
