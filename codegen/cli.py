"""flashgen command line: the installed `flashgen` script, and `python gen.py` in a checkout (the same CLI).

  flashgen --shape S,H,D [--dtype f16|bf16] [--causal] [--split 96,32] [--window -1,0] [--sinks] [--out DIR] [--run]
           [--export DIR [--force]]
      emit <name>.cu and <name>.json (into --out, default $FLASHGEN_CACHE_DIR/kernels, i.e.
      ~/.cache/flashgen/kernels), compile with NVRTC, print registers, spills, shared memory and compile time;
      --run also runs it on the GPU against a float64 reference (needs torch with CUDA); --export DIR writes a
      bundle with a C launcher for builds without Python.
  flashgen --shape S,H,D --backward [--causal] [--kv-heads N] [--seq-k N] [--window L,R] [--softcap X]
      [--deterministic] [--varlen]   the backward kernels (pre, main, post) of that forward, emitted and compiled
  flashgen --shape S_MAX,H,D --kv-heads N --decode S_Q [--page-size P [--gather/--no-gather]] [--ctas-per-sm N]
      [--head-pack N] [--run [--batch B]] [--export DIR]
      the decode kernel of attention_with_kvcache; --run checks it on the GPU over B random ragged caches of
      S_MAX rows (paged, a shuffled page table, with --page-size) against float64, and times it (K+V GB/s).
  flashgen layout ...   derived shared-memory layouts, descriptors and tensor maps (flashgen layout -h)
  flashgen verify       check every layout derivation the generator uses
  flashgen probe        GPU: check the layout models against the GPU's real TMA loads and wgmma reads
                        (--arch sm_100a/sm_103a: the Blackwell probe, on a B200/B300)
  flashgen simulate     CPU: one Blackwell tile's dataflow from the derived layouts, against float64; ends in
                        PASS or FAIL (--inject-seed-bug must FAIL)
  flashgen bench ...    GPU: time flashgen beside cuDNN and the other peers (from a checkout: gen.py bench -h)
  flashgen canonical    regenerate the kernels checked into generated/ (of a checkout)

Errors are one line on stderr and a non-zero exit (2: bad arguments or a spec flashgen cannot emit), and
nothing is written unless every output file could be.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import pathlib
import re
import shlex
import sys
import time

from layouts.dtypes import DTYPE_NAMES

from .cuda_env import PIP_HINT_TORCH as TORCH_HINT
from .families.decode_sm90.plan import GATHER_MAX_PAGE_ROWS, HEAD_PACKS

# The kernels checked into generated/ (tests/test_codegen.py proves they are current): the seed shape with
# the plan's default tile (what `flashgen --shape 1024,64,128` emits), and with the two PV splits of a 128-key
# block.
CANONICAL = [dict(seq_len=1024, heads=64, head_dim=128, dtype="f16", causal=False, pv_split=split)
             for split in ((), (96, 32), (64, 64))]


# Options whose value may begin with "-" (argparse would take "-1,0" for an option otherwise).
_SIGNED_VALUE_OPTIONS = ("--window",)
_SIGNED_VALUE = re.compile(r"-\d+(,\s*-?\d+)*")


class CliError(Exception):
    """A command-line error, printed as one line."""


class _QuietParser(argparse.ArgumentParser):
    """A parser that raises CliError instead of printing usage and exiting (for parsing our own commands)."""

    def error(self, message):
        raise CliError(message)


_FIND = object()


def main(argv: list[str] | None = None, *, checkout=_FIND) -> int:
    """Run the command line on `argv` (default sys.argv[1:]) and return the exit code.

    `checkout` is the repository root for `bench` and `canonical` (gen.py passes its own folder); by default
    the checkout this codegen package lives in, if it lives in one, else None."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if checkout is _FIND:
        checkout = find_checkout()
    try:
        if argv and not argv[0].startswith("-"):
            command = COMMANDS.get(argv[0])
            if command is None:
                return _unknown_command(argv[0])
            return command(argv[1:], checkout)
        return generate_main(argv)
    except SystemExit as e:  # argparse: --help (0) and usage errors (2, already printed)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def find_checkout() -> pathlib.Path | None:
    """The flashgen checkout this package runs from (editable install or source tree), or None (installed)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    if (root / "gen.py").is_file() and (root / "bench" / "__init__.py").is_file() and (root / "generated").is_dir():
        return root
    return None


def _error(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _unknown_command(name: str) -> int:
    close = difflib.get_close_matches(name, list(COMMANDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return _error(f"unknown command {name!r}{hint}; the commands are {', '.join(COMMANDS)}, "
                  "or options such as --shape S,H,D to generate a kernel (flashgen --help)")


def join_signed_values(argv: list[str]) -> list[str]:
    """['--window', '-1,0'] -> ['--window=-1,0'], so negative values parse without the '=' form."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _SIGNED_VALUE_OPTIONS and i + 1 < len(argv) and _SIGNED_VALUE.fullmatch(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


