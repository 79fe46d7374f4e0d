"""`gen.py bench --matrix decode`: codegen.decode.attention_with_kvcache against cuDNN (and SDPA's flash and
efficient backends) on full KV caches, in the forward bench's interleaved rounds (gpu_run.measure_together).

Every sequence fills its cache (cache_seqlens = S_k for all, S_max = S_k) and nothing is masked: flashgen runs
with causal=False (S_q new tokens over a full cache), SDPA with is_causal=False on the (B, H, S, D) transposes of
the same tensors with enable_gqa=True, so both sides do the same work. A backend that refuses the views gets
contiguous copies, then copies with the K/V heads repeated (made outside the timed calls; the row's notes say
which); one that refuses them all is a skipped row with its reasons.

Per row: `ms` (kernel: flashgen's call with a preallocated out=, SDPA's call; GPU time behind a sleep), `call_ms`
(flashgen without out=, cuDNN's SDPA call, host time visible), `call_host_ms` (the host's own time a call in
those loops: where it reaches call_ms, the call is host-bound), `kv_gbs` (K and V bytes / ms), `copy_gbs` (this
run's device-to-device copy bandwidth, read + write), `ratio_to_cudnn`, `rel_err` (the first CHECK_SEQS
sequences against float64 codegen.check.kvcache_reference), `num_splits` (from flashgen's cached launcher).
Nothing here imports torch until run_decode runs.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .cases import BenchUsageError, Case
from .config import DECODE_CALL_ROUNDS, DECODE_IMPLS, DECODE_MATRIX, BenchConfig
from .report import TimedRow, _finite, _short, geomean, render_markdown, render_text, save_matrix_files, with_run_keys

GPU_MEMORY_BYTES = 139 * 2**30  # the H200's memory, for the matrix's plan (each case is checked again at run time)
MEMORY_HEADROOM_BYTES = 4 * 2**30  # left free beyond a case's estimate: SDPA and cuDNN workspaces, the allocator
ROTATE_BELOW_BYTES = 200 * 2**20  # as bench.inputs: rotate input sets until the working set is far past L2 (50 MB)
MAX_DECODE_SETS = 16  # B=1, S_k=2048 (8.4 MB a set) rotates 16 sets, 134 MB
CHECK_SEQS = 2  # rel_err covers the first CHECK_SEQS sequences (the float64 reference of B=128 x 32k would take long)
COPY_BYTES = 2 * 2**30  # copy_gbs: a 2 GiB tensor copied into another (2 GiB read and 2 GiB written a copy)
COPY_ITERS = 10
# The SDPA inputs, tried in this order: views (no copy), contiguous copies, contiguous copies with the K/V heads
# repeated to H (for a backend without GQA; it then reads H / H_kv times the K/V bytes).
SDPA_FORMS = ("views", "contiguous", "repeated")
SDPA_FORM_NOTES = {
    "views": "SDPA on (B,H,S,D) transposed views, enable_gqa=True",
    "contiguous": "SDPA on contiguous (B,H,S,D) copies (made outside the timing), enable_gqa=True; the views "
                  "were refused",
    "repeated": "SDPA on contiguous (B,H,S,D) copies with K/V heads repeated to H (no enable_gqa; it reads H/H_kv "
                "x the K/V bytes; kv_gbs counts the cache's bytes); views and GQA copies were refused",
}
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


@dataclass(frozen=True)
class DecodeCase:
    """q (batch, q_len, heads, dim) over full caches (batch, cache_len, kv_heads, dim); page_size 0 = dense."""

    batch: int
    q_len: int
    cache_len: int
    heads: int = 32
    kv_heads: int = 8
    dim: int = 128
    dtype: str = "bf16"
    page_size: int = 0

    def __post_init__(self):
        if min(self.batch, self.q_len, self.cache_len, self.heads, self.kv_heads, self.dim) < 1:
            raise BenchUsageError(f"every dimension of a decode case must be at least 1: {self}")
        if self.heads % self.kv_heads:
            raise BenchUsageError(f"heads {self.heads} must be a multiple of K/V heads {self.kv_heads}")

    @property
    def elem_bytes(self) -> int:
        return 2  # f16 and bf16

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V read: B * S_k * H_kv * D * 2 (K and V) * element bytes."""
        return self.batch * self.cache_len * self.kv_heads * self.dim * 2 * self.elem_bytes

    @property
    def q_bytes(self) -> int:
        """Bytes of q (and of o)."""
        return self.batch * self.q_len * self.heads * self.dim * self.elem_bytes

    @property
    def set_bytes(self) -> int:
        """One input set: q, o and both caches."""
        return 2 * self.q_bytes + self.kv_bytes

    @property
    def input_sets(self) -> int:
        """Sets rotated through so that a small cache is not timed out of L2 (as bench.inputs does)."""
        return max(1, min(MAX_DECODE_SETS, -(-ROTATE_BELOW_BYTES // self.set_bytes)))

    @property
    def check_seqs(self) -> int:
        return min(self.batch, CHECK_SEQS)

    @property
    def reference_bytes(self) -> int:
        """The float64 reference's peak, per checked sequence: K and V repeated to H heads, o, and slack."""
        per_seq = 2 * self.heads * self.cache_len * self.dim * 8 + self.heads * self.q_len * self.cache_len * 8 * 3
        return per_seq + self.check_seqs * self.q_len * self.heads * self.dim * 8

    @property
    def memory_bytes(self) -> int:
        """What the case holds at once, before any SDPA copies: the rotated sets (and their paged copies) and the
        reference's peak."""
        paged = self.input_sets * self.kv_bytes if self.page_size else 0
        return self.input_sets * self.set_bytes + paged + self.reference_bytes

    @property
    def bench_case(self) -> Case:
        """The forward Case that gpu_run.measure_together carries through its rows (S = the cache length)."""
        return Case(self.batch, self.cache_len, self.heads, self.dim, self.dtype, False, self.kv_heads)

    @property
    def label(self) -> str:
        page = f" page{self.page_size}" if self.page_size else ""
        return (f"B={self.batch} S_q={self.q_len} S_k={self.cache_len} H={self.heads}/{self.kv_heads} D={self.dim} "
                f"{self.dtype}{page}")

    def planned_skip(self, memory_bytes: int = GPU_MEMORY_BYTES) -> str | None:
        """Why the case is not run, known before the run: more memory than the GPU has."""
        need = self.memory_bytes + MEMORY_HEADROOM_BYTES
        if need > memory_bytes:
            return f"does not fit: needs {need / 2**30:.1f} GiB of {memory_bytes / 2**30:.0f} GiB"
        return None


def decode_cases() -> tuple[DecodeCase, ...]:
    """The issue's matrix, all bf16, H/H_kv 32/8 and D 128 unless said: S_q 1 at B 1, 8, 32, 128 x S_k 2k, 8k, 32k;
    S_q 4 and 8 at B 32 x 8k; H/H_kv 64/8, D 64 and D 256 at B 32 x 8k S_q 1; page sizes 16 and 128 at B 32 x 8k
    (flashgen on a paged copy of the caches, its pages shuffled; the peers on the dense caches), and 4 (a TMA load
    per page and column block: 64 a block of K, from the producer warp's lanes), the cost of small pages."""
    cases = [DecodeCase(b, 1, s) for b in (1, 8, 32, 128) for s in (2048, 8192, 32768)]
    cases += [DecodeCase(32, sq, 8192) for sq in (4, 8)]
    cases += [DecodeCase(32, 1, 8192, heads=64)]
    cases += [DecodeCase(32, 1, 8192, dim=d) for d in (64, 256)]
    cases += [DecodeCase(32, 1, 8192, page_size=p) for p in (16, 128, 4)]
    return tuple(cases)


# ---------------------------------------------------------------------------------------------- rows


# cuDNN's own paged read (bench.cudnn_paged) on the paged cases: what the pages' scatter costs the vendor's kernel too.
PAGED_YARDSTICK = "cudnn_paged"


@dataclass(frozen=True)
class DecodeRow(TimedRow):
    impl: str  # flashgen, cudnn, flash, efficient; cudnn_paged on paged cases
    case: DecodeCase
    ms: float | None = None
    call_ms: float | None = None
    rel_err: float | None = None
    snr_db: float | None = None
    call_rel_err: float | None = None
    num_splits: int | None = None
    iters: int | None = None
    error: str | None = None
    call_error: str | None = None
    skipped: str | None = None
    notes: str | None = None
    copy_gbs: float | None = None
    ratio_to_cudnn: float | None = None
    call_vs_cudnn: float | None = None
    ratio_to_cudnn_paged: float | None = None  # cuDNN's paged read's ms / this row's (paged cases)
    call_host_ms: float | None = None  # the host's own ms a call in the call_ms loops (gpu_run.time_call_samples)

    @property
    def kv_gbs(self) -> float | None:
        return kv_gbs(self.case, self.ms) if self.ok else None

    @property
    def kv_pct_of_copy(self) -> float | None:
        return pct_of(self.kv_gbs, self.copy_gbs)

    def to_json(self) -> dict:
        c = self.case
        return {
            "impl": self.impl, "B": c.batch, "S_q": c.q_len, "S_k": c.cache_len, "H": c.heads, "H_kv": c.kv_heads,
            "D": c.dim, "dtype": c.dtype, "page_size": c.page_size, "ms": _finite(self.ms),
            "call_ms": _finite(self.call_ms), "call_host_ms": _finite(self.call_host_ms),
            "kv_gbs": _finite(self.kv_gbs), "copy_gbs": _finite(self.copy_gbs),
            "kv_pct_of_copy": _finite(self.kv_pct_of_copy), "ratio_to_cudnn": _finite(self.ratio_to_cudnn),
            "call_vs_cudnn": _finite(self.call_vs_cudnn),
            "ratio_to_cudnn_paged": _finite(self.ratio_to_cudnn_paged), "rel_err": _finite(self.rel_err),
            "snr_db": _finite(self.snr_db), "call_rel_err": _finite(self.call_rel_err),
            "rel_err_seqs": c.check_seqs if self.rel_err is not None else None, "num_splits": self.num_splits,
            "iters": self.iters, "input_sets": c.input_sets, "kv_bytes": c.kv_bytes, "error": self.error,
            "call_error": self.call_error, "skipped": self.skipped, "notes": self.notes,
        }


def kv_gbs(case: DecodeCase, ms: float | None) -> float | None:
    """GB/s of K and V read: case.kv_bytes / (ms / 1000) / 1e9."""
    return case.kv_bytes / ms / 1e6 if ms and ms > 0 and math.isfinite(ms) else None


def copy_bandwidth_gbs(nbytes: int, ms: float) -> float | None:
    """A copy of nbytes reads and writes nbytes each: 2 * nbytes / time, in GB/s."""
    return 2 * nbytes / ms / 1e6 if ms and ms > 0 and math.isfinite(ms) else None


def pct_of(value: float | None, whole: float | None) -> float | None:
    return 100.0 * value / whole if value is not None and whole else None


# The keys of every JSON row, before the run keys (report.RUN_KEYS) each row also carries.
ROW_KEYS = tuple(DecodeRow(impl="cudnn", case=DecodeCase(1, 1, 1, 1, 1, 1)).to_json())


def finalize_decode(rows: Sequence[DecodeRow], copy_gbs: float | None) -> list[DecodeRow]:
    """Each row's copy_gbs, ratio_to_cudnn (cuDNN ms / its ms) and call_vs_cudnn (cuDNN call_ms / its call_ms),
    against the cuDNN row of its own case, and on a paged case ratio_to_cudnn_paged (cuDNN's paged read's ms / its
    ms)."""
    out = []
    for r in rows:
        cudnn = next((c for c in rows if c.case == r.case and c.impl == "cudnn"), None)
        paged = next((c for c in rows if c.case == r.case and c.impl == PAGED_YARDSTICK), None)
        ratio = cudnn.ms / r.ms if cudnn is not None and cudnn.ok and r.ok else None
        call = cudnn.call_ms / r.call_ms if cudnn is not None and cudnn.call_ok and r.call_ok else None
        to_paged = paged.ms / r.ms if paged is not None and paged.ok and r.ok else None
        out.append(dataclasses.replace(r, copy_gbs=copy_gbs, ratio_to_cudnn=ratio, call_vs_cudnn=call,
                                       ratio_to_cudnn_paged=to_paged))
    return out


def decode_impls(case: DecodeCase) -> tuple[str, ...]:
    """The implementations a case times: DECODE_IMPLS, and on a paged case cuDNN's paged read as well."""
    return DECODE_IMPLS + ((PAGED_YARDSTICK,) if case.page_size else ())


def skipped_rows(case: DecodeCase, reason: str, impls: Iterable[str] | None = None, *, error: bool = False):
    return [DecodeRow(i, case, **({"error": reason} if error else {"skipped": reason}))
            for i in (decode_impls(case) if impls is None else impls)]


# ---------------------------------------------------------------------------------------------- tables


TABLE_HEADER = ("case", "cuDNN ms", "cuDNN KV GB/s", "% copy", "flashgen ms", "flashgen vs cuDNN", "call vs cuDNN",
                "flash vs cuDNN", "efficient vs cuDNN", "vs cuDNN paged", "splits")


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec) + suffix


def _unique(items: Iterable) -> list:
    return list(dict.fromkeys(items))


def _status(r: DecodeRow | None) -> str | None:
    """'skipped' or 'error' for a row without a time, else None."""
    if r is None:
        return "-"
    if r.skipped:
        return "skipped"
    return "error" if r.ms is None else None


def decode_table(rows: Sequence[DecodeRow]) -> list[list[str]]:
    """One line per case: cuDNN's time, KV bandwidth and its share of the copy bandwidth, flashgen's time and
    ratios (kernel, call), the other backends' ratios, flashgen's ratio to cuDNN's paged read (paged cases) and
    flashgen's splits. A case skipped for every implementation with one reason is one line saying so."""
    table = [list(TABLE_HEADER)]
    for case in _unique(r.case for r in rows):
        group = [r for r in rows if r.case == case]
        reasons = {r.skipped for r in group}
        if len(reasons) == 1 and None not in reasons:
            table.append([case.label, f"skipped: {_short(reasons.pop(), 120)}"] + [""] * (len(TABLE_HEADER) - 2))
            continue
        by = {r.impl: r for r in group}
        cudnn, ours = by.get("cudnn"), by.get("flashgen")

        def ms(r: DecodeRow | None) -> str:
            return _status(r) or _fmt(r.ms, ".4f")

        def ratio(impl: str) -> str:
            r = by.get(impl)
            return _status(r) or ("error" if r.error else _fmt(r.ratio_to_cudnn, ".3f", "x"))

        table.append([
            case.label, ms(cudnn), _fmt(cudnn.kv_gbs if cudnn else None, ".0f"),
            _fmt(cudnn.kv_pct_of_copy if cudnn else None, ".0f", "%"), ms(ours), ratio("flashgen"),
            _fmt(ours.call_vs_cudnn if ours else None, ".3f", "x"), ratio("flash"), ratio("efficient"),
            _paged_cell(by) if case.page_size else "-",
            "-" if ours is None or ours.num_splits is None else str(ours.num_splits),
        ])
    return table


def _paged_cell(by: dict) -> str:
    """flashgen's ratio to cuDNN's paged read, or why there is none (cuDNN's paged read skipped or failed)."""
    ours, paged = by.get("flashgen"), by.get(PAGED_YARDSTICK)
    if ours is not None and ours.ratio_to_cudnn_paged is not None:
        return _fmt(ours.ratio_to_cudnn_paged, ".3f", "x")
    return _status(paged) or ("error" if paged.error else "-")


def summary_line(rows: Sequence[DecodeRow]) -> str:
    """The geomean of flashgen's ratio to cuDNN over the cases where both ran (of the cases that were not
    skipped), its call's, the copy bandwidth, and flashgen's ratio to cuDNN's paged read on each paged case that
    has one (or why cuDNN's paged read did not run)."""
    cases = _unique(r.case for r in rows if not r.skipped)
    ours = [r for r in rows if r.impl == "flashgen"]
    kernel = [r.ratio_to_cudnn for r in ours if r.ratio_to_cudnn is not None]
    calls = [r.call_vs_cudnn for r in ours if r.call_vs_cudnn is not None]
    copy = next((r.copy_gbs for r in rows if r.copy_gbs), None)
    paged = [f"page {r.case.page_size} {r.ratio_to_cudnn_paged:.3f}x" for r in ours
             if r.ratio_to_cudnn_paged is not None]
    ran = {r.case for r in ours if r.ok}  # a case skipped whole (it does not fit) is said in its own line
    missed = [r.skipped or r.error for r in rows
              if r.impl == PAGED_YARDSTICK and r.case in ran and not r.ok and (r.skipped or r.error)]
    return (f"geomean flashgen vs cuDNN: {_fmt(geomean(kernel), '.3f', 'x')} over {len(kernel)}/{len(cases)} cases "
            f"(call vs cuDNN's call: {_fmt(geomean(calls), '.3f', 'x')} over {len(calls)}); copy bandwidth "
            f"{_fmt(copy, '.0f', ' GB/s')} (read + write bytes / time)"
            + (f"; flashgen vs cuDNN's paged read: {', '.join(paged)}" if paged else "")
            + (f"; cuDNN's paged read: {_short(missed[0], 120)}" if missed and not paged else ""))


DETAIL_HEADER = ("impl", "ms", "call ms", "host ms", "KV GB/s", "% copy", "vs cuDNN", "call vs cuDNN", "rel err",
                 "splits", "notes")


def detail_table(rows: Sequence[DecodeRow]) -> list[list[str]]:
    table = [list(DETAIL_HEADER)]
    for r in rows:
        if r.skipped or (r.error and r.ms is None):
            table.append([r.impl, f"{'skipped' if r.skipped else 'error'}: {_short(r.skipped or r.error, 200)}"]
                         + [""] * (len(DETAIL_HEADER) - 2))
            continue
        call = f"error: {_short(r.call_error, 60)}" if r.call_error else _fmt(r.call_ms, ".4f")
        table.append([r.impl, _fmt(r.ms, ".4f"), call, _fmt(r.call_host_ms, ".4f"), _fmt(r.kv_gbs, ".0f"),
                      _fmt(r.kv_pct_of_copy, ".0f", "%"), _fmt(r.ratio_to_cudnn, ".3f", "x"),
                      _fmt(r.call_vs_cudnn, ".3f", "x"), _fmt(r.rel_err, ".2e"),
                      "-" if r.num_splits is None else str(r.num_splits),
                      (r.notes or "") + (f" (error: {_short(r.error)})" if r.error else "")])
    return table


CALL_NOTE = ("ms: the kernel's GPU time behind a sleep (flashgen: attention_with_kvcache(..., out=o) with o made "
             "once; SDPA: its call); call ms: the user's call with host time visible (flashgen without out=, so o "
             "is allocated; cuDNN: its SDPA call), in the same interleaved rounds; host ms: the host's own time a "
             "call in those loops (where it reaches call ms, the call is host-bound). KV GB/s = B*S_k*H_kv*D*2*2 "
             "bytes / ms; % copy = of this run's device-to-device copy bandwidth (read + write bytes / time). "
             f"rel err: the first {CHECK_SEQS} sequences against float64 codegen.check.kvcache_reference.")


def decode_markdown(meta: dict, rows: Sequence[DecodeRow]) -> str:
    parts = ["# flashgen bench (decode)", ""]
    parts += [f"- {k}: {v}" for k, v in meta.items()]
    parts += ["", CALL_NOTE, "", "## Ratio to cuDNN (same run; > 1 is faster)", "",
              render_markdown(decode_table(rows)), "", summary_line(rows)]
    for case in _unique(r.case for r in rows):
        parts += ["", f"## {case.label}", "", render_markdown(detail_table([r for r in rows if r.case == case]))]
    return "\n".join(parts) + "\n"


def decode_json(meta: dict, rows: Sequence[DecodeRow]) -> list[dict]:
    return with_run_keys(meta, (r.to_json() for r in rows))


def save_decode(meta: dict, rows: Sequence[DecodeRow], out_dir: Path) -> list[Path]:
    """<gpu-slug>-<UTC stamp>-decode.json and .md; on an H200 also h200-latest-decode.* (report.save_matrix_files)."""
    return save_matrix_files(meta, DECODE_MATRIX, decode_json(meta, rows), decode_markdown(meta, rows), out_dir)


# ---------------------------------------------------------------------------------------------- GPU side


def _first_seqs(out, inputs):
    """The checked sequences of an output (B, S_q, H, D): the reference covers the first CHECK_SEQS."""
    return out[: inputs.ref.shape[0]]


def make_decode_inputs(torch, case: DecodeCase, device: str = "cuda"):
    """bench.inputs.Inputs whose sets are (q, k_cache, v_cache, cache_seqlens), the caches full (S_max = S_k =
    every cache_seqlens), and whose ref is the float64 o of the first set's first check_seqs sequences."""
    from codegen.check import kvcache_reference, torch_dtype

    from .inputs import Inputs

    dtype = torch_dtype(case.dtype)
    q_shape = (case.batch, case.q_len, case.heads, case.dim)
    kv_shape = (case.batch, case.cache_len, case.kv_heads, case.dim)
    lens = torch.full((case.batch,), case.cache_len, dtype=torch.int32, device=device)
    sets = tuple((torch.randn(q_shape, dtype=dtype, device=device), torch.randn(kv_shape, dtype=dtype, device=device),
                  torch.randn(kv_shape, dtype=dtype, device=device), lens) for _ in range(case.input_sets))
    n = case.check_seqs
    q, k, v, _ = sets[0]
    ref = kvcache_reference(q[:n], k[:n], v[:n], [case.cache_len] * n, causal=False)[0]
    return Inputs(sets, ref)


def _free_bytes(torch) -> int:
    """Free device memory, counting what torch's allocator holds unused."""
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def _refusal(e: Exception, caught) -> str:
    """A backend's refusal: the error's first line and the warnings that say why (SDPA warns the reasons)."""
    why = [" ".join(str(w.message).split()) for w in caught]
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return _short(text + (" (" + "; ".join(_unique(why)) + ")" if why else ""), 400)


def _sdpa_tensors(torch, sets, case: DecodeCase, form: str) -> list[tuple]:
    """(q, k, v) in (B, H, S, D) for each set, in one of SDPA_FORMS; Unavailable when copies do not fit."""
    from .peers import Unavailable

    if form == "views":
        return [tuple(t.transpose(1, 2) for t in s[:3]) for s in sets]
    kv = case.kv_bytes * (case.group if form == "repeated" else 1)
    need = len(sets) * (case.q_bytes + kv) + MEMORY_HEADROOM_BYTES
    free = _free_bytes(torch)
    if need > free:
        raise Unavailable(f"{form} copies need {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
    out = []
    for q, k, v, _ in sets:
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        if form == "repeated":
            k, v = (t.repeat_interleave(case.group, dim=1) for t in (k, v))
        out.append((q, k, v))
    return out


def _sdpa_form(torch, inputs, case: DecodeCase):
    """The first of SDPA_FORMS the active backend takes: (form, one call per set). Each form is tried with one
    untimed call on the first set; a RuntimeError (the backend refuses) moves to the next. Unavailable, with
    every form's reason, when none is taken."""
    from .peers import Unavailable

    sdpa = torch.nn.functional.scaled_dot_product_attention
    reasons = []
    for form in SDPA_FORMS:
        if form == "repeated" and not case.gqa:
            continue
        try:
            tensors = _sdpa_tensors(torch, inputs.sets, case, form)
        except Unavailable as e:
            reasons.append((form, str(e)))
            continue
        kwargs = {"enable_gqa": True} if case.gqa and form != "repeated" else {}
        calls = [lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=False, **kwargs).transpose(1, 2)
                 for q, k, v in tensors]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                calls[0]()
            except RuntimeError as e:
                reasons.append((form, _refusal(e, caught)))
                tensors = calls = None  # free the refused copies now
                gc.collect()
                torch.cuda.empty_cache()
                continue
        return form, calls
    raise Unavailable(_joined_reasons(reasons))


def _joined_reasons(reasons: Sequence[tuple[str, str]]) -> str:
    """'form1, form2: reason; form3: other reason': the forms that failed alike share their reason."""
    by_reason: dict[str, list[str]] = {}
    for form, why in reasons:
        by_reason.setdefault(why, []).append(form)
    return "; ".join(f"{', '.join(forms)}: {why}" for why, forms in by_reason.items())


def sdpa_peer(impl: str, case: DecodeCase, forms: dict):
    """A bench.peers.Peer for one SDPA backend; `forms[impl]` records the form it took. cuDNN is the yardstick
    and has its call timed too (the same calls)."""
    from .peers import Peer, _sdpa_backend

    made: dict = {}

    def make(torch, inputs, _case):
        if "calls" not in made:
            forms[impl], made["calls"] = _sdpa_form(torch, inputs, case)
        return made["calls"]

    yardstick = impl == "cudnn"
    return Peer(impl, make, _sdpa_backend(SDPA_BACKENDS[impl]), output=_first_seqs,
                call=make if yardstick else None, yardstick=yardstick)


def paged_copy(torch, k, page_size: int, seed: int = 0, span: int = 0):
    """A full dense cache (B, S, H_kv, D) as a paged one: (pages, page_table). Its pages are shuffled within runs of
    `span` pool pages (0: over the whole pool; 1: in key order, the dense cache's bytes where they were, to tell the
    pages' scatter from the kernel; between: how far the scatter reaches, e.g. within a 2 MB translation page)."""
    batch, length = k.shape[:2]
    per = length // page_size
    total = batch * per
    span = span or total
    if not (span > 0 and total % span == 0):
        raise ValueError(f"span {span} must divide the pool's {total} pages")
    gen = torch.Generator().manual_seed(seed)
    order = (torch.arange(0, total, span).repeat_interleave(span)
             + torch.cat([torch.randperm(span, generator=gen) for _ in range(total // span)]))
    table = order.view(batch, per).to(torch.int32).to(k.device)
    pages = torch.empty((batch * per, page_size) + tuple(k.shape[2:]), dtype=k.dtype, device=k.device)
    pages[table.flatten().long()] = k.reshape(batch * per, page_size, *k.shape[2:])
    return pages, table


def cache_sets(page_size: int = 0):
    """(torch, inputs) -> each set as (q, k, v, lengths, page_table), made once: with a page size, a paged copy of
    the set's caches (the pages shuffled) that flashgen and cuDNN's paged read share; else the dense caches."""
    made: dict = {}

    def caches(torch, inputs):
        if "sets" not in made:
            made["sets"] = []
            for q, k, v, lens in inputs.sets:
                if page_size:
                    (pk, table), (pv, _) = paged_copy(torch, k, page_size), paged_copy(torch, v, page_size)
                    made["sets"].append((q, pk, pv, lens, table))
                else:
                    made["sets"].append((q, k, v, lens, None))
        return made["sets"]

    return caches


def cudnn_paged_peer(caches):
    """cuDNN's own paged read (bench.cudnn_paged) of the paged copies flashgen reads: skipped, with the reason, where
    the cuDNN frontend is not installed or refuses the graph."""
    from .cudnn_paged import paged_sdpa
    from .peers import Peer

    made: dict = {}

    def make(torch, inputs, _case):
        if "calls" not in made:
            runs = [paged_sdpa(torch, q, k, v, table, lens) for q, k, v, lens, table in caches(torch, inputs)]
            made["calls"] = [lambda run=run, o=o: (run(), o)[1] for run, o in runs]
        return made["calls"]

    return Peer(PAGED_YARDSTICK, make, output=_first_seqs)


def flashgen_peer(caches):
    """flashgen: the kernel is attention_with_kvcache(..., out=o) with o made once per set; the call is the same
    without out= (o allocated per call). It reads `caches` (cache_sets): on a paged case a paged copy of each set's
    caches, while the SDPA peers read the dense caches: the same keys and values."""
    from .peers import Peer

    def make(with_out: bool):
        def calls(torch, inputs, _case):
            from codegen.decode import attention_with_kvcache as fn

            out = []
            for q, k, v, lens, table in caches(torch, inputs):
                if with_out:
                    o = torch.empty_like(q)
                    out.append(lambda q=q, k=k, v=v, lens=lens, t=table, o=o: fn(q, k, v, lens, causal=False,
                                                                               page_table=t, out=o))
                else:
                    out.append(lambda q=q, k=k, v=v, lens=lens, t=table: fn(q, k, v, lens, causal=False, page_table=t))
            return out

        return calls

    return Peer("flashgen", make(True), output=_first_seqs, call=make(False))


def launcher_splits() -> int | None:
    """num_splits of the one launcher attention_with_kvcache cached during this case (bench_decode_case empties
    its cache first: the flashgen calls of a case, with out= and without, share one); None if not exactly one."""
    from codegen import decode

    found = list(decode._LAUNCHERS.values())
    return getattr(found[0], "splits", None) if len(found) == 1 else None


def measure_copy(torch, nbytes: int = COPY_BYTES, iters: int = COPY_ITERS) -> tuple[float | None, float]:
    """(GB/s, ms): the median time of copying an nbytes tensor into another, read + write bytes over time."""
    from codegen.check import time_gpu_samples

    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = statistics.median(time_gpu_samples(torch, lambda: dst.copy_(src), warmup=2, iters=iters))
    src = dst = None  # freed before the cases
    torch.cuda.empty_cache()
    return copy_bandwidth_gbs(nbytes, ms), ms


def _notes(*parts: str | None) -> str | None:
    text = "; ".join(p for p in parts if p)
    return text or None


def bench_decode_case(torch, case: DecodeCase, config: BenchConfig, progress) -> tuple[list[DecodeRow], str | None]:
    """Every implementation on one case, in gpu_run.measure_together's interleaved rounds; (rows, why the CUDA
    context died, or None)."""
    from codegen import decode

    from .gpu_run import _ContextLost, cuda_fault, measure_together

    need, free = case.memory_bytes + MEMORY_HEADROOM_BYTES, _free_bytes(torch)
    if need > free:
        reason = f"does not fit: needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        progress(f"  skipped: {reason}")
        return skipped_rows(case, reason), None
    try:
        inputs = make_decode_inputs(torch, case)
    except Exception as e:
        return skipped_rows(case, f"inputs: {type(e).__name__}: {e}", error=True), cuda_fault(torch)
    forms: dict = {}
    entries = [(sdpa_peer(impl, case, forms), None) for impl in DECODE_IMPLS if impl in SDPA_BACKENDS]
    caches = cache_sets(case.page_size)
    if case.page_size:
        entries += [(cudnn_paged_peer(caches), None)]
    entries += [(flashgen_peer(caches), None)]  # last: if ours faults the context, the peers are measured
    progress(f"  {case.input_sets} input set(s) of {case.set_bytes / 2**20:.1f} MiB; {len(entries)} implementations, "
             "timed in interleaved rounds (round_orders: each follows each other equally often)")
    fault = None
    decode._LAUNCHERS.clear()  # so that the case's own launcher is the one left (launcher_splits)
    try:
        # Decode's calls are timed right after their kernels, whatever the config was built with.
        measured = measure_together(torch, entries, case.bench_case, inputs,
                                    dataclasses.replace(config, call_rounds=DECODE_CALL_ROUNDS), check_fault=True)
    except _ContextLost as e:
        measured, fault = e.rows, e.reason
    check = f"rel_err: first {case.check_seqs} of {case.batch} sequences vs float64 kvcache_reference"
    rows = []
    for r in measured:
        splits, extra = None, None
        if r.impl == "flashgen":
            splits = launcher_splits() if r.ms is not None or r.call_ms is not None else None
            maps = getattr(decode, "MAPS_PER_CACHE", None)
            if maps is not None and case.input_sets > maps:
                extra = (f"{case.input_sets} input sets rotate past the launcher's {maps} tensor maps per cache: "
                         "each call re-encodes them (host time: in call_ms, not ms)")
        else:
            extra = SDPA_FORM_NOTES.get(forms.get(r.impl))
        rows.append(DecodeRow(r.impl, case, ms=r.ms, call_ms=r.call_ms, call_host_ms=r.call_host_ms,
                              rel_err=r.rel_err, snr_db=r.snr_db, call_rel_err=r.call_rel_err, num_splits=splits,
                              iters=r.iters, error=r.error, call_error=r.call_error, skipped=r.skipped,
                              notes=None if r.skipped else _notes(check if r.rel_err is not None else None, extra)))
        progress(f"  {r.impl:<10} " + (f"{r.ms:.4f} ms, rel err {r.rel_err:.2e}" if r.ms is not None
                                       else _short(r.skipped or r.error or "", 200))
                 + (f"; call {r.call_ms:.4f} ms" if r.call_ms is not None else "")
                 + (f"; call: {_short(r.call_error, 60)}" if r.call_error else "")
                 + (f"; splits {splits}" if splits is not None else ""))
    del measured, entries, inputs
    if not fault:
        gc.collect()
        torch.cuda.empty_cache()
    return rows, fault


def run_decode(config: BenchConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)):
    """(meta, finalized rows) of the decode matrix."""
    from .gpu_run import cuda_torch, run_meta

    torch = cuda_torch()
    meta = run_meta(torch, config, DECODE_MATRIX,
                    call_timing="call_ms: attention_with_kvcache(...) without out= (cuDNN: its SDPA call) by events "
                                "between consecutive calls, no GPU sleep ahead; ms: with out=, behind a GPU sleep",
                    rel_err_check=f"the first {CHECK_SEQS} sequences of the first input set, vs float64 "
                                  "codegen.check.kvcache_reference")
    torch.manual_seed(config.seed)
    progress(f"copy bandwidth: {COPY_BYTES / 2**30:.0f} GiB device-to-device copy, median of {COPY_ITERS}")
    copy, copy_ms = measure_copy(torch)
    meta.update(copy_gbs=copy, copy_bytes=COPY_BYTES, copy_ms=copy_ms)
    progress(f"  {_fmt(copy, '.0f')} GB/s ({copy_ms:.3f} ms)")
    total = _free_bytes(torch)
    cases = decode_cases()
    rows: list[DecodeRow] = []
    fault = None
    for i, case in enumerate(cases):
        progress(f"[{i + 1}/{len(cases)}] {case.label}")
        if fault:
            rows += skipped_rows(case, fault, error=True)
            continue
        skip = case.planned_skip(min(total, GPU_MEMORY_BYTES))
        if skip:
            progress(f"  skipped: {skip}")
            rows += skipped_rows(case, skip)
            continue
        case_rows, fault = bench_decode_case(torch, case, config, progress)
        rows += case_rows
    return meta, finalize_decode(rows, copy)


def decode_main(config: BenchConfig) -> int:
    try:
        meta, rows = run_decode(config)
    except (ImportError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.out is not None:
        for path in save_decode(meta, rows, config.out):
            print(f"wrote {path}", file=sys.stderr)
    print()
    print(f"decode: attention_with_kvcache vs cuDNN (SDPA), full caches, no mask, on {meta.get('gpu')}:")
    print(render_text(decode_table(rows)))
    print(summary_line(rows))
    return 0 if any(r.impl == "flashgen" and r.ok for r in rows) else 1
