"""The Hopper forward kernel's barrier protocol (codegen/families/fwd_sm90/protocol.py): no deadlock, aliased
wait or overrun for the three tile loops the plan emits, across 0 to 3x the ring depth of key blocks and over
tiles without keys; every dropped wait or release is caught; the model waits on what the kernel waits on. The
producer's arrivals are TMA loads' completions, checked as landing in any order after their issue
(codegen/protocol.py's async_completions); the immediate model runs as well. A multicast pair (two CTAs sharing
their key blocks' copies) passes over alike and unequal tiles, and a wrong arrival count, a single release of a
block only one CTA visits, a missing remote release, cluster barrier or producer tail is caught."""

from __future__ import annotations

import functools
import re

import pytest

import codegen.protocol
from codegen.build import build
from codegen.families.fwd_sm90 import protocol
from codegen.protocol import ProtocolError, Step
from codegen.spec import KernelSpec


def _producer_loads(role, step):
    """The producer's arrivals: its TMA loads' completions (Q, K, V; the persistent loop's closing QFull arrival
    is a plain one, but the producer's last step, so taking it late adds no interleaving)."""
    return role == "producer"


@pytest.fixture(autouse=True)
def tma_loads_land_in_any_order(monkeypatch):
    """protocol.check runs under asynchronous TMA completions (the family's programs do not mark their engines)."""
    monkeypatch.setattr(protocol, "run", functools.partial(codegen.protocol.run, async_completions=_producer_loads))


@pytest.mark.parametrize("stages", (2, 3, 4))
def test_one_tile_per_cta(stages):
    for n in range(0, 3 * stages + 1):
        protocol.check(stages, n, persistent=False, overlap=False, schedules=15, seed=n)


@pytest.mark.parametrize("stages", (2, 3))
@pytest.mark.parametrize("overlap", (False, True), ids=("plain", "overlap"))
@pytest.mark.parametrize("pingpong", (True, False), ids=("pingpong", "no-pingpong"))
def test_persistent_tiles(stages, overlap, pingpong):
    lists = [[1, 1], [stages, stages, stages], [2 * stages + 1, 1, 3], [3, 3, 3, 3]]
    if not overlap:  # causal/varlen tiles may have no keys (overlap is only for alike tiles)
        lists += [[1, 0, 3], [0, 0, 2], [0], [2, 0]]
    for tiles in lists:
        protocol.check(stages, tiles, persistent=True, overlap=overlap, pingpong=pingpong, schedules=15,
                       seed=len(tiles))


@pytest.mark.parametrize("stages", (2, 3))
def test_the_immediate_model_passes_as_well(monkeypatch, stages):
    monkeypatch.setattr(protocol, "run", codegen.protocol.run)
    for n in range(0, 3 * stages + 1):
        protocol.check(stages, n, persistent=False, overlap=False, schedules=15, seed=n)
    for overlap in (False, True):
        for tiles in ([1, 1], [2 * stages + 1, 1, 3], [3, 3, 3, 3]) + (() if overlap else ([1, 0, 3], [2, 0])):
            protocol.check(stages, tiles, persistent=True, overlap=overlap, schedules=15, seed=len(tiles))


@pytest.mark.parametrize("role, kind, name, overlap, pingpong, message", [
    ("producer", "wait", "KEmpty", False, True, "K slot .* loaded with block .* before both consumers read"),
    ("producer", "wait", "VEmpty", False, True, "V slot .* loaded with block .* before both consumers read"),
    ("producer", "wait", "QEmpty", False, True, "Q of tile .* loaded before|aliased|older phase"),
    ("consumer0", "wait", "QFull", False, True, "without tile .*'s Q|aliased|older phase"),
    ("consumer0", "wait", "KFull", False, True, "before K block .* was loaded"),
    ("consumer0", "wait", "QEmpty", False, True, "staged tile .*'s O in K slot .* before both last QKs"),
    ("consumer1", "arrive", "KEmpty", False, True, "deadlock"),
    ("consumer1", "signal", "Turn", False, True, "deadlock"),
])
@pytest.mark.parametrize("model", ("async", "immediate"))
def test_a_dropped_wait_or_release_is_caught(monkeypatch, role, kind, name, overlap, pingpong, message, model):
    """(Under tile_overlap the Q-empty wait before staging the pending O cannot be missed: the next tile's Q,
    which the consumer waited for first, is loaded only after that same phase. The kernel keeps the wait.)"""
    if model == "immediate":
        monkeypatch.setattr(protocol, "run", codegen.protocol.run)
    real = protocol.programs

    def without(*args, **kwargs):
        progs = real(*args, **kwargs)
        progs[role] = [s for s in progs[role] if not (s.kind == kind and s.barrier.startswith(name))]
        return progs

    monkeypatch.setattr(protocol, "programs", without)
    with pytest.raises(ProtocolError, match=message):
        for tiles in ([1, 1], [4, 2, 5], [3, 3, 3]):
            protocol.check(2, tiles, persistent=True, overlap=overlap, pingpong=pingpong, schedules=60, seed=3)


