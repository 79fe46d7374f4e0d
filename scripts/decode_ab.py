#!/usr/bin/env python3
"""A/B of decode variants (attention_with_kvcache knobs) against cuDNN, all timed in one process.

    python3 scripts/decode_ab.py --case 32,8192 --case 128,8192 --variant base: --variant s2:num_splits=2
    python3 scripts/decode_ab.py --case 32,8192 --heads 32/8 --dim 128 --variant n64:block_n=64,stages=4

A case is B,S_K (full caches, S_q from --q-len; `--page-size P`: flashgen reads them as shuffled pages of P rows,
bench.decode.paged_copy, pages in key order with `--in-order`, or shuffled within runs of N pool pages with
`--shuffle-span N`, while cuDNN reads the dense copy, and with `--cudnn-paged` the paged one too); a variant
NAME:KNOB=VALUE,... with attention_with_kvcache's keywords (num_splits, block_n, stages). Each round times every
variant and cuDNN (SDPA, enable_gqa, the cache as (B,H,S,D) views) by CUDA events over --iters calls behind a GPU
sleep, rounds interleaved; the median of the rounds is printed with the K+V read rate and the plan the call chose
(splits, CTAs a SM, gathered pages: what a default is being compared with). For quick decisions
(bench/LOG.md); `gen.py bench --matrix decode` makes the committed numbers. `--profile NAME` instead launches one
variant (or `cudnn`) a few times for ncu.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, knobs = text.partition(":")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME:KNOB=VALUE,...")
    return name, {k: int(v) for k, _, v in (item.partition("=") for item in filter(None, knobs.split(",")))}


def plan_note(launcher) -> str:
    """What a launcher runs, in the words of the policy: splits (clustered or plain), CTAs a SM, gathered pages."""
    spec = launcher.plan.spec
    splits = f"{launcher.splits} split" + ("s" if launcher.splits > 1 else "")
    kind = " (cluster)" if launcher.cluster is not None else ""
    return f"{splits}{kind}, {spec.ctas_per_sm} CTA(s) a SM" + (", gathered" if spec.gather else "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", required=True, metavar="B,S_K")
    parser.add_argument("--heads", default="32/8", metavar="H/H_KV")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--q-len", type=int, default=1)
    parser.add_argument("--page-size", type=int, default=0, help="flashgen reads a paged copy (0: the dense cache)")
    parser.add_argument("--in-order", action="store_true",
                        help="the paged copy's pages in key order, not shuffled (what the pages' scatter costs)")
    parser.add_argument("--shuffle-span", type=int, default=0, metavar="N",
                        help="shuffle the paged copy's pages only within runs of N pool pages (how far the scatter "
                             "must reach to cost; 0: the whole pool)")
    parser.add_argument("--sorted-rows", type=int, default=None, metavar="N",
                        help="sort each row of the page table by page within runs of N entries (0: the whole row): "
                             "the keys of a full, unmasked cache in another order (the same attention), read in "
                             "address order (what an address-ordered read would win, and over how many pages)")
    parser.add_argument("--head-major", action="store_true",
                        help="dense caches stored (B, H_kv, S, D), each head's rows contiguous, and passed to both "
                             "sides as views: what the (B, S, H_kv, D) layout's interleaved heads cost")
    parser.add_argument("--cudnn-paged", action="store_true",
                        help="also time cuDNN's own paged read of the same pool and page table (the cuDNN frontend, "
                             "bench.cudnn_paged; said and skipped where it does not import or run)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KNOB=VALUE,...")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", metavar="NAME", help="launch this variant (or cudnn) 3 times, nothing timed")
    parser.add_argument("--unchecked", action="store_true",
                        help="time variants whose output is wrong on purpose (a copy that skips work, to bound what it "
                             "costs); their error is printed, not enforced")
    args = parser.parse_args(argv)
    if (args.in_order or args.shuffle_span) and not args.page_size:
        parser.error("--in-order and --shuffle-span order a paged copy's pages; they need --page-size")
    if args.sorted_rows is not None and not args.page_size:
        parser.error("--sorted-rows sorts a paged copy's page table; it needs --page-size")
    if args.in_order and args.shuffle_span:
        parser.error("--in-order is --shuffle-span 1; give one of them")
    if args.cudnn_paged and not args.page_size:
        parser.error("--cudnn-paged reads the paged copy; it needs --page-size")
    if args.head_major and args.page_size:
        parser.error("--head-major is a dense cache's layout; it does not go with --page-size")

    import torch

    from bench.decode import paged_copy
    from codegen import InputError, attention_with_kvcache, decode

    heads, kv_heads = (int(x) for x in args.heads.split("/"))
    variants = [parse_variant(v) for v in args.variant] or [("base", {})]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"H={heads}/{kv_heads} D={args.dim} S_q={args.q_len} bf16 page {args.page_size or 'dense'}; "
          f"ms median of {args.rounds} rounds")
    for text in args.case:
        batch, cache_len = (int(x) for x in text.split(","))
        sets = []
        for _ in range(2):  # two input sets, alternated, so L2 does not hold a set between calls
            q = torch.randn(batch, args.q_len, heads, args.dim, dtype=torch.bfloat16, device="cuda")
            if args.head_major:
                k, v = (torch.randn(batch, kv_heads, cache_len, args.dim, dtype=torch.bfloat16,
                                    device="cuda").transpose(1, 2) for _ in range(2))
            else:
                k, v = (torch.randn(batch, cache_len, kv_heads, args.dim, dtype=torch.bfloat16, device="cuda")
                        for _ in range(2))
            lens = torch.full((batch,), cache_len, dtype=torch.int32, device="cuda")
            cache = {}
            if args.page_size:
                span = 1 if args.in_order else args.shuffle_span
                (pk, table), (pv, _) = (paged_copy(torch, k, args.page_size, span=span),
                                        paged_copy(torch, v, args.page_size, span=span))
                if args.sorted_rows is not None:  # K and V share the table: the same keys, permuted together
                    run = args.sorted_rows or table.shape[1]
                    if table.shape[1] % run:
                        raise SystemExit(f"--sorted-rows {run} must divide the table's {table.shape[1]} columns")
                    table = table.view(batch, -1, run).sort(dim=2).values.view(batch, -1).contiguous()
                cache = {"k": pk, "v": pv, "page_table": table}
            sets.append((q, k, v, lens, torch.empty_like(q), cache))
        calls = {name: [lambda s=s, kw=kw: attention_with_kvcache(
                            s[0], s[5].get("k", s[1]), s[5].get("v", s[2]), s[3], page_table=s[5].get("page_table"),
                            causal=False, out=s[4], **kw) for s in sets] for name, kw in variants}
        outs = {}  # each timed call's output of the first set, where it is not the variants' s[4]
        if args.cudnn_paged:
            from bench.cudnn_paged import Unavailable, paged_sdpa
            try:
                runs = [paged_sdpa(torch, s[0], s[5]["k"], s[5]["v"], s[5]["page_table"], s[3]) for s in sets]
                calls["cudnn_paged"], outs["cudnn_paged"] = [run for run, _ in runs], runs[0][1]
            except Unavailable as err:
                print(f"  {'cudnn_paged':>12}: skipped ({err})")
        calls["cudnn"] = [lambda s=s: sdpa(s[0].transpose(1, 2), s[1].transpose(1, 2), s[2].transpose(1, 2),
                                           enable_gqa=True) for s in sets]
        ref = sdpa(sets[0][0].transpose(1, 2).float(), sets[0][1].transpose(1, 2).float(),
                   sets[0][2].transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            if args.profile:
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("profiled")  # ncu --nvtx --nvtx-include profiled/
                for i in range(3):
                    calls[args.profile][i % 2]()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
                print(f"profiled {args.profile} at B={batch} S_k={cache_len}")
                continue
            plans = {}  # each flashgen variant's plan as the call chose it (splits, CTAs a SM, gathered)
            for name, fns in list(calls.items()):  # warm-up (compiles), and a check of each variant's output
                known = set(decode._LAUNCHERS)
                try:
                    fns[0]()
                except InputError as err:  # a knob the shape cannot take: said, and the others still timed
                    print(f"  {name:>12}: skipped ({err})")
                    del calls[name]
                    continue
                plans.update((name, plan_note(decode._LAUNCHERS[key])) for key in set(decode._LAUNCHERS) - known)
                if name != "cudnn":
                    out = outs.get(name, sets[0][4])
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    if args.unchecked:
                        print(f"  {name:>12}: unchecked, relative error {err:.3g}")
                    elif not err < 2e-2:
                        raise SystemExit(f"{name}: relative error {err:.3g} at B={batch} S_k={cache_len}")
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, fns in calls.items():
                    torch.cuda._sleep(2_000_000)
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for i in range(args.iters):
                        fns[i % 2]()
                    stop.record()
                    torch.cuda.synchronize()
                    times[name].append(start.elapsed_time(stop) / args.iters)
        kv_bytes = batch * cache_len * kv_heads * args.dim * 2 * 2
        base = statistics.median(times["cudnn"])
        print(f"B={batch} S_k={cache_len}: cudnn {base:.4f} ms {kv_bytes / base / 1e6:.0f} GB/s")
        for name in calls:
            if name == "cudnn":
                continue
            ms = statistics.median(times[name])
            spread = (max(times[name]) - min(times[name])) / ms
            print(f"  {name:>12}: {ms:.4f} ms {kv_bytes / ms / 1e6:5.0f} GB/s  {base / ms:.3f}x cudnn  "
                  f"(spread {spread:.1%})" + (f"  [{plans[name]}]" if name in plans else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
