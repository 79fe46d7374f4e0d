"""The results: Row and the numbers derived from rows (best split, ratio to cuDNN, geomeans), the text and
Markdown tables, BenchResult and its files on disk, and the run's metadata (git, host, GPU)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .cases import OWN_LATEST, Case, varlen_case

ROOT = Path(__file__).resolve().parent.parent  # bench/report.py -> the repository root
DEFAULT_OUT = ROOT / "bench" / "results"


def split_name(split: Sequence[int]) -> str:
    return "+".join(str(c) for c in split)


class TimedRow:
    """What a result row's times stand for: `ok`, its kernel time (ms) was measured and checked; `call_ok`, the
    user's call (call_ms) was too. Every matrix's row (forward, decode, backward) has these fields."""

    @property
    def ok(self) -> bool:
        return self.ms is not None and self.error is None and self.skipped is None

    @property
    def call_ok(self) -> bool:
        return self.call_ms is not None and self.call_error is None and self.skipped is None


@dataclass(frozen=True)
class Row(TimedRow):
    impl: str
    case: Case
    ms: float | None = None
    rel_err: float | None = None
    snr_db: float | None = None
    pv_split: tuple[int, ...] | None = None
    # flashgen's headline row: "default" (the split attention() runs for the shape, timed among the candidates) or
    # "best" (the fastest of the splits asked for with --split, or of a result file from before this field)
    split_choice: str | None = None
    iters: int | None = None
    error: str | None = None
    skipped: str | None = None
    ratio_to_cudnn: float | None = None  # cuDNN ms / this ms: > 1 is faster than cuDNN
    err_vs_ours: float | None = None  # rel_err / flashgen's best rel_err
    # What users call (flashgen: codegen.attention(...), which checks, resolves, encodes and launches every call),
    # timed in interleaved rounds with its host time visible (gpu_run.time_call_samples; where: the run's
    # call_rounds, gpu_run.measure_together); the cuDNN yardstick's own
    # call is timed the same way, so call_vs_cudnn = cuDNN's call_ms / this call_ms. None: not timed (peers, and
    # results written before call_ms existed); call_error: why the call has no time (it raised, or its output
    # is wrong), while ms, the kernel through prepare(), may still stand.
    call_ms: float | None = None
    call_rel_err: float | None = None
    call_error: str | None = None
    call_vs_cudnn: float | None = None
    # The host's own ms a call in those loops (median over rounds): where it reaches call_ms, the call is host-bound.
    call_host_ms: float | None = None
    # The kernel's median in each timing round, in the order the rounds ran (ms is the median of all samples): a
    # run's spread, and whether a row's median rests on a few slow rounds. None in files from before it existed.
    round_ms: tuple[float, ...] | None = None

    @property
    def tflops(self) -> float | None:
        return self.case.flops / self.ms / 1e9 if self.ms else None

    def to_json(self) -> dict:
        c = self.case
        return {
            "impl": self.impl, "B": c.batch, "S": c.seq, "S_k": c.seq_k, "H": c.heads, "H_kv": c.kv_heads, "D": c.dim,
            "causal": c.causal, "dtype": c.dtype, "ms": _finite(self.ms), "tflops": _finite(self.tflops),
            "snr_db": _finite(self.snr_db), "rel_err": _finite(self.rel_err),
            "err_vs_ours": _finite(self.err_vs_ours), "ratio_to_cudnn": _finite(self.ratio_to_cudnn),
            "call_ms": _finite(self.call_ms), "call_vs_cudnn": _finite(self.call_vs_cudnn),
            "call_host_ms": _finite(self.call_host_ms),
            "call_rel_err": _finite(self.call_rel_err), "call_error": self.call_error,
            "pv_split": list(self.pv_split) if self.pv_split else None, "split_choice": self.split_choice,
            "iters": self.iters, "round_ms": [_finite(x) for x in self.round_ms] if self.round_ms else None,
            "error": self.error, "skipped": self.skipped,
            # ratio_to_cudnn divides this implementation's time into the yardstick's: "cudnn" on the problem
            # itself, or "cudnn-padded" (cuDNN on the zero-padded batch) for a varlen case, where B is the
            # number of sequences, S the longest, and seqlens every length.
            "yardstick": c.yardstick, "varlen": c.varlen, "seqlens": list(c.lens) if c.varlen else None,
            "total_tokens": c.total_tokens, "flops": c.flops, "padding_efficiency": c.padding_efficiency,
        }


    @classmethod
    def from_json(cls, d: dict) -> "Row":
        """A row as to_json wrote it, from this version or an older one: keys a file lacks (call_ms and the other
        call_* keys before they existed, H_kv before grouped-query, varlen and seqlens before varlen) read as
        None, or as the default they had then (H_kv = H, dense)."""
        heads, kv = d["H"], d.get("H_kv")
        if d.get("varlen") and d.get("seqlens"):
            case = varlen_case(d["seqlens"], heads, d["D"], d["dtype"], bool(d["causal"]), kv)
        else:
            case = Case(d["B"], d["S"], heads, d["D"], d["dtype"], bool(d["causal"]), kv, seq_k=d.get("S_k"))
        split = d.get("pv_split")
        return cls(d["impl"], case, ms=d.get("ms"), rel_err=d.get("rel_err"), snr_db=d.get("snr_db"),
                   pv_split=tuple(split) if split else None,
                   split_choice=d.get("split_choice") or ("best" if d["impl"] == "flashgen" and split else None),
                   iters=d.get("iters"), error=d.get("error"),
                   skipped=d.get("skipped"), ratio_to_cudnn=d.get("ratio_to_cudnn"), err_vs_ours=d.get("err_vs_ours"),
                   call_ms=d.get("call_ms"), call_rel_err=d.get("call_rel_err"), call_error=d.get("call_error"),
                   call_vs_cudnn=d.get("call_vs_cudnn"), call_host_ms=d.get("call_host_ms"),
                   round_ms=tuple(d["round_ms"]) if d.get("round_ms") else None)


def load_rows(path: Path) -> list[Row]:
    """The rows of a result file (a JSON list of rows; an object holding them under "rows" works too), old or new,
    ready for case_table and summary_table."""
    data = json.loads(Path(path).read_text())
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f"{path} is not a benchmark result file (a JSON list of rows)")
    return [Row.from_json(r) for r in rows]


def _finite(x: float | None) -> float | None:
    """JSON has no inf or NaN; a non-finite number is written as null (the row's error says why)."""
    return x if x is not None and math.isfinite(x) else None


def split_impl(split: Sequence[int]) -> str:
    return f"flashgen[{split_name(split)}]"


def finalize(rows: Sequence[Row], defaults: Mapping[Case, tuple[int, ...]] | None = None) -> list[Row]:
    """Add each case's headline `flashgen` row, the ratio to cuDNN and the error relative to ours. The headline is
    the split in `defaults` (what attention() runs for the case) where it was timed, so the reported number is what
    users get; else the fastest split that ran (splits asked for by hand, or rows from an older file)."""
    out: list[Row] = []
    for case in _unique(r.case for r in rows):
        group = [r for r in rows if r.case == case and not (r.impl == "flashgen" and r.ok)]
        tried = [r for r in group if r.impl.startswith("flashgen[")]
        splits = [r for r in tried if r.ok]
        default = (defaults or {}).get(case) or next(  # or the one an earlier finalize chose (idempotent)
            (r.pv_split for r in rows if r.case == case and r.impl == "flashgen" and r.split_choice == "default"), None)
        chosen = next((r for r in tried if r.pv_split == default), None) if default else None
        if chosen is not None or splits or tried:
            group = [r for r in group if r.impl != "flashgen"]  # an earlier headline (finalize is idempotent)
        if chosen is not None:
            group.insert(0, dataclasses.replace(chosen, impl="flashgen", split_choice="default"))
        elif splits:
            group.insert(0, dataclasses.replace(min(splits, key=lambda r: r.ms), impl="flashgen",
                                                split_choice="best"))
        elif tried:
            group.insert(0, Row("flashgen", case, error="no PV split ran; see the flashgen[...] rows"))
        cudnn = next((r for r in group if r.impl == "cudnn" and r.ok), None)
        cudnn_call = next((r for r in group if r.impl == "cudnn" and r.call_ok), None)
        ours = min((r.rel_err for r in splits if r.rel_err is not None and math.isfinite(r.rel_err)), default=None)
        for r in group:
            ratio = cudnn.ms / r.ms if cudnn and r.ok else None
            # Calls against cuDNN's call (its SDPA call timed the same way), never against its kernel-only ms.
            call_ratio = cudnn_call.call_ms / r.call_ms if cudnn_call and r.call_ok else None
            vs_ours = r.rel_err / ours if ours and r.rel_err is not None else None
            out.append(dataclasses.replace(r, ratio_to_cudnn=ratio, err_vs_ours=vs_ours, call_vs_cudnn=call_ratio))
    return out


def _unique(items: Iterable) -> list:
    return list(dict.fromkeys(items))


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


@dataclass(frozen=True)
class RatioSummary:
    impl: str
    ratios: tuple[float | None, ...]  # one per case, in case order
    geomean: float | None
    measured: int  # cases with a ratio


CALL_SUFFIX = " call"  # "flashgen call": the summary of flashgen's call_vs_cudnn, beside "flashgen" (the kernel's)
CALL_IMPLS = ("flashgen",)  # the implementations whose call is timed apart from their kernel


def ratio_summaries(rows: Sequence[Row]) -> list[RatioSummary]:
    """Per implementation (split rows left out): its ratio to cuDNN in each case, and their geomean; flashgen is
    followed by "flashgen call", the ratios of what users call (call_vs_cudnn; "-" in results without call_ms)."""
    cases = _unique(r.case for r in rows)
    impls = _unique(r.impl for r in rows if not r.impl.startswith("flashgen["))
    out = []

    def summary(name: str, by_case: dict) -> RatioSummary:
        ratios = tuple(by_case.get(c) for c in cases)
        return RatioSummary(name, ratios, geomean(ratios), sum(r is not None for r in ratios))

    for impl in impls:
        out.append(summary(impl, {r.case: r.ratio_to_cudnn for r in rows if r.impl == impl}))
        if impl in CALL_IMPLS:
            out.append(summary(impl + CALL_SUFFIX, {r.case: r.call_vs_cudnn for r in rows if r.impl == impl}))
    return out


# ms and vs cuDNN: the kernel (flashgen through prepare()); call ms and call vs cuDNN: what users call (flashgen
# through attention(); cuDNN's own SDPA call for the yardstick), "-" where no call was timed.
TABLE_HEADER = ("impl", "ms", "TFLOPS", "SNR dB", "rel err", "err vs ours", "vs cuDNN", "call ms", "call vs cuDNN")


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return format(x, spec) + suffix


def display_name(row: Row) -> str:
    if row.impl == "flashgen" and row.pv_split:
        return f"flashgen ({row.split_choice or 'best'}: {split_name(row.pv_split)})"
    if row.impl == "cudnn" and row.case.varlen:
        return "cudnn (padded" + ("" if row.case.causal else ", key-padding mask") + ")"
    return row.impl


def row_cells(row: Row) -> list[str]:
    name = display_name(row)
    blank = [""] * (len(TABLE_HEADER) - 2)
    if row.skipped:
        return [name, f"skipped: {row.skipped}", *blank]
    if row.error and row.ms is None:
        cells = [name, f"error: {_short(row.error)}", *blank]
        if row.call_ms is not None:  # the kernel's timing failed, the call's did not
            cells[-2:] = call_cells(row)
        return cells
    cells = [name, _fmt(row.ms, ".4f"), _fmt(row.tflops, ".1f"), _fmt(row.snr_db, ".1f"), _fmt(row.rel_err, ".2e"),
             _fmt(row.err_vs_ours, ".2f"), _fmt(row.ratio_to_cudnn, ".3f", "x"), *call_cells(row)]
    if row.error:
        cells[0] += f" (error: {_short(row.error)})"
    return cells


def call_cells(row: Row) -> list[str]:
    """The call ms and call vs cuDNN cells: the times, or why the call has none."""
    if row.call_error:
        return [f"error: {_short(row.call_error, 60)}", ""]
    return [_fmt(row.call_ms, ".4f"), _fmt(row.call_vs_cudnn, ".3f", "x")]


def _short(text: str, limit: int = 90) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def case_table(rows: Sequence[Row]) -> list[list[str]]:
    return [list(TABLE_HEADER)] + [row_cells(r) for r in rows]


def summary_table(rows: Sequence[Row]) -> list[list[str]]:
    """Shapes down, implementations across: each cell the ratio to cuDNN; the last line the geomean."""
    cases = _unique(r.case for r in rows)
    summaries = [s for s in ratio_summaries(rows) if s.impl != "cudnn"]
    cudnn = {r.case: r for r in rows if r.impl == "cudnn"}
    best = {r.case: r for r in rows if r.impl == "flashgen"}
    table = [["shape", "cuDNN ms", "cuDNN TFLOPS"] + [s.impl for s in summaries]]
    for i, case in enumerate(cases):
        ref = cudnn.get(case)
        shape = f"{case.label} (vs {case.yardstick})" if case.varlen else case.label
        line = [shape, _fmt(ref.ms if ref else None, ".4f"), _fmt(ref.tflops if ref else None, ".1f")]
        for s in summaries:
            cell = _fmt(s.ratios[i], ".3f", "x")
            if s.impl == "flashgen" and case in best and best[case].pv_split:
                cell += f" ({split_name(best[case].pv_split)})"
            line.append(cell)
        table.append(line)
    # One geomean per yardstick: ratios to cuDNN on the problem itself and ratios to cuDNN on a padded batch
    # (varlen: the padding is part of what they measure) are not averaged together.
    for name, varlen in (("geomean", False), ("geomean varlen (vs cudnn-padded)", True)):
        picked = [i for i, c in enumerate(cases) if c.varlen == varlen]
        if not picked:
            continue
        cells = []
        for s in summaries:
            ratios = [s.ratios[i] for i in picked]
            measured = sum(r is not None for r in ratios)
            cells.append(f"{_fmt(geomean(ratios), '.3f', 'x')} ({measured}/{len(picked)})")
        table.append([name, "", ""] + cells)
    return table


def render_text(table: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(table: Sequence[Sequence[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(table[0]), "|" + "|".join("---" for _ in table[0]) + "|"] + [line(r) for r in table[1:]])


# The run facts repeated in every JSON row, so each row stands alone; the Markdown file lists them all.
RUN_KEYS = ("gpu", "driver_version", "torch", "cudnn", "triton", "date_utc", "flashgen_commit", "flashgen_tree",
            "flashgen_source_sha256", "command", "call_rounds")


@dataclass(frozen=True)
class BenchResult:
    meta: dict
    rows: tuple[Row, ...]
    mode: str

    def to_json(self) -> list[dict]:
        """A list of rows (the issue's format); each row carries the run's GPU, driver, versions and date."""
        return with_run_keys(self.meta, [r.to_json() for r in self.rows])


def with_run_keys(meta: dict, rows: Iterable[dict]) -> list[dict]:
    """JSON rows, each followed by the run's facts (RUN_KEYS), so that every row stands alone."""
    run = {key: meta.get(key) for key in RUN_KEYS}
    return [{**row, **run} for row in rows]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def utc_stamp(now: _dt.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ")


CALL_NOTE = ("ms and vs cuDNN time the kernel (flashgen through codegen.api.prepare(), a launch only); call ms and "
             "call vs cuDNN time what users call (flashgen's codegen.attention(...), cuDNN's own SDPA call) with the "
             "host's time visible, in interleaved rounds (call_rounds in the metadata); \"flashgen call\" is "
             "flashgen's call vs cuDNN's call.")


def results_markdown(result: BenchResult) -> str:
    parts = [f"# flashgen bench ({result.mode})", ""]
    parts += [f"- {k}: {v}" for k, v in result.meta.items()]
    parts += ["", CALL_NOTE]
    if result.mode == "matrix" or len(_unique(r.case for r in result.rows)) > 1:
        parts += ["", "## Ratio to cuDNN (same run; > 1 is faster)", "", render_markdown(summary_table(result.rows))]
    for case in _unique(r.case for r in result.rows):
        parts += ["", f"## {case.label}", ""]
        if case.varlen:
            parts += [varlen_note(case), ""]
        parts += [render_markdown(case_table([r for r in result.rows if r.case == case]))]
    return "\n".join(parts) + "\n"


def varlen_note(case: Case) -> str:
    """What a varlen case's table measures, in one paragraph."""
    mask = "is_causal" if case.causal else "an additive key-padding mask"
    return (f"Sequence lengths (q = k): {', '.join(map(str, case.lens))}. TFLOPS count the useful work, "
            f"{case.flops / 1e12:.2f} TFLOP (sum of 4*H*L^2*D{', halved (causal)' if case.causal else ''}). "
            f"The yardstick `cudnn-padded` is cuDNN SDPA on the zero-padded ({case.batch}, {case.seq}) batch with "
            f"{mask}, which computes {1 / case.padding_efficiency:.2f}x that work (padding efficiency "
            f"{case.padding_efficiency:.0%}); its error is taken over the valid rows only. cudnn_varlen and "
            "flash_varlen are torch's own ragged cuDNN and FlashAttention-2 kernels.")


def save_results(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write <gpu-slug>-<UTC stamp>.json and .md; also h200-latest.* when the GPU is an H200. A matrix in
    cases.OWN_LATEST (fa4) has its name after the stamp and in the latest files: h200-latest-fa4.*."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result.meta.get("date_utc_stamp") or utc_stamp(_dt.datetime.now(_dt.timezone.utc))
    matrix = result.meta.get("matrix")
    tail = f"-{matrix}" if matrix in OWN_LATEST else ""
    stem = f"{slug(str(result.meta.get('gpu', 'unknown')))}-{stamp}{tail}"
    text_json = json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n"
    text_md = results_markdown(result)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(text_json)
    paths[1].write_text(text_md)
    if "h200" in str(result.meta.get("gpu", "")).lower():
        for src, suffix in zip(paths, (".json", ".md")):
            latest = out_dir / f"h200-latest{tail}{suffix}"
            shutil.copyfile(src, latest)
            paths.append(latest)
    return paths


def save_matrix_files(meta: dict, matrix: str, rows: list[dict], markdown: str, out_dir: Path) -> list[Path]:
    """The files of a matrix with its own rows (decode, backward): <gpu-slug>-<UTC stamp>-<matrix>.json (rows) and
    .md, and on an H200 also h200-latest-<matrix>.json and .md (the forward matrix's h200-latest.* are left alone)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = meta.get("date_utc_stamp") or utc_stamp(_dt.datetime.now(_dt.timezone.utc))
    stems = [f"{slug(str(meta.get('gpu', 'unknown')))}-{stamp}-{matrix}"]
    if "h200" in str(meta.get("gpu", "")).lower():
        stems.append(f"h200-latest-{matrix}")
    texts = (json.dumps(rows, indent=2, allow_nan=False) + "\n", markdown)
    paths = []
    for stem in stems:
        for suffix, text in zip((".json", ".md"), texts):
            paths.append(out_dir / f"{stem}{suffix}")
            paths[-1].write_text(text)
    return paths


COMMIT_ENV = "FLASHGEN_COMMIT"  # "<commit>:<tree>", from `git log -1 --format=%H:%T` where the copy was made


def _git(root: Path, *args: str, env: dict | None = None) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def working_tree(root: Path = ROOT) -> str | None:
    """The git tree hash of the files as they stand (tracked and untracked-not-ignored), built in a scratch
    index: it names the exact source even where .git is stale, as on the GPU machine's copy of the tree. None
    where root is not its checkout's top level (a copy in an ignored folder of another checkout): git would see
    that checkout's files, or none of these."""
    import tempfile

    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(root).resolve():
        return None
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        if _git(root, "add", "--all", ".", env=env) is None:
            return None
        return _git(root, "write-tree", env=env)


def git_commit(tree: str | None, root: Path = ROOT) -> str | None:
    """The commit whose tree is `tree` (the working tree): HEAD, or the commit that FLASHGEN_COMMIT declares
    with its tree (a copy's .git can lag its files); otherwise HEAD+dirty. None outside a git checkout."""
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return None
    if tree is not None and tree == _git(root, "rev-parse", "HEAD^{tree}"):
        return head
    declared = os.environ.get(COMMIT_ENV, "")
    commit, _, declared_tree = declared.partition(":")
    if tree is not None and declared_tree == tree and re.fullmatch(r"[0-9a-f]{40}", commit):
        return commit
    return head + "+dirty"


def source_sha256() -> str:
    """SHA-256 over the generator's sources and templates: names the kernel version where there is no .git
    (the GPU machine runs a copy of the working tree)."""
    import hashlib

    digest = hashlib.sha256()
    for folder in ("codegen", "layouts", "templates"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".j2", ".cuh", ".h"):
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def host_meta(command: str, now: _dt.datetime) -> dict:
    """What every result records, GPU or not."""
    tree = working_tree()
    meta = {
        "date_utc": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "date_utc_stamp": utc_stamp(now),
        "command": command,
        "flashgen_commit": git_commit(tree),
        "flashgen_tree": tree,
        "flashgen_source_sha256": source_sha256(),
        "python": platform.python_version(),
        "host_cpus": os.cpu_count(),
    }
    try:
        from codegen import cuda_env

        meta["nvrtc"] = ".".join(map(str, cuda_env.nvrtc_version()))
    except Exception as e:  # the report still stands without the toolchain version
        meta["nvrtc"] = f"unknown ({type(e).__name__})"
    return meta


def nvidia_smi_driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[0].strip() if res.returncode == 0 and lines else None


def gpu_meta(torch) -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver_version": nvidia_smi_driver(),
        "cuda_driver_api": _cuda_driver_api(),
        "cuda_runtime_torch": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    return meta


def _cuda_driver_api() -> str | None:
    """The driver's CUDA API version (e.g. 13.0), from cuda.bindings: what the installed driver supports."""
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        return f"{version // 1000}.{version % 1000 // 10}"
    except Exception:
        return None
