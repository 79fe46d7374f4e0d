"""The speed criteria of the decode issue (#19) and the FlashAttention-4 issue (#22), read back from result files.

Each criterion holds or not within one run (one result file, every ratio timed in the same process):

  decode (`gen.py bench --matrix decode`), flashgen's kernel time against cuDNN's:
    b8        every S_q = 1 row with B >= 8 at 1.0x or better
    slow      rows where cuDNN reads under 60% of the run's copy bandwidth at 1.2x or better
    floor     no row below 1.0x
    paged     paged rows of pages of 16 rows or more within 5% of the dense cache's row of the same problem (by
              their ratios to cuDNN's dense read, each timed in its own case's rounds)
  A row the matrix asked for that has no ratio (an error, a skip of one side, a missing row) or whose flashgen
  output is off (rel_err over ERR_FACTOR x cuDNN's in the same case) fails the row criteria and the geomean; a row
  every implementation skipped (it does not fit the GPU) is left out.
    geomean   the matrix's geomean at 1.2x or better
  fa4 (`gen.py bench --matrix fa4`), flashgen's kernel time against FA4's:
    floor     every row at 1.0x FA4 or better
    geomean   the geomean at 1.05x FA4 or better

A run's ratios move by a few percent (bench/LOG.md: the decode geomean 1.195-1.198x over three runs of one tree; the
fa4 matrix's D=256 row 0.955x and 1.015x with one kernel), so `runs_table` puts runs side by side: each row's ratio per
run with its median and range, then each criterion per run and in how many runs it held. `scripts/targets.py
--matrix decode|fa4` prints it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .report import geomean

DECODE_B8_MIN = 1.0
DECODE_SLOW_PCT = 60.0    # cuDNN under this % of the copy bandwidth ...
DECODE_SLOW_MIN = 1.2     # ... takes this ratio
DECODE_FLOOR = 1.0
DECODE_PAGED_MIN_PAGE = 16
DECODE_PAGED_SLACK = 1.05  # a paged row's ratio to cuDNN at least the dense row's over this
DECODE_GEOMEAN = 1.2
FA4_FLOOR = 1.0
FA4_GEOMEAN = 1.05


@dataclass(frozen=True)
class Criterion:
    name: str
    held: bool
    failing: tuple[str, ...]  # the rows that break it (empty where it holds or is about the whole run)


@dataclass(frozen=True)
class Run:
    """One result file: flashgen's ratio per row (to cuDNN for decode, to FA4 for fa4) and the criteria."""

    source: str
    ratios: dict[str, float]
    criteria: tuple[Criterion, ...]
    # flashgen's ratio to another yardstick, shown beside the criteria but judged by none (decode: cuDNN's own paged
    # read on the paged rows, bench/cudnn_paged.py), by label
    references: dict[str, float] = field(default_factory=dict)

    @property
    def geomean(self) -> float | None:
        return geomean(self.ratios.values()) if self.ratios else None


def _decode_label(r: dict) -> str:
    page = f" page{r['page_size']}" if r.get("page_size") else ""
    return f"B={r['B']} S_q={r['S_q']} S_k={r['S_k']} H={r['H']}/{r['H_kv']} D={r['D']} {r['dtype']}{page}"


def _problem(r: dict) -> tuple:
    """A decode row's problem, whatever its cache's paging: a paged row's dense twin shares it."""
    return r["B"], r["S_q"], r["S_k"], r["H"], r["H_kv"], r["D"], r["dtype"]


def _ok(r: dict) -> bool:
    return bool(r.get("ms")) and not r.get("error") and not r.get("skipped")


def _by_impl(rows: Iterable[dict], impl: str) -> list[dict]:
    return [r for r in rows if r.get("impl") == impl and _ok(r)]


def _unmeasured(rows: Sequence[dict], label: Callable[[dict], str], impls: tuple[str, str]) -> dict[str, dict]:
    """The rows of the matrix (by label, any implementation's row naming it) that lack a ratio: either of `impls`
    errored, was skipped or is missing while the other ran. A matrix whose every implementation skipped a row (one
    that does not fit the GPU) leaves it out; any other gap fails the row criteria and the geomean, since a run is
    judged on the rows it was asked for, not on those that happened to run."""
    runs = {}
    for r in rows:
        if r.get("impl") in impls:
            runs.setdefault(label(r), {})[r["impl"]] = r
    return {name: by for name, by in runs.items()
            if not all(_ok(by.get(i) or {}) for i in impls) and not all((by.get(i) or {}).get("skipped") for i in impls)
            or _off(by.get(impls[0]), by.get(impls[1]))}


