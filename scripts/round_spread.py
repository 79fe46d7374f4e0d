#!/usr/bin/env python3
"""Each row's timing rounds, read back from a benchmark result file (no GPU needed).

    python3 scripts/round_spread.py bench/results/nvidia-h200-...-fa4.json [--peer fa4]

A row's `ms` is the median of all its samples; `round_ms` (bench/README.md) keeps each round's median, in the
order the rounds ran. Per case: flashgen's and the peer's rounds (fastest, median, slowest), flashgen / peer from
the two `ms` (what the matrix reports), and the same ratio round by round (peer's round r over flashgen's round r:
the two ran within one round, so a clock both saw cancels). Where the per-round median differs from the reported
ratio, the run's median rests on a few rounds that caught one implementation at another clock. The last line
counts the cases under 1.0x round by round (scripts/gpu_check.py puts it in its summary).
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


def paired(rows: list[Row], peer: str) -> list[tuple[str, Row, Row, list[float] | None]]:
    """Per case with flashgen's headline row and the peer's both timed: (label, flashgen, peer, the peer's round
    over flashgen's round r, sorted; None where the file has no rounds for one of them)."""
    by_case: dict[str, dict[str, Row]] = {}
    for row in rows:
        by_case.setdefault(row.case.label, {})[row.impl] = row
    cases = []
    for label, impls in by_case.items():
        ours, theirs = impls.get("flashgen"), impls.get(peer)
        if not (ours and theirs and ours.ok and theirs.ok):
            continue
        alike = ours.round_ms and theirs.round_ms and len(ours.round_ms) == len(theirs.round_ms)
        cases.append((label, ours, theirs,
                      sorted(t / o for o, t in zip(ours.round_ms, theirs.round_ms)) if alike else None))
    return cases


def spread_table(rows: list[Row], peer: str) -> list[list[str]]:
    """One line per case of `paired`."""
    table = [HEADER]
    for label, ours, theirs, ratios in paired(rows, peer):
        if ratios is None:
            table.append([label, "no rounds in this file", "", f"{theirs.ms / ours.ms:.3f}x", ""])
        else:
            table.append([label, _rounds(ours), _rounds(theirs), f"{theirs.ms / ours.ms:.3f}x",
                          f"{statistics.median(ratios):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"])
    return table


def verdict(rows: list[Row], peer: str) -> str:
    """How many cases sit under 1.0x the peer round by round (the median of their paired rounds)."""
    cases = [ratios for *_, ratios in paired(rows, peer) if ratios]
    below = sum(1 for ratios in cases if statistics.median(ratios) < 1.0)
    return f"{below} of {len(cases)} case(s) with flashgen / {peer} under 1.0x round by round (median of the rounds)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=pathlib.Path, metavar="FILE")
    parser.add_argument("--peer", default="fa4", help="the implementation flashgen is read against (default: fa4)")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        parser.error(f"no such file: {args.path}")
    try:
        rows = load_rows(args.path)
    except (ValueError, KeyError) as e:
        print(f"round_spread.py: {e}", file=sys.stderr)
        return 2
    table = spread_table(rows, args.peer)
    if len(table) == 1:
        print(f"round_spread.py: no case in {args.path} has both flashgen and {args.peer} timed", file=sys.stderr)
        return 2
    print(render_text(table))
    print("\n" + verdict(rows, args.peer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
