"""The Blackwell forward kernel's barrier protocol as data, and a CPU check that it cannot deadlock, wait on an
aliased phase, or overwrite a buffer still in use.

`programs(stages, n_kv)` lists, per role (the TMA thread, the MMA thread, each of the four softmax warps), the
steps the kernel takes for a tile of n_kv key blocks: waits on a barrier phase, arrivals, and the buffer accesses
between them. tcgen05.commit and TMA completion are arrivals that depend on no barrier, so they are modelled as
immediate (a delay cannot add a wait). `check(stages, n_kv)` runs the roles under many interleavings with
mbarrier parity semantics and reports the first problem:

* deadlock: no role can take a step and some are not finished;
* aliasing: a wait for phase k while the barrier has not finished phase k - 1 (try_wait.parity would pass on
  the older phase of the same parity);
* overrun: a TMA load into a ring slot, a QK into an S buffer, or a P write, before the last reader of that
  buffer has finished; an O rescale or read while a PV may be writing O.

The steps mirror templates/fwd_sm100/kernel.cu.j2 (producer, mma_issuer, issue_pv, softmax); tests hold the two
together by the barriers each device function waits on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SOFTMAX_WARPS = 4


@dataclass(frozen=True)
class Step:
    kind: str           # "wait", "arrive", "use"
    barrier: str = ""   # e.g. "KFull[1]"
    phase: int = 0      # wait: the phase index waited for
    use: str = ""       # use: what is read or written, e.g. "write K[1] j=4"


def wait(barrier, phase):
    return Step("wait", barrier, phase)


def arrive(barrier):
    return Step("arrive", barrier)


def use(what):
    return Step("use", use=what)


def programs(stages: int, n_kv: int, chunks: int = 2) -> dict[str, list[Step]]:
    """The roles' steps for a tile of n_kv key blocks, a `stages`-slot ring and PV in `chunks` chunks."""
    prod = [arrive("QFull")]
    for j in range(n_kv):
        s = j % stages
        if j >= stages:
            prod.append(wait(f"KEmpty[{s}]", j // stages - 1))
        prod += [use(f"write K{s} {j}"), arrive(f"KFull[{s}]")]
        if j >= stages:
            prod.append(wait(f"VEmpty[{s}]", j // stages - 1))
        prod += [use(f"write V{s} {j}"), arrive(f"VFull[{s}]")]

    def pv(i):
        b, s = i % 2, i % stages
        steps = [wait(f"VFull[{s}]", i // stages)]
        for c in range(chunks):
            steps += [wait(f"PFull[{b}{c}]", i // 2), use(f"PV {i} reads P{b} chunk {c} V{s}")]
        return steps + [use(f"PV {i} writes O"), arrive("PvDone"), arrive(f"VEmpty[{s}]")]

    mma = [wait("QFull", 0)]
    for j in range(n_kv):
        b, s = j % 2, j % stages
        if j >= 2:
            mma.append(wait("PvDone", j - 2))
        mma += [wait(f"KFull[{s}]", j // stages), use(f"QK {j} reads K{s} writes S{b}"), arrive(f"SFull[{b}]"),
                arrive(f"KEmpty[{s}]")]
        if j >= 1:
            mma += pv(j - 1)
    if n_kv:
        mma += pv(n_kv - 1)

    roles = {"producer": prod, "mma": mma}
    for w in range(SOFTMAX_WARPS):
        steps = []
        for j in range(n_kv):
            b = j % 2
            steps += [wait(f"SFull[{b}]", j // 2), use(f"softmax {j} reads S{b}")]
            if j > 0:
                steps += [wait("PvDone", j - 1), use(f"softmax {j} rescales O")]
            for c in range(chunks):
                steps += [use(f"softmax {j} writes P{b} chunk {c}"), arrive(f"PFull[{b}{c}]")]
        if n_kv:
            steps.append(wait("PvDone", n_kv - 1))
        steps.append(use("softmax reads O"))
        roles[f"softmax{w}"] = steps
    return roles


ARRIVALS = {"PFull": SOFTMAX_WARPS}  # every other barrier completes a phase on one arrival


@dataclass
class _Barrier:
    arrivals: int
    done: int = 0  # completed phases
    pending: int = 0


@dataclass
class _State:
    stages: int
    barriers: dict = field(default_factory=dict)
    # who last used each buffer, for the overrun checks: K/V slot -> block, S/P buffer -> block
    k_block: dict = field(default_factory=dict)
    v_block: dict = field(default_factory=dict)
    qk_done: set = field(default_factory=set)
    pv_done: set = field(default_factory=set)
    pv_issued: set = field(default_factory=set)
    p_written: dict = field(default_factory=dict)  # block -> softmax warps that wrote their rows of its P

    def barrier(self, name):
        if name not in self.barriers:
            self.barriers[name] = _Barrier(ARRIVALS.get(name.split("[")[0], 1))
        return self.barriers[name]


class ProtocolError(AssertionError):
    pass


def _apply_use(state: _State, what: str) -> None:
    words = what.split()
    if words[0] == "write":  # TMA load of block j into slot: its previous block's reader must be done
        slot, j = words[1], int(words[2])
        previous = j - state.stages
        if previous >= 0:
            if slot[0] == "K" and previous not in state.qk_done:
                raise ProtocolError(f"K slot {slot[1:]} loaded with block {j} before QK {previous} read it")
            if slot[0] == "V" and previous not in state.pv_done:
                raise ProtocolError(f"V slot {slot[1:]} loaded with block {j} before PV {previous} read it")
        (state.k_block if slot[0] == "K" else state.v_block)[slot] = j
    elif words[0] == "QK":
        j = int(words[1])
        if state.k_block.get(f"K{j % state.stages}") != j:
            raise ProtocolError(f"QK {j} ran before K block {j} was loaded")
        if j >= 2 and (j - 2) not in state.pv_done:
            raise ProtocolError(f"QK {j} overwrote S buffer {j % 2} before PV {j - 2} read P there")
        state.qk_done.add(j)
    elif words[0] == "PV" and words[2] == "reads":
        i, c = int(words[1]), int(words[5])
        if state.v_block.get(f"V{i % state.stages}") != i:
            raise ProtocolError(f"PV {i} ran before V block {i} was loaded")
        if state.p_written.get((i, c), 0) != SOFTMAX_WARPS:
            raise ProtocolError(f"PV {i} read chunk {c} of P before every softmax warp wrote it")
    elif words[0] == "PV" and words[2] == "writes":
        i = int(words[1])
        state.pv_issued.add(i)
        state.pv_done.add(i)  # the MMA completes before its commit arrives (modelled as immediate)
    elif words[0] == "softmax":
        if words[1] == "reads" and words[2] == "O":
            if len(state.pv_done) != len(state.qk_done):
                raise ProtocolError("O read before the last PV finished")
            return
        j, action = int(words[1]), words[2]
        if action == "reads" and j not in state.qk_done:
            raise ProtocolError(f"softmax read S {j} before QK {j} finished")
        if action == "rescales" and (j - 1) not in state.pv_done:
            raise ProtocolError(f"O rescaled for block {j} while PV {j - 1} may write it")
        if action == "writes":
            key = (j, int(words[5]))
            state.p_written[key] = state.p_written.get(key, 0) + 1


def check(stages: int, n_kv: int, *, chunks: int = 2, schedules: int = 200, seed: int = 0) -> None:
    """Run every role of a tile with n_kv key blocks under `schedules` random interleavings, the one that always
    runs the first runnable role, and one per role that runs it only when nothing else can (the slowest that
    role can be); raise ProtocolError on a deadlock, an aliased wait or an overrun."""
    rng = random.Random(seed)
    roles = list(programs(stages, n_kv, chunks))
    # Schedules: the first runnable role always; each role starved (run only when nothing else can); random.
    strategies = ["first"] + [("starve", r) for r in roles] + ["random"] * schedules
    for strategy in strategies:
        progs = programs(stages, n_kv, chunks)
        pc = {role: 0 for role in progs}
        state = _State(stages)
        while True:
            runnable = []
            for role, steps in progs.items():
                if pc[role] == len(steps):
                    continue
                step = steps[pc[role]]
                if step.kind == "wait":
                    bar = state.barrier(step.barrier)
                    if bar.done < step.phase:
                        raise ProtocolError(f"{role} waits for phase {step.phase} of {step.barrier} while phase "
                                            f"{step.phase - 1} is not done: the parity wait would pass on an older phase")
                    if bar.done == step.phase:
                        continue  # blocked
                runnable.append(role)
            if not runnable:
                stuck = {r: progs[r][pc[r]] for r in progs if pc[r] < len(progs[r])}
                if stuck:
                    raise ProtocolError(f"deadlock with {n_kv} key blocks, {stages} stages: " +
                                        "; ".join(f"{r} at {s.kind} {s.barrier or s.use} {s.phase}" for r, s in stuck.items()))
                break
            if strategy == "first":
                role = runnable[0]
            elif strategy == "random":
                role = rng.choice(runnable)
            else:
                others = [r for r in runnable if r != strategy[1]]
                role = others[0] if others else runnable[0]
            step = progs[role][pc[role]]
            pc[role] += 1
            if step.kind == "arrive":
                bar = state.barrier(step.barrier)
                bar.pending += 1
                if bar.pending == bar.arrivals:
                    bar.done, bar.pending = bar.done + 1, 0
            elif step.kind == "use":
                _apply_use(state, step.use)
