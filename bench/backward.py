"""`gen.py bench --matrix backward`: flashgen's backward pass against SDPA's cuDNN and flash backends, in the forward
bench's interleaved rounds (gpu_run.measure_together), one run for every implementation of a case.

Each implementation is two entries of the same rounds: its backward alone and its forward + backward. Per row:
`ms`, the backward alone (flashgen: codegen.backward.attention_backward on an o and lse saved once; SDPA: .backward()
on a graph retained from one forward; GPU time behind a sleep), `call_ms` (flashgen's o.backward(do) through
autograd, what users call, and cuDNN's .backward(), with host time visible), `fwd_bwd_ms` (a forward and its
backward, every implementation), TFLOPS (the backward counts 2.5 times the forward's FLOPs, DESIGN.md section 7),
the ratios to cuDNN, and rel_err of dq, dk and dv on the first batch entry against float64
codegen.check.reference_backward. A backend that refuses a case (flash under grouped-query heads, say) gives a
skipped row with SDPA's reasons. Nothing here imports torch until run_backward runs.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .cases import Case
from .config import BACKWARD_IMPLS, BACKWARD_MATRIX, BenchConfig
from .decode import SDPA_BACKENDS, _fmt, _refusal, _unique
from .report import TimedRow, _finite, _short, geomean, render_markdown, render_text, save_matrix_files, with_run_keys

BACKWARD_FLOPS = 2.5  # the backward's FLOPs per forward FLOP (DESIGN.md section 7): 10 * B * H * S_q * S_k * D
CHECK_BATCHES = 1  # rel_err covers the first batch entry (the float64 reference of all of them would take long)
FWD_BWD = " fwd+bwd"  # the name suffix of an implementation's forward + backward entry in measure_together


def backward_cases() -> tuple[Case, ...]:
    """Issue 21's matrix, bf16 unless said: (4,4096,32,128) and (1,16384,16,128) non-causal and causal,
    (16,1024,32,64), (2,4096,16,256), (1,8192,32,128) over 8 K/V heads causal, and (4,4096,32,128) f16."""
    return (
        Case(4, 4096, 32, 128, "bf16"), Case(4, 4096, 32, 128, "bf16", True),
        Case(1, 16384, 16, 128, "bf16"), Case(1, 16384, 16, 128, "bf16", True),
        Case(16, 1024, 32, 64, "bf16"), Case(2, 4096, 16, 256, "bf16"),
        Case(1, 8192, 32, 128, "bf16", True, kv_heads=8),
        Case(4, 4096, 32, 128, "f16"),
    )


def backward_flops(case: Case) -> float:
    """The backward's FLOPs: 2.5 x the forward's (case.flops: 4 * B * H * S_q * S_k * D, halved for causal)."""
    return BACKWARD_FLOPS * case.flops


def fwd_bwd_flops(case: Case) -> float:
    return (1 + BACKWARD_FLOPS) * case.flops


def tflops(flops: float, ms: float | None) -> float | None:
    return flops / ms / 1e9 if ms and ms > 0 and math.isfinite(ms) else None


# ---------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class BackwardRow(TimedRow):
    impl: str  # flashgen, cudnn, flash
    case: Case
    ms: float | None = None
    call_ms: float | None = None
    fwd_bwd_ms: float | None = None
    rel_err: float | None = None  # the worst of rel_err_dq, rel_err_dk, rel_err_dv
    rel_err_dq: float | None = None
    rel_err_dk: float | None = None
    rel_err_dv: float | None = None
    call_rel_err: float | None = None  # of dq, dk, dv together
    iters: int | None = None
    error: str | None = None
    call_error: str | None = None
    fwd_bwd_error: str | None = None
    skipped: str | None = None
    notes: str | None = None
    ratio_to_cudnn: float | None = None
    call_vs_cudnn: float | None = None
    fwd_bwd_vs_cudnn: float | None = None

    @property
    def fwd_bwd_ok(self) -> bool:
        return self.fwd_bwd_ms is not None and self.fwd_bwd_error is None and self.skipped is None

    @property
    def tflops(self) -> float | None:
        return tflops(backward_flops(self.case), self.ms)

    @property
    def fwd_bwd_tflops(self) -> float | None:
        return tflops(fwd_bwd_flops(self.case), self.fwd_bwd_ms)

    def to_json(self) -> dict:
        c = self.case
        err = self.rel_err
        snr = -20.0 * math.log10(err) if err is not None and 0 < err < math.inf else None
        return {
            "impl": self.impl, "B": c.batch, "S": c.seq, "S_k": c.seq_k, "H": c.heads, "H_kv": c.kv_heads, "D": c.dim,
            "causal": c.causal, "dtype": c.dtype, "ms": _finite(self.ms), "tflops": _finite(self.tflops),
            "call_ms": _finite(self.call_ms), "fwd_bwd_ms": _finite(self.fwd_bwd_ms),
            "fwd_bwd_tflops": _finite(self.fwd_bwd_tflops), "ratio_to_cudnn": _finite(self.ratio_to_cudnn),
            "call_vs_cudnn": _finite(self.call_vs_cudnn), "fwd_bwd_vs_cudnn": _finite(self.fwd_bwd_vs_cudnn),
            "snr_db": _finite(snr), "rel_err": _finite(err), "rel_err_dq": _finite(self.rel_err_dq),
            "rel_err_dk": _finite(self.rel_err_dk), "rel_err_dv": _finite(self.rel_err_dv),
            "call_rel_err": _finite(self.call_rel_err),
            "rel_err_batches": min(c.batch, CHECK_BATCHES) if err is not None else None, "iters": self.iters,
            "flops": backward_flops(c), "fwd_bwd_flops": fwd_bwd_flops(c), "error": self.error,
            "call_error": self.call_error, "fwd_bwd_error": self.fwd_bwd_error, "skipped": self.skipped,
            "notes": self.notes,
        }


# The keys of every JSON row, before the run keys (report.RUN_KEYS) each row also carries.
ROW_KEYS = tuple(BackwardRow(impl="cudnn", case=Case(1, 1, 1, 1)).to_json())


def finalize_backward(rows: Sequence[BackwardRow]) -> list[BackwardRow]:
    """Each row's ratios against the cuDNN row of its case: ratio_to_cudnn (cuDNN ms / its ms), call_vs_cudnn (cuDNN
    call_ms / its call_ms) and fwd_bwd_vs_cudnn (cuDNN fwd_bwd_ms / its fwd_bwd_ms)."""
    out = []
    for r in rows:
        cudnn = next((c for c in rows if c.case == r.case and c.impl == "cudnn"), None)
        out.append(dataclasses.replace(
            r,
            ratio_to_cudnn=cudnn.ms / r.ms if cudnn is not None and cudnn.ok and r.ok else None,
            call_vs_cudnn=cudnn.call_ms / r.call_ms if cudnn is not None and cudnn.call_ok and r.call_ok else None,
            fwd_bwd_vs_cudnn=(cudnn.fwd_bwd_ms / r.fwd_bwd_ms if cudnn is not None and cudnn.fwd_bwd_ok
                              and r.fwd_bwd_ok else None)))
    return out


def skipped_rows(case: Case, reason: str, impls: Iterable[str] = BACKWARD_IMPLS, *, error: bool = False):
    return [BackwardRow(i, case, **({"error": reason} if error else {"skipped": reason})) for i in impls]


def merge_rows(case: Case, measured, errors: dict) -> list[BackwardRow]:
    """One BackwardRow per implementation from measure_together's rows (report.Row): its backward entry (ms,
    call_ms) and its FWD_BWD entry (fwd_bwd_ms), with the per-gradient errors GradCheck recorded. A forward +
    backward whose gradients are more than gpu_run.CALL_ERR_FACTOR times the backward's error off gets
    fwd_bwd_error, not a time that counts."""
    from .gpu_run import CALL_ERR_FACTOR, CALL_ERR_SLACK

    by = {r.impl: r for r in measured}
    rows = []
    for r in measured:
        if r.impl.endswith(FWD_BWD):
            continue
        both = by.get(r.impl + FWD_BWD)
        grads = errors.get(r.impl)
        fwd_bwd_error = None
        if both is None:
            fwd_bwd_error = "not run"
        elif both.skipped or both.error:
            fwd_bwd_error = both.skipped or both.error
        elif both.rel_err is not None and r.rel_err is not None and math.isfinite(r.rel_err) and \
                both.rel_err > CALL_ERR_FACTOR * r.rel_err + CALL_ERR_SLACK:
            fwd_bwd_error = f"wrong gradients: rel err {both.rel_err:.2e}, the backward's {r.rel_err:.2e}"
        rows.append(BackwardRow(
            r.impl, case, ms=r.ms, call_ms=r.call_ms, fwd_bwd_ms=None if both is None else both.ms,
            rel_err=max(grads) if grads else r.rel_err, rel_err_dq=grads[0] if grads else None,
            rel_err_dk=grads[1] if grads else None, rel_err_dv=grads[2] if grads else None,
            call_rel_err=r.call_rel_err, iters=r.iters, error=r.error, call_error=r.call_error,
            fwd_bwd_error=None if r.skipped else fwd_bwd_error, skipped=r.skipped,
            notes=None if r.skipped else NOTES.get(r.impl)))
    return rows


NOTES = {
    "flashgen": "ms: attention_backward(q, k, v, o, lse, do) on o, lse saved once; call ms: o.backward(do) through "
                "autograd on a retained graph",
    "cudnn": "SDPA CUDNN_ATTENTION on (B,H,S,D) transposed views; ms and call ms: .backward() on a retained graph",
    "flash": "SDPA FLASH_ATTENTION on (B,H,S,D) transposed views; ms: .backward() on a retained graph",
}


# ---------------------------------------------------------------------------------------------- tables


TABLE_HEADER = ("case", "cuDNN ms", "cuDNN TFLOPS", "flashgen ms", "flashgen TFLOPS", "vs cuDNN", "call vs cuDNN",
                "fwd+bwd vs cuDNN", "flash vs cuDNN", "flash fwd+bwd vs cuDNN", "flashgen rel err", "cuDNN rel err")


def _status(r: BackwardRow | None) -> str | None:
    """'-' for no row, 'skipped' or 'error' for a row without a time, else None."""
    if r is None:
        return "-"
    if r.skipped:
        return "skipped"
    return "error" if r.ms is None else None


def backward_table(rows: Sequence[BackwardRow]) -> list[list[str]]:
    """One line per case: cuDNN's backward time and TFLOPS, flashgen's and its ratios (backward, call, forward +
    backward), flash's ratios, flashgen's and cuDNN's worst gradient error."""
    table = [list(TABLE_HEADER)]
    for case in _unique(r.case for r in rows):
        by = {r.impl: r for r in rows if r.case == case}
        cudnn, ours, flash = by.get("cudnn"), by.get("flashgen"), by.get("flash")

        def ms(r: BackwardRow | None) -> str:
            return _status(r) or _fmt(r.ms, ".3f")

        def ratio(r: BackwardRow | None, field: str) -> str:
            return _status(r) or ("error" if r.error and field == "ratio_to_cudnn" else
                                  _fmt(getattr(r, field), ".3f", "x"))

        table.append([
            case.label, ms(cudnn), _fmt(cudnn.tflops if cudnn else None, ".0f"), ms(ours),
            _fmt(ours.tflops if ours else None, ".0f"), ratio(ours, "ratio_to_cudnn"), ratio(ours, "call_vs_cudnn"),
            ratio(ours, "fwd_bwd_vs_cudnn"), ratio(flash, "ratio_to_cudnn"), ratio(flash, "fwd_bwd_vs_cudnn"),
            _fmt(ours.rel_err if ours else None, ".2e"), _fmt(cudnn.rel_err if cudnn else None, ".2e"),
        ])
    return table


