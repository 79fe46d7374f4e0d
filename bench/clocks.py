"""The SM clock and board power while one implementation runs back to back (`scripts/clocks.py`).

Why: a kernel's time is its cycles divided by the SM clock, and on the H200 the clock is not fixed. Under a
long attention load the board reaches its power limit and the driver lowers the SM clock to stay under it
(nvidia-smi's clocks-event reason "SW power cap", bit 0x4). A kernel variant that needs fewer cycles but keeps
more of the chip busy then gets a lower clock, and its time may not move at all (bench/LOG.md v18c: a tile
boundary with 10% fewer cycles ran no faster). Under the cap, time is about energy per call divided by the
power limit, so this module reports energy per call beside time.

nvidia-smi is sampled in the background (`Sampler`); each implementation's run is a `Window` of wall-clock
time; `summarize` takes the samples inside a window. Reading clocks changes nothing on the GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import subprocess
import tempfile
import time

# nvidia-smi / NVML clocks-event reason bits (nvmlClocksEventReason*).
REASONS = {
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake",
    0x100: "display clocks setting",
}
# Queries to try in order. power.draw is a one-second average on Ampere and later (NVML's nvmlDeviceGetPowerUsage),
# which lags a load that changes every second or two; power.draw.instant does not, where the driver has it.
# Older drivers name the last field clocks_throttle_reasons.
QUERIES = tuple((("timestamp", "clocks.sm", power) + rest)
                for power in ("power.draw.instant", "power.draw")
                for rest in (("enforced.power.limit", "clocks_event_reasons.active"),
                             ("enforced.power.limit", "clocks_throttle_reasons.active"), ()))
SAMPLE_MS = 20
SETTLE_S = 0.3  # the start of each window is left out: the clock moves when the load changes
# A window has settled from the first sample after which every sample is within this of its settled median
# (nvidia-smi reports the SM clock in 15 MHz steps).
SETTLE_TOLERANCE_MHZ = 15.0


def decode_reasons(mask: int) -> tuple[str, ...]:
    """Names of the set bits of a clocks-event reason mask; unknown bits as hex."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return tuple(names) + ((hex(rest),) if rest else ())


@dataclasses.dataclass(frozen=True)
class Sample:
    t: float           # seconds since the epoch (the host's clock, as time.time())
    sm_mhz: float
    watts: float
    limit_w: float | None = None
    reasons: int | None = None


def parse_sample(line: str) -> Sample | None:
    """One line of `nvidia-smi --query-gpu=<QUERIES[i]> --format=csv,noheader,nounits`, or None when it is not a
    sample (a header, an error message, "[N/A]")."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 3:
        return None
    try:
        stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        mhz, watts = float(parts[1]), float(parts[2])
    except ValueError:
        return None
    limit = reasons = None
    if len(parts) > 3:
        try:
            limit = float(parts[3])
        except ValueError:
            pass
    if len(parts) > 4:
        try:
            reasons = int(parts[4], 16)
        except ValueError:
            pass
    return Sample(stamp, mhz, watts, limit, reasons)


@dataclasses.dataclass(frozen=True)
class Window:
    """One implementation running back to back from `start` to `end` (time.time()), `ms` per call."""
    name: str
    start: float
    end: float
    ms: float
    flops: float  # per call


def in_window(window: Window, samples: list[Sample], settle_s: float = 0.0) -> list[Sample]:
    """The window's samples from settle_s after its start to its end, in time order."""
    return sorted((s for s in samples if window.start + settle_s <= s.t <= window.end), key=lambda s: s.t)


def settle_ms(window: Window, samples: list[Sample], settled_mhz: float,
              tolerance_mhz: float = SETTLE_TOLERANCE_MHZ) -> float | None:
    """Milliseconds from the window's start to its first sample after which the clock stays within tolerance_mhz
    of settled_mhz: how long the power controller took to move from the clock the previous load left. None when
    even the last sample is outside."""
    settled_from = None
    for s in in_window(window, samples):
        if abs(s.sm_mhz - settled_mhz) > tolerance_mhz:
            settled_from = None
        elif settled_from is None:
            settled_from = s.t
    return None if settled_from is None else (settled_from - window.start) * 1000.0


