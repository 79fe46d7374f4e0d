#!/usr/bin/env python3
"""The benchmark's timing slots on one case, one by one: what each implementation's slot ran at (GPU machine).

    python3 scripts/slot_probe.py --shape 4,4096,32,128 --causal --peer fa4 [--sleep-ms 4] [--iters 100] [--repeat 2]

Runs the matrix's measure_together on the case (cuDNN, the --peer implementations, flashgen's kernel and its
attention() call, in round_orders' interleaved rounds, --iters calls each) and prints, per slot: the round, the
implementation, the GPU sleep the round asked ahead of its kernel slots (gpu_run.round_sleep_s: the longest any
of them needs, codegen.check.queue_ahead_s), the slot's median ms, and the SM clock over the slot (NVML, read
every ~0.5 ms in a thread: mean and first reading; the driver updates the value only every ~20 ms, so a slot of
20 ms has one or two). Then each implementation's median over all its slots and the ratio of each to cuDNN, as
the matrix reports them.

Why: under the power cap a slot's clock is what its predecessor and the idle before it left. Sized per call, the
sleep gave an implementation with a slow host path a longer idle before each of its slots (session 51 found it);
the matrix now gives every kernel slot of a round the same. `--sleep-ms` sets that sleep (a slot still sleeps
as long as its own enqueueing needs) to see how much the idle moves the ratios. Reads clocks only: nothing on the
GPU is changed.
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import bench.gpu_run as gpu_run
from bench.cases import block_n_for, case_from, parse_shape
from bench.config import CALL_ROUNDS, BenchConfig
from bench.inputs import make_inputs
from bench.peers import PEERS, peers_for
from layouts.dtypes import DTYPE_NAMES

NVML_CLOCK_SM = 1


class ClockSampler:
    """The SM clock from NVML (libnvidia-ml, ctypes) every `period_s` in a daemon thread: (host time, MHz)."""

    def __init__(self, period_s: float = 5e-4):
        self.samples: list[tuple[float, int]] = []
        self.period_s, self._stop = period_s, threading.Event()
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self._handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(0) failed")
        self._nvml = nvml
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        mhz = ctypes.c_uint()
        while not self._stop.is_set():
            if self._nvml.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(mhz)) == 0:
                self.samples.append((time.perf_counter(), mhz.value))
            time.sleep(self.period_s)

    def between(self, t0: float, t1: float) -> list[int]:
        return [mhz for t, mhz in self.samples if t0 <= t <= t1]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, metavar="B,S,H,D[:KV]")
    parser.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--peer", action="append", default=[], choices=sorted(set(PEERS) - {"cudnn"}))
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=None,
                        help="the GPU sleep ahead of every kernel slot, and with --call-rounds apart the idle ahead "
                             "of every call slot (default: the benchmark's, the round's longest need)")
    parser.add_argument("--call-rounds", choices=CALL_ROUNDS, default=CALL_ROUNDS[0],
                        help=f"where the calls' slots run, as gen.py bench --call-rounds (default {CALL_ROUNDS[0]})")
    parser.add_argument("--repeat", type=int, default=1, help="measure_together this many times")
    args = parser.parse_args(argv)

    import torch

    case = case_from(parse_shape(args.shape), args.dtype, args.causal)
    config = BenchConfig(mode="matrix", cases=(case,), peers=("cudnn", *args.peer, "flashgen"), splits=(),
                         iters=args.iters, warmup=args.warmup, seed=0, out=None, command="slot_probe",
                         call_rounds=args.call_rounds)
    sampler = ClockSampler()
    slots: list[dict] = []
    if args.sleep_ms is not None:
        gpu_run.round_sleep_s = lambda timings, rounds, r: args.sleep_ms / 1e3

    def slot_recorder(time_round, kind: str):
        def recorded(torch_, timing, *, warmup: int, iters: int, **sleep) -> None:
            samples = timing.call_samples if kind == "call" else timing.samples
            before, t0 = len(samples), time.perf_counter()
            time_round(torch_, timing, warmup=warmup, iters=iters, **sleep)
            t1 = time.perf_counter()
            clocks = sampler.between(t0, t1)
            new = samples[before:]
            role = " call" if kind == "call" else "" if sleep.get("keep", True) else " stand-in"  # untimed: no ms
            slots.append({"impl": timing.peer.name + role,
                          "sleep_ms": sleep.get("sleep_s", sleep.get("idle_s", 0.0)) * 1e3,
                          "ms": statistics.median(new) if new else None,
                          "mhz": statistics.fmean(clocks) if clocks else None,
                          "first_mhz": clocks[0] if clocks else None, "slot_s": t1 - t0})
        return recorded

    gpu_run._time_round = slot_recorder(gpu_run._time_round, "kernel")
    gpu_run._time_call_round = slot_recorder(gpu_run._time_call_round, "call")

    torch.manual_seed(0)
    inputs = make_inputs(torch, case)
    entries = peers_for(case, config, block_n_for(case))
    print(f"{case.label}: {', '.join(p.name for p, _ in entries)}; --iters {args.iters}, sleep "
          + (f"{args.sleep_ms} ms every kernel slot" if args.sleep_ms is not None
             else "the benchmark's (a round's longest need)"))
    for rep in range(args.repeat):
        first = len(slots)
        rows = gpu_run.measure_together(torch, entries, case, inputs, config)
        print(f"\n-- repeat {rep + 1}: slot, implementation, sleep ahead ms, median ms, mean MHz, first MHz, slot s")
        for i, s in enumerate(slots[first:]):
            print(f"{i:3d} {s['impl']:<16} {s['sleep_ms']:7.2f} {s['ms'] or 0:8.4f} {s['mhz'] or 0:7.0f} "
                  f"{s['first_mhz'] or 0:6.0f} {s['slot_s']:6.3f}")
        yard = next(r for r in rows if r.impl == "cudnn")
        for impl in dict.fromkeys(s["impl"] for s in slots[first:] if not s["impl"].endswith(" stand-in")):
            mine = [s for s in slots[first:] if s["impl"] == impl]
            mhz = [s["mhz"] for s in mine if s["mhz"]]
            row = next((r for r in rows if r.impl == impl.split()[0]), None)
            ms = (row.call_ms if impl.endswith(" call") else row.ms) if row else None
            ratio = f"{yard.ms / ms:.3f}x cuDNN" if ms and yard.ms else "-"
            print(f"    {impl:<16} median {ms or 0:.4f} ms, {ratio}, mean clock over its slots "
                  f"{statistics.fmean(mhz) if mhz else 0:.0f} MHz")
    sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