def summary_line(rows: Sequence[BackwardRow]) -> str:
    """The geomeans of flashgen's ratios to cuDNN (backward, call, forward + backward) and of flash's, over the
    cases where both ran."""
    cases = _unique(r.case for r in rows)

    def mean(impl: str, field: str) -> str:
        ratios = [getattr(r, field) for r in rows if r.impl == impl and getattr(r, field) is not None]
        return f"{_fmt(geomean(ratios), '.3f', 'x')} over {len(ratios)}/{len(cases)}"

    return (f"geomean flashgen vs cuDNN, backward: {mean('flashgen', 'ratio_to_cudnn')} cases (call: "
            f"{mean('flashgen', 'call_vs_cudnn')}; forward + backward: {mean('flashgen', 'fwd_bwd_vs_cudnn')}); "
            f"flash: {mean('flash', 'ratio_to_cudnn')} (forward + backward: {mean('flash', 'fwd_bwd_vs_cudnn')})")


DETAIL_HEADER = ("impl", "ms", "TFLOPS", "call ms", "fwd+bwd ms", "fwd+bwd TFLOPS", "vs cuDNN", "call vs cuDNN",
                 "fwd+bwd vs cuDNN", "rel err dq", "rel err dk", "rel err dv", "notes")


def detail_table(rows: Sequence[BackwardRow]) -> list[list[str]]:
    table = [list(DETAIL_HEADER)]
    for r in rows:
        if r.skipped or (r.error and r.ms is None):
            table.append([r.impl, f"{'skipped' if r.skipped else 'error'}: {_short(r.skipped or r.error, 200)}"]
                         + [""] * (len(DETAIL_HEADER) - 2))
            continue
        call = f"error: {_short(r.call_error, 60)}" if r.call_error else _fmt(r.call_ms, ".3f")
        both = f"error: {_short(r.fwd_bwd_error, 60)}" if r.fwd_bwd_error else _fmt(r.fwd_bwd_ms, ".3f")
        table.append([r.impl, _fmt(r.ms, ".3f"), _fmt(r.tflops, ".0f"), call, both, _fmt(r.fwd_bwd_tflops, ".0f"),
                      _fmt(r.ratio_to_cudnn, ".3f", "x"), _fmt(r.call_vs_cudnn, ".3f", "x"),
                      _fmt(r.fwd_bwd_vs_cudnn, ".3f", "x"), _fmt(r.rel_err_dq, ".2e"), _fmt(r.rel_err_dk, ".2e"),
                      _fmt(r.rel_err_dv, ".2e"), (r.notes or "") + (f" (error: {_short(r.error)})" if r.error else "")])
    return table


