"""The decode kernel's barrier protocol (codegen/families/decode_sm90/protocol.py) and the asynchronous
completions it is checked under (codegen/protocol.py): the real plans cannot deadlock, alias or overrun over 0
to 3x the ring depth of key blocks; an odd ring shared by two key groups aliases once TMA loads may land in any
order (the fault a GPU launch showed, which the immediate model misses); every dropped wait is caught; the
model waits on what the kernel waits on."""

from __future__ import annotations

import dataclasses
import re

import pytest

from codegen import families
from codegen.families.decode_sm90 import protocol
from codegen.families.decode_sm90.plan import DecodeSpec, Plan, make_plan, resolve
from codegen.protocol import ProtocolError, arrive, run, use, wait
from codegen.render import render
from codegen.spec import SpecError

# The plans resolve makes: one row group of two key groups on an even ring, two row groups on an odd one.
REAL = {
    "1x2": DecodeSpec(heads=32, kv_heads=8, head_dim=128),
    "1x2-d64": DecodeSpec(heads=32, kv_heads=8, head_dim=64),
    "1x2-d256": DecodeSpec(heads=16, kv_heads=8, head_dim=256, q_len=2),
    "2x1": DecodeSpec(heads=64, kv_heads=8, head_dim=128, q_len=16),
    "2x1-st2": DecodeSpec(heads=64, kv_heads=8, head_dim=128, q_len=16, stages=2),
}


def _odd_ring(stages: int = 3) -> Plan:
    """A 1x2 plan on an odd ring, which resolve refuses: Plan(spec) builds it anyway."""
    spec = DecodeSpec(heads=32, kv_heads=8, head_dim=128, block_n=128, stages=stages)
    with pytest.raises(SpecError, match="multiple of 2"):
        resolve(spec)
    plan = Plan(spec)
    assert (plan.row_groups, plan.key_groups, plan.spec.stages) == (1, 2, stages)
    return plan


def test_the_real_plans_are_the_shapes_the_check_covers():
    shapes = {name: (p.row_groups, p.key_groups, p.spec.stages)
              for name, p in ((n, make_plan(s)) for n, s in REAL.items())}
    assert shapes["1x2"] == (1, 2, 2) and shapes["2x1"] == (2, 1, 3) and shapes["2x1-st2"] == (2, 1, 2)
    assert all(stages % keys == 0 for _, keys, stages in shapes.values())
    assert shapes["1x2-d64"][2] > 2  # a deeper even ring


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("async_completions", (True, False), ids=("async", "immediate"))
def test_the_real_plans_cannot_deadlock_alias_or_overrun(name, async_completions):
    plan = make_plan(REAL[name])
    for count in range(0, 3 * plan.spec.stages + 1):
        for tail in (True, False):
            protocol.check(plan, count, tail=tail, async_completions=async_completions, schedules=30, seed=count)


@pytest.mark.parametrize("stages", (2, 4, 6, 8))
def test_every_even_ring_with_two_key_groups_holds(stages):
    plan = Plan(DecodeSpec(heads=32, kv_heads=8, head_dim=64, block_n=64, stages=stages))
    assert plan.key_groups == 2
    for count in range(0, 3 * stages + 1):
        protocol.check(plan, count, schedules=20, seed=count)


@pytest.mark.parametrize("stages", (3, 5, 7))
def test_an_odd_ring_with_two_key_groups_aliases_under_async_completions(stages):
    """Blocks j and j + stages share a slot but belong to different key groups: the second group waits for the
    slot's phase of block j + stages while block j's load (or an earlier lap's) has not landed, and the parity
    wait passes on the older phase. Caught from the first block that reuses a slot across groups."""
    plan = _odd_ring(stages)
    for count in range(0, stages + 1):  # no slot reused across the key groups yet
        protocol.check(plan, count, schedules=30, seed=count)
    for count in range(stages + 1, 3 * stages + 1):
        with pytest.raises(ProtocolError, match=r"consumer\d waits for phase \d+ of KFull\[\d\] while phase \d+ is "
                                                r"not done \(in flight: land K .*older phase"):
            protocol.check(plan, count, schedules=30, seed=count)


