#!/usr/bin/env python3
"""Each row's timing rounds, read back from a benchmark result file (no GPU needed).

    python3 scripts/round_spread.py bench/results/nvidia-h200-...-fa4.json [--peer fa4]

A row's `ms` is the median of all its samples; `round_ms` (bench/README.md) keeps each round's median, in the
order the rounds ran. Per case: flashgen's and the peer's rounds (fastest, median, slowest), flashgen / peer from
the two `ms` (what the matrix reports), and the same ratio round by round (peer's round r over flashgen's round r:
the two ran within one round, so a clock both saw cancels). Where the paired ratios sit well above the reported
one, the run's median rests on a few rounds that caught one implementation at a low clock.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.report import Row, load_rows, render_text

HEADER = ["case", "flashgen rounds ms", "peer rounds ms", "flashgen / peer", "per round: median (range)"]


def _rounds(row: Row) -> str:
    r = sorted(row.round_ms)
    return f"{r[0]:.4f} {statistics.median(r):.4f} {r[-1]:.4f}"


def spread_table(rows: list[Row], peer: str) -> list[list[str]]:
    """One line per case that has flashgen's headline row and the peer's, both with their rounds."""
    table = [HEADER]
    by_case: dict[str, dict[str, Row]] = {}
    for row in rows:
        by_case.setdefault(row.case.label, {}).setdefault(row.impl, row)  # the headline row comes first
    for label, impls in by_case.items():
        ours, theirs = impls.get("flashgen"), impls.get(peer)
        if not (ours and theirs and ours.ok and theirs.ok):
            continue
        if not (ours.round_ms and theirs.round_ms) or len(ours.round_ms) != len(theirs.round_ms):
            table.append([label, "no rounds in this file", "", f"{theirs.ms / ours.ms:.3f}x", ""])
            continue
        paired = sorted(t / o for o, t in zip(ours.round_ms, theirs.round_ms))
        table.append([label, _rounds(ours), _rounds(theirs), f"{theirs.ms / ours.ms:.3f}x",
                      f"{statistics.median(paired):.3f}x ({paired[0]:.3f}-{paired[-1]:.3f})"])
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=pathlib.Path, metavar="FILE")
    parser.add_argument("--peer", default="fa4", help="the implementation flashgen is read against (default: fa4)")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        parser.error(f"no such file: {args.path}")
    try:
        table = spread_table(load_rows(args.path), args.peer)
    except (ValueError, KeyError) as e:
        print(f"round_spread.py: {e}", file=sys.stderr)
        return 2
    if len(table) == 1:
        print(f"round_spread.py: no case in {args.path} has both flashgen and {args.peer} timed", file=sys.stderr)
        return 2
    print(render_text(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
