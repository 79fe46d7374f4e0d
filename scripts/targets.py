#!/usr/bin/env python3
"""Issue 4's speed targets over benchmark result files, run by run (no GPU needed).

    python3 scripts/targets.py bench/results/nvidia-h200-20261130T162839Z.json ...
    python3 scripts/targets.py RESULTS_DIR    (its timestamped files, not h200-latest.json)

Each file is one run of `gen.py bench --matrix default`. Prints the seed shape and the five bf16 shapes per run,
the median and range over the runs, whether each run meets each target, and a last line for summaries.
The targets and the reasons to read several runs are in bench/targets.py.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

# The checkout's root on the path (bench/, scripts/, and codegen/ where it is not installed): no PYTHONPATH=.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.report import render_text
from bench.targets import load_runs, runs_table, verdict


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=pathlib.Path, metavar="FILE_OR_DIR")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        parser.error("no such file or folder: " + ", ".join(map(str, missing)))
    try:
        runs = load_runs(args.paths)
        if not runs:
            parser.error("no result files found in " + ", ".join(map(str, args.paths)))
        print(render_text(runs_table(runs)))
    except (ValueError, KeyError) as e:
        print(f"targets.py: {e}", file=sys.stderr)
        return 2
    print("\n" + verdict(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