TIMING_NOTE = ("ms: the backward alone, GPU time behind a sleep (flashgen: codegen.backward.attention_backward on o "
               "and lse saved once; SDPA: .backward() on a retained graph, the forward outside the timing); call ms: "
               "flashgen's o.backward(do) through autograd and cuDNN's .backward(), host time visible; fwd+bwd ms: a "
               "forward and its backward; all in the same interleaved rounds. TFLOPS: the backward counts "
               f"{BACKWARD_FLOPS:g} x the forward's 4*B*H*S_q*S_k*D (halved for causal), forward + backward "
               f"{1 + BACKWARD_FLOPS:g} x. rel err: dq, dk, dv of the first {CHECK_BATCHES} batch entry against "
               "float64 codegen.check.reference_backward; the row's rel err is the worst of the three.")


def backward_markdown(meta: dict, rows: Sequence[BackwardRow]) -> str:
    parts = ["# flashgen bench (backward)", ""]
    parts += [f"- {k}: {v}" for k, v in meta.items()]
    parts += ["", TIMING_NOTE, "", "## Ratio to cuDNN (same run; > 1 is faster)", "",
              render_markdown(backward_table(rows)), "", summary_line(rows)]
    for case in _unique(r.case for r in rows):
        parts += ["", f"## {case.label}", "", render_markdown(detail_table([r for r in rows if r.case == case]))]
    return "\n".join(parts) + "\n"


