#!/usr/bin/env python3
"""Each row's timing rounds, read back from a benchmark result file (no GPU needed).

    python3 scripts/round_spread.py bench/results/nvidia-h200-...-fa4.json [--peer fa4]

A row's `ms` is the median of all its samples; `round_ms` (bench/README.md) keeps each round's median, in the
order the rounds ran. Per case: flashgen's and the peer's rounds (fastest, median, slowest), flashgen / peer from
the two `ms` (what the matrix reports), and the same ratio round by round (peer's round r over flashgen's round r:
the two ran within one round, so a clock both saw cancels). Where the per-round median differs from the reported
ratio, the run's median rests on a few rounds that caught one implementation at another clock. The last line
counts the cases under 1.0x round by round (scripts/gpu_check.py puts it in its summary).

    python3 scripts/round_spread.py FILE [FILE ...] --after

reads what each slot followed instead: the rounds are replayed in the benchmark's orders (bench.gpu_run.round_orders
over a case's timed implementations, the file's rows but the headline `flashgen`, in order; a row with a `call_ms`
had its call slot right after its kernel slot, unless the file's `call_rounds` (or its command) says `apart`), and each
kernel slot's round median over its implementation's median is averaged by the slot just before it ("first:" where
that slot ended the round before). Pooled over the files' rows of at least --min-ms.

    python3 scripts/round_spread.py FILE [FILE ...] --by-impl

how far each implementation's rounds scatter: per kernel row of at least --min-ms, the rounds' standard deviation
and range over their median, averaged by implementation over the files (two harnesses compare by their files).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.config import build_parser
from bench.gpu_run import round_orders
from bench.report import Row, load_rows, render_text, split_impl

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


def _short(impl: str, headline: Row) -> str:
    """flashgen's headline split as `flashgen`, its other splits as `flashgen[other]`, the peers by name."""
    if headline.pv_split and impl == split_impl(headline.pv_split):
        return "flashgen"
    return "flashgen[other]" if impl.startswith("flashgen[") else impl


def calls_apart(path: pathlib.Path) -> bool:
    """Whether the run's user calls had rounds of their own: its rows' `call_rounds`, or in files from before that
    field (when `shared` was the only default) whether its command asked for `--call-rounds apart`."""
    data = json.loads(path.read_text())
    rows = data.get("rows", []) if isinstance(data, dict) else data
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    if first.get("call_rounds"):
        return first["call_rounds"] == "apart"
    command = first.get("command") or ""
    words = command.split()[2:] if command.startswith("gen.py bench") else []
    # The bench's parser reads the words; a command without the flag is from before the field, when the bench's
    # default was shared (today's default reaches a file only through its field).
    given = build_parser().parse_known_args(words)[0].call_rounds
    return (given or "shared") == "apart"


def after_table(runs: list[tuple[list[Row], bool]], min_ms: float = 0.3) -> list[list[str]]:
    """Each kernel slot's round median / its implementation's median, averaged by (implementation, the slot before
    it), over the runs' cases whose headline flashgen row takes at least min_ms; each run is (its rows, whether its
    calls had rounds of their own, so that no call slot stood between kernel slots)."""
    pooled: dict[tuple[str, str], list[float]] = {}
    for rows, apart in runs:
        by_case: dict[str, list[Row]] = {}
        for row in rows:
            by_case.setdefault(row.case.label, []).append(row)
        for case_rows in by_case.values():
            headline = next((r for r in case_rows if r.impl == "flashgen" and r.ok), None)
            timed = [r for r in case_rows if r.impl != "flashgen" and r.round_ms]
            if headline is None or headline.ms < min_ms or len(timed) < 2 or len({len(r.round_ms) for r in timed}) > 1:
                continue
            before = None
            for r, order in enumerate(round_orders(len(timed), len(timed[0].round_ms))[:len(timed[0].round_ms)]):
                for position, i in enumerate(order):
                    row = timed[i]
                    if before is not None:
                        key = (_short(row.impl, headline), ("first: " if position == 0 else "") + before)
                        pooled.setdefault(key, []).append(row.round_ms[r] / statistics.median(row.round_ms))
                    before = _short(row.impl, headline) + (" call" if row.call_ms is not None and not apart else "")
    table = [["implementation", "slot before it", "round / median", "slots"]]
    for (impl, before), values in sorted(pooled.items()):
        table.append([impl, before, f"{statistics.mean(values):.3f}", str(len(values))])
    return table


def impl_spread(runs: list[list[Row]], min_ms: float = 0.3) -> dict[str, tuple[int, float, float]]:
    """Per implementation (flashgen's headline split as `flashgen`): (rows, mean round stdev / median, mean round
    range / median) over the runs' kernel rows with two or more rounds, in cases whose headline takes min_ms."""
    pooled: dict[str, list[tuple[float, float]]] = {}
    for rows in runs:
        headlines = {r.case.label: r for r in rows if r.impl == "flashgen" and r.ok}
        for row in rows:
            headline = headlines.get(row.case.label)
            if row.impl == "flashgen" or headline is None or headline.ms < min_ms or len(row.round_ms or ()) < 2:
                continue
            mid = statistics.median(row.round_ms)
            pooled.setdefault(_short(row.impl, headline), []).append(
                (statistics.stdev(row.round_ms) / mid, (max(row.round_ms) - min(row.round_ms)) / mid))
    return {impl: (len(v), statistics.mean(sd for sd, _ in v), statistics.mean(rg for _, rg in v))
            for impl, v in sorted(pooled.items())}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", type=pathlib.Path, nargs="+", metavar="FILE")
    parser.add_argument("--peer", default="fa4", help="the implementation flashgen is read against (default: fa4)")
    parser.add_argument("--after", action="store_true",
                        help="each slot's time by the slot before it, pooled over the files (see above)")
    parser.add_argument("--by-impl", action="store_true",
                        help="each implementation's round spread, pooled over the files (see above)")
    parser.add_argument("--min-ms", type=float, default=0.3,
                        help="--after and --by-impl: rows whose flashgen takes this long")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not path.is_file():
            parser.error(f"no such file: {path}")
    if args.after and args.by_impl:
        parser.error("--after and --by-impl are two readings: ask for one")
    if len(args.paths) > 1 and not (args.after or args.by_impl):
        parser.error("several files are read with --after or --by-impl only")
    try:
        runs = [load_rows(path) for path in args.paths]
    except (ValueError, KeyError) as e:
        print(f"round_spread.py: {e}", file=sys.stderr)
        return 2
    if args.after:
        table = after_table([(rows, calls_apart(path)) for rows, path in zip(runs, args.paths)], args.min_ms)
        if len(table) == 1:
            print("round_spread.py: no case with two or more timed implementations and their rounds", file=sys.stderr)
            return 2
        print(render_text(table))
        return 0
    if args.by_impl:
        spread = impl_spread(runs, args.min_ms)
        if not spread:
            print("round_spread.py: no kernel row with two or more rounds", file=sys.stderr)
            return 2
        print(render_text([["implementation", "rows", "round stdev / median", "round range / median"]] +
                          [[impl, str(n), f"{sd:.4f}", f"{rg:.4f}"] for impl, (n, sd, rg) in spread.items()]))
        return 0
    rows = runs[0]
    table = spread_table(rows, args.peer)
    if len(table) == 1:
        print(f"round_spread.py: no case in {args.paths[0]} has both flashgen and {args.peer} timed", file=sys.stderr)
        return 2
    print(render_text(table))
    print("\n" + verdict(rows, args.peer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