# ----------------------------------------------------------------------------------------------------------------
# Kernel generation


def _spec_arguments(parser: argparse.ArgumentParser, default_shape: str | None = None) -> None:
    from .families import FORWARD_BY_ARCH
    from .spec import SUPPORTED_ARCHS

    probe_only = [a for a in SUPPORTED_ARCHS if a not in FORWARD_BY_ARCH]

    parser.add_argument("--shape", required=default_shape is None, default=default_shape, metavar="S,H,D",
                        help="sequence length, heads, head dim" + (f" (default {default_shape})" if default_shape else ""))
    parser.add_argument("--dtype", default="f16", choices=DTYPE_NAMES)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--split", default="", metavar="96,32", help="PV chunks in keys (default: per shape)")
    parser.add_argument("--arch", default="sm_90a", choices=SUPPORTED_ARCHS,
                        help="GPU architecture to compile for (the 'a' targets: wgmma, tcgen05, setmaxnreg); "
                             f"forward kernels for {', '.join(FORWARD_BY_ARCH)} (default sm_90a: H100, H200)"
                             + (f"; {', '.join(probe_only)}: the layouts and the probe only, no forward kernel yet"
                                if probe_only else ""))
    parser.add_argument("--block-n", type=int, default=0,
                        help="keys per K/V tile, a multiple of 16 in 64..256 that fits the registers (default: per shape)")
    parser.add_argument("--stages", type=int, default=0, help="depth of the K/V ring (default: as deep as fits)")
    parser.add_argument("--kv-heads", type=int, default=None, metavar="N",
                        help="K/V heads for grouped-query attention (default: the query heads)")
    parser.add_argument("--seq-k", type=int, default=None, metavar="N", help="key/value length (default: S)")
    window_arguments(parser)
    parser.add_argument("--decode", type=int, default=None, metavar="S_Q",
                        help="the decode kernel instead (attention_with_kvcache): S_Q new tokens per sequence over "
                             "a KV cache; S in --shape is then the cache's capacity, a run-time value")
    parser.add_argument("--page-size", type=int, default=0, metavar="P",
                        help="with --decode: a paged cache of P-row pages (1..256, a power of two; default: dense)")
    parser.add_argument("--gather", action=argparse.BooleanOptionalAction, default=None,
                        help="with --page-size: load the pages' rows by the producer warpgroup's cp.async (16 bytes a "
                             "thread), or (--no-gather) by a TMA copy per page (default: gathered for pages of up to "
                             f"{GATHER_MAX_PAGE_ROWS} rows)")
    parser.add_argument("--ctas-per-sm", type=int, default=1, choices=(1, 2),
                        help="with --decode: 1 (default) runs two consumer warpgroups per CTA; 2 one per CTA, two CTAs "
                             "per SM (tiles of at most 64 packed rows, D <= 128; what attention_with_kvcache picks "
                             "where the tiles fill the SMs)")
    parser.add_argument("--head-pack", type=int, default=1, choices=HEAD_PACKS,
                        help="with --decode: K/V heads per tile, their rows loaded by one TMA box (tiles of at most 16 "
                             "packed rows; pages by TMA, not gathered); what attention_with_kvcache picks: 2 at D=64 "
                             "where the tiles fill the SMs")
    parser.add_argument("--backward", action="store_true",
                        help="the backward kernels instead (dQ, dK, dV of this forward: codegen.attention(...)"
                             ".backward()); D 64, 96, 128, 192 or 256 on sm_90a")
    parser.add_argument("--deterministic", action="store_true",
                        help="with --backward: dQ's key blocks add in a fixed order (bit-identical gradients)")
    parser.add_argument("--varlen", action="store_true",
                        help="variable-length batches: packed sequences cut by cu_seqlens at run time, S (and "
                             "--seq-k) being the longest the kernel accepts")
    parser.add_argument("--sinks", action="store_true",
                        help="learned attention sinks (gpt-oss): the kernel takes a float32 logit per query head "
                             "that joins each row's softmax denominator and logsumexp")
    parser.add_argument("--multicast", action=argparse.BooleanOptionalAction, default=None,
                        help="query tiles 2c and 2c+1 as a two-CTA cluster that loads each key block both visit "
                             "once (sm_90a forward; fixed lengths, no left window; persistent where the tiles are "
                             "alike); --no-multicast: never (default: per shape)")


