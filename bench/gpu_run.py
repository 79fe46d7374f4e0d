"""The GPU run: measure_together (implementations on one case: each one's error, then their times in interleaved
rounds within a budget: the kernels' GPU time, and what users call with its host time), time_call_samples,
bench_case (every implementation on a case, stopping when the CUDA context faults) and run_gpu (every case)."""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import codegen.check as check
from codegen.check import time_gpu, time_gpu_samples
from .cases import Case, block_n_for, resolved_spec
from .config import MIN_ROUNDS, BenchConfig
from .inputs import Inputs, make_inputs
from .peers import Peer, Unavailable, peer_names, peers_for
from .report import BenchResult, Row, _short, finalize, gpu_meta, host_meta

TIME_BUDGET_MS = 3000.0  # per implementation and shape: caps iterations for the slow peers
# Each implementation is timed in at least config.rounds rounds (--rounds; MIN_ROUNDS by default), interleaved
# with the others, so that a clock drifting during the run moves every implementation alike. Timed one after
# another, identical kernels gave 0.94x-1.11x cuDNN at D=256 between runs (bench/LOG.md v16). ROUND_WARMUP untimed
# calls start each round after the first. Under the power cap a slot also runs at the clock its predecessor left for
# 0.1-0.7 s (scripts/clocks.py --gap 0), longer than most slots: round_orders makes every implementation follow every
# other equally often. The idle ahead of a slot sets its clock as well, so every kernel slot of a round waits behind
# the same GPU sleep (round_sleep_s). Slots of one kernel still differ by a few percent (the clock NVML reads moved
# 1320-1980 MHz between them, bench/LOG.md session 51), and a slot's calls share its clock: more rounds average more
# slots, more calls a slot do not.
ROUND_WARMUP = 2
# A user's call (attention()) must compute what its kernel computes: a rel err above this multiple of the prepared
# kernel's (plus CALL_ERR_SLACK) makes it an error, not a time. Two correct kernels' errors differ by a few percent.
CALL_ERR_FACTOR = 2.0
CALL_ERR_SLACK = 1e-6


def round_orders(n: int, min_rounds: int = MIN_ROUNDS) -> list[list[int]]:
    """The order of n implementations in each timing round: a Williams design (within the rounds, each one directly
    follows each other one equally often, so no one always inherits the clock of the same predecessor), its
    sequences chained so a round starts where the last one ended where the design allows, and repeated to at least
    min_rounds rounds."""
    if n <= 1:
        return [[0] * n for _ in range(min_rounds)]
    first = [0]
    for step in range(1, n):
        first.append((first[-1] + (step if step % 2 else -step)) % n)  # 0, 1, n-1, 2, n-2, ...
    design = [[(x + shift) % n for x in first] for shift in range(n)]
    if n % 2:  # an odd n balances only with the reversed sequences as well
        design += [seq[::-1] for seq in design]
    chained = [design.pop(0)]
    while design:
        follow = next((seq for seq in design if seq[0] == chained[-1][-1]), design[0])
        design.remove(follow)
        chained.append(follow)
    return chained * math.ceil(min_rounds / len(chained))


def iterations_within(budget_ms: float, estimate_ms: float, iters: int, floor: int = 10) -> int:
    """Iterations that fit the per-implementation budget, never fewer than floor nor more than asked."""
    if estimate_ms <= 0 or not math.isfinite(estimate_ms):
        return iters
    return max(min(floor, iters), min(iters, int(budget_ms / estimate_ms)))


def measure(torch, peer: Peer, split, case: Case, inputs: Inputs, config: BenchConfig) -> Row:
    """One implementation alone on one case (measure_together with a single entry)."""
    return measure_together(torch, [(peer, split)], case, inputs, config)[0]


