"""The decode kernel's barrier protocol as data, checked by codegen.protocol.run under asynchronous TMA completions.

`programs(plan, count)` lists, per role, the steps templates/decode_sm90 takes for a split of `count` key blocks:
the producer thread (producer() in kernel.cu.j2) and the plan's row_groups x key_groups consumer warpgroups
(consumer() in consumer.j2; consumer c is row group c % row_groups of key group c // row_groups, as there).
Every number comes from the plan: the ring's depth (spec.stages), the groups, and each barrier's arrival count
(plan.abi). Each step of a warpgroup is its four warps at once (their lane-0 releases count 4).

* The producer, for block j in slot s = j % stages: past the first lap it waits for KEmpty[s]'s phase of block
  j - stages, issues the TMA load of K (the copy engine writes the slot from then on) and the load's completion
  arrives on KFull[s] when it lands; then the same for V. The completions are asynchronous events
  (`engine="tma"`): issued in order, landing in any order (codegen/protocol.py). A paged cache's block is
  several loads on one barrier whose expect_tx counts all their bytes, so its phase completes when the last
  lands: one completion here too. Where a block spans many pages (plan.page_lanes) the producer is a warp whose
  lanes each wait for the slot and issue some of its pages' loads after lane 0's expect_tx: still one arming
  and one completion of the barrier per block, as modelled.
* Key group g takes blocks j = g, g + key_groups, ...: it waits for KFull[s]'s phase j // stages, runs QK, and
  (its wgmma waited) each warp releases KEmpty[s]; then VFull[s], PV, VEmpty[s]. Every row group reads every
  block it is given, so a slot's release counts 4 x row_groups arrivals. With `tail`, the last block holds the
  sequence's end and its V rows past it are zeroed by each reader (zero_v_tail) before its PV.
* Where plan.early_load, the producer issues block 0 before the split's count is known; a split that then has no
  block still has those two loads in flight, and every consumer waits for them to land before the exchange
  writes over the ring or the CTA exits.
* Q: each row group's tile is written by its key groups together (copy_q, at kernel entry), then a named-barrier
  rendezvous (wait_q), whether or not the split has key blocks.
* The swapped consumer (plan.spec.swap; consumer_swapped.j2) past its blocks writes its rows' O into K slot `key
  group` and reads it back in the plain fragment layout (plan.swap_stage_bytes); no load may be in flight into that
  slot, its block must have been read, and no load may follow into it while the rows are there.
* With two key groups, merge_key_groups: both rendezvous, the second writes its O fragment, row maxima and sums over
  the K/V ring memory and signals, the first syncs and reads them.

`_apply_use` refuses: a load into a slot before every reader of its previous block is done with it; a QK, PV
or tail zeroing that finds its slot not holding its block landed (a load still in flight, or an older block); a
QK before its row group's Q is whole; the key groups' exchange written over the ring while a load may still
write it (every load must have landed) or a consumer may still read it, or read before it is written.

Under the immediate model of earlier families (async_completions=False) a load lands when issued, so loads land
in issue order. That model passes a ring of 3 slots with two key groups; the asynchronous one finds the fault a
GPU launch showed: blocks j and j + 3 share a slot but belong to different key groups, so a group can wait for
the slot's next phase while the other group's load before it has not landed and pass on the older phase of the
same parity (tests/test_protocol_decode.py). plan.resolve requires stages % key_groups == 0 for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.protocol import ProtocolError, Step, arrive, run, signal, sync, use, wait

from .plan import WARPS_PER_WARPGROUP, Plan

__all__ = ["ProtocolError", "Step", "arrivals", "check", "programs"]


def _rendezvous(name: str, me: int, other: int) -> list[Step]:
    """Both sides of a bar.sync two warpgroups share: neither passes before the other has arrived."""
    return [signal(f"{name}:{me}>{other}"), sync(f"{name}:{other}>{me}")]


def programs(plan: Plan, count: int, *, tail: bool = True) -> dict[str, list[Step]]:
    """The roles' steps for a split of `count` key blocks (`tail`: the last one holds the sequence's end)."""
    stages, rows, keys = plan.spec.stages, plan.row_groups, plan.key_groups

    prod = []
    # plan.early_load: block 0 is issued before the length says whether the split has any block.
    for j in range(max(count, 1 if plan.early_load else 0)):
        s, lap = j % stages, j // stages
        for op in ("K", "V"):
            if j >= stages:
                prod.append(wait(f"{op}Empty[{s}]", lap - 1))
            prod += [use(f"issue {op} {s} {j}"), arrive(f"{op}Full[{s}]", engine="tma", use=f"land {op} {s} {j}")]

    roles = {"producer": prod}
    for c in range(plan.consumers):
        rg, kg = c % rows, c // rows
        steps = []
        steps.append(use(f"write Q {rg} {kg}"))  # copy_q, wait_q: the row group's key groups fill its Q tile, then sync
        if keys > 1:
            steps += _rendezvous(f"RowGroup{rg}.q", kg, 1 - kg)
        for j in range(kg, count, keys):
            s, lap = j % stages, j // stages
            steps += [wait(f"KFull[{s}]", lap), use(f"QK {c} {j} {s}"), use(f"QK done {c} {j}"),
                      arrive(f"KEmpty[{s}]", WARPS_PER_WARPGROUP), wait(f"VFull[{s}]", lap)]
            if tail and j == count - 1:
                steps.append(use(f"zero V {c} {j} {s}"))
            steps += [use(f"PV {c} {j} {s}"), use(f"PV done {c} {j}"), arrive(f"VEmpty[{s}]", WARPS_PER_WARPGROUP)]
        if plan.early_load and count == 0:  # the early loads land before the ring is reused (or the CTA exits)
            steps += [wait("KFull[0]", 0), wait("VFull[0]", 0)]
        if plan.spec.swap:  # the rows' O through K slot `key group`, to the plain fragment layout
            steps += [use(f"stage write {c} {kg}"), use(f"stage read {c} {kg}")]
        if keys > 1:  # merge_key_groups (two key groups: one row group)
            steps += _rendezvous(f"RowGroup{rg}.merge", kg, 1 - kg)
            if kg == 1:
                steps += [use(f"exchange write {rg}"), signal(f"RowGroup{rg}.exchange")]
            else:
                steps += [sync(f"RowGroup{rg}.exchange"), use(f"exchange read {rg}")]
        roles[f"consumer{c}"] = steps
    return roles


def arrivals(plan: Plan):
    """Barrier name ("KEmpty[1]") -> the arrivals that complete a phase, from the plan's ABI."""
    counts = {b.name: b.arrivals for b in plan.abi.barriers.barriers}
    return lambda name: counts[name.split("[")[0]]