def window_arguments(parser: argparse.ArgumentParser) -> None:
    """--window and --softcap (the generator's and `simulate`'s; parse_window reads --window)."""
    parser.add_argument("--window", default="", metavar="LEFT,RIGHT",
                        help="local attention: keys in [i-LEFT, i+RIGHT] of query i's diagonal, -1 for unbounded: "
                             "--window 256,0 sees the 256 keys before each query, --window -1,0 masks as --causal")
    parser.add_argument("--softcap", type=float, default=0.0, metavar="X", help="cap scores at X*tanh(s/X)")


def parse_window(text: str) -> tuple[int, int]:
    """--window's LEFT,RIGHT; '' is unbounded, (-1, -1)."""
    from .spec import SpecError

    try:
        window = tuple(int(x) for x in text.split(",")) if text else (-1, -1)
    except ValueError:
        raise SpecError(f"--window expects LEFT,RIGHT as integers (-1 for unbounded), got {text!r}") from None
    if len(window) != 2:
        raise SpecError(f"--window expects LEFT,RIGHT, two integers (-1 for unbounded), got {text!r}")
    return window


def _spec_from(args):
    from .families import resolve
    from .spec import KernelSpec, SpecError, parse_split

    try:
        s, h, d = (int(x) for x in args.shape.split(","))
    except ValueError:
        raise SpecError(f"--shape expects S,H,D as three integers, got {args.shape!r}") from None
    window = parse_window(args.window)
    # Options whose absence means "the default": an explicit value out of range is an error, never the default.
    for flag, value in (("--kv-heads", getattr(args, "kv_heads", None)), ("--seq-k", getattr(args, "seq_k", None))):
        if value is not None and value < 1:
            raise SpecError(f"{flag} must be at least 1, got {value} (leave it out for the default)")
    if getattr(args, "decode", None) is not None:
        if getattr(args, "backward", False):
            raise SpecError("--decode and --backward are different kernels: give one of them")
        return _decode_spec_from(args, s, h, d, window)
    if getattr(args, "backward", False):
        return _backward_spec_from(args, s, h, d, window)
    if getattr(args, "deterministic", False):
        raise SpecError("--deterministic is for the backward kernels: add --backward")
    if (getattr(args, "page_size", 0) or getattr(args, "gather", False) or getattr(args, "ctas_per_sm", 1) != 1
            or getattr(args, "head_pack", 1) != 1):
        raise SpecError("--page-size, --gather, --ctas-per-sm and --head-pack are for the decode kernel: add "
                        "--decode S_Q")
    return resolve(KernelSpec(seq_len=s, heads=h, head_dim=d, dtype=args.dtype, causal=args.causal, arch=args.arch,
                              block_n=args.block_n, pv_split=parse_split(args.split), stages=args.stages,
                              kv_heads=args.kv_heads or 0, seq_len_k=args.seq_k or 0, window=window,
                              softcap=args.softcap,
                              varlen=args.varlen, sinks=args.sinks, multicast=args.multicast))