def test_the_immediate_model_misses_the_odd_ring():
    """Loads landing at their issue land in issue order, and then a group's wait always finds the older phase
    done: the old model passes the ring of 3 that faulted on the GPU."""
    plan = _odd_ring(3)
    for count in range(0, 3 * 3 + 1):
        protocol.check(plan, count, async_completions=False, schedules=100, seed=count)


def test_an_odd_ring_hands_a_slot_s_phases_to_both_key_groups():
    """Why it can alias: on the ring of 3, slot 0's phases 0, 1, 2 (blocks 0, 3, 6) go to key groups 0, 1, 0, so
    no group has waited for the phase before the one it waits for; on an even ring each slot is one group's."""
    def phases(plan, count):
        progs = protocol.programs(plan, count)
        return {c: [(s.barrier, s.phase) for s in progs[c] if s.kind == "wait" and s.barrier.startswith("KFull")]
                for c in ("consumer0", "consumer1")}

    odd = phases(_odd_ring(3), 7)
    assert odd["consumer0"] == [("KFull[0]", 0), ("KFull[2]", 0), ("KFull[1]", 1), ("KFull[0]", 2)]  # blocks 0 2 4 6
    assert odd["consumer1"] == [("KFull[1]", 0), ("KFull[0]", 1), ("KFull[2]", 1)]                  # blocks 1 3 5
    even = phases(make_plan(REAL["1x2"]), 8)
    assert even["consumer0"] == [("KFull[0]", k) for k in range(4)]
    assert even["consumer1"] == [("KFull[1]", k) for k in range(4)]


@pytest.mark.parametrize("name", ("1x2", "2x1"))
@pytest.mark.parametrize("role, kind, prefix, message", [
    ("producer", "wait", "KEmpty", "K slot .* loaded with block .* (before every QK of block|while block .*'s load "
                                   "is still in flight)"),
    ("producer", "wait", "VEmpty", "V slot .* loaded with block .* (before every PV of block|while block .*'s load "
                                   "is still in flight)"),
    ("consumer0", "wait", "KFull", "QK of block .* found K slot .* not block .* landed"),
    ("consumer1", "wait", "KFull", "QK of block .* found K slot .* not block .* landed"),
    ("consumer0", "wait", "VFull", "(PV|tail zeroing) of block .* found V slot .* not block .* landed"),
    ("consumer1", "wait", "VFull", "(PV|tail zeroing) of block .* found V slot .* not block .* landed"),
    ("consumer1", "arrive", "KEmpty", "deadlock"),
    ("consumer0", "arrive", "VEmpty", "deadlock"),
])
def test_a_dropped_wait_or_release_is_caught(monkeypatch, name, role, kind, prefix, message):
    real = protocol.programs

    def without(*args, **kwargs):
        progs = real(*args, **kwargs)
        progs[role] = [s for s in progs[role] if not (s.kind == kind and s.barrier.startswith(prefix))]
        return progs

    monkeypatch.setattr(protocol, "programs", without)
    plan = make_plan(REAL[name])
    with pytest.raises(ProtocolError, match=message):
        for count in range(1, 3 * plan.spec.stages + 1):
            protocol.check(plan, count, schedules=60, seed=count)


@pytest.mark.parametrize("role, barrier, message", [
    # the second key group writes the exchange without waiting for the first to finish its blocks
    ("consumer1", "RowGroup0.merge", "exchange wrote the K/V ring (while .* in flight|before .* landed|before every)"),
    # the first reads it without waiting for the write
    ("consumer0", "RowGroup0.exchange", "read the exchange before the second wrote it"),
    # a key group's QK before its partner's share of Q is written
    ("consumer1", "RowGroup0.q", "QK of block .* before row group 0's Q was whole"),
])
def test_a_dropped_rendezvous_of_the_key_groups_is_caught(monkeypatch, role, barrier, message):
    real = protocol.programs

    def without(*args, **kwargs):
        progs = real(*args, **kwargs)
        progs[role] = [s for s in progs[role] if not (s.kind == "sync" and s.barrier.startswith(barrier))]
        return progs

    monkeypatch.setattr(protocol, "programs", without)
    plan = make_plan(REAL["1x2"])
    with pytest.raises(ProtocolError, match=message):
        for count in range(1, 3 * plan.spec.stages + 1):
            protocol.check(plan, count, schedules=60, seed=count)


