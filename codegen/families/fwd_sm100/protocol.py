"""The Blackwell forward kernel's barrier protocol as data, checked by codegen.protocol.run.

`programs(stages, tiles, chunks)` lists, per role (the TMA thread, the MMA thread, each of the four softmax
warps), the steps the kernel takes for a persistent CTA's tiles (`tiles`: the key blocks of each; an int is
one tile): waits on a barrier phase, arrivals, and the buffer accesses between them. `check` runs them under
many interleavings (codegen/protocol.py says how) and `_apply_use` refuses an overrun: a TMA load into a ring
slot, a Q load, a QK into an S buffer or a P write before the last reader of that buffer has finished; a PV
that reads P before every softmax warp wrote its part, or overwrites O before the softmax read the previous
tile's; an O rescale or read while a PV may be writing O.

A tile's key blocks are counted, not placed: which key block a tile starts at (kv_first > 0 under a left window)
changes the keys a TMA load fetches, never a barrier, slot or phase, so the tile lists (counts, 0 for a tile
whose rows see no key) are the whole input. A varlen CTA's list also holds None for each tile past its
sequence's query end (Plan.walk gives the kernel's lists): every role skips it (Tiles::take), so it takes no
step and no phase; `unskipped` names roles that would wrongly walk it as a tile without keys (the fault the
check must catch).

The steps mirror templates/fwd_sm100/kernel.cu.j2 (producer, mma_issuer, issue_pv, softmax_tile); tests hold
the two together by the barriers each device function waits on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.protocol import ProtocolError, Step, arrive, run, use, wait

SOFTMAX_WARPS = 4

__all__ = ["ProtocolError", "Step", "check", "programs"]


def _taken(walk, role: str, unskipped) -> list[int]:
    """The key-block counts of the tiles a role takes: a skipped tile (None) is no tile at all, except for a role
    in `unskipped` (a fault), which walks it as one without keys."""
    return [0 if n is None else n for n in walk if n is not None or role in unskipped]


def programs(stages: int, n_kv, chunks: int = 2, unskipped=()) -> dict[str, list[Step]]:
    """The roles' steps for a persistent CTA's tiles, `n_kv` key blocks each (an int: one tile; None: a varlen
    tile past its sequence's end, skipped), through a `stages`-slot ring with PV in `chunks` chunks. Ring
    slots, S buffers and PvDone phases count key blocks across tiles (G, the CTA's global block index); QFull
    and QEmpty count tiles."""
    walk = [n_kv] if n_kv is None or isinstance(n_kv, int) else list(n_kv)
    tiles = _taken(walk, "producer", unskipped)
    starts = [sum(tiles[:t]) for t in range(len(tiles))]

    prod = []
    for t, (n, g) in enumerate(zip(tiles, starts)):
        if t > 0:
            prod.append(wait("QEmpty", t - 1))  # the last QK of the previous tile has read Q
        prod += [use(f"write Q {t}"), arrive("QFull")]
        for G in range(g, g + n):
            s = G % stages
            if G >= stages:
                prod.append(wait(f"KEmpty[{s}]", G // stages - 1))
            prod += [use(f"write K{s} {G}"), arrive(f"KFull[{s}]")]
            if G >= stages:
                prod.append(wait(f"VEmpty[{s}]", G // stages - 1))
            prod += [use(f"write V{s} {G}"), arrive(f"VFull[{s}]")]

    def pv(G, t, first):
        # A tile's first PV overwrites O with no barrier of its own: the softmax warps read the previous tile's
        # O before they write any P of this one, and this PV waits for that P (checked by the overrun rules).
        b, s = G % 2, G % stages
        steps = [wait(f"VFull[{s}]", G // stages)]
        for c in range(chunks):
            steps += [wait(f"PFull[{b}{c}]", G // 2), use(f"PV {G} reads P{b} chunk {c} V{s}")]
        return steps + [use(f"PV {G} writes O {t}"), arrive("PvDone"), arrive(f"VEmpty[{s}]")]

    mma = []
    tiles = _taken(walk, "mma", unskipped)
    starts = [sum(tiles[:t]) for t in range(len(tiles))]
    for t, (n, g) in enumerate(zip(tiles, starts)):
        mma.append(wait("QFull", t))
        for G in range(g, g + n):
            b, s = G % 2, G % stages
            if G >= 2:
                mma.append(wait("PvDone", G - 2))
            mma += [wait(f"KFull[{s}]", G // stages), use(f"QK {G} reads Q {t} K{s} writes S{b}"),
                    arrive(f"SFull[{b}]"), arrive(f"KEmpty[{s}]")]
            if G > g:
                mma += pv(G - 1, t, G - 1 == g)
        if n:
            mma += pv(g + n - 1, t, n == 1)
        mma += [use(f"QK done with Q {t}"), arrive("QEmpty")]

    roles = {"producer": prod, "mma": mma}
    for w in range(SOFTMAX_WARPS):
        steps = []
        tiles = _taken(walk, f"softmax{w}", unskipped)
        starts = [sum(tiles[:t]) for t in range(len(tiles))]
        for t, (n, g) in enumerate(zip(tiles, starts)):
            for G in range(g, g + n):
                b = G % 2
                steps += [wait(f"SFull[{b}]", G // 2), use(f"softmax {G} reads S{b}")]
                if G > g:
                    steps += [wait("PvDone", G - 1), use(f"softmax {G} rescales O")]
                for c in range(chunks):
                    steps += [use(f"softmax {G} writes P{b} chunk {c}"), arrive(f"PFull[{b}{c}]")]
            if n:
                steps.append(wait("PvDone", g + n - 1))
            steps.append(use(f"softmax reads O {t} after {n}"))
        roles[f"softmax{w}"] = steps
    return roles


ARRIVALS = {"PFull": SOFTMAX_WARPS}  # every other barrier completes a phase on one arrival


@dataclass
class _State:
    stages: int
    # who last used each buffer, for the overrun checks: K/V slot -> block, S/P buffer -> block
    k_block: dict = field(default_factory=dict)
    v_block: dict = field(default_factory=dict)
    qk_done: set = field(default_factory=set)
    pv_done: set = field(default_factory=set)
    pv_issued: set = field(default_factory=set)
    p_written: dict = field(default_factory=dict)  # (block, chunk) -> softmax warps that wrote their rows of P
    q_tile: int = -1          # the tile whose Q is in shared memory
    q_done: set = field(default_factory=set)   # tiles whose QKs have all read Q
    o_read: dict = field(default_factory=dict)  # tile -> softmax warps that read its O
    pv_tiles: dict = field(default_factory=dict)  # tile -> PVs written into O



def _apply_use(state: _State, what: str) -> None:
    words = what.split()
    if words[0] == "write" and words[1] == "Q":  # the previous tile's QKs must be done with Q
        t = int(words[2])
        if t > 0 and (t - 1) not in state.q_done:
            raise ProtocolError(f"Q of tile {t} loaded before the QKs of tile {t - 1} read theirs")
        state.q_tile = t
    elif words[0] == "write":  # TMA load of block G into slot: its previous block's reader must be done
        slot, j = words[1], int(words[2])
        previous = j - state.stages
        if previous >= 0:
            if slot[0] == "K" and previous not in state.qk_done:
                raise ProtocolError(f"K slot {slot[1:]} loaded with block {j} before QK {previous} read it")
            if slot[0] == "V" and previous not in state.pv_done:
                raise ProtocolError(f"V slot {slot[1:]} loaded with block {j} before PV {previous} read it")
        (state.k_block if slot[0] == "K" else state.v_block)[slot] = j
    elif words[0] == "QK" and words[1] == "done":
        state.q_done.add(int(words[4]))
    elif words[0] == "QK":
        j, t = int(words[1]), int(words[4])
        if state.q_tile != t:
            raise ProtocolError(f"QK {j} of tile {t} ran without that tile's Q")
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
        i, t = int(words[1]), int(words[4])
        if t > 0 and not state.pv_tiles.get(t) and state.o_read.get(t - 1, 0) != SOFTMAX_WARPS:
            raise ProtocolError(f"the first PV of tile {t} overwrote O before the softmax read tile {t - 1}'s")
        state.pv_tiles[t] = state.pv_tiles.get(t, 0) + 1
        state.pv_issued.add(i)
        state.pv_done.add(i)  # the MMA completes before its commit arrives (modelled as immediate)
    elif words[0] == "softmax":
        if words[1] == "reads" and words[2] == "O":
            t, n = int(words[3]), int(words[5])
            if state.pv_tiles.get(t, 0) != n:
                raise ProtocolError(f"O of tile {t} read before its last PV finished")
            state.o_read[t] = state.o_read.get(t, 0) + 1
            return
        j, action = int(words[1]), words[2]
        if action == "reads" and j not in state.qk_done:
            raise ProtocolError(f"softmax read S {j} before QK {j} finished")
        if action == "rescales" and (j - 1) not in state.pv_done:
            raise ProtocolError(f"O rescaled for block {j} while PV {j - 1} may write it")
        if action == "writes":
            key = (j, int(words[5]))
            state.p_written[key] = state.p_written.get(key, 0) + 1


def check(stages: int, n_kv, *, chunks: int = 2, schedules: int = 200, seed: int = 0, unskipped=()) -> None:
    """Run every role of a CTA's tiles (n_kv: the key blocks of one tile, or a list, one per tile, None for a
    skipped one) through codegen.protocol.run; raise ProtocolError on a deadlock, an aliased wait or an
    overrun."""
    run(lambda: programs(stages, n_kv, chunks, unskipped), lambda name: ARRIVALS.get(name.split("[")[0], 1),
        lambda: _State(stages), _apply_use, what=f"key blocks {n_kv}, {stages} stages, {chunks} PV chunks",
        schedules=schedules, seed=seed)