def _backward_spec_from(args, seq: int, heads: int, dim: int, window: tuple[int, int]):
    from .families.bwd_sm90 import BackwardSpec, resolve
    from .spec import SpecError

    for flag, given in (("--split", args.split), ("--block-n", args.block_n),
                        ("--sinks", args.sinks), ("--page-size", args.page_size), ("--gather", args.gather),
                        ("--ctas-per-sm", args.ctas_per_sm != 1), ("--head-pack", args.head_pack != 1),
                        ("--multicast", args.multicast is not None)):
        if given:
            raise SpecError(f"{flag} does not apply to the backward kernels (--backward)"
                            + ("; sinks need nothing of them (the forward's logsumexp carries them)"
                               if flag == "--sinks" else ""))
    return resolve(BackwardSpec(seq_len=seq, seq_len_k=args.seq_k or seq, heads=heads, kv_heads=args.kv_heads or heads,
                                head_dim=dim, dtype=args.dtype, causal=args.causal, window=window,
                                softcap=args.softcap, stages=args.stages or 2, deterministic=args.deterministic,
                                varlen=args.varlen, arch=args.arch))


def _decode_spec_from(args, capacity: int, heads: int, dim: int, window: tuple[int, int]):
    from .families.decode_sm90 import DecodeSpec, resolve
    from .families.decode_sm90.plan import gather_by_default
    from .spec import SpecError

    if args.decode < 1:
        raise SpecError(f"--decode expects the number of new tokens per sequence (>= 1), got {args.decode}")
    if capacity < 1:
        raise SpecError(f"--shape S_MAX,H,D: a cache of at least one row, got S_MAX {capacity}")
    for flag, given in (("--split", args.split), ("--seq-k", args.seq_k), ("--varlen", args.varlen),
                        ("--multicast", args.multicast is not None), ("--deterministic", args.deterministic)):
        if given:
            raise SpecError(f"{flag} does not apply to the decode kernel (--decode)")
    if args.sinks:
        raise SpecError("--sinks does not apply to the decode kernel (--decode): it always takes sinks, as a "
                        "run-time pointer (null: none)")
    return resolve(DecodeSpec(heads=heads, kv_heads=args.kv_heads or heads, head_dim=dim, q_len=args.decode,
                              dtype=args.dtype, causal=args.causal, window=window, softcap=args.softcap,
                              block_n=args.block_n, stages=args.stages, arch=args.arch, page_size=args.page_size,
                              gather=gather_by_default(args.page_size, args.gather, args.head_pack),
                              ctas_per_sm=args.ctas_per_sm,
                              head_pack=args.head_pack))