def test_the_exchange_waits_for_every_load_to_land(monkeypatch):
    """A key group that skips its last block's V (no wait, no PV, no release) reaches the exchange with that
    load possibly in flight: the exchange's write over the ring is refused."""
    real = protocol.programs

    def skipping_last_v(plan, count, **kwargs):
        progs = real(plan, count, **kwargs)
        last, stages = count - 1, plan.spec.stages
        steps = progs["consumer0"]
        start = steps.index(wait(f"VFull[{last % stages}]", last // stages))
        end = next(i for i in range(start, len(steps)) if steps[i].kind == "arrive")
        progs["consumer0"] = steps[:start] + steps[end + 1:]
        return progs

    monkeypatch.setattr(protocol, "programs", skipping_last_v)
    plan = make_plan(REAL["1x2"])
    with pytest.raises(ProtocolError, match=r"exchange wrote the K/V ring (while V block 4's load into slot 0 was in "
                                            r"flight|before V block 4's load landed|before every PV of block 4)"):
        protocol.check(plan, 5, schedules=30)


def test_a_split_with_no_block_waits_for_its_early_loads(monkeypatch):
    """Where plan.early_load, block 0 is loaded before the length; a split of no block that went straight to the
    exchange would write over the ring with those loads in flight: the model refuses it, and with the waits it
    passes, for every real plan that loads early."""
    early = [n for n, spec in REAL.items() if make_plan(spec).early_load]
    base = DecodeSpec(heads=32, kv_heads=8, head_dim=128)
    # TMA pages, a page of the first block per issuing lane: loaded before the length too (d31)
    paged = [base.replace(page_size=16), base.replace(page_size=128), base.replace(page_size=16, q_len=4)]
    assert early and all(make_plan(spec).early_load for spec in paged)
    assert not make_plan(base.replace(window=(64, 0))).early_load  # the first block moves with the length
    assert not make_plan(base.replace(page_size=4, gather=True)).early_load  # copies by address: no guessed page
    assert not make_plan(base.replace(page_size=1, block_n=176)).early_load  # six pages a lane: producer spills
    for plan in [make_plan(REAL[name]) for name in early] + [make_plan(spec) for spec in paged]:
        protocol.check(plan, 0, schedules=30)
    real = protocol.programs

    def no_wait(plan, count, **kwargs):
        progs = real(plan, count, **kwargs)
        return {role: [s for s in steps if not (role.startswith("consumer") and s.kind == "wait")]
                for role, steps in progs.items()}

    monkeypatch.setattr(protocol, "programs", no_wait)
    with pytest.raises(ProtocolError, match="exchange wrote the K/V ring while . block 0's load"):
        protocol.check(make_plan(REAL["1x2"].replace(swap=False)), 0, schedules=30)
    with pytest.raises(ProtocolError, match="staged its rows in K slot 0 while block 0's load"):
        protocol.check(make_plan(REAL["1x2"]), 0, schedules=30)


def test_the_model_waits_on_what_the_kernel_waits_on():
    for spec in (REAL["1x2"], REAL["1x2"].replace(swap=False), REAL["2x1"]):
        plan = make_plan(spec)
        source = render(plan, families.get("decode_sm90")).source
        bodies = {fn: re.search(rf"__forceinline__ \w+ {fn}\((.*?)\n}}\n", source, flags=re.S).group(1)
                  for fn in ("producer", "consumer", "finish_rows")}

        def waited(fn):
            return {m for m in re.findall(r"mbar_wait\(bar\(bars, kBar(\w+)", bodies[fn])}

        def modelled(role):
            return {s.barrier.split("[")[0] for s in protocol.programs(plan, 7)[role] if s.kind == "wait"}

        assert waited("producer") == modelled("producer") == {"KEmpty", "VEmpty"}
        assert waited("consumer") == modelled("consumer0") == {"KFull", "VFull"}
        # the groups the model runs are the kernel's, and the exchange it models is the consumer's merge
        assert f"kStages = {plan.spec.stages}," in source
        assert f"kRowGroups = {plan.row_groups}, kKeyGroups = {plan.key_groups};" in source
        assert "if constexpr (cfg::kKeyGroups > 1) {\n    if (!merge_key_groups(" in bodies["finish_rows"]
        assert bodies["consumer"].rstrip().endswith("finish_rows(args, w, smem, o, row_max, row_sum, rows, scale_log2, "
                                                    "key_group, row_group, lane, tid);")
        # the swapped consumer stages its rows in K slot `key group`, as the model's stage steps say
        staged = "const u32 stage = smem + cfg::kKOffset + key_group * cfg::kKBytes;" in bodies["consumer"]
        assert staged == bool(plan.spec.swap) == any(s.use.startswith("stage write")
                                                     for s in protocol.programs(plan, 3)["consumer0"] if s.kind == "use")
        # the producer arms each slot's full barriers through load_block, which the early load shares
        load_block = re.search(r"__forceinline__ void load_block\((.*?)\n}\n", source, flags=re.S).group(1)
        assert "load_block<false>(" in bodies["producer"] and "load_block<true>(" in bodies["producer"]
        assert "bar(bars, (kIsV ? kBarVFull : kBarKFull) + s)" in load_block and "mbar_expect_tx(full," in load_block
        # the early load's count-0 waits (plan.early_load): in the consumer as in the model
        assert plan.early_load and "constexpr bool kEarlyLoad = true;" in source
        assert "if (w.count == 0) mbar_wait(bar(bars, kBarKFull), 0), mbar_wait(bar(bars, kBarVFull), 0);" in bodies["consumer"]
        assert [s.barrier for s in protocol.programs(plan, 0)["consumer0"] if s.kind == "wait"] == ["KFull[0]", "VFull[0]"]
        assert "load_first_block(args, w, smem, bars, threadIdx.x);" in source


def test_a_paged_kernel_loads_its_first_block_by_every_issuing_lane_and_the_tables_row():
    """What the model does not see (it has no pages or lanes): a paged early load is issued by every lane that
    loads a block's pages (one lane would arm all of the block's bytes and load one page: a hang), bounded by the
    table's row (not the length, which is unread then), and the producer's loop starts at block 1 with block 1's
    pages (block 0's again would load the wrong keys)."""
    plan = make_plan(DecodeSpec(heads=32, kv_heads=8, head_dim=128, page_size=16))
    assert plan.early_load and plan.page_lanes == plan.producer_threads == 32
    source = render(plan, families.get("decode_sm90")).source
    assert "if (threadIdx.x < cfg::kProducerThreads) load_first_block(args, w, smem, bars, threadIdx.x);" in source
    first = re.search(r"__forceinline__ void load_first_block\((.*?)\n}\n", source, flags=re.S).group(1)
    assert "args.page_table_cols * cfg::kPageRowsOr1, lane);" in first
    producer = re.search(r"__forceinline__ void producer\((.*?)\n}\n", source, flags=re.S).group(1)
    assert "constexpr int kNext = cfg::kEarlyLoad ? 1 : 0;" in producer
    assert "pages = read_block_pages(table, w.key0(kNext), w.len, lane);" in producer
    assert "for (int j = cfg::kEarlyLoad ? 1 : 0; j < w.count; ++j)" in producer


def test_the_model_counts_arrivals_from_the_plan():
    for name in ("1x2", "2x1"):
        plan = make_plan(REAL[name])
        arrivals = protocol.arrivals(plan)
        assert arrivals("KFull[0]") == arrivals("VFull[1]") == 1
        assert arrivals("KEmpty[0]") == arrivals("VEmpty[1]") == 4 * plan.row_groups
        progs = protocol.programs(plan, 2 * plan.spec.stages)
        for s in range(plan.spec.stages):  # one lap's releases of a slot make one phase exactly
            made = sum(st.count for r, steps in progs.items() if r != "producer" for st in steps
                       if st.kind == "arrive" and st.barrier == f"KEmpty[{s}]")
            assert made == 2 * arrivals(f"KEmpty[{s}]")


# ---- the asynchronous completions themselves (codegen/protocol.py)

def _toy(async_loads: bool):
    """The decode fault in miniature: loads 0 and 2 share barrier Full (phases 0 and 1), load 1 is on Other. Role
    a reads block 0 and frees the slot; role b, once block 1 has landed, waits for Full's phase 1 (block 2). In
    issue order block 0 has landed by then; out of order it may not have, and b's wait aliases."""
    engine = "tma" if async_loads else ""

    def progs():
        return {"producer": [use("issue 0"), arrive("Full", engine=engine, use="land 0"),
                             use("issue 1"), arrive("Other", engine=engine, use="land 1"),
                             wait("Empty", 0), use("issue 2"), arrive("Full", engine=engine, use="land 2")],
                "a": [wait("Full", 0), use("read 0"), arrive("Empty")],
                "b": [wait("Other", 0), use("read 1"), wait("Full", 1), use("read 2")]}
    return progs


def _landed_state():
    return {"landed": set()}


def _toy_use(state, what):
    w = what.split()
    if w[0] == "land":
        state["landed"].add(int(w[1]))
    elif w[0] == "read" and int(w[1]) not in state["landed"]:
        raise ProtocolError(f"read {w[1]} before it landed")


TOY = dict(arrivals=lambda name: 1, make_state=_landed_state, apply_use=_toy_use, what="toy", schedules=20)


def test_async_completions_land_in_any_order():
    run(_toy(True), **TOY)  # the default: immediate, so in issue order
    run(_toy(False), **TOY, async_completions=True)  # nothing marked with an engine: immediate
    with pytest.raises(ProtocolError, match=r"b waits for phase 1 of Full while phase 0 is not done \(in flight: "
                                            r"land 0\)"):
        run(_toy(True), **TOY, async_completions=True)


def test_a_predicate_picks_the_asynchronous_arrivals():
    run(_toy(False), **TOY, async_completions=lambda role, step: False)
    with pytest.raises(ProtocolError, match="older phase"):
        run(_toy(False), **TOY, async_completions=lambda role, step: role == "producer")


def test_a_completion_nothing_waits_for_is_refused():
    def progs():
        return {"producer": [use("issue 0"), arrive("Full", engine="tma", use="land 0")], "consumer": []}

    run(progs, **TOY)  # immediate: nothing to wait for
    with pytest.raises(ProtocolError, match="still in flight when every role has finished .*nothing waits for it"):
        run(progs, **TOY, async_completions=True)


def test_the_swapped_rows_are_staged_in_a_slot_no_load_reaches(monkeypatch):
    """Key group g stages its rows in K slot g, which only its own blocks use: every schedule passes. Staged in the
    other group's slot, the model finds the load or the read it would clobber."""
    plan = make_plan(REAL["1x2"])
    assert plan.spec.swap and plan.key_groups == 2
    for count in (0, 1, 2, 3, 5, 8):
        protocol.check(plan, count, schedules=40)
    real = protocol.programs

    def other_slot(plan, count, **kwargs):
        def moved(step):
            if step.kind != "use" or not step.use.startswith("stage "):
                return step
            verb, c, s = step.use.split()[1:]
            return dataclasses.replace(step, use=f"stage {verb} {c} {1 - int(s)}")
        return {role: [moved(s) for s in steps] for role, steps in real(plan, count, **kwargs).items()}

    monkeypatch.setattr(protocol, "programs", other_slot)
    with pytest.raises(ProtocolError, match="staged its rows in K slot|staged rows|holding nothing"):
        protocol.check(plan, 6, schedules=60)