@dataclass
class _Timing:
    """An implementation ready to time: its calls, its error, and the samples taken so far; and, when it has one,
    what users call (next_user_call), timed in a slot of its own (measure_together says in which rounds)."""

    peer: Peer
    split: tuple[int, ...] | None
    next_call: Callable[[], Callable]
    rel_err: float
    iters: int
    host_s: float = 0.0  # host seconds to enqueue one call (round_sleep_s)
    samples: list[float] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)  # each round's median, in the order the rounds ran
    error: str | None = None
    next_user_call: Callable[[], Callable] | None = None
    call_rel_err: float | None = None
    call_samples: list[float] = field(default_factory=list)
    call_host_samples: list[float] = field(default_factory=list)  # host ms a call, one per round
    call_error: str | None = None
    timed_call: bool = False  # a user call was tried (next_user_call, or call_error saying why not)

    def row(self, case: Case) -> Row:
        call = self._call_fields()
        if self.error or not self.samples:  # a call that failed in any round voids the timing, the user call's too
            if call:  # its rounds stopped with the kernel's: a partial median is not a measurement
                call = dict(call, call_ms=None, call_error=call["call_error"] or "not timed: the kernel's timing failed")
            return Row(self.peer.name, case, rel_err=self.rel_err, pv_split=self.split, error=self.error or "not timed",
                       **call)
        note = None if math.isfinite(self.rel_err) else "output holds NaN or inf"
        return Row(self.peer.name, case, ms=statistics.median(self.samples), rel_err=self.rel_err,
                   snr_db=snr_db_from(self.rel_err), pv_split=self.split, iters=len(self.samples), error=note,
                   round_ms=tuple(self.round_ms), **call)

    def _call_fields(self) -> dict:
        if not self.timed_call:
            return {}
        ms = statistics.median(self.call_samples) if self.call_samples and not self.call_error else None
        host = statistics.median(self.call_host_samples) if ms is not None and self.call_host_samples else None
        return {"call_ms": ms, "call_host_ms": host, "call_rel_err": self.call_rel_err,
                "call_error": self.call_error or (None if ms is not None else "not timed")}


def _prepare(torch, peer: Peer, split, case: Case, inputs: Inputs, config: BenchConfig,
             with_call: bool = False) -> _Timing | Row:
    """First call (it may compile), error against float64 on the first input set, and the iteration count
    that fits the time budget; or the row saying why the implementation cannot run. With with_call, the same for
    peer.call, what users call (_prepare_call)."""
    from codegen.check import rel_err

    skip = peer.skip(case)
    if skip:
        return Row(peer.name, case, pv_split=split, skipped=skip)
    try:
        with peer.context(torch):
            calls = peer.make(torch, inputs, case)
            out = calls[0]()
            torch.cuda.synchronize()
            with peer.steady(torch):
                err = rel_err(peer.output(out, inputs), inputs.ref)
                del out
                next_call = itertools.cycle(calls).__next__  # rotate over the input sets
                host_s: list[float] = []

                def host_timed_call():
                    t0 = time.perf_counter()
                    out = next_call()()
                    host_s.append(time.perf_counter() - t0)
                    return out

                estimate = time_gpu(torch, host_timed_call, warmup=1, iters=3)
    except Unavailable as e:
        return Row(peer.name, case, pv_split=split, skipped=str(e))
    except Exception as e:  # one failing peer is a row, never the end of the run
        return Row(peer.name, case, pv_split=split, error=f"{type(e).__name__}: {e}")
    timing = _Timing(peer, split, next_call, err, iterations_within(TIME_BUDGET_MS, estimate, config.iters),
                     host_s=statistics.median(host_s))
    if with_call and peer.call is not None:
        _prepare_call(torch, timing, case, inputs)
    return timing


def _prepare_call(torch, timing: _Timing, case: Case, inputs: Inputs) -> None:
    """The user's call, checked as the kernel is: a first call, its error against float64 on the first input set
    (NaN or inf, or more than CALL_ERR_FACTOR times the kernel's error, makes it a call_error: a fast but wrong
    call gets no time). A call that raises is a call_error too; the kernel's row stands either way."""
    from codegen.check import rel_err

    peer = timing.peer
    timing.timed_call = True
    try:
        with peer.context(torch):
            calls = peer.call(torch, inputs, case)
            out = calls[0]()
            torch.cuda.synchronize()
            with peer.steady(torch):
                err = rel_err(peer.output(out, inputs), inputs.ref)
                del out
    except Exception as e:
        timing.call_error = f"{type(e).__name__}: {e}"
        return
    timing.call_rel_err = err
    kernel = timing.rel_err
    if not math.isfinite(err):
        timing.call_error = "output holds NaN or inf"
    elif math.isfinite(kernel) and err > CALL_ERR_FACTOR * kernel + CALL_ERR_SLACK:
        timing.call_error = f"wrong output: rel err {err:.2e}, the kernel's {kernel:.2e}"
    else:
        timing.next_user_call = itertools.cycle(calls).__next__