def _generate_parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser = cls(prog="flashgen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _spec_arguments(parser)
    parser.add_argument("--out", type=pathlib.Path, metavar="DIR",
                        help="folder for <name>.cu and <name>.json (default: $FLASHGEN_CACHE_DIR/kernels, "
                             "~/.cache/flashgen/kernels)")
    parser.add_argument("--no-cache", action="store_true", help="compile even if the cubin is cached")
    parser.add_argument("--run", action="store_true",
                        help="run on the GPU against a float64 reference (needs torch with CUDA)")
    parser.add_argument("--batch", type=int, default=1,
                        help="batch size for --run (with --decode: sequences of ragged lengths over S-row caches)")
    parser.add_argument("--export", metavar="DIR",
                        help="also write a self-contained bundle (kernel, C launcher, example, CMakeLists.txt, "
                             "PTX, cubin) for builds without Python, into a new or empty folder (or one holding "
                             "a bundle of the same kernel)")
    parser.add_argument("--force", action="store_true", help="let --export write into a folder that is not empty")
    return parser


def default_out_dir() -> pathlib.Path:
    from .cache import default_cache_dir

    return default_cache_dir() / "kernels"


def kernel_files(built) -> dict[str, str]:
    """<name>.cu and <name>.json of a built kernel."""
    name = built.spec.name
    return {f"{name}.cu": built.rendered.source, f"{name}.json": json.dumps(built.manifest(), indent=2) + "\n"}


def emit(spec, out_dir: pathlib.Path, *, use_cache: bool = True):
    """Render, compile and write <name>.cu and <name>.json (both or neither); returns the BuiltKernel."""
    from .build import build
    from .files import write_all

    built = build(spec, use_cache=use_cache)
    write_all({pathlib.Path(out_dir) / n: text for n, text in kernel_files(built).items()})
    return built


def _require_torch_gpu(what: str):
    try:
        import torch
    except ImportError:
        raise CliError(f"{what} needs torch: {TORCH_HINT}") from None
    if not torch.cuda.is_available():
        raise CliError(f"{what} needs a CUDA GPU (torch {torch.__version__} sees none)")
    return torch


def _known_errors() -> tuple[type[BaseException], ...]:
    from layouts import LayoutError

    from .cuda_env import ToolchainMissingError
    from .files import OutputError
    from .nvrtc import CompileError
    from .spec import SpecError

    return (SpecError, LayoutError, OutputError, CliError, CompileError, ToolchainMissingError)


def generate_main(argv: list[str]) -> int:
    args = _generate_parser().parse_args(join_signed_values(argv))
    from .families.fwd_sm90.plan import CONSUMER_REGS, PRODUCER_REGS

    try:
        from .build import build
        from .export import bundle_files, check_destination, nvcc_command
        from .files import check_writable, write_all

        spec = _spec_from(args)
        if args.export is not None and not args.export.strip():
            raise CliError("--export needs a folder name, got an empty one (write --export . for this folder)")
        if str(args.out) == "":
            raise CliError("--out needs a folder name, got an empty one")
        export = pathlib.Path(args.export) if args.export is not None else None
        out = args.out if args.out is not None else default_out_dir()
        check_writable(out, "--out")
        if export is not None:
            check_destination(export, spec.name, force=args.force)
        decode = args.decode is not None
        if args.run and args.batch < 1:
            raise CliError(f"--batch must be at least 1, got {args.batch}")
        if args.backward and (args.run or export is not None):
            raise CliError(("--run" if args.run else "--export") + " is not written for the backward kernels yet: "
                           "run them through codegen.attention(...).backward() or `gen.py bench --matrix backward`")
        if args.run:
            if decode:
                capacity = _decode_run_capacity(args)
            elif spec.varlen:
                raise CliError("--run times fixed-length batches; run a varlen batch with `gen.py bench --varlen "
                               "...` or codegen.attention(..., cu_seqlens_q=..., cu_seqlens_k=...)")
            _require_torch_gpu("--run")
        print(f"generating {spec.name}", flush=True)
        t0 = time.perf_counter()
        built = build(spec, use_cache=not args.no_cache)  # the spec's own family (forward, decode or backward)
        files = {out / n: text for n, text in kernel_files(built).items()}
        bundle = {}
        if export is not None:
            bundle = {export / n: content for n, content in bundle_files(built).items()}
        write_all({**files, **bundle})
        total = time.perf_counter() - t0
    except _known_errors() as e:
        return _error(_one_line(e))
    c, name = built.compiled, built.rendered.kernel_name
    print(f"  source     {out / (spec.name + '.cu')}")
    print(f"  manifest   {out / (spec.name + '.json')}")
    regs = ((CONSUMER_REGS, PRODUCER_REGS) if built.family.name == "fwd_sm90" else
            (built.plan.consumer_regs, built.plan.producer_regs) if getattr(built.plan, "moves_registers", False)
            else None)
    moves = f" (setmaxnreg moves consumers to {regs[0]}, the producer to {regs[1]})" if regs else ""
    print(f"  registers  {c.registers.get(name)} per thread at entry{moves}")
    print(f"  spills     {c.spill_stores.get(name, 0)} bytes stored, {c.spill_loads.get(name, 0)} bytes loaded")
    print(f"  smem       {built.plan.smem.total} bytes dynamic")
    print(f"  compile    {c.compile_seconds:.2f} s NVRTC{' (cache hit)' if c.cached else ''}, "
          f"{total:.2f} s total")
    if export is not None:
        from .export import Bundle

        written = Bundle(export, tuple(bundle), built)
        print(f"  bundle     {export}/ ({len(bundle)} files); build the example with:")
        print("             " + shlex.join(nvcc_command(written)))
    if args.run:
        return run_decode_main(spec, args.batch, capacity) if decode else run_main(spec, args.batch)
    return 0


def _decode_run_capacity(args) -> int:
    """S_MAX of --shape, the caches' rows for `--decode ... --run` (a run-time value of the kernel)."""
    return int(args.shape.split(",")[0])  # at least one row: _decode_spec_from checked


def _one_line(e: BaseException) -> str:
    """The message of a known error; a compiler error keeps its log (the lines after the first)."""
    from .nvrtc import CompileError

    text = str(e).strip() or type(e).__name__
    return text if isinstance(e, CompileError) else " ".join(text.split("\n"))


def run_main(spec, batch: int) -> int:
    from . import check
    from .api import prepare
    from .driver import DriverError

    try:
        torch = _require_torch_gpu("--run")
    except CliError as e:
        return _error(str(e))
    dtype = check.torch_dtype(spec.dtype)
    q = torch.randn(batch, spec.seq_len, spec.heads, spec.head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, spec.keys, spec.kv_heads, spec.head_dim, device="cuda", dtype=dtype) for _ in range(2))
    options = dict(causal=spec.causal, window=spec.window, softcap=spec.softcap)
    if spec.sinks:  # logits near a row's own logsumexp (about ln S_k here), so each sink takes a real share
        options["sinks"] = torch.randn(spec.heads, device="cuda", dtype=torch.float32) + math.log(spec.keys)
    try:
        call = prepare(q, k, v, pv_split=spec.pv_split, block_n=spec.block_n, stages=spec.stages,
                       pingpong=spec.pingpong, multicast=spec.multicast, **options)
        call.o.fill_(float("nan"))  # poisoned: an element the kernel never writes fails the check
        call.lse.fill_(float("nan"))
        call()
    except DriverError as e:
        return _error(str(e), 1)
    ref_o, ref_lse = check.reference(q, k, v, **options)
    same_dtype = check.same_dtype_output(q, k, v, **options)
    failure = check.accuracy_failure(call.o, ref_o, same_dtype)
    err, yardstick = check.rel_err(call.o, ref_o), check.rel_err(same_dtype, ref_o)
    lse_err = check.lse_rel_err(call.lse, ref_lse)
    ms = check.time_gpu(torch, call, warmup=10, iters=100)
    # Useful FLOPs: the dense count, halved for causal (the other masks are not discounted).
    tflops = 4.0 * batch * spec.heads * spec.seq_len * spec.keys * spec.head_dim / (2 if spec.causal else 1) / ms / 1e9
    ok = failure is None and (lse_err < 1e-3 or not torch.isfinite(ref_lse).all())
    print(f"  run        B={batch}: {ms:.4f} ms, {tflops:.1f} TFLOPS, rel err {err:.2e} "
          f"(same-dtype PyTorch {yardstick:.2e}), lse rel err {lse_err:.2e}: {'PASS' if ok else 'FAIL'}")
    if failure:
        print(f"  {failure}")
    return 0 if ok else 1


