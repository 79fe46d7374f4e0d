#!/usr/bin/env python3
"""Speed targets over benchmark result files, run by run (no GPU needed).

    python3 scripts/targets.py bench/results/nvidia-h200-20261130T162839Z.json ...
    python3 scripts/targets.py RESULTS_DIR    (its timestamped files, not h200-latest.json)
    python3 scripts/targets.py --matrix decode bench/results/nvidia-h200-*-decode.json
    python3 scripts/targets.py --matrix fa4 bench/results/nvidia-h200-*-fa4.json

Each file is one run of `gen.py bench --matrix <matrix>`. The default matrix: issue 4's targets, the seed shape and
the five bf16 shapes per run (bench/targets.py). The decode and fa4 matrices: their issues' Done-when criteria
(#19: against cuDNN; #22: against FlashAttention-4), every row per run, over one GPU's files oldest first
(bench/done_when.py). Then the median and range over the runs, whether each run meets each target, and a last line
for summaries.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import done_when, targets
from bench.report import render_text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=pathlib.Path, metavar="FILE_OR_DIR")
    parser.add_argument("--matrix", default="default", choices=["default", *sorted(done_when.MATRICES)],
                        help="the matrix the files are runs of (default: issue 4's targets over the default matrix)")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        parser.error("no such file or folder: " + ", ".join(map(str, missing)))
    module = targets if args.matrix == "default" else done_when
    try:
        runs = targets.load_runs(args.paths) if module is targets else done_when.load_runs(args.matrix, args.paths)
        if not runs:
            parser.error("no result files found in " + ", ".join(map(str, args.paths)))
        print(render_text(module.runs_table(runs)))
    except (ValueError, KeyError) as e:
        print(f"targets.py: {e}", file=sys.stderr)
        return 2
    print("\n" + module.verdict(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
