#!/usr/bin/env python3
"""Launch one flashgen kernel a few times, for a profiler to attach to (ncu, compute-sanitizer).

    ncu --clock-control none --section SpeedOfLight -k regex:flashgen \\
        python3 scripts/profile_one.py --shape 2,4096,16,256 [--dtype bf16] [--causal] [--knob block_n=80]

Inputs are random; the result is checked against nothing (gpu tests do that). Knobs are prepare()'s tuning
keywords, as in scripts/ab.py. `--fa4` launches FlashAttention-4's forward (flash_attn.cute, bench.peers) on the
same inputs instead, for side-by-side profiles (`-k regex:'[Ff]lash|cutlass'` takes both kernels in ncu). It puts
the checkout's root on sys.path itself (--shape is read by the benchmark's parse_shape, and bench/ is not
installed), so it runs from any folder without PYTHONPATH=.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen.api import InputError, parse_knob, prepare
from bench.cases import parse_shape
from codegen.check import torch_dtype
from layouts.dtypes import DTYPE_NAMES


def shape_arguments(parser: argparse.ArgumentParser) -> None:
    """--shape, --dtype, --causal and --knob, as this script and scripts/trace.py take them."""
    parser.add_argument("--shape", required=True, metavar="B,S,H,D")
    parser.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--knob", action="append", default=[], metavar="KNOB=VALUE",
                        help="a tuning knob of prepare(), e.g. block_n=128, lazy_rescale=1, pv_split=96+32")


def random_inputs(args: argparse.Namespace):
    """(q, k, v) on the GPU for args.shape and args.dtype, and the knobs as prepare() keywords."""
    import torch

    batch, seq, heads, dim, kv_heads = parse_shape(args.shape)
    dtype = torch_dtype(args.dtype)
    q = torch.randn(batch, seq, heads, dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, seq, kv_heads or heads, dim, device="cuda", dtype=dtype) for _ in range(2))
    return (q, k, v), knobs_of(args)


def knobs_of(args: argparse.Namespace) -> dict:
    """--knob's values as prepare() keywords (SystemExit with the reason for a bad one)."""
    try:
        return dict(parse_knob(text) for text in args.knob)
    except InputError as e:
        raise SystemExit(f"--knob: {e}") from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(parser)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--fa4", action="store_true", help="launch FlashAttention-4's forward instead (no knobs)")
    args = parser.parse_args(argv)
    if args.fa4 and args.knob:
        parser.error("--knob tunes flashgen's kernel; FlashAttention-4 takes none")

    import torch

    (q, k, v), knobs = random_inputs(args)
    if args.fa4:
        from bench.peers import fa4_function

        attention = fa4_function()  # Unavailable, with the import's error, where FA4 is not installed
        call, name = (lambda: attention(q, k, v, causal=args.causal)), "FlashAttention-4's forward"
    else:
        call = prepare(q, k, v, causal=args.causal, **knobs)
        name = call.built.rendered.kernel_name
    for _ in range(args.launches):
        call()
    torch.cuda.synchronize()
    print(f"{args.launches} launches of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