def run_decode_main(spec, batch: int, capacity: int) -> int:
    """`--decode S_Q --run`: the decode kernel through attention_with_kvcache on random ragged caches (paged with
    --page-size), against float64 (codegen/decode_run.py)."""
    from .api import InputError
    from .decode_run import run_decode
    from .driver import DriverError

    try:
        torch = _require_torch_gpu("--run")
    except CliError as e:
        return _error(str(e))
    try:
        code, lines = run_decode(torch, spec, batch, capacity)
    except InputError as e:
        return _error(_one_line(e))
    except (DriverError, torch.cuda.OutOfMemoryError) as e:
        return _error(_one_line(e), 1)
    for line in lines:
        print(line)
    return code


def regenerate_command(spec) -> str:
    """The command that emits exactly this resolved spec's kernel: a `flashgen` command line where the spec's
    fields are all options of it (the tuned block_n, split and stages pinned, so a change of the measured
    defaults does not change what it emits), else the Python call."""
    s = spec
    args = ["--shape", f"{s.seq_len},{s.heads},{s.head_dim}"]
    if s.dtype != "f16":
        args += ["--dtype", s.dtype]
    if s.causal:
        args.append("--causal")
    if s.arch != "sm_90a":
        args += ["--arch", s.arch]
    args += ["--block-n", str(s.block_n), "--split", ",".join(map(str, s.pv_split)), "--stages", str(s.stages)]
    if s.kv_heads and s.kv_heads != s.heads:
        args += ["--kv-heads", str(s.kv_heads)]
    if s.seq_len_k and s.seq_len_k != s.seq_len:
        args += ["--seq-k", str(s.seq_len_k)]
    if tuple(s.window) != (-1, -1):
        args += ["--window", ",".join(map(str, s.window))]
    if s.softcap:
        args += ["--softcap", repr(float(s.softcap))]
    if s.varlen:
        args.append("--varlen")
    if s.sinks:
        args.append("--sinks")
    if s.multicast:
        args.append("--multicast")
    try:
        reproduced = _spec_from(_generate_parser(_QuietParser).parse_args(join_signed_values(args)))
    except Exception:  # noqa: BLE001 - any failure means the command line cannot say it
        reproduced = None
    if reproduced == s:
        return "flashgen " + shlex.join(args)
    fields = ", ".join(f"{f.name}={getattr(s, f.name)!r}" for f in dataclasses.fields(s)
                       if f.default is dataclasses.MISSING or getattr(s, f.name) != f.default)
    return ('python -c "from codegen.build import build; from codegen.spec import KernelSpec; '
            f'print(build(KernelSpec({fields})).rendered.source)"')


