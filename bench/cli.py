"""The `gen.py bench` entry point: bench_main parses the arguments, runs the GPU benchmark or the compile-time
report, writes the result files and prints the closing table."""

from __future__ import annotations

import sys

from .cases import BenchUsageError
from .compile_timing import compile_table, run_compile, save_compile
from .config import BenchConfig, parse_config
from .gpu_run import run_gpu
from .report import CALL_NOTE, case_table, render_text, save_results, summary_table


def bench_main(argv: list[str]) -> int:
    try:
        config = parse_config(argv)
    except BenchUsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.mode == "compile":
        return _compile_main(config)
    if config.mode == "decode":
        from .decode import decode_main

        return decode_main(config)
    if config.mode == "backward":
        from .backward import backward_main

        return backward_main(config)
    try:
        result = run_gpu(config)
    except (ImportError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.out is not None:
        for path in save_results(result, config.out):
            print(f"wrote {path}", file=sys.stderr)
    print()
    if config.mode == "matrix" or len(config.cases) > 1:
        print("ratio to cuDNN, measured in this run (> 1 is faster):")
        print(render_text(summary_table(result.rows)))
    else:
        print(f"{config.cases[0].label}, on {result.meta.get('gpu')}:")
        print(render_text(case_table(result.rows)))
    print(CALL_NOTE)
    return 0 if any(r.impl == "flashgen" and r.ok for r in result.rows) or "flashgen" not in config.peers else 1


def _compile_main(config: BenchConfig) -> int:
    from codegen.spec import SpecError

    try:
        meta, timings = run_compile(config)
    except (SpecError, RuntimeError, ImportError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if config.out is not None:
        for path in save_compile(meta, timings, config.out):
            print(f"wrote {path}", file=sys.stderr)
    imp = meta.get("import_s")
    print(f"import of the generator in a fresh interpreter: {imp * 1e3:.0f} ms" if imp is not None
          else "import time: could not be measured")
    print(f"template parse (part of cold): {', '.join(f'{t.template_load_s * 1e3:.1f} ms' for t in timings)}")
    print(render_text(compile_table(timings)))
    return 0
