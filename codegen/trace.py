"""Pipeline timelines from an instrumented kernel (KernelSpec.trace).

A traced kernel has a module global `flashgen_trace`: for each of its first TRACE_CTAS CTAs, one row of
TRACE_WORDS 64-bit words per warp of each consumer warpgroup (0 and 1; TRACE_WARPS warps each), written by the
warp's first lane (the producer's 24 registers have no room for the trace state). Word n of a row is the n-th
event that lane passed, as

    bits 63..40  step (the key block t of its tile; the tile count for per-tile events)
    bits 39..32  event code (EVENTS)
    bits 31..0   %clock when the lane got there

so differences of clocks on one row are cycles. Between rows of one CTA (one SM) they are cycles give or take
an offset per SM sub-partition (below). The writes are a few predicated stores per key block on one lane a warp;
the traced kernel is otherwise the same kernel.

`phases` turns one warp's events into the time each of its steps spent in each phase; `scripts/trace.py` runs a
traced kernel on the GPU and prints them. Compare clocks across warps with care: on the H200, warps that leave
one named barrier together read %clock values up to ~150 cycles apart (bench/LOG.md v16b), so a phase is only
trusted within one warp's row.
"""

from __future__ import annotations

import dataclasses
import statistics

TRACE_CTAS = 4
TRACE_WARPS = 4  # every warp of a consumer warpgroup
TRACE_WORDS = 2048

# Events, in the order a consumer passes them in one key-block step (codes are what the kernel writes).
EVENTS = {
    "q_ready": 1,     # consumer: the tile's Q has landed (its tile starts)
    "turn": 2,        # consumer: got its MMA turn (ping-pong) for step t
    "k_ready": 3,     # consumer: K(t) has landed
    "qk_issued": 4,   # consumer: QK(t)'s wgmmas issued
    "v_ready": 5,     # consumer: V(t-1) has landed
    "issued": 6,      # consumer: PV(t-1) issued too, turn passed
    "qk_done": 7,     # consumer: QK(t) complete
    "softmax": 8,     # consumer: softmax of block t done
    "pv_done": 9,     # consumer: PV(t-1) complete
    "packed": 10,     # consumer: O rescaled and P(t) packed: step t ends
    "finished": 11,   # consumer: the tile's last PV is done and its rows normalized
    "stored": 12,     # consumer: a tile's O stored (with tile_overlap, the previous tile's, at step 0)
}
NAMES = {code: name for name, code in EVENTS.items()}

# The phases of one steady-state step, each the time from the previous event to this one.
STEP_PHASES = (("turn", "wait for the MMA turn"), ("k_ready", "wait for K(t)"), ("qk_issued", "issue QK(t)"),
               ("v_ready", "wait for V(t-1)"), ("issued", "issue PV(t-1)"),
               ("qk_done", "wait for QK(t)"), ("softmax", "softmax(t)"), ("pv_done", "wait for PV(t-1)"),
               ("packed", "rescale O, pack P(t)"))
PHASE_NAMES = tuple(name for name, _ in STEP_PHASES)


@dataclasses.dataclass(frozen=True)
class Event:
    name: str
    step: int
    clock: int  # cycles since the row's first event, or since `base` (unwrapped)


def decode(words, base: int | None = None) -> list[Event]:
    """One row's words -> its events in order, up to the first zero word. Clocks count from `base` (a raw
    %clock value; rows of one CTA share the SM's clock) or else from the row's first event."""
    events, last, wraps = [], None, 0
    for word in words:
        word = int(word)
        if word == 0:
            break
        clock, code, step = word & 0xFFFFFFFF, (word >> 32) & 0xFF, word >> 40
        if code not in NAMES:
            raise ValueError(f"trace word {word:#x} has unknown event code {code}")
        if base is None:
            base = clock
        if last is None and clock < base:  # the row starts after the clock wrapped past the shared base
            wraps = 1
        if last is not None and clock < last:
            wraps += 1
        last = clock
        events.append(Event(NAMES[code], step, clock + (wraps << 32) - base))
    return events


