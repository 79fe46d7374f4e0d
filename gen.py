#!/usr/bin/env python3
"""flashgen command line.

  gen.py --shape S,H,D [--dtype f16|bf16] [--causal] [--split 96,32] [--arch sm_90a] [--run] [--export DIR]
      emit generated/<name>.cu and <name>.json, compile with NVRTC, print registers, spills, shared memory
      and compile time; --run also runs it on the GPU against a float64 reference; --export DIR writes a
      bundle with a C launcher for builds without Python.
  gen.py layout ...   derived shared-memory layouts, descriptors and tensor maps (gen.py layout -h)
  gen.py verify       check every layout derivation the generator uses
  gen.py probe        check the layout models against the GPU's real TMA loads and wgmma reads
  gen.py bench ...    time flashgen beside cuDNN and the other peers (gen.py bench -h)
  gen.py canonical    regenerate the kernels checked into generated/
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from layouts.dtypes import DTYPE_NAMES

ROOT = pathlib.Path(__file__).resolve().parent
GENERATED = ROOT / "generated"
# The kernels checked into generated/ (tests/test_codegen.py proves they are current): the seed shape with
# the plan's default tile (what the quick start's `gen.py --shape 1024,64,128` emits), and with the two PV
# splits of a 128-key block.
CANONICAL = [dict(seq_len=1024, heads=64, head_dim=128, dtype="f16", causal=False, pv_split=split)
             for split in ((), (96, 32), (64, 64))]


def main(argv: list[str]) -> int:
    if argv and argv[0] == "layout":
        from layouts.cli import layout_main
        return layout_main(argv[1:])
    if argv and argv[0] == "verify":
        from layouts.cli import verify_main
        return verify_main(argv[1:])
    if argv and argv[0] == "probe":
        return probe_main(argv[1:])
    if argv and argv[0] == "bench":
        from bench.cli import bench_main
        return bench_main(argv[1:])
    if argv and argv[0] == "canonical":
        return canonical_main(argv[1:])
    return generate_main(argv)


def _spec_arguments(parser: argparse.ArgumentParser, default_shape: str | None = None) -> None:
    parser.add_argument("--shape", required=default_shape is None, default=default_shape, metavar="S,H,D",
                        help="sequence length, heads, head dim")
    parser.add_argument("--dtype", default="f16", choices=DTYPE_NAMES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--split", default="", metavar="96,32", help="PV chunks in keys (default: per shape)")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--block-n", type=int, default=0,
                        help="keys per K/V tile, a multiple of 16 in 64..256 that fits the registers (default: per shape)")
    parser.add_argument("--stages", type=int, default=0, help="depth of the K/V ring (default: as deep as fits)")
    parser.add_argument("--kv-heads", type=int, default=0, metavar="N",
                        help="K/V heads for grouped-query attention (default: the query heads)")
    parser.add_argument("--seq-k", type=int, default=0, metavar="N", help="key/value length (default: S)")
    parser.add_argument("--window", default="", metavar="LEFT,RIGHT",
                        help="local attention: keys in [i-LEFT, i+RIGHT] of query i's diagonal; -1 is unbounded")
    parser.add_argument("--softcap", type=float, default=0.0, metavar="X", help="cap scores at X*tanh(s/X)")
    parser.add_argument("--varlen", action="store_true",
                        help="variable-length batches: packed sequences cut by cu_seqlens at run time, S (and "
                             "--seq-k) being the longest the kernel accepts")


def _spec_from(args):
    from codegen.families import resolve
    from codegen.spec import KernelSpec, SpecError, parse_split

    try:
        s, h, d = (int(x) for x in args.shape.split(","))
    except ValueError:
        raise SpecError(f"--shape expects S,H,D as three integers, got {args.shape!r}") from None
    try:
        window = tuple(int(x) for x in args.window.split(",")) if args.window else (-1, -1)
    except ValueError:
        raise SpecError(f"--window expects LEFT,RIGHT as integers (-1 for unbounded), got {args.window!r}") from None
    return resolve(KernelSpec(seq_len=s, heads=h, head_dim=d, dtype=args.dtype, causal=args.causal, arch=args.arch,
                              block_n=args.block_n, pv_split=parse_split(args.split), stages=args.stages,
                              kv_heads=args.kv_heads, seq_len_k=args.seq_k, window=window, softcap=args.softcap,
                              varlen=args.varlen))


def emit(spec, out_dir: pathlib.Path, *, use_cache: bool = True):
    """Render, compile and write <name>.cu and <name>.json; returns the BuiltKernel."""
    from codegen.build import build

    built = build(spec, use_cache=use_cache)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{spec.name}.cu").write_text(built.rendered.source)
    (out_dir / f"{spec.name}.json").write_text(json.dumps(built.manifest(), indent=2) + "\n")
    return built


def generate_main(argv: list[str]) -> int:
    from codegen.families.fwd_sm90.plan import CONSUMER_REGS, PRODUCER_REGS
    from codegen.spec import SpecError
    from layouts import LayoutError

    parser = argparse.ArgumentParser(prog="gen.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _spec_arguments(parser)
    parser.add_argument("--out", type=pathlib.Path, default=GENERATED, help="output folder (default generated/)")
    parser.add_argument("--no-cache", action="store_true", help="compile even if the cubin is cached")
    parser.add_argument("--run", action="store_true", help="run on the GPU against a float64 reference")
    parser.add_argument("--batch", type=int, default=1, help="batch size for --run")
    parser.add_argument("--export", type=pathlib.Path, metavar="DIR",
                        help="also write a self-contained bundle (kernel, C launcher, example, CMakeLists.txt, "
                             "PTX, cubin) for builds without Python")
    args = parser.parse_args(argv)
    try:
        spec = _spec_from(args)
        print(f"generating {spec.name}", flush=True)
        t0 = time.perf_counter()
        built = emit(spec, args.out, use_cache=not args.no_cache)
        total = time.perf_counter() - t0
    except (SpecError, LayoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c, name = built.compiled, built.rendered.kernel_name
    print(f"  source     {args.out / (spec.name + '.cu')}")
    print(f"  manifest   {args.out / (spec.name + '.json')}")
    print(f"  registers  {c.registers.get(name)} per thread at entry (setmaxnreg moves consumers to {CONSUMER_REGS}, "
          f"the producer to {PRODUCER_REGS})")
    print(f"  spills     {c.spill_stores.get(name, 0)} bytes stored, {c.spill_loads.get(name, 0)} bytes loaded")
    print(f"  smem       {built.plan.smem.total} bytes dynamic")
    print(f"  compile    {c.compile_seconds:.2f} s NVRTC{' (cache hit)' if c.cached else ''}, "
          f"{total:.2f} s total")
    if args.export:
        from codegen.export import export_bundle, nvcc_command

        try:
            bundle = export_bundle(spec, args.export)
        except SpecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"  bundle     {args.export}/ ({len(bundle.files)} files); build the example with:")
        print("             " + " ".join(nvcc_command(bundle)))
    if args.run:
        return run_main(spec, args.batch)
    return 0


def run_main(spec, batch: int) -> int:
    import torch

    from codegen import check
    from codegen.api import prepare

    if not torch.cuda.is_available():
        print("error: --run needs a CUDA GPU", file=sys.stderr)
        return 2
    if spec.varlen:
        print("error: --run times fixed-length batches; run a varlen batch with `gen.py bench --varlen ...` or "
              "codegen.attention(..., cu_seqlens_q=..., cu_seqlens_k=...)", file=sys.stderr)
        return 2
    dtype = check.torch_dtype(spec.dtype)
    q = torch.randn(batch, spec.seq_len, spec.heads, spec.head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, spec.keys, spec.kv_heads, spec.head_dim, device="cuda", dtype=dtype) for _ in range(2))
    options = dict(causal=spec.causal, window=spec.window, softcap=spec.softcap)
    call = prepare(q, k, v, pv_split=spec.pv_split, block_n=spec.block_n, stages=spec.stages,
                   pingpong=spec.pingpong, **options)
    call()
    ref_o, ref_lse = check.reference(q, k, v, **options)
    err = check.rel_err(call.o, ref_o)
    lse_err = check.rel_err(call.lse, ref_lse)
    yardstick = check.same_dtype_error(q, k, v, ref_o, **options)
    ms = check.time_gpu(torch, call, warmup=10, iters=100)
    # Useful FLOPs: the dense count, halved for causal (the other masks are not discounted).
    tflops = 4.0 * batch * spec.heads * spec.seq_len * spec.keys * spec.head_dim / (2 if spec.causal else 1) / ms / 1e9
    ok = err <= max(2 * yardstick, 1e-6) and (lse_err < 1e-3 or not torch.isfinite(ref_lse).all())
    print(f"  run        B={batch}: {ms:.4f} ms, {tflops:.1f} TFLOPS, rel err {err:.2e} "
          f"(same-dtype PyTorch {yardstick:.2e}), lse rel err {lse_err:.2e}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def probe_main(argv: list[str]) -> int:
    from codegen.probe import run_probe

    parser = argparse.ArgumentParser(prog="gen.py probe", description="basis-vector probe on the GPU")
    _spec_arguments(parser, default_shape="1024,64,128")
    args = parser.parse_args(argv)
    report = run_probe(_spec_from(args))
    for operand, n in report.checked.items():
        print(f"  {operand}: {n} basis vectors injected")
    print(report.summary())
    return 0 if report.ok else 1


def canonical_main(argv: list[str]) -> int:
    """Regenerate the kernels checked into generated/."""
    from codegen.families import resolve
    from codegen.spec import KernelSpec

    for fields in CANONICAL:
        spec = resolve(KernelSpec(**fields))
        emit(spec, GENERATED)
        print(f"wrote generated/{spec.name}.cu")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