def round_sleep_s(timings: list[_Timing], rounds: int, r: int) -> float:
    """The GPU sleep ahead of every kernel slot of round r: the longest any of them needs to enqueue its calls
    (codegen.check.queue_ahead_s). Under the power cap the idle ahead of a slot raises its clock; sized per call,
    the sleep gave a slow host path (FA4: 4-5 ms of idle at 4k causal, flashgen under 3) the faster clock."""
    needs = [check.queue_ahead_s(t.host_s, round_iters(t.iters, rounds, r)) for t in timings if t.error is None]
    return max(needs, default=0.0)


def round_iters(total: int, rounds: int, r: int) -> int:
    """Round r's share of total iterations over `rounds` rounds (the shares add up to total; at least 1)."""
    return max(1, total * (r + 1) // rounds - total * r // rounds)


def _time_round(torch, timing: _Timing, *, warmup: int, iters: int, sleep_s: float = 0.0, keep: bool = True) -> None:
    """One round of the kernel, behind a GPU sleep of at least sleep_s. Without keep a stand-in: its samples are
    dropped, and so is a failure (its kernel rounds are measured already; a lost context still raises in
    measure_together's fault check)."""
    try:
        with timing.peer.context(torch), timing.peer.steady(torch):
            samples = time_gpu_samples(torch, lambda: timing.next_call()(), warmup=warmup, iters=iters,
                                       min_sleep_s=sleep_s)
            if keep:
                timing.samples += samples
                timing.round_ms.append(statistics.median(samples))
    except Exception as e:
        if keep:
            timing.error = f"{type(e).__name__}: {e}"


def _time_slot(torch, timing: _Timing, user_call: bool, r: int, rounds: int, config: BenchConfig,
               sleep_s: float = 0.0, stand_in: bool = False) -> None:
    """Round r's slot of one implementation: its kernel (behind a GPU sleep of sleep_s) or its user call (after
    sleep_s of GPU sleep it waits out: nothing queues ahead of the calls); skipped once that timing has failed (a
    failed kernel voids its calls). A stand-in runs the kernel as its slot would, untimed."""
    warmup = config.warmup if r == 0 else ROUND_WARMUP
    iters = round_iters(timing.iters, rounds, r)
    if user_call and timing.error is None and timing.call_error is None:
        _time_call_round(torch, timing, warmup=warmup, iters=iters, idle_s=sleep_s)
    elif not user_call and timing.error is None:
        _time_round(torch, timing, warmup=warmup, iters=iters, sleep_s=sleep_s, keep=not stand_in)


def _time_call_round(torch, timing: _Timing, *, warmup: int, iters: int, idle_s: float = 0.0) -> None:
    """One round of the user's call: as many calls as the kernel's round, by time_call_samples."""
    try:
        with timing.peer.context(torch), timing.peer.steady(torch):
            samples, host_ms = time_call_samples(torch, lambda: timing.next_user_call()(), warmup=warmup, iters=iters,
                                                 idle_s=idle_s)
            timing.call_samples += samples
            timing.call_host_samples.append(host_ms)
    except Exception as e:
        timing.call_error = f"{type(e).__name__}: {e}"


# How each --call-rounds places the call slots, for the result files' call_timing.
CALL_ROUNDS_TIMING = {"apart": "in rounds of their own after the kernels': the kernels' rounds again, in the same "
                               "orders and behind the same GPU idles (waited out), each call in its kernel's slot and "
                               "an implementation without a call running its kernel untimed",
                      "shared": "each slot right after its kernel's, in the kernels' rounds"}


def time_call_samples(torch, fn: Callable[[], object], *, warmup: int, iters: int, idle_s: float = 0.0,
                      clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], float]:
    """Milliseconds per call of fn as a loop of calls sees them, host time included where it shows; and the host's
    own milliseconds a call over the timed loop (`clock`, in seconds), which says whether the samples are host time.

    `warmup` untimed calls and a sync; one more untimed call, then an event, then `iters` calls each followed by an
    event; sample i is the time between event i and event i + 1 on the GPU. Unlike time_gpu_samples no GPU sleep
    is queued first: while fn's host time (checks, kernel lookup, tensor maps, launch) is under its GPU time the
    calls queue up and a sample is the GPU time, as the kernel's is; once it is over, the GPU waits for the host
    between calls and a sample is the host's time per call. (The one event recorded per call, a few microseconds
    of host time, is in every implementation's call alike, and in the host time.) With idle_s, the GPU sleeps that
    long after the warm-ups and the host waits it out before the timed calls: an idle ahead like a kernel slot's
    (under the power cap it sets the clock), with the queue still empty when the calls start."""
    for _ in range(max(1, warmup)):
        fn()
    torch.cuda.synchronize()
    sleep = getattr(torch.cuda, "_sleep", None)
    if idle_s > 0 and sleep is not None:
        sleep(int(idle_s * check.ASSUMED_CLOCK_HZ))
        torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    fn()  # the queue is empty after the sync: the first event waits behind one call, as every later one does
    events[0].record()
    start = clock()
    for event in events[1:]:
        fn()
        event.record()
    host_ms = (clock() - start) * 1e3 / iters
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])], host_ms