ERR_FACTOR = 2.0  # flashgen's rel_err against float64 at most this times its yardstick's in the same case


def _off(ours: dict | None, yardstick: dict | None) -> bool:
    """Whether flashgen's output in a timed row is off: its rel_err against float64 above ERR_FACTOR times the
    yardstick's (the implementation it is compared with, cuDNN or FA4, checked on the same inputs in the same run),
    or not finite. A fast wrong answer is no row."""
    if not ours or not _ok(ours) or not yardstick or yardstick.get("rel_err") is None:
        return False
    err = ours.get("rel_err")
    return err is None or not err <= ERR_FACTOR * max(yardstick["rel_err"], 1e-6)


def decode_run(rows: Sequence[dict], source: str = "") -> Run:
    """#19's criteria over one decode result file's rows."""
    ours = _by_impl(rows, "flashgen")
    cudnn = {_decode_label(r): r for r in _by_impl(rows, "cudnn")}
    ratios = {_decode_label(r): r["ratio_to_cudnn"] for r in ours if r.get("ratio_to_cudnn")}
    gaps = _unmeasured(rows, _decode_label, ("flashgen", "cudnn"))
    gap_rows = [next(iter(by.values())) for by in gaps.values()]
    # A paged row against the dense cache's row of the same problem, each as its ratio to cuDNN's dense read in its
    # own case (timed in the same rounds), so no two times from different cases are divided.
    dense = {_problem(r): ratios[label] for r in ours if not r.get("page_size") and (label := _decode_label(r)) in ratios}

    def failing(pick: Callable[[dict], bool], minimum: float) -> tuple[str, ...]:
        low = tuple(label for r in ours if pick(r) and (label := _decode_label(r)) in ratios and ratios[label] < minimum)
        return low + tuple(f"{_decode_label(r)} (no ratio, or its output off)" for r in gap_rows if pick(r))

    slow = [label for label, c in cudnn.items() if c.get("kv_pct_of_copy") is not None
            and c["kv_pct_of_copy"] < DECODE_SLOW_PCT]
    paged_bad = tuple(label for r in ours if (r.get("page_size") or 0) >= DECODE_PAGED_MIN_PAGE
                      and (label := _decode_label(r)) in ratios and _problem(r) in dense
                      and ratios[label] * DECODE_PAGED_SLACK < dense[_problem(r)])
    paged_bad += tuple(f"{_decode_label(r)} (no ratio, or its output off)" for r in gap_rows
                       if (r.get("page_size") or 0) >= DECODE_PAGED_MIN_PAGE)
    b8 = failing(lambda r: r["S_q"] == 1 and r["B"] >= 8, DECODE_B8_MIN)
    slow_bad = tuple(label for label in slow if label in ratios and ratios[label] < DECODE_SLOW_MIN)
    floor = failing(lambda r: True, DECODE_FLOOR)
    mean = geomean(ratios.values()) if ratios else None
    whole = f" ({len(gaps)} rows without a ratio)" if gaps else ""
    criteria = (
        Criterion(f"S_q=1, B>=8 rows >= {DECODE_B8_MIN:.1f}x", not b8, b8),
        Criterion(f"cuDNN < {DECODE_SLOW_PCT:.0f}% of copy: >= {DECODE_SLOW_MIN:.1f}x", not slow_bad, slow_bad),
        Criterion(f"no row < {DECODE_FLOOR:.1f}x", not floor, floor),
        Criterion(f"pages >= {DECODE_PAGED_MIN_PAGE}: within {DECODE_PAGED_SLACK - 1:.0%} of dense", not paged_bad,
                  paged_bad),
        Criterion(f"geomean >= {DECODE_GEOMEAN:.2f}x", mean is not None and mean >= DECODE_GEOMEAN and not gaps,
                  (whole.strip(" ()"),) if gaps else ()),
    )
    references = {f"{_decode_label(r)} vs cuDNN paged": r["ratio_to_cudnn_paged"] for r in ours
                  if r.get("ratio_to_cudnn_paged")}
    return Run(source, ratios, criteria, references)


def _fa4_label(r: dict) -> str:
    kv = f" kv{r['H_kv']}" if r.get("H_kv") not in (None, r["H"]) else ""
    sk = f" S_k={r['S_k']}" if r.get("S_k") not in (None, r["S"]) else ""
    return f"({r['B']},{r['S']},{r['H']},{r['D']}){kv}{sk} {r['dtype']}{' causal' if r['causal'] else ''}"