# ----------------------------------------------------------------------------------------------------------------
# Subcommands


def layout_command(argv: list[str], checkout) -> int:
    from layouts.cli import layout_main

    return layout_main(argv)


def verify_command(argv: list[str], checkout) -> int:
    from layouts.cli import verify_main

    return verify_main(argv)


def probe_command(argv: list[str], checkout) -> int:
    parser = argparse.ArgumentParser(prog="flashgen probe",
                                     description="basis-vector probe on the GPU: inject unit elements through the "
                                                 "real TMA + wgmma path of a kernel's tiles and compare with the "
                                                 "layout models (needs an NVIDIA GPU, its driver and torch)")
    _spec_arguments(parser, default_shape="1024,64,128")
    args = parser.parse_args(join_signed_values(argv))
    from .cuda_env import driver_status

    try:
        spec = _spec_from(args)
        ok, why = driver_status()
        if not ok:
            raise CliError(f"flashgen probe runs on an NVIDIA GPU: {why}")
        _require_torch_gpu("flashgen probe")
        from .probe import run_probe

        report = run_probe(spec)
    except _known_errors() + (RuntimeError,) as e:  # RuntimeError: driver errors, a GPU of another arch
        return _error(_one_line(e))
    for operand, n in report.checked.items():
        print(f"  {operand}: {n} basis vectors injected")
    print(report.summary())
    return 0 if report.ok else 1


def _checkout_only(what: str, checkout) -> str | None:
    if checkout is not None:
        return None
    import codegen

    return (f"`flashgen {what}` runs from a checkout of the flashgen repository (this flashgen is installed at "
            f"{pathlib.Path(codegen.__file__).parent}, without {'bench/' if what == 'bench' else 'generated/'}): "
            f"clone it and run `python gen.py {what} ...` there")


def bench_command(argv: list[str], checkout) -> int:
    message = _checkout_only("bench", checkout)
    if message:
        return _error(message)
    root = str(pathlib.Path(checkout).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        from bench.cli import bench_main
    except ImportError as e:
        return _error(f"cannot import the benchmark package from {root}: {e}")
    return bench_main(argv)


def canonical_command(argv: list[str], checkout) -> int:
    parser = argparse.ArgumentParser(prog="flashgen canonical",
                                     description="Regenerate the kernels checked into generated/ of this checkout "
                                                 "(tests/test_codegen.py checks they are what the templates emit).")
    parser.parse_args(argv)
    message = _checkout_only("canonical", checkout)
    if message:
        return _error(message)
    import codegen

    from .build import build
    from .families import resolve
    from .files import write_all
    from .spec import KernelSpec

    root = pathlib.Path(checkout).resolve()
    here = pathlib.Path(codegen.__file__).resolve().parent
    if not here.is_relative_to(root):
        return _error(f"this codegen ({here}) is not the checkout's own ({root / 'codegen'}): run `python gen.py "
                      "canonical` from the checkout's root")
    generated = root / "generated"
    files = {}
    try:
        for fields in CANONICAL:
            built = build(resolve(KernelSpec(**fields)))
            files.update({generated / n: text for n, text in kernel_files(built).items()})
        written = write_all(files)
    except _known_errors() as e:
        return _error(_one_line(e))
    for path in written:
        if path.suffix == ".cu":
            print(f"wrote generated/{path.name}")
    return 0


def simulate_command(argv: list[str], checkout=None) -> int:
    from .simulate import simulate_main

    return simulate_main(argv)


COMMANDS = {
    "simulate": simulate_command,
    "layout": layout_command,
    "verify": verify_command,
    "probe": probe_command,
    "bench": bench_command,
    "canonical": canonical_command,
}


if __name__ == "__main__":
    sys.exit(main())