def test_the_model_waits_on_what_the_kernel_waits_on():
    source = build(KernelSpec(seq_len=1024, heads=8, head_dim=128, tile_overlap=False)).rendered.source
    bodies = dict(re.findall(r"static __device__ __forceinline__ \w+ (\w+)\((.*?)\n}\n", source, flags=re.S))
    bodies.update(re.findall(r"static __device__ __forceinline__ \w+ (\w+_tiles)\((.*?)\n}\n", source, flags=re.S))

    def waited(*names):
        # A wait names its barrier, or the producer's slot_ready(t, empty, ...) waits on `empty`.
        return {m for n in names
                for m in re.findall(r"(?:mbar_wait(?:_parked)?\(bar\(bars, |slot_ready\(t, )kBar(\w+)", bodies[n])}

    def modelled(role):
        progs = protocol.programs(2, [2, 0, 3], persistent=True, overlap=False)
        return {s.barrier.split("[")[0] for s in progs[role] if s.kind == "wait"}

    assert waited("producer", "producer_tiles") == modelled("producer")
    assert waited("consumer", "consumer_tiles", "store_tile") == modelled("consumer0")


# (n_kv of tile 2c, of tile 2c + 1); None: an odd last tile's cluster, whose CTA 1 has no tile and stays idle.
PAIRS = [(0, 0), (1, 1), (1, 2), (3, 3), (3, 4), (5, 6), (2, 4), (0, 1), (0, None), (3, None), (5, None)]


@pytest.mark.parametrize("stages", (2, 3, 4))
@pytest.mark.parametrize("model", ("async", "immediate"))
def test_multicast_pair(stages, model):
    """check_pair marks its copies (engine "tma") and passes its own async_completions, over the fixture's."""
    for n0, n1 in PAIRS:
        protocol.check_pair(stages, n0, n1, async_completions=model == "async", schedules=15, seed=n0)


def test_multicast_pair_without_pingpong():
    for n0, n1 in PAIRS:
        protocol.check_pair(2, n0, n1, pingpong=False, schedules=15, seed=n0)


def _mutated(monkeypatch, change):
    """pair_programs with every role's steps passed through change(role, steps)."""
    real = protocol.pair_programs
    monkeypatch.setattr(protocol, "pair_programs",
                        lambda *a, **k: {role: change(role, steps) for role, steps in real(*a, **k).items()})


@pytest.mark.parametrize("model", ("async", "immediate"))
def test_empty_barriers_counting_one_cta_race(monkeypatch, model):
    """Empty barriers that count one CTA's 8 warps complete on the first 8 releases of a slot: rank 0's producer
    multicasts the next K into CTA 1's slot while CTA 1's consumers still read the block before it."""
    for name in ("KEmpty", "VEmpty"):
        monkeypatch.setitem(protocol.PAIR_ARRIVALS, name, protocol.CONSUMERS * protocol.WARPS)
    with pytest.raises(ProtocolError, match=r"CTA 1 \(multicast by CTA 0\): K slot 0 loaded with block 2 before both "
                                            r"consumers read block 0"):
        protocol.check_pair(2, 3, 3, async_completions=model == "async", schedules=30)


@pytest.mark.parametrize("model", ("async", "immediate"))
def test_single_release_of_unshared_block_deadlocks(monkeypatch, model):
    """A block only CTA 1 visits released once per warp fills half its empty barrier: the producer's load of the
    block `stages` later into that slot, or where none follows its tail, waits forever (blocks 1 and 2 of CTA 1)."""
    def single(role, steps):
        return [Step(s.kind, s.barrier, s.phase, s.use, protocol.WARPS) if s.kind == "arrive"
                and s.count == 2 * protocol.WARPS else s for s in steps]

    _mutated(monkeypatch, single)
    async_ = model == "async"
    for n1 in (3, 4):  # the tail's wait for block 1's release, or block 3's load into its slot
        with pytest.raises(ProtocolError, match=r"deadlock .*cta1\.producer at wait cta1\.KEmpty\[1\] 0"):
            protocol.check_pair(2, 1, n1, async_completions=async_, schedules=30)


