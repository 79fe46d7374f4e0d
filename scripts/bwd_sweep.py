#!/usr/bin/env python3
"""Compile a grid of backward specs (no GPU) and report every one that spills, serializes its wgmmas or fails.

    python3 scripts/bwd_sweep.py [--head-dims 64,96,128,256] [--jobs 2] [--quick]

The grid: head dims x masks (full, causal, a (128, 0) window) x soft cap (off, 30) x deterministic x (S_q, S_k) in
(17, 17), (1000, 1000), (4096, 4096), (512, 2048), (2048, 512) x GQA 1 and 4, in bf16, plus a causal f16 spec per
head dim; --quick keeps one (S_q, S_k) pair and GQA 1. Each spec is resolved and built as a call would build it
(codegen.build, NVRTC and ptxas, no cache), so ptxas's spill and wgmma-serialization checks apply. Specs the family
refuses (a SpecError: e.g. deterministic at D=96) are counted apart, not as failures. Exit status 1 if any spec
failed. This is the check behind every backward register-pressure change in bench/LOG.md (b5-b9).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import multiprocessing
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MASKS = {"full": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (128, 0))}
SEQ_PAIRS = ((17, 17), (1000, 1000), (4096, 4096), (512, 2048), (2048, 512))
HEADS = 8


def grid(head_dims: list[int], quick: bool) -> list[tuple]:
    pairs, groups = ((SEQ_PAIRS[1],), (1,)) if quick else (SEQ_PAIRS, (1, 4))
    specs = [(d, mask, cap, det, pair, group, "bf16")
             for d, mask, cap, det, pair, group in itertools.product(head_dims, MASKS, (0.0, 30.0), (False, True),
                                                                     pairs, groups)]
    return specs + [(d, "causal", 0.0, False, SEQ_PAIRS[1], 1, "f16") for d in head_dims]


def compile_one(spec: tuple) -> tuple[tuple, str, str]:
    """(spec, "ok" | "refused" | "failed", detail)."""
    import codegen.api  # noqa: F401  (codegen.backward after codegen.attention: the import order the package needs)
    from codegen.build import build
    from codegen.families.bwd_sm90.plan import BackwardSpec, resolve
    from codegen.spec import SpecError

    d, mask, cap, det, (sq, sk), group, dtype = spec
    causal, window = MASKS[mask]
    try:
        resolved = resolve(BackwardSpec(seq_len=sq, seq_len_k=sk, heads=HEADS, kv_heads=HEADS // group, head_dim=d,
                                        dtype=dtype, causal=causal, window=window, softcap=cap, deterministic=det))
    except SpecError as e:
        return spec, "refused", str(e)
    try:
        build(resolved, use_cache=False)
    except Exception as e:  # spills, serialized wgmmas, ignored setmaxnreg, compile errors: all reported
        return spec, "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return spec, "ok", ""


def label(spec: tuple) -> str:
    d, mask, cap, det, (sq, sk), group, dtype = spec
    return (f"D={d} {mask}{' cap' if cap else ''}{' det' if det else ''} S_q={sq} S_k={sk} GQA {group} {dtype}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,96,128,256")
    parser.add_argument("--jobs", type=int, default=max(1, multiprocessing.cpu_count()))
    parser.add_argument("--quick", action="store_true", help="one (S_q, S_k) pair and GQA 1")
    args = parser.parse_args(argv)
    try:
        head_dims = [int(x) for x in args.head_dims.split(",")]
    except ValueError:
        parser.error(f"--head-dims {args.head_dims!r}: expected comma-separated integers")
    specs = grid(head_dims, args.quick)
    print(f"{len(specs)} backward specs, {args.jobs} compile jobs", flush=True)
    counts, failed, start = collections.Counter(), [], time.time()
    pool = multiprocessing.Pool(args.jobs) if args.jobs > 1 else None  # --jobs 1: in this process
    try:
        results = pool.imap_unordered(compile_one, specs) if pool else map(compile_one, specs)
        for i, (spec, status, detail) in enumerate(results, 1):
            counts[status] += 1
            if status == "failed":
                failed.append((spec, detail))
                print(f"FAILED {label(spec)}: {detail}", flush=True)
            if i % 25 == 0 or i == len(specs):
                print(f"  {i}/{len(specs)} compiled ({time.time() - start:.0f} s)", flush=True)
    finally:
        if pool:
            pool.terminate()
    print(f"{counts['ok']} clean, {counts['refused']} refused by the family (not failures), {counts['failed']} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