def summarize(window: Window, samples: list[Sample], settle_s: float = SETTLE_S) -> dict:
    """Median clock, power and limit over the window's samples (after settle_s), the union of the reasons seen,
    energy per call = median power x time per call, and the clock at the window's first sample with the time it
    took to settle (settle_ms)."""
    inside = in_window(window, samples, settle_s)
    out = {"impl": window.name, "ms": window.ms, "tflops": window.flops / window.ms / 1e9, "samples": len(inside)}
    if not inside:
        return out
    watts = statistics.median(s.watts for s in inside)
    limits = [s.limit_w for s in inside if s.limit_w is not None]
    mask = 0
    for s in inside:
        mask |= s.reasons or 0
    out.update(sm_mhz=statistics.median(s.sm_mhz for s in inside), watts=watts,
               limit_w=statistics.median(limits) if limits else None,
               reasons=list(decode_reasons(mask)), energy_mj=watts * window.ms)  # W x ms = mJ
    out.update(start_mhz=in_window(window, samples)[0].sm_mhz, settle_ms=settle_ms(window, samples, out["sm_mhz"]))
    return out


class Sampler:
    """nvidia-smi in the background, one sample every SAMPLE_MS, from __enter__ to __exit__."""

    def __init__(self, period_ms: int = SAMPLE_MS):
        self.period_ms = period_ms
        self.query: tuple[str, ...] = ()
        self._proc = None
        self._file = None
        self._final: list[Sample] | None = None

    def __enter__(self) -> "Sampler":
        for query in QUERIES:
            self._file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
            try:
                self._proc = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits",
                     "-lms", str(self.period_ms)], stdout=self._file, stderr=subprocess.STDOUT, text=True)
            except OSError as e:
                self._stop()
                raise RuntimeError(f"cannot run nvidia-smi to sample the clock: {e}") from None
            deadline = time.time() + 3.0
            while time.time() < deadline and self._proc.poll() is None and not self._read():
                time.sleep(0.05)
            if self._read():
                self.query = query
                return self
            self._stop()
        raise RuntimeError("nvidia-smi gave no clock samples (is it on the PATH?)")

    def __exit__(self, *exc) -> None:
        self._stop(keep=True)
        self._final = self._read()
        self._stop()

    def samples(self) -> list[Sample]:
        """The samples so far (inside the with block) or all of them (after it)."""
        return self._final if self._final is not None else self._read()

    def _read(self) -> list[Sample]:
        if self._file is None:
            return []
        with open(self._file.name) as f:
            return [s for s in map(parse_sample, f) if s is not None]

    def _stop(self, keep: bool = False) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait()
        self._proc = None
        if self._file is not None and not keep:
            self._file.close()
            os.unlink(self._file.name)
            self._file = None


def table(rows: list[dict]) -> str:
    """The printed table: one row per window."""
    head = f"{'impl':14s} {'round':>5s} {'ms':>8s} {'TFLOPS':>7s} {'SM MHz':>7s} {'W':>6s} {'limit W':>7s} " \
           f"{'mJ/call':>8s} {'from MHz':>8s} {'settle ms':>9s}  clock limited by"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "sm_mhz" not in r:
            lines.append(f"{r['impl']:14s} {r.get('round', 0):5d} {r['ms']:8.4f} {r['tflops']:7.1f}  (no samples)")
            continue
        limit = f"{r['limit_w']:7.0f}" if r.get("limit_w") else f"{'-':>7s}"
        settle = f"{r['settle_ms']:9.0f}" if r.get("settle_ms") is not None else f"{'never':>9s}"
        lines.append(f"{r['impl']:14s} {r.get('round', 0):5d} {r['ms']:8.4f} {r['tflops']:7.1f} {r['sm_mhz']:7.0f} "
                     f"{r['watts']:6.0f} {limit} {r['energy_mj']:8.2f} {r['start_mhz']:8.0f} {settle}  "
                     f"{', '.join(r['reasons']) or 'nothing'}")
    return "\n".join(lines)
