"""codegen/trace.py: decoding trace words and cutting them into phases; the traced build's source and compile."""

from __future__ import annotations


import pytest

from codegen import trace
from codegen.build import build
from codegen.families import make_plan, resolve
from codegen.render import render
from codegen.spec import KernelSpec


def word(name: str, step: int, clock: int) -> int:
    return (step << 40) | (trace.EVENTS[name] << 32) | (clock & 0xFFFFFFFF)


def steady_step(t: int, start: int, gaps: dict[str, int]) -> list[int]:
    """Words for one turn..packed run starting `start` cycles after the previous 'packed'."""
    words, clock = [], start
    for name in trace.PHASE_NAMES:
        clock += gaps[name]
        words.append(word(name, t, clock))
    return words


GAPS = {name: 10 * (i + 1) for i, name in enumerate(trace.PHASE_NAMES)}


def test_decode_reads_step_event_and_clock_and_unwraps():
    words = [word("q_ready", 3, 0xFFFFFF00), word("turn", 1, 0xFFFFFFF0), word("issued", 1, 0x20), 0,
             word("packed", 9, 5)]
    events = trace.decode(words)
    assert [(e.name, e.step, e.clock) for e in events] == [("q_ready", 3, 0), ("turn", 1, 0xF0), ("issued", 1, 0x120)]


def test_every_warp_of_a_cta_shares_one_clock_base():
    import numpy as np

    words = np.zeros((trace.TRACE_CTAS, 2, trace.TRACE_WARPS, trace.TRACE_WORDS), dtype=np.uint64)
    words[0, 0, 0, :2] = [word("q_ready", 0, 1000), word("turn", 0, 1100)]
    words[0, 0, 3, :2] = [word("q_ready", 0, 1010), word("turn", 0, 1100)]
    words[0, 1, 2, :2] = [word("q_ready", 0, 1040), word("turn", 0, 1900)]
    # CTA 1's rows start on both sides of the clock's wrap: the earliest is the one before it.
    words[1, 0, 0, :2] = [word("q_ready", 0, 0xFFFFFFF0), word("turn", 0, 0x10)]
    words[1, 1, 1, :1] = [word("q_ready", 0, 0x8)]
    events = trace.split_rows(words.reshape(-1))
    assert len(events) == trace.TRACE_CTAS * 2 * trace.TRACE_WARPS
    assert [e.clock for e in events[(0, 0, 0)]] == [0, 100]
    assert [e.clock for e in events[(0, 0, 3)]] == [10, 100]
    assert [e.clock for e in events[(0, 1, 2)]] == [40, 900]
    assert [e.clock for e in events[(1, 0, 0)]] == [0, 0x20]
    assert [e.clock for e in events[(1, 1, 1)]] == [0x18]
    assert events[(0, 0, 1)] == [] and events[(3, 1, 3)] == []


def test_decode_rejects_an_unknown_event_code():
    with pytest.raises(ValueError, match="unknown event code 99"):
        trace.decode([(99 << 32) | 5])


def test_phases_are_the_gaps_between_events_of_complete_steps():
    first = [word("q_ready", 0, 100), word("turn", 0, 110), word("issued", 0, 150), word("qk_done", 0, 400),
             word("packed", 0, 1000)]
    words = first + steady_step(1, 1000, GAPS)
    words += steady_step(2, (words[-1] & 0xFFFFFFFF) + 100, GAPS)  # 100 cycles after step 1's 'packed'
    result = trace.phases(trace.decode(words))
    # Step 1 starts at step 0's 'packed'; step 2 lacks nothing either; the first step is not a steady one.
    assert result["turn"] == [GAPS["turn"], 100 + GAPS["turn"]]
    for name in trace.PHASE_NAMES[1:]:
        assert result[name] == [GAPS[name], GAPS[name]]
    assert result["step"] == [sum(GAPS.values()), 100 + sum(GAPS.values())]


def test_a_step_after_a_new_tile_or_an_incomplete_run_is_left_out():
    words = [word("q_ready", 0, 0), word("packed", 0, 50)] + steady_step(1, 50, GAPS)
    words += [word("turn", 2, 5000), word("issued", 2, 5100)]  # the tile's last PV: no softmax, no packed
    words += [word("q_ready", 1, 6000)] + steady_step(1, 6000, GAPS)  # no 'packed' before it in this tile
    result = trace.phases(trace.decode(words))
    assert len(result["step"]) == 1
    assert trace.tiles(trace.decode(words)) == [6000]


def test_every_event_is_written_by_the_traced_source_and_none_by_the_plain_one():
    spec = resolve(KernelSpec(seq_len=1000, heads=8, head_dim=128, trace=True))
    traced = render(make_plan(spec)).source
    plain = render(make_plan(spec.replace(trace=False))).source
    # Each event is an enumerator with the code codegen.trace decodes, and the consumer records every one.
    for name, code in trace.EVENTS.items():
        enumerator = "kEv" + "".join(w.title() for w in name.split("_"))
        assert f"{enumerator} = {code}" in traced and f"trace({enumerator}," in traced, name
    assert "flashgen_trace" in traced and "flashgen_trace" not in plain
    assert "operator()(TraceEvent, int) {}" in plain  # the plain build's recorder does nothing
    assert (f"kTraceCtas = {trace.TRACE_CTAS}, kTraceWarps = {trace.TRACE_WARPS}, "
            f"kTraceWords = {trace.TRACE_WORDS}") in traced
    assert "tid % 32 == 0" in traced  # the first lane of every consumer warp
    assert spec.name.endswith("_trace") and not spec.replace(trace=False).name.endswith("_trace")


@pytest.mark.parametrize("shape", [dict(seq_len=1024, heads=64, head_dim=128, dtype="f16"),
                                   dict(seq_len=4096, heads=16, head_dim=256),
                                   dict(seq_len=1000, heads=8, head_dim=64, causal=True)],
                         ids=("seed", "D256", "D64-causal"))
def test_traced_builds_compile_without_spills(shape):
    built = build(resolve(KernelSpec(trace=True, **shape)))
    info = built.compiled.kernels[built.rendered.kernel_name]
    assert info.spill_stores == 0 and info.spill_loads == 0


def test_the_trace_script_pools_each_consumers_warps(capsys):
    import numpy as np

    from scripts.trace import print_warps

    words = np.zeros((trace.TRACE_CTAS, 2, trace.TRACE_WARPS, trace.TRACE_WORDS), dtype=np.uint64)
    for cta in (0, 2):  # consumer 0 of CTAs 0 and 2: warp w's softmax takes 10 * w cycles more
        for w in range(trace.TRACE_WARPS):
            gaps = dict(GAPS, softmax=GAPS["softmax"] + 10 * w + cta)
            row = [word("q_ready", 0, 0), word("packed", 0, 1000)] + steady_step(1, 1000, gaps)
            words[cta, 0, w, :len(row)] = row
    out = print_warps(trace.split_rows(words.reshape(-1)))
    for w in range(trace.TRACE_WARPS):
        assert out["0,%d" % w]["softmax"] == [GAPS["softmax"] + 10 * w, GAPS["softmax"] + 10 * w + 2]
        assert out["0,%d" % w]["step"] == [sum(GAPS.values()) + 10 * w, sum(GAPS.values()) + 10 * w + 2]
    assert out["1,3"]["step"] == []
    printed = capsys.readouterr().out
    assert "softmax(t)" in printed and "c1/w3" in printed