def fa4_run(rows: Sequence[dict], source: str = "") -> Run:
    """#22's criteria over one fa4 result file's rows: flashgen's ms against FA4's, row by row (flashgen's headline
    row: the split attention() runs)."""
    peer = {_fa4_label(r): r["ms"] for r in _by_impl(rows, "fa4")}
    ratios = {label: peer[label] / r["ms"] for r in _by_impl(rows, "flashgen")
              if (label := _fa4_label(r)) in peer}
    gaps = _unmeasured(rows, _fa4_label, ("flashgen", "fa4"))
    floor = tuple(label for label, v in ratios.items() if v < FA4_FLOOR) + tuple(f"{g} (no ratio, or its output off)" for g in gaps)
    mean = geomean(ratios.values()) if ratios else None
    criteria = (Criterion(f"every row >= {FA4_FLOOR:.1f}x FA4", bool(ratios) and not floor, floor),
                Criterion(f"geomean >= {FA4_GEOMEAN:.2f}x FA4", mean is not None and mean >= FA4_GEOMEAN and not gaps,
                          (f"{len(gaps)} rows without a ratio",) if gaps else ()))
    return Run(source, ratios, criteria)


MATRICES = {"decode": decode_run, "fa4": fa4_run}


def load_runs(matrix: str, paths: Iterable[Path]) -> list[Run]:
    """One Run per result file of `matrix`, oldest first (by the files' time stamps), all from one GPU. A folder stands for its timestamped
    files of that matrix (`*-<matrix>.json`, not the h200-latest copy, which repeats one of them)."""
    read = MATRICES[matrix]
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(f for f in p.glob(f"*-{matrix}.json") if not f.name.startswith("h200-latest")) \
            if p.is_dir() else [p]
    runs, gpus = [], set()
    for f in files:
        rows = json.loads(f.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{f} is not a benchmark result file (a JSON list of rows)")
        gpus |= {r["gpu"] for r in rows if r.get("gpu")}
        stamp = f.stem.rsplit("-", 2)[-2] if f.stem.endswith(f"-{matrix}") else f.stem
        runs.append(read(rows, stamp + _source_of(rows)))
    runs.sort(key=lambda r: r.source)  # by time stamp: the last run is the newest
    if len(gpus) > 1:
        raise ValueError(f"the files come from {len(gpus)} GPUs ({', '.join(sorted(gpus))}): ratios compare within one "
                         "GPU's runs; pass one GPU's files (e.g. bench/results/nvidia-h200-*-decode.json)")
    return runs


def _source_of(rows: Sequence[dict]) -> str:
    """' <tree>' (7 hex digits of the source tree the run measured), '+dirty' where its checkout had changes: runs
    of different trees are runs of different code, and a dirty one is of code no commit holds."""
    first = next((r for r in rows if r.get("flashgen_tree") or r.get("flashgen_commit")), {})
    tree, commit = first.get("flashgen_tree") or "", first.get("flashgen_commit") or ""
    return (f" {tree[:7]}" if tree else "") + ("+dirty" if "dirty" in commit or "dirty" in tree else "")


def _x(v: float | None) -> str:
    return f"{v:.3f}x" if v is not None else "-"


def runs_table(runs: Sequence[Run]) -> list[list[str]]:
    """Rows: every row of any run, the geomean, each reference ratio (Run.references), then each criterion; columns:
    the runs, then the median (range) over them (criteria: in how many runs they held)."""
    if not runs:
        raise ValueError("no runs to tabulate")
    table = [["row"] + [r.source for r in runs] + ["median (range)"]]
    labels = list(dict.fromkeys(label for r in runs for label in r.ratios))
    references = list(dict.fromkeys(label for r in runs for label in r.references))
    for label in labels + ["geomean"] + references:
        values = [r.geomean if label == "geomean" else r.ratios.get(label, r.references.get(label)) for r in runs]
        got = [v for v in values if v is not None]
        spread = f"{statistics.median(got):.3f}x ({min(got):.3f}-{max(got):.3f})" if got else "-"
        table.append([label] + [_x(v) for v in values] + [spread])
    for i, criterion in enumerate(runs[0].criteria):
        held = [r.criteria[i].held for r in runs]
        table.append([criterion.name] + ["met" if h else "no" for h in held] + [f"{sum(held)} of {len(runs)} runs"])
    return table


def verdict(runs: Sequence[Run]) -> str:
    """One line: each criterion in how many runs it held, and what broke it in the last run."""
    last = runs[-1]
    parts = []
    for i, c in enumerate(last.criteria):
        held = sum(r.criteria[i].held for r in runs)
        why = f" (last run: {', '.join(c.failing)})" if c.failing else ""
        parts.append(f"{c.name}: {held} of {len(runs)}{why}")
    return "; ".join(parts)
