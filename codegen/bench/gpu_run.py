"""The GPU run: measure (one implementation on one case: error, then the median time within a budget),
bench_case (every implementation on a case, stopping when the CUDA context faults) and run_gpu (every case)."""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import sys

from ..check import time_gpu
from .cases import Case, block_n_for
from .config import BenchConfig
from .inputs import Inputs, make_inputs
from .peers import Peer, Unavailable, peer_names, peers_for
from .report import BenchResult, Row, _short, finalize, gpu_meta, host_meta

TIME_BUDGET_MS = 3000.0  # per implementation and shape: caps iterations for the slow peers


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