def backward_json(meta: dict, rows: Sequence[BackwardRow]) -> list[dict]:
    return with_run_keys(meta, (r.to_json() for r in rows))


def save_backward(meta: dict, rows: Sequence[BackwardRow], out_dir: Path) -> list[Path]:
    """<gpu-slug>-<UTC stamp>-backward.json and .md; on an H200 also h200-latest-backward.*."""
    return save_matrix_files(meta, BACKWARD_MATRIX, backward_json(meta, rows), backward_markdown(meta, rows), out_dir)


# ---------------------------------------------------------------------------------------------- GPU side


class GradCheck:
    """The float64 dq, dk, dv of the first set's first CHECK_BATCHES batch entries, and each entry's three errors
    against them, recorded when measure_together checks its first call (output(name) is that entry's Peer.output:
    it also hands measure_together the three gradients as one tensor, beside `ref`, for its own rel_err)."""

    def __init__(self, refs):
        self.refs = tuple(refs)
        self.errors: dict[str, tuple[float, float, float]] = {}

    @property
    def ref(self):
        import torch

        return torch.cat([r.reshape(-1) for r in self.refs])

    def output(self, name: str, bhsd: bool = False):
        from codegen.check import rel_err

        def checked(grads, inputs):
            import torch

            got = [(g.transpose(1, 2) if bhsd else g)[: self.refs[0].shape[0]] for g in grads]
            self.errors.setdefault(name, tuple(rel_err(g, r) for g, r in zip(got, self.refs)))
            return torch.cat([g.reshape(-1) for g in got])

        return checked


