#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS opcode and per mbarrier wait, from Nsight Compute's source page.

On the GPU machine (one call, about 20 s):

    ncu -o $OUT/k -f -k regex:flashgen --launch-skip 1 --launch-count 1 --section SourceCounters \\
        python3 scripts/profile_one.py --shape 1,1024,64,128 --dtype f16
    ncu -i $OUT/k.ncu-rep --page source --print-source sass --csv | gzip > $OUT/k_src.csv.gz

then here: `python3 scripts/sass_stalls.py k_src.csv.gz`. Each row of the page is one SASS instruction with its
warp-stall samples (a sample is one warp seen at that instruction, stalled or issuing) split by reason. An
mbarrier wait is a SYNCS...TRYWAIT followed by a branch back to it, and its samples land on both: they are
summed under the barrier's address operand, with how often the wait ran (`ex`), which tells the role apart
(the producer is one warp, the consumers eight).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
# A branch this many instructions after a TRYWAIT is taken as that wait's retry loop.
WAIT_LOOP_SPAN = 5


def read_rows(path: str) -> tuple[list[str], list[list[str]]]:
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    with raw:
        rows = list(csv.reader(io.StringIO(raw.read())))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[header_at], [r for r in rows[header_at + 1:] if len(r) > 2]


def opcode(sass: str) -> str:
    words = sass.split()
    if not words:
        return ""
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output (.csv or .csv.gz)")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)

    header, rows = read_rows(args.csv)
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def value(row: list[str], name: str) -> float:
        try:
            return float(row[col[name]])
        except (ValueError, IndexError):
            return 0.0

    total = sum(value(r, SAMPLES) for r in rows)
    if not total:
        raise SystemExit(f"{args.csv}: no warp-stall samples (was the SourceCounters section collected?)")
    by_op: collections.Counter = collections.Counter()
    why: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    waits: collections.Counter = collections.Counter()
    wait_at = -WAIT_LOOP_SPAN - 1
    wait_name = ""
    for i, row in enumerate(rows):
        sass, samples = row[col["Source"]], value(row, SAMPLES)
        op = opcode(sass)
        if "TRYWAIT" in sass:
            operand = re.search(r"\[(.*?)\]", sass)
            wait_at, wait_name = i, f"mbarrier [{operand.group(1) if operand else '?'}] ex={row[col[EXECUTED]]}"
        if "TRYWAIT" in sass or (op == "BRA" and i - wait_at <= WAIT_LOOP_SPAN):
            waits[wait_name] += samples
            op = "mbarrier wait"
        by_op[op] += samples
        for reason in reasons:
            why[op][reason.removeprefix("stall_")] += value(row, reason)

    print(f"{int(total)} samples over {len(rows)} SASS instructions\n")
    print("share  opcode          top stall reasons")
    for op, samples in by_op.most_common(args.top):
        top = " ".join(f"{r}={n / total:.1%}" for r, n in why[op].most_common(3) if n)
        print(f"{samples / total:5.1%}  {op:15s} {top}")
    print("\nmbarrier waits (samples on the TRYWAIT and its retry branch)")
    for name, samples in waits.most_common(args.top):
        print(f"{samples / total:5.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