def measure_together(torch, entries, case: Case, inputs: Inputs, config: BenchConfig,
                     check_fault: bool = False) -> list[Row]:
    """Rows for (peer, split) entries on one case, in their order: each is prepared (_prepare), then all are
    timed in interleaved rounds (in round_orders' orders), and each row's time is the median of its
    samples over all rounds. Interleaving makes the ratios between implementations immune to the clock
    drifting during the run. An entry whose peer has a `call` (flashgen's attention()) also has that call timed
    (call_ms, by time_call_samples), and so has the yardstick's call (cuDNN's SDPA call) when any other entry has
    one: with config.call_rounds "apart" (the default) in rounds after the kernels' that replay them (the same
    orders and idles, each call in its kernel's slot, an implementation without a call standing in with its kernel,
    untimed); with "shared" in a slot right after its kernel's, in the kernels' rounds. With check_fault, a lost
    CUDA context raises _ContextLost carrying the rows."""
    with_calls = any(peer.call is not None and not peer.yardstick for peer, _ in entries)
    slots: list[_Timing | Row] = []
    for peer, split in entries:
        slots.append(_prepare(torch, peer, split, case, inputs, config, with_call=with_calls))
        _raise_on_fault(torch, check_fault, slots, case, peer.name)
    timings = [s for s in slots if isinstance(s, _Timing)]
    apart = config.call_rounds == "apart"
    orders = round_orders(len(timings), config.rounds)
    sleeps = []  # each kernel round's, for the calls' rounds to replay
    for r, order in enumerate(orders):
        sleep_s = round_sleep_s(timings, len(orders), r)
        sleeps.append(sleep_s)
        # shared: each implementation's slots are its kernel's, then its user call's where it has one.
        timed = [(timings[i], user_call) for i in order
                 for user_call in ((False, True) if timings[i].next_user_call and not apart else (False,))]
        for timing, user_call in timed:  # a shared call slot follows its kernel's at once, as before h5
            _time_slot(torch, timing, user_call, r, len(orders), config, 0.0 if user_call else sleep_s)
            _raise_on_fault(torch, check_fault, slots, case, timing.peer.name + (" (call)" if user_call else ""))
    if apart and any(t.next_user_call for t in timings):
        # The calls' rounds replay the kernels': under the power cap a slot's clock answers the power of the slots
        # before it, so a call slot gets its kernel slot's neighbours (a slow peer's kernel, untimed, included).
        for r, order in enumerate(orders):
            sleep_s = sleeps[r]  # the kernel round's, even where a timing failed since
            for i in order:
                caller = timings[i].next_user_call is not None and timings[i].call_error is None
                _time_slot(torch, timings[i], caller, r, len(orders), config, sleep_s, stand_in=not caller)
                _raise_on_fault(torch, check_fault, slots, case,
                                timings[i].peer.name + (" (call)" if caller else " (stand-in)"))
    return [s.row(case) if isinstance(s, _Timing) else s for s in slots]


class _ContextLost(Exception):
    def __init__(self, rows: list[Row], reason: str):
        super().__init__(reason)
        self.rows, self.reason = rows, reason


def _raise_on_fault(torch, check: bool, slots, case: Case, name: str) -> None:
    fault = cuda_fault(torch) if check else None
    if fault:
        reason = f"CUDA context lost after {name} on {case.label}: {fault}"
        for s in slots:
            if isinstance(s, _Timing) and s.error is None:
                s.error = reason
            if isinstance(s, _Timing) and s.timed_call and s.call_error is None:
                s.call_error = reason
        raise _ContextLost([s.row(case) if isinstance(s, _Timing) else s for s in slots], reason)