def make_backward_inputs(torch, case: Case, device: str = "cuda"):
    """(bench.inputs.Inputs whose sets are (q, k, v, do), the GradCheck of the first set). Sets rotate as the
    forward bench's do (bench.inputs.input_set_count)."""
    from codegen.check import reference_backward, torch_dtype

    from .inputs import Inputs, input_set_count

    dtype = torch_dtype(case.dtype)
    q_shape = (case.batch, case.seq, case.heads, case.dim)
    kv_shape = (case.batch, case.seq_k, case.kv_heads, case.dim)
    sets = tuple(tuple(torch.randn(shape, dtype=dtype, device=device) for shape in (q_shape, kv_shape, kv_shape,
                                                                                    q_shape))
                 for _ in range(input_set_count(case)))
    n = min(case.batch, CHECK_BATCHES)
    q, k, v, do = sets[0]
    grads = GradCheck(reference_backward(q[:n], k[:n], v[:n], do[:n], causal=case.causal))
    return Inputs(sets, grads.ref), grads


def _leaves(tensors, bhsd: bool):
    """Leaves that require grad, sharing the tensors' memory; (B, H, S, D) transposed views for SDPA."""
    return tuple((t.transpose(1, 2) if bhsd else t).detach().requires_grad_() for t in tensors)


def _backward_of(o, do, leaves):
    """A call of o.backward(do) on a retained graph, returning the leaves' grads (reset first, so that each call's
    gradients are its own, not a sum)."""

    def call():
        for t in leaves:
            t.grad = None
        o.backward(do, retain_graph=True)
        return tuple(t.grad for t in leaves)

    return call


def _forward_backward(torch, forward, do, leaves):
    """A call of forward(*leaves) and its backward."""

    def call():
        for t in leaves:
            t.grad = None
        with torch.enable_grad():
            o = forward(*leaves)
        o.backward(do)
        return tuple(t.grad for t in leaves)

    return call


def _sdpa_forward(torch, case: Case):
    """SDPA on (B, H, S, D) tensors with the case's is_causal and enable_gqa (bench.peers.sdpa_kwargs)."""
    from .peers import sdpa_kwargs

    sdpa = torch.nn.functional.scaled_dot_product_attention
    kwargs = sdpa_kwargs(case)
    return lambda q, k, v: sdpa(q, k, v, **kwargs)