@pytest.mark.parametrize("model", ("async", "immediate"))
def test_missing_remote_release_deadlocks(monkeypatch, model):
    """Without the consumers' arrivals on the peer's empty barrier, a shared slot's barrier fills only half: the
    first load that comes back to it (K block 2 into slot 0 of both CTAs), or where none does the producer's tail,
    waits forever."""
    def local(role, steps):
        cta = role.split(".")[0]
        return [s for s in steps if not (s.kind == "arrive" and not s.engine and s.barrier.startswith("cta")
                                         and not s.barrier.startswith(cta + "."))]

    _mutated(monkeypatch, local)
    async_ = model == "async"
    for n in (1, 3):  # the tails' waits, or K block 2's loads
        with pytest.raises(ProtocolError, match=r"deadlock .*cta0\.producer at wait cta0\.KEmpty\[0\] 0; .*"
                                                r"cta1\.producer at wait cta1\.KEmpty\[0\] 0"):
            protocol.check_pair(2, n, n, async_completions=async_, schedules=30)


def test_missing_cluster_barrier_is_caught(monkeypatch):
    """Without the barrier after the init a peer's copy can land on a barrier not yet initialized."""
    _mutated(monkeypatch, lambda role, steps: [s for s in steps if s.barrier != "ClusterInit"])
    with pytest.raises(ProtocolError, match="a . copy reaches CTA . before it initialized its barriers"):
        protocol.check_pair(2, 1, 1, schedules=30)


@pytest.mark.parametrize("tiles, persistent", [(3, False), ([2, 2], True)])
def test_missing_producer_tail_is_caught(monkeypatch, tiles, persistent):
    """Without the producer's tail a CTA can exit while its peer's consumers still release shared slots on it."""
    def untailed(role, steps):
        exit_at = len(steps) - 1
        body = [s for i, s in enumerate(steps[:exit_at]) if not (role.endswith("producer") and s.kind == "wait"
                and "Empty" in s.barrier and i > max(j for j, t in enumerate(steps) if t.kind == "arrive"))]
        return body + steps[exit_at:]

    protocol.check_pair(2, tiles, tiles, persistent=persistent, schedules=30)
    _mutated(monkeypatch, untailed)
    with pytest.raises(ProtocolError, match="a remote arrival reaches CTA . after it exited"):
        protocol.check_pair(2, tiles, tiles, persistent=persistent, schedules=30)


PERSISTENT_PAIRS = [[1], [2, 2], [1, 1, 1], [3, 3, 3], [4, 4]]


@pytest.mark.parametrize("stages", (2, 3))
@pytest.mark.parametrize("overlap", (False, True))
@pytest.mark.parametrize("model", ("async", "immediate"))
def test_persistent_pair(stages, overlap, model):
    """A persistent pair takes the same tile pair at every step (alike tiles: every block shared); each CTA stages
    its O in its last block's K slot, which both CTAs' rings then reuse."""
    for tiles in PERSISTENT_PAIRS:
        protocol.check_pair(stages, tiles, tiles, persistent=True, overlap=overlap,
                            async_completions=model == "async", schedules=15, seed=sum(tiles))


def _staged_releases(steps, change):
    """steps with each release that follows an O staged in a K slot (its own and the peer's arrival) replaced by
    change(own arrival, peer arrival)."""
    out, i = [], 0
    while i < len(steps):
        s = steps[i]
        out.append(s)
        i += 1
        if s.kind == "use" and s.use.split()[1:3] == ["stage", "O"] and s.use.split()[-1].startswith("K"):
            out += change(steps[i], steps[i + 1])
            i += 2
    return out


@pytest.mark.parametrize("overlap", (False, True))
def test_persistent_pair_staged_slot_released_on_one_cta_races(monkeypatch, overlap):
    """The K slot that staged a tile's O is the pair's: released twice on its own CTA only, the peer's producer
    multicasts the next tile's block into it while this CTA's O store may still read it."""
    _mutated(monkeypatch, lambda role, steps: _staged_releases(
        steps, lambda own, peer: [Step(own.kind, own.barrier, own.phase, own.use, 2 * own.count)]))
    with pytest.raises(ProtocolError, match=r"\(multicast by CTA \d\): K slot \d loaded with block \d+ "
                                            r"while tile \d's O is staged there"):
        protocol.check_pair(2, [2, 2, 2], [2, 2, 2], persistent=True, overlap=overlap, schedules=60)


def test_persistent_pair_releases_q_on_its_own_cta_only():
    """Q is each CTA's own: its empty barrier counts this CTA's 8 warps, and a release on the peer's would complete
    the peer's phase early."""
    progs = protocol.pair_programs(2, [2, 2], [2, 2], persistent=True)
    owners = {(role.split(".")[0], s.barrier.split(".")[0]) for role, steps in progs.items() for s in steps
              if s.kind == "arrive" and s.barrier.endswith("QEmpty")}
    assert owners == {("cta0", "cta0"), ("cta1", "cta1")}