def snr_db_from(err: float) -> float:
    """-20 log10(rel err), as codegen.check.snr_db computes it, without a second pass over the tensors."""
    if err == 0:
        return float("inf")
    return -20.0 * math.log10(err) if math.isfinite(err) else float("-inf")


def cuda_fault(torch) -> str | None:
    """None while the CUDA context still works; else why it does not (a fault is sticky for the process)."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def bench_case(torch, case: Case, config: BenchConfig, progress) -> tuple[list[Row], str | None]:
    """Every implementation on one case; returns the rows and, if the CUDA context died, why."""
    block_n, plan_error = None, None
    if "flashgen" in config.peers:
        try:
            block_n = block_n_for(case)
        except Exception as e:
            plan_error = f"{type(e).__name__}: {e}"
    rows = [Row("flashgen", case, error=plan_error)] if plan_error else []
    try:
        inputs = make_inputs(torch, case)
    except Exception as e:
        return rows + [Row(name, case, error=f"inputs: {type(e).__name__}: {e}")
                       for name in peer_names(case, config.peers)], cuda_fault(torch)
    entries = peers_for(case, config, block_n)
    progress(f"  {len(entries)} implementations: error each, then timed in "
             "interleaved rounds (round_orders: each follows each other equally often)")
    fault = None
    try:
        measured = measure_together(torch, entries, case, inputs, config, check_fault=True)
    except _ContextLost as e:
        measured, fault = e.rows, e.reason
    for row in measured:
        progress(f"  {row.impl:<18} " + (f"{row.ms:.4f} ms, rel err {row.rel_err:.2e}" if row.ms is not None
                                         else row.skipped or _short(row.error or "")) + _call_progress(row))
    rows += measured
    if fault:
        return rows, fault
    del inputs
    torch.cuda.empty_cache()
    return rows, None


def _call_progress(row: Row) -> str:
    if row.call_ms is not None and not row.call_error:
        return f"; call {row.call_ms:.4f} ms, rel err {row.call_rel_err:.2e}"
    return f"; call: {_short(row.call_error, 60)}" if row.call_error else ""


def cuda_torch():
    """torch, imported here (nothing in bench imports it before a GPU mode runs); RuntimeError without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"gen.py bench needs a CUDA GPU; torch {torch.__version__} sees none")
    return torch


def run_meta(torch, config: BenchConfig, matrix: str | None, **extra) -> dict:
    """What a GPU run records: the GPU and host facts, the command, the timing settings, and `extra`."""
    now = _dt.datetime.now(_dt.timezone.utc)
    return {**gpu_meta(torch), **host_meta(config.command, now), "iters": config.iters, "warmup": config.warmup,
            "timing_rounds": f"{config.rounds} or more, in round_orders' orders", "call_rounds": config.call_rounds,
            "seed": config.seed, "matrix": matrix, **extra}


def run_gpu(config: BenchConfig, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> BenchResult:
    torch = cuda_torch()
    meta = run_meta(torch, config, config.matrix,
                    call_timing="call_ms: codegen.attention(...) (cuDNN: its SDPA call) by events between consecutive "
                                "calls, nothing queued ahead (host time shows when the GPU waits for it); "
                                + CALL_ROUNDS_TIMING[config.call_rounds])
    torch.manual_seed(config.seed)
    rows: list[Row] = []
    fault = None
    for i, case in enumerate(config.cases):
        if fault:
            rows += [Row(name, case, error=fault) for name in peer_names(case, config.peers)]
            continue
        progress(f"[{i + 1}/{len(config.cases)}] {case.label}")
        if case.varlen:
            progress(f"  seqlens {list(case.lens)}; padding efficiency {case.padding_efficiency:.0%} "
                     f"(the cudnn yardstick runs the zero-padded ({case.batch}, {case.seq}) batch)")
        case_rows, fault = bench_case(torch, case, config, progress)
        rows += case_rows
    return BenchResult(meta, tuple(finalize(rows, default_splits(config))), config.mode)


def default_splits(config: BenchConfig) -> dict[Case, tuple[int, ...]]:
    """Each case's PV split as attention() resolves it, the split its headline flashgen row reports; none where
    the splits were asked for by hand (--split: the fastest of them is reported) or the spec does not resolve."""
    if config.splits or "flashgen" not in config.peers:
        return {}
    out = {}
    for case in config.cases:
        try:
            out[case] = tuple(resolved_spec(case).pv_split)
        except Exception:  # noqa: BLE001 - the case's own rows say what is wrong with it
            continue
    return out