def _refused(torch, forward, leaves):
    """forward(*leaves) under grad; a backend's refusal (a RuntimeError: SDPA finds no kernel) raises Unavailable
    with SDPA's reasons, so the row is skipped rather than an error."""
    from .peers import Unavailable

    with warnings.catch_warnings(record=True) as caught, torch.enable_grad():
        warnings.simplefilter("always")
        try:
            return forward(*leaves)
        except RuntimeError as e:
            raise Unavailable(_refusal(e, caught)) from None


def _sdpa_backward_calls(torch, inputs, case: Case):
    forward = _sdpa_forward(torch, case)
    calls = []
    for q, k, v, do in inputs.sets:
        leaves = _leaves((q, k, v), bhsd=True)
        calls.append(_backward_of(_refused(torch, forward, leaves), do.transpose(1, 2), leaves))
    return calls


def _sdpa_fwd_bwd_calls(torch, inputs, case: Case):
    forward = _sdpa_forward(torch, case)
    calls = []
    for q, k, v, do in inputs.sets:
        leaves = _leaves((q, k, v), bhsd=True)
        _refused(torch, forward, leaves)
        calls.append(_forward_backward(torch, forward, do.transpose(1, 2), leaves))
    return calls


def _flashgen_backward_calls(torch, inputs, case: Case):
    """The backward kernels alone: attention_backward on the o and lse of one forward per set, made here."""
    from codegen import attention
    from codegen.backward import attention_backward

    calls = []
    for q, k, v, do in inputs.sets:
        with torch.no_grad():
            o, lse = attention(q, k, v, causal=case.causal, return_lse=True)
        calls.append(lambda q=q, k=k, v=v, o=o, lse=lse, do=do: attention_backward(q, k, v, o, lse, do,
                                                                                   causal=case.causal))
    return calls


def _flashgen_autograd_calls(torch, inputs, case: Case):
    """What users call: o.backward(do) on the graph of attention() on leaves that require grad."""
    from codegen import attention

    calls = []
    for q, k, v, do in inputs.sets:
        leaves = _leaves((q, k, v), bhsd=False)
        with torch.enable_grad():
            o = attention(*leaves, causal=case.causal)
        calls.append(_backward_of(o, do, leaves))
    return calls


def _flashgen_fwd_bwd_calls(torch, inputs, case: Case):
    from codegen import attention

    return [_forward_backward(torch, lambda q, k, v: attention(q, k, v, causal=case.causal), do,
                              _leaves((q, k, v), bhsd=False)) for q, k, v, do in inputs.sets]


def backward_entries(impls: Iterable[str], grads: GradCheck) -> list:
    """measure_together's (Peer, None) entries: per implementation its backward and its forward + backward. cuDNN is
    the yardstick and has its call timed too; flashgen comes last (if it faults the context, the peers are measured)."""
    from .peers import Peer, _sdpa_backend

    entries = []
    for impl in (i for i in impls if i != "flashgen"):
        context = _sdpa_backend(SDPA_BACKENDS[impl])
        yardstick = impl == "cudnn"
        entries.append(Peer(impl, _sdpa_backward_calls, context, output=grads.output(impl, bhsd=True),
                            call=_sdpa_backward_calls if yardstick else None, yardstick=yardstick))
        entries.append(Peer(impl + FWD_BWD, _sdpa_fwd_bwd_calls, context,
                            output=grads.output(impl + FWD_BWD, bhsd=True)))
    if "flashgen" in impls:
        entries.append(Peer("flashgen", _flashgen_backward_calls, output=grads.output("flashgen"),
                            call=_flashgen_autograd_calls))
        entries.append(Peer("flashgen" + FWD_BWD, _flashgen_fwd_bwd_calls, output=grads.output("flashgen" + FWD_BWD)))
    return [(peer, None) for peer in entries]


