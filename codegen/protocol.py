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

Completions that depend on no barrier (TMA, tcgen05.commit, wgmma groups) are arrivals taken as immediate by
default: a delay cannot add a wait, so deadlock freedom does not depend on it. It can break parity, though: a
role that waits for phase k of a barrier whose phase k - 1 is a load still in flight passes on the older phase.
`run(..., async_completions=True)` takes the arrivals an asynchronous engine makes (`arrive(..., engine="tma")`)
as separate events instead: each is issued at its step and completes exactly once, later, in any order with
the others (TMA completions are not ordered), and a wait for its phase passes only after it; its `use` (what
the engine's operation has done: "the K block landed") is applied when it completes. A callable
`async_completions(role, step)` picks them instead, for programs that do not mark their engines. Such a
completion still in flight when every role has finished is refused too: nothing waits for it, so the CTA could
exit with the load writing its shared memory.

Families: decode_sm90/protocol.py (marks its TMA loads and is checked under async completions, which catch
an odd ring shared by two key groups aliasing, as a GPU launch faulted, where the immediate model passes it),
fwd_sm100/protocol.py, fwd_sm90/protocol.py (their programs mark no engine; their tests pick the producer's
arrivals, its TMA loads, by a callable and pass under both models; fwd_sm100's tcgen05.commit arrivals stay
immediate).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Union


class ProtocolError(AssertionError):
    pass


@dataclass(frozen=True)
class Step:
    kind: str           # "wait", "arrive", "use", "sync" (named barrier), "signal" (named-barrier arrive)
    barrier: str = ""   # e.g. "KFull[1]"
    phase: int = 0      # wait: the phase index waited for
    use: str = ""       # use: what is read or written, in the family's words; arrive: what the arrival completes
    count: int = 1      # arrive: arrivals this step makes (a warpgroup's warps at once)
    engine: str = ""    # arrive: "" the role itself; else the engine that arrives when its work is done ("tma")


def wait(barrier, phase):
    return Step("wait", barrier, phase)


def arrive(barrier, count=1, *, engine="", use=""):
    """An arrival; with an `engine`, the one that engine makes when the operation just issued is done, and `use`
    (for apply_use) what it has done then, e.g. "land K 0 3". Immediate unless run under async_completions."""
    return Step("arrive", barrier, count=count, engine=engine, use=use)


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


AsyncCompletions = Union[bool, Callable[[str, Step], bool]]


def run(make_programs: Callable[[], dict], arrivals: Callable[[str], int], make_state: Callable[[], object],
        apply_use: Callable[[object, str], None], *, what: str, schedules: int = 200, seed: int = 0,
        async_completions: AsyncCompletions = False) -> None:
    """Every role under `schedules` random interleavings, the one that always runs the first runnable role,
    and one per role that runs it only when nothing else can (the slowest that role can be).

    Under `async_completions` (True: the arrivals marked with an engine; a callable (role, step) -> bool: the
    arrivals it picks) those arrivals are in-flight completions, each an event of its own: "first" fires them
    only when no role can step, oldest first; "newest" likewise, newest first (out of issue order); half the
    random schedules pick among roles and completions alike, the other half fire completions only when no role
    can step, in random order."""
    if async_completions is True:
        is_async = lambda role, step: bool(step.engine)  # noqa: E731
    elif async_completions is False:
        is_async = lambda role, step: False  # noqa: E731
    else:
        is_async = async_completions
    asynchronous = async_completions is not False
    rng = random.Random(seed)
    roles = list(make_programs())
    strategies = ["first"] + (["newest"] if asynchronous else []) + [("starve", r) for r in roles]
    if asynchronous:
        strategies += ["random", "late"] * (schedules // 2) + ["random"] * (schedules % 2)
    else:
        strategies += ["random"] * schedules
    for strategy in strategies:
        progs = make_programs()
        pc = {role: 0 for role in progs}
        barriers: dict[str, _Barrier] = {}
        tokens: dict[str, int] = {}  # named barriers: signals not yet matched by a sync
        in_flight: list[tuple[str, Step]] = []  # issued asynchronous completions, oldest first
        state = make_state()

        def barrier(name):
            if name not in barriers:
                barriers[name] = _Barrier(arrivals(name))
            return barriers[name]

        def complete(role, step):
            if step.use:
                apply_use(state, step.use)
            bar = barrier(step.barrier)
            bar.pending += step.count
            if bar.pending > bar.arrivals:
                by = f"{role}'s {step.engine} completion" if step.engine else role
                raise ProtocolError(f"{by} over-arrives on {step.barrier} ({bar.pending} of {bar.arrivals})")
            if bar.pending == bar.arrivals:
                bar.done, bar.pending = bar.done + 1, 0

        while True:
            runnable = []
            for role, steps in progs.items():
                if pc[role] == len(steps):
                    continue
                step = steps[pc[role]]
                if step.kind == "wait":
                    bar = barrier(step.barrier)
                    if bar.done < step.phase:
                        late = [s.use or s.barrier for _, s in in_flight if s.barrier == step.barrier]
                        detail = f" (in flight: {', '.join(late)})" if late else ""
                        raise ProtocolError(f"{role} waits for phase {step.phase} of {step.barrier} while phase "
                                            f"{step.phase - 1} is not done{detail}: the parity wait would pass on "
                                            "an older phase")
                    if bar.done == step.phase:
                        continue  # blocked
                if step.kind == "sync" and tokens.get(step.barrier, 0) == 0:
                    continue
                runnable.append(role)
            if not runnable and not in_flight:
                stuck = {r: progs[r][pc[r]] for r in progs if pc[r] < len(progs[r])}
                if stuck:
                    raise ProtocolError(f"deadlock ({what}): " + "; ".join(
                        f"{r} at {s.kind} {s.barrier or s.use} {s.phase}" for r, s in stuck.items()))
                break
            if in_flight and all(pc[r] == len(progs[r]) for r in progs):
                raise ProtocolError(f"{in_flight[0][0]}'s {in_flight[0][1].use or in_flight[0][1].barrier} "
                                    f"({in_flight[0][1].barrier}) is still in flight when every role has finished "
                                    f"({what}): nothing waits for it")
            # candidates: a role's name, or the index of an in-flight completion
            candidates = runnable + list(range(len(in_flight)))
            if strategy == "first":
                pick = runnable[0] if runnable else 0
            elif strategy == "newest":
                pick = runnable[0] if runnable else len(in_flight) - 1
            elif strategy == "random":
                pick = rng.choice(candidates)
            elif strategy == "late":
                pick = rng.choice(runnable) if runnable else rng.randrange(len(in_flight))
            else:
                others = [r for r in candidates if r != strategy[1]]
                pick = others[0] if others else candidates[0]
            if isinstance(pick, int):
                complete(*in_flight.pop(pick))
                continue
            role = pick
            step = progs[role][pc[role]]
            pc[role] += 1
            if step.kind == "arrive":
                if is_async(role, step):
                    in_flight.append((role, step))
                else:
                    complete(role, step)
            elif step.kind == "signal":
                tokens[step.barrier] = tokens.get(step.barrier, 0) + 1
                if tokens[step.barrier] > 1:  # a named barrier would complete without its syncing side
                    raise ProtocolError(f"{role} signals {step.barrier} twice before its partner synced")
            elif step.kind == "sync":
                tokens[step.barrier] -= 1
            elif step.kind == "use":
                apply_use(state, step.use)