@dataclass
class _State:
    plan: Plan
    count: int
    block: dict = field(default_factory=dict)      # ("K", slot) -> block landed there (None while a load writes it)
    loading: dict = field(default_factory=dict)    # ("K", slot) -> block whose load is in flight
    landed: set = field(default_factory=set)       # ("K", block) loads completed
    read: dict = field(default_factory=dict)       # ("QK", block) -> consumers whose wgmma on it completed
    q_parts: dict = field(default_factory=dict)    # row group -> key groups that wrote their share of its Q
    exchange: set = field(default_factory=set)     # row groups whose exchange was written
    staged: dict = field(default_factory=dict)     # K slot -> the swapped consumer whose rows it holds

    def readers(self, j: int) -> set:
        rows, keys = self.plan.row_groups, self.plan.key_groups
        return {c for c in range(self.plan.consumers) if c // rows == j % keys}


def _apply_use(state: _State, what: str) -> None:
    w = what.split()
    stages = state.plan.spec.stages
    if w[0] == "issue":
        op, s, j = w[1], int(w[2]), int(w[3])
        reader = "QK" if op == "K" else "PV"
        if state.exchange:
            raise ProtocolError(f"{op} block {j}'s load into slot {s} over the key groups' exchange")
        if op == "K" and s in state.staged:
            raise ProtocolError(f"K block {j}'s load into slot {s} over consumer {state.staged[s]}'s staged rows")
        if (op, s) in state.loading:
            raise ProtocolError(f"{op} slot {s} loaded with block {j} while block {state.loading[op, s]}'s load "
                                "is still in flight")
        prev = j - stages
        if prev >= 0 and state.read.get((reader, prev), set()) != state.readers(prev):
            raise ProtocolError(f"{op} slot {s} loaded with block {j} before every {reader} of block {prev} read it")
        state.loading[op, s], state.block[op, s] = j, None
    elif w[0] == "land":
        op, s, j = w[1], int(w[2]), int(w[3])
        assert state.loading.get((op, s)) == j, (what, state.loading)
        del state.loading[op, s]
        state.block[op, s] = j
        state.landed.add((op, j))
    elif w[0] == "write" and w[1] == "Q":
        state.q_parts.setdefault(int(w[2]), set()).add(int(w[3]))
    elif w[0] in ("QK", "PV") and w[1] == "done":  # wgmma.wait_group 0: the warpgroup's reads of the slot are over
        state.read.setdefault((w[0], int(w[3])), set()).add(int(w[2]))
    elif w[0] in ("QK", "PV", "zero"):
        if w[0] == "zero":
            c, j, s, op, doing = int(w[2]), int(w[3]), int(w[4]), "V", "tail zeroing"
        else:
            c, j, s, op, doing = int(w[1]), int(w[2]), int(w[3]), "K" if w[0] == "QK" else "V", w[0]
        rg = c % state.plan.row_groups
        if w[0] == "QK" and len(state.q_parts.get(rg, ())) != state.plan.key_groups:
            raise ProtocolError(f"consumer {c}'s QK of block {j} ran before row group {rg}'s Q was whole")
        held = state.block.get((op, s))
        if held != j:
            now = (f"block {state.loading[op, s]}'s load in flight" if (op, s) in state.loading
                   else "nothing" if held is None else f"block {held}")
            raise ProtocolError(f"consumer {c}'s {doing} of block {j} found {op} slot {s} holding {now}, not block "
                                f"{j} landed")
    elif w[0] == "exchange" and w[1] == "write":
        rg = int(w[2])
        if state.loading:
            op, s = next(iter(state.loading))
            raise ProtocolError(f"the key groups' exchange wrote the K/V ring while {op} block "
                                f"{state.loading[op, s]}'s load into slot {s} was in flight")
        missing = [(op, j) for j in range(state.count) for op in "KV" if (op, j) not in state.landed]
        if missing:
            raise ProtocolError(f"the key groups' exchange wrote the K/V ring before {missing[0][0]} block "
                                f"{missing[0][1]}'s load landed")
        for j in range(state.count):
            for reader in ("QK", "PV"):
                if state.read.get((reader, j), set()) != state.readers(j):
                    raise ProtocolError(f"the key groups' exchange wrote the K/V ring before every {reader} of block "
                                        f"{j} had read it")
        state.exchange.add(rg)
    elif w[0] == "stage":
        c, s = int(w[2]), int(w[3])
        if w[1] == "read":
            assert state.staged.get(s) == c, (what, state.staged)
            del state.staged[s]
            return
        if ("K", s) in state.loading:
            raise ProtocolError(f"consumer {c} staged its rows in K slot {s} while block {state.loading['K', s]}'s "
                                "load into it was in flight")
        held = state.block.get(("K", s))
        if held is not None and held < state.count and state.read.get(("QK", held), set()) != state.readers(held):
            raise ProtocolError(f"consumer {c} staged its rows in K slot {s} before every QK of block {held} read it")
        state.block["K", s], state.staged[s] = None, c
    elif w[0] == "exchange" and w[1] == "read":
        if int(w[2]) not in state.exchange:
            raise ProtocolError(f"row group {w[2]}'s first key group read the exchange before the second wrote it")
    else:
        raise AssertionError(f"unknown use {what!r}")


def check(plan: Plan, count: int, *, tail: bool = True, async_completions=True, schedules: int = 100,
          seed: int = 0) -> None:
    """Run every role of a split of `count` key blocks through codegen.protocol.run (by default with TMA loads
    landing in any order after their issue); raise ProtocolError on a deadlock, an aliased wait or an overrun."""
    s = plan.spec
    run(lambda: programs(plan, count, tail=tail), arrivals(plan), lambda: _State(plan, count), _apply_use,
        what=f"{count} key blocks, {s.stages} stages, {plan.row_groups} row x {plan.key_groups} key groups",
        schedules=schedules, seed=seed, async_completions=async_completions)
