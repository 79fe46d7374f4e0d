"""Barrier protocols as data, and the CPU check every family's protocol runs through.

A family states its kernel's protocol as `programs`: per role (a thread, a warp, a warpgroup), the steps it
takes: a wait for phase k of an mbarrier, an arrival (with a count: a warpgroup's four warps arrive as one
step of 4), a named-barrier sync or arrive, or a `use` of a buffer that the family's own `apply_use` checks
against what has happened so far. `run` executes the roles under many interleavings with mbarrier parity
semantics and raises ProtocolError on the first problem:

* deadlock: no role can take a step and some are not finished;
* aliasing: a wait for phase k while the barrier has not finished phase k - 1 (try_wait.parity would pass on
  the older phase of the same parity);
* whatever `apply_use` refuses (a buffer written while still being read, read before it was written).

Completions that depend on no barrier (TMA, tcgen05.commit, wgmma groups) are arrivals taken as immediate: a
delay cannot add a wait, so deadlock freedom does not depend on it. Families: fwd_sm100/protocol.py,
fwd_sm90/protocol.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable


class ProtocolError(AssertionError):
    pass


@dataclass(frozen=True)
class Step:
    kind: str           # "wait", "arrive", "use", "sync" (named barrier), "signal" (named-barrier arrive)
    barrier: str = ""   # e.g. "KFull[1]"
    phase: int = 0      # wait: the phase index waited for
    use: str = ""       # use: what is read or written, in the family's words
    count: int = 1      # arrive: arrivals this step makes (a warpgroup's warps at once)


def wait(barrier, phase):
    return Step("wait", barrier, phase)


def arrive(barrier, count=1):
    return Step("arrive", barrier, count=count)


def use(what):
    return Step("use", use=what)


def sync(named):
    """bar.sync on a named barrier another role completes with its bar.arrive (`signal`)."""
    return Step("sync", named)


def signal(named):
    return Step("signal", named)


@dataclass
class _Barrier:
    arrivals: int
    done: int = 0  # completed phases
    pending: int = 0


def run(make_programs: Callable[[], dict], arrivals: Callable[[str], int], make_state: Callable[[], object],
        apply_use: Callable[[object, str], None], *, what: str, schedules: int = 200, seed: int = 0) -> None:
    """Every role under `schedules` random interleavings, the one that always runs the first runnable role,
    and one per role that runs it only when nothing else can (the slowest that role can be)."""
    rng = random.Random(seed)
    roles = list(make_programs())
    strategies = ["first"] + [("starve", r) for r in roles] + ["random"] * schedules
    for strategy in strategies:
        progs = make_programs()
        pc = {role: 0 for role in progs}
        barriers: dict[str, _Barrier] = {}
        tokens: dict[str, int] = {}  # named barriers: signals not yet matched by a sync
        state = make_state()

        def barrier(name):
            if name not in barriers:
                barriers[name] = _Barrier(arrivals(name))
            return barriers[name]

        while True:
            runnable = []
            for role, steps in progs.items():
                if pc[role] == len(steps):
                    continue
                step = steps[pc[role]]
                if step.kind == "wait":
                    bar = barrier(step.barrier)
                    if bar.done < step.phase:
                        raise ProtocolError(f"{role} waits for phase {step.phase} of {step.barrier} while phase "
                                            f"{step.phase - 1} is not done: the parity wait would pass on an older phase")
                    if bar.done == step.phase:
                        continue  # blocked
                if step.kind == "sync" and tokens.get(step.barrier, 0) == 0:
                    continue
                runnable.append(role)
            if not runnable:
                stuck = {r: progs[r][pc[r]] for r in progs if pc[r] < len(progs[r])}
                if stuck:
                    raise ProtocolError(f"deadlock ({what}): " + "; ".join(
                        f"{r} at {s.kind} {s.barrier or s.use} {s.phase}" for r, s in stuck.items()))
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
                bar = barrier(step.barrier)
                bar.pending += step.count
                if bar.pending > bar.arrivals:
                    raise ProtocolError(f"{role} over-arrives on {step.barrier} ({bar.pending} of {bar.arrivals})")
                if bar.pending == bar.arrivals:
                    bar.done, bar.pending = bar.done + 1, 0
            elif step.kind == "signal":
                tokens[step.barrier] = tokens.get(step.barrier, 0) + 1
                if tokens[step.barrier] > 1:  # a named barrier would complete without its syncing side
                    raise ProtocolError(f"{role} signals {step.barrier} twice before its partner synced")
            elif step.kind == "sync":
                tokens[step.barrier] -= 1
            elif step.kind == "use":
                apply_use(state, step.use)