def phases(events: list[Event]) -> dict[str, list[int]]:
    """Cycles per phase of each complete steady-state step: each event's time since the event before it.

    A step runs from the previous step's 'packed' to its own, whatever order its events come in. A tile's first
    step (no softmax under a PV) and its last PV (no new block) have no complete run, so they are left out, as
    is any step whose previous end is in another tile.
    """
    result = {name: [] for name in PHASE_NAMES + ("step",)}
    previous_end, current = None, {}
    for e in events:
        if e.name == "q_ready":
            previous_end, current = None, {}
        elif e.name in PHASE_NAMES:
            current[e.name] = e.clock
            if e.name == "packed":
                if previous_end is not None and len(current) == len(PHASE_NAMES):
                    prev = previous_end
                    for name, clock in current.items():  # in the order they happened
                        result[name].append(clock - prev)
                        prev = clock
                    result["step"].append(e.clock - previous_end)
                previous_end, current = e.clock, {}
    return result


def tiles(events: list[Event]) -> list[int]:
    """Cycles between consecutive tile starts (q_ready) of one consumer."""
    starts = [e.clock for e in events if e.name == "q_ready"]
    return [b - a for a, b in zip(starts, starts[1:])]


def median(values: list[int]) -> float:
    return statistics.median(values) if values else float("nan")


def _buffer(prepared) -> tuple[int, int]:
    """(device address, bytes) of a prepared traced kernel's trace buffer."""
    from cuda.bindings import driver as cu

    from .driver import check

    from .driver import current

    if not prepared.built.spec.trace:
        raise ValueError(f"{prepared.built.spec.name} is not a traced build: prepare(..., trace=True)")
    with current(prepared.kernel.context):
        address, size = check(cu.cuModuleGetGlobal(prepared.kernel.module, b"flashgen_trace"), "cuModuleGetGlobal")
    return int(address), int(size)


def clear(prepared) -> None:
    """Zero the trace buffer (before the launch to trace)."""
    from cuda.bindings import driver as cu

    from .driver import check

    from .driver import current

    address, size = _buffer(prepared)
    with current(prepared.kernel.context):
        check(cu.cuMemsetD8(address, 0, size), "cuMemsetD8")


def read(prepared) -> dict[tuple[int, int, int], list[Event]]:
    """The events of the last launch, by (CTA, consumer, warp); call after the launch has finished."""
    import numpy as np
    from cuda.bindings import driver as cu

    from .driver import check

    from .driver import current

    address, size = _buffer(prepared)
    words = np.zeros(size // 8, dtype=np.uint64)
    with current(prepared.kernel.context):
        check(cu.cuMemcpyDtoH(words.ctypes.data, address, size), "cuMemcpyDtoH")
    return split_rows(words)


def split_rows(words) -> dict[tuple[int, int, int], list[Event]]:
    """The whole buffer (TRACE_CTAS x 2 x TRACE_WARPS x TRACE_WORDS words) -> events by (CTA, consumer, warp).
    All rows of a CTA count from the earliest of their first events ("earliest" on the 32-bit clock's circle,
    since the rows start within cycles of each other), so the two consumers' timelines line up to within the
    ~150 cycles by which warps' clocks can differ."""
    rows = words.reshape(TRACE_CTAS, 2 * TRACE_WARPS, TRACE_WORDS)
    events = {}
    for cta in range(TRACE_CTAS):
        firsts = [int(row[0]) & 0xFFFFFFFF for row in rows[cta] if int(row[0])]
        base = min(firsts, key=lambda c: max((f - c) % 2**32 for f in firsts)) if firsts else None
        for r, row in enumerate(rows[cta]):
            events[(cta, r // TRACE_WARPS, r % TRACE_WARPS)] = decode(row, base=base)
    return events
