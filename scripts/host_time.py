#!/usr/bin/env python3
"""Host time per call: the wall time of N back-to-back calls on a tiny problem, divided by N (issue 18's method).

    python3 scripts/host_time.py [--calls 2000] [--shape 1,128,8,128] [--dtype bf16]

On a tiny shape the GPU finishes each kernel long before the host issues the next, so the time per call is the
host's: flashgen's attention() (fixed lengths, and the same batch packed as a varlen one, its offsets unread and
read) and a prepare()d call beside SDPA (its own backend choice, and inside
sdpa_kernel(CUDNN_ATTENTION) and (FLASH_ATTENTION)), and torch.empty_like(q) as the floor.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch

import codegen
from codegen.api import prepare
from codegen.check import torch_dtype
from layouts.dtypes import DTYPE_NAMES


def per_call_us(fn, calls: int, rounds: int = 5) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def breakdown(q, k, v) -> dict:
    """The steps of a cached attention() call, each alone."""
    from codegen import api

    codegen.attention(q, k, v)
    (launch,) = [entry for key, entry in api._LAUNCHERS.items() if key[0] == q.shape]
    o = torch.empty_like(q)
    lse = torch.empty(launch.lse_shape, dtype=torch.float32, device=q.device)
    stream = api._current_stream(q.device)
    addresses = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
    return {
        "  part: torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "  part: the cache key": lambda: (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
                                          k.dtype, v.dtype, q.device, k.device, v.device),
        "  part: torch.empty lse": lambda: torch.empty(launch.lse_shape, dtype=torch.float32, device=q.device),
        "  part: current stream": lambda: api._current_stream(q.device),
        "  part: is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "  part: launcher call (maps, args, launch)": lambda: launch(stream, *addresses, lse.data_ptr()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--shape", default="1,128,8,128", metavar="B,S,H,D")
    parser.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the parts of an attention() call on their own (where its host time goes)")
    args = parser.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch_dtype(args.dtype)) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    backend = torch.nn.attention.SDPBackend
    prepared = prepare(q, k, v)

    def in_backend(which):
        def call():
            with torch.nn.attention.sdpa_kernel(which):
                sdpa(qt, kt, vt)
        return call

    # The same batch packed as a variable-length one: with both max lengths its offsets stay on the device.
    packed = [t.reshape(b * s, h, d) for t in (q, k, v)]
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device="cuda")
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)
    rows = {
        "flashgen attention()": lambda: codegen.attention(q, k, v),
        "flashgen varlen attention(), max lengths": lambda: codegen.attention(*packed, **varlen),
        "flashgen varlen attention(), check=True": lambda: codegen.attention(*packed, **varlen, check=True),
        "flashgen prepare()d call": prepared,
        "SDPA (own backend choice)": lambda: sdpa(qt, kt, vt),
        "SDPA in sdpa_kernel(CUDNN_ATTENTION)": in_backend(backend.CUDNN_ATTENTION),
        "SDPA in sdpa_kernel(FLASH_ATTENTION)": in_backend(backend.FLASH_ATTENTION),
        "torch.empty_like(q) (floor)": lambda: torch.empty_like(q),
    }
    if args.breakdown:
        from codegen import launcher

        rows.update(breakdown(q, k, v))
        launcher._load_driver_lib()
        print(f"launches through libcuda by ctypes: {launcher._lib_launch is not None}")
    results = {name: per_call_us(fn, args.calls) for name, fn in rows.items()}
    if args.json:
        print(json.dumps({"shape": args.shape, "dtype": args.dtype, "calls": args.calls, "us_per_call": results}))
    else:
        print(f"host time per call, {args.calls} back-to-back calls, best of 5 rounds, shape {args.shape} {args.dtype}")
        for name, us in results.items():
            print(f"  {name:40s} {us:8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
