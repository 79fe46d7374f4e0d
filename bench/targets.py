"""Issue 4's speed targets, read back from benchmark result files.

The targets, each checked within one run (one result file of `gen.py bench --matrix default`, whose ratios to
cuDNN were timed in the same process):

    seed       (1, 1024, 64, 128) f16 non-causal          flashgen >= 1.10x cuDNN
    bf16 five  (4,4096,32,128) (1,16384,16,128)            geometric mean >= 1.05x cuDNN,
               (16,1024,32,64) (2,4096,16,256)             and no shape below 0.95x
               (8,512,32,128), bf16 non-causal

Identical runs differ by a few percent (bench/LOG.md v16), and the bf16 target sits inside that spread, so
one run says little: `runs_table` puts several side by side with, per shape, the median and range over the runs,
and how many runs meet each target. `scripts/targets.py` prints it; `scripts/gpu_check.py` runs the default
matrix several times and ends with it.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .report import geomean

# A default-matrix result file's name: the GPU, then the time stamp (bench/results.py), no matrix suffix.
_DEFAULT_RUN = re.compile(r"nvidia-.*-\d{8}T\d{6}Z")

# (B, S, H, D, dtype, causal) as the result rows spell them.
Shape = tuple[int, int, int, int, str, bool]

SEED: Shape = (1, 1024, 64, 128, "f16", False)
SEED_MIN_RATIO = 1.10
BF16_FIVE: tuple[Shape, ...] = (
    (4, 4096, 32, 128, "bf16", False),
    (1, 16384, 16, 128, "bf16", False),
    (16, 1024, 32, 64, "bf16", False),
    (2, 4096, 16, 256, "bf16", False),
    (8, 512, 32, 128, "bf16", False),
)
FIVE_MIN_GEOMEAN = 1.05
FIVE_MIN_EACH = 0.95


def shape_label(shape: Shape) -> str:
    b, s, h, d, dtype, causal = shape
    return f"({b},{s},{h},{d}) {dtype}{' causal' if causal else ''}"


@dataclass(frozen=True)
class RunTargets:
    """One run's flashgen ratios to cuDNN on the target shapes (None: the shape is missing or failed)."""

    source: str
    seed: float | None
    five: tuple[float | None, ...]  # in BF16_FIVE order

    @property
    def five_geomean(self) -> float | None:
        return geomean(self.five) if all(r is not None for r in self.five) else None

    @property
    def five_min(self) -> float | None:
        return min(self.five) if all(r is not None for r in self.five) else None

    @property
    def seed_met(self) -> bool:
        return self.seed is not None and self.seed >= SEED_MIN_RATIO

    @property
    def five_met(self) -> bool:
        g, low = self.five_geomean, self.five_min
        return g is not None and low is not None and g >= FIVE_MIN_GEOMEAN and low >= FIVE_MIN_EACH


def run_targets(rows: Iterable[dict], source: str = "") -> RunTargets:
    """The target shapes' ratios from one result file's rows: the `flashgen` row of each case (its best split)."""
    ratios: dict[Shape, float | None] = {}
    for r in rows:
        if r.get("impl") != "flashgen" or r.get("varlen"):
            continue
        if r.get("H_kv") not in (None, r.get("H")):  # a grouped-query case is a different problem
            continue
        shape = (r["B"], r["S"], r["H"], r["D"], r["dtype"], bool(r["causal"]))
        ratios[shape] = r.get("ratio_to_cudnn")
    return RunTargets(source, ratios.get(SEED), tuple(ratios.get(s) for s in BF16_FIVE))


def load_runs(paths: Iterable[Path]) -> list[RunTargets]:
    """One RunTargets per result file (a JSON list of rows), in the order given. A folder stands for its
    timestamped result files of the default matrix (`<gpu>-<stamp>.json`: not h200-latest.json, which repeats one
    of them, nor another matrix's `-decode.json` or an A/B's `ab-...json`)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(f for f in p.glob("*.json") if _DEFAULT_RUN.fullmatch(f.stem)) if p.is_dir() else [p]
    runs = []
    for f in files:
        rows = json.loads(f.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{f} is not a benchmark result file (a JSON list of rows)")
        runs.append(run_targets(rows, f.stem.rsplit("-", 1)[-1]))  # nvidia-h200-<stamp>: the stamp
    return runs


def _x(v: float | None) -> str:
    return f"{v:.3f}x" if v is not None else "-"


def _spread(values: Sequence[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    return f"{statistics.median(got):.3f}x ({min(got):.3f}-{max(got):.3f})"


def runs_table(runs: Sequence[RunTargets]) -> list[list[str]]:
    """Rows: each target shape, the bf16 five's geomean and lowest shape, and whether each run meets each target;
    columns: the runs, then the median (range) over them."""
    if not runs:
        raise ValueError("no runs to tabulate")
    header = ["shape"] + [r.source for r in runs] + ["median (range)"]
    table = [header]

    def line(label: str, values: Sequence[float | None]) -> None:
        table.append([label] + [_x(v) for v in values] + [_spread(values)])

    line(shape_label(SEED) + " (seed)", [r.seed for r in runs])
    for i, shape in enumerate(BF16_FIVE):
        line(shape_label(shape), [r.five[i] for r in runs])
    line("bf16 five: geomean", [r.five_geomean for r in runs])
    line("bf16 five: lowest", [r.five_min for r in runs])
    n = len(runs)
    seed_met, five_met = sum(r.seed_met for r in runs), sum(r.five_met for r in runs)
    table.append([f"seed >= {SEED_MIN_RATIO:.2f}x"] + ["met" if r.seed_met else "no" for r in runs]
                 + [f"{seed_met} of {n} runs"])
    table.append([f"five >= {FIVE_MIN_GEOMEAN:.2f}x, none < {FIVE_MIN_EACH:.2f}x"]
                 + ["met" if r.five_met else "no" for r in runs] + [f"{five_met} of {n} runs"])
    return table


def verdict(runs: Sequence[RunTargets]) -> str:
    """One line for a summary: each target's median over the runs and in how many runs it was met."""
    n = len(runs)
    seeds = [r.seed for r in runs if r.seed is not None]
    fives = [r.five_geomean for r in runs if r.five_geomean is not None]
    seed = f"{statistics.median(seeds):.3f}x" if seeds else "-"
    five = f"{statistics.median(fives):.3f}x" if fives else "-"
    return (f"seed {seed} median (>= {SEED_MIN_RATIO:.2f}x in {sum(r.seed_met for r in runs)} of {n} runs); "
            f"bf16 five {five} median (met in {sum(r.five_met for r in runs)} of {n} runs)")