def _progress_line(r: BackwardRow) -> str:
    if r.ms is None:
        return f"  {r.impl:<9} " + _short(r.skipped or r.error or "", 200)
    parts = [f"{r.ms:.3f} ms, rel err dq {_fmt(r.rel_err_dq, '.2e')} dk {_fmt(r.rel_err_dk, '.2e')} "
             f"dv {_fmt(r.rel_err_dv, '.2e')}"]
    if r.call_ms is not None or r.call_error:
        parts.append(f"call {_fmt(r.call_ms, '.3f')} ms" if not r.call_error else f"call: {_short(r.call_error, 60)}")
    parts.append(f"fwd+bwd {r.fwd_bwd_ms:.3f} ms" if r.fwd_bwd_ok else f"fwd+bwd: {_short(r.fwd_bwd_error, 60)}")
    return f"  {r.impl:<9} " + "; ".join(parts)


def bench_backward_case(torch, case: Case, config: BenchConfig, progress) -> tuple[list[BackwardRow], str | None]:
    """Every implementation on one case, in gpu_run.measure_together's interleaved rounds; (rows, why the CUDA
    context died, or None)."""
    from .gpu_run import _ContextLost, cuda_fault, measure_together

    try:
        inputs, grads = make_backward_inputs(torch, case)
    except Exception as e:
        return skipped_rows(case, f"inputs: {type(e).__name__}: {e}", config.peers, error=True), cuda_fault(torch)
    entries = backward_entries(config.peers, grads)
    progress(f"  {len(inputs.sets)} input set(s); {len(entries)} entries (backward, forward + backward), timed in "
             "interleaved rounds (round_orders: each follows each other equally often)")
    fault = None
    try:
        measured = measure_together(torch, entries, case, inputs, config, check_fault=True)
    except _ContextLost as e:
        measured, fault = e.rows, e.reason
    rows = merge_rows(case, measured, grads.errors)
    for r in rows:
        progress(_progress_line(r))
    del measured, entries, inputs, grads
    if not fault:
        gc.collect()
        torch.cuda.empty_cache()
    return rows, fault


def run_backward(config: BenchConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)):
    """(meta, finalized rows) of the backward matrix."""
    from .gpu_run import CALL_ROUNDS_TIMING, cuda_torch, run_meta

    torch = cuda_torch()
    meta = run_meta(torch, config, BACKWARD_MATRIX, implementations=",".join(config.peers),
                    call_timing="call_ms: flashgen's o.backward(do) through autograd (cuDNN: its .backward()) on a "
                                "retained graph, by events between consecutive calls, nothing queued ahead, "
                                + CALL_ROUNDS_TIMING[config.call_rounds] + "; ms and fwd_bwd_ms behind a GPU sleep",
                    rel_err_check=f"dq, dk, dv of the first {CHECK_BATCHES} batch entry of the first input set, vs "
                                  "float64 codegen.check.reference_backward",
                    flops=f"backward {BACKWARD_FLOPS:g} x 4*B*H*S_q*S_k*D, halved for causal")
    torch.manual_seed(config.seed)
    cases = backward_cases()
    rows: list[BackwardRow] = []
    fault = None
    for i, case in enumerate(cases):
        progress(f"[{i + 1}/{len(cases)}] {case.label}")
        if fault:
            rows += skipped_rows(case, fault, config.peers, error=True)
            continue
        case_rows, fault = bench_backward_case(torch, case, config, progress)
        rows += case_rows
    return meta, finalize_backward(rows)


def backward_main(config: BenchConfig) -> int:
    try:
        meta, rows = run_backward(config)
    except (ImportError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.out is not None:
        for path in save_backward(meta, rows, config.out):
            print(f"wrote {path}", file=sys.stderr)
    print()
    print(f"backward: flashgen vs cuDNN (SDPA), on {meta.get('gpu')}:")
    print(render_text(backward_table(rows)))
    print(summary_line(rows))
    return 0 if any(r.impl == "flashgen" and r.ok for r in rows) or "flashgen" not in config.peers else 1
