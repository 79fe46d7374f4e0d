"""The Hopper forward kernel's barrier protocol as data, checked by codegen.protocol.run.

Roles: the producer thread, and the two consumer warpgroups (each step of a warpgroup is its four warps at
once: their lane-0 arrivals count 4). The steps mirror templates/fwd_sm90 (producer() and its loads in
mainloop.j2, the consumer's kv_step and tile boundary, store_tile in epilogue.j2, the tile loop in tiles.j2)
for the three shapes of tile loop the plan emits: one tile per CTA, persistent with the plain tile boundary,
and persistent with `tile_overlap` (a tile's O stored under the next tile's first QK). Ping-pong turns are
named-barrier rendezvous between the consumers.

An MMA is issued inside the consumer's turn and complete only at the wgmma wait that covers it (the `done` uses
just before each release), so the model does not take an issued wgmma for a finished one.

The buffer rules (`_apply_use`): a K or V slot is loaded only after both consumers' last reader of its previous
block is done, and a K slot that staged a tile's O only after both stores have read it; Q is loaded only after
both consumers' last QK of the previous tile; O is staged in a K slot only after both consumers' last QK of
the tile has read it; every QK/PV finds its block loaded.

A multicast pair (KernelSpec.multicast; `pair_programs`, `check_pair`) is two CTAs of a cluster on query tiles 2c
and 2c + 1, each running the one-tile program above with its barriers named by CTA ("cta1.KFull[0]") and its
loads and releases rewritten as the kernel's: a full barrier counts the producer's arrive.expect_tx and the
copy's bytes, which for a block both tiles visit (the first min(n_kv) of them) come from one producer's copy
multicast into both CTAs' slot (K from rank 0's, V from rank 1's); an empty barrier counts both CTAs' consumer
warps, so such a block is released on the own CTA's barrier and on the peer's (a remote arrival), and a block
only one CTA visits by a double arrival on its own. The buffer rules are the one-tile rules per CTA, a multicast
copy being a write into both CTAs' slot (both CTAs' consumers must have read its previous block); and a remote
arrival or a copy may reach a CTA only between its barrier init (the cluster barrier before any role starts) and
its exit, which its producer delays until the last release of every slot its ring used (the producer tail).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.protocol import ProtocolError, Step, arrive, run, signal, sync, use, wait

CONSUMERS = 2
WARPS = 4  # per consumer warpgroup; each releases a slot with one lane-0 arrival
ARRIVALS = {"QFull": 1, "KFull": 1, "VFull": 1, "KEmpty": CONSUMERS * WARPS, "VEmpty": CONSUMERS * WARPS,
            "QEmpty": CONSUMERS * WARPS}

# multicast: the CTAs of a pair, their roles (a producer, the consumers) and every arrival count. A full barrier
# counts the producer's arrive.expect_tx and the copy's bytes (complete_tx), in either order (the peer's
# multicast may land first); Q stays one arrival for both, as above. The cluster barrier counts every role.
CTAS = 2
ROLES = 1 + CONSUMERS
PAIR_ARRIVALS = {"QFull": 1, "KFull": 2, "VFull": 2, "KEmpty": CTAS * CONSUMERS * WARPS,
                 "VEmpty": CTAS * CONSUMERS * WARPS, "QEmpty": CONSUMERS * WARPS, "ClusterInit": CTAS * ROLES}
ISSUER = {"K": 0, "V": 1}  # the rank whose producer copies a shared block's operand into both CTAs

__all__ = ["ProtocolError", "check", "check_pair", "pair_programs", "programs"]


def programs(stages: int, tiles, *, persistent: bool, overlap: bool, pingpong: bool = True) -> dict:
    tiles = [tiles] if isinstance(tiles, int) else list(tiles)
    if not persistent:
        assert len(tiles) == 1 and not overlap, "one tile per CTA"
    if overlap:
        assert all(tiles), "tile_overlap is only for alike tiles, which all have keys"
    starts = [sum(tiles[:t]) for t in range(len(tiles))]

    # ---- the producer
    prod = []
    for t, (n, r) in enumerate(zip(tiles, starts)):
        def load(op, i):
            G, steps = r + i, []
            s = G % stages
            if G >= stages:
                steps.append(wait(f"{op}Empty[{s}]", G // stages - 1))
            return steps + [use(f"write {op} {s} {G}"), arrive(f"{op}Full[{s}]")]

        def load_kv(i):
            return load("K", i) + (load("V", i - 1) if i > 0 else [])

        if not persistent:
            prod += [use("write Q 0"), arrive("QFull")]
            for i in range(n):
                prod += load_kv(i)
            if n:
                prod += load("V", n - 1)
            continue
        early = min(n, stages - 1)
        for i in range(early):
            prod += load_kv(i)
        if t > 0:
            prod.append(wait("QEmpty", t - 1))
        prod += [use(f"write Q {t}"), arrive("QFull")]
        if overlap:
            if early > 0:
                prod += load("V", early - 1)
            for i in range(early, n):
                prod += load("K", i) + (load("V", i - 1) if i > early else [])
            if n > early:
                prod += load("V", n - 1)
        else:
            for i in range(early, n):
                prod += load_kv(i)
            if n:
                prod += load("V", n - 1)
    if persistent:  # no Q comes: a plain arrival ends the consumers' loop
        prod += [wait("QEmpty", len(tiles) - 1), arrive("QFull")]

    # ---- the consumers
    def consumer(c):
        other = 1 - c
        steps = [signal("Turn[0]")] if pingpong and c == 1 else []

        def take():
            return [sync(f"Turn[{c}]")] if pingpong else []

        def give():
            return [signal(f"Turn[{other}]")] if pingpong else []

        pending = None  # overlap: (tile, K slot) whose O is not stored yet
        for t, (n, r) in enumerate(zip(tiles, starts)):
            steps.append(wait("QFull", t))
            last_release = "QEmpty" if persistent else None

            def release_k(i):  # after the wait that covers QK(G): its wgmma group is done, the slot is free
                G = r + i
                name = last_release if persistent and i == n - 1 else f"KEmpty[{G % stages}]"
                return [use(f"QK done {c} {G}"), arrive(name, WARPS)]

            def release_v(G):
                return [use(f"PV done {c} {G}"), arrive(f"VEmpty[{G % stages}]", WARPS)]

            if n:
                steps += take() + [wait(f"KFull[{r % stages}]", r // stages), use(f"QK {c} {t} {r}")] + give()
                if overlap and pending is not None:
                    pt, ps = pending
                    steps += [wait("QEmpty", pt), use(f"stage O {c} {pt} K{ps}"), arrive(f"KEmpty[{ps}]", WARPS)]
                steps += release_k(0)
                for i in range(1, n):
                    G = r + i
                    steps += take() + [wait(f"KFull[{G % stages}]", G // stages), use(f"QK {c} {t} {G}"),
                                       wait(f"VFull[{(G - 1) % stages}]", (G - 1) // stages), use(f"PV {c} {G - 1}")]
                    steps += give() + release_k(i) + release_v(G - 1)
                G = r + n - 1
                steps += take() + [wait(f"VFull[{G % stages}]", G // stages), use(f"PV {c} {G}")] + give()
                steps += release_v(G)
            if overlap:
                pending = (t, (r + n - 1) % stages)
            elif persistent:
                if n:
                    s = (r + n - 1) % stages
                    steps += [wait("QEmpty", t), use(f"stage O {c} {t} K{s}"), arrive(f"KEmpty[{s}]", WARPS)]
                else:  # no keys: O is staged in the Q tile, which is released instead
                    steps += [use(f"stage O {c} {t} Q"), arrive("QEmpty", WARPS)]
            else:
                steps.append(use(f"stage O {c} {t} Q"))
        if persistent:
            steps.append(wait("QFull", len(tiles)))  # the end
        if pending is not None:
            pt, ps = pending
            steps += [wait("QEmpty", pt), use(f"stage O {c} {pt} K{ps}"), arrive(f"KEmpty[{ps}]", WARPS)]
        return steps

    return {"producer": prod, **{f"consumer{c}": consumer(c) for c in range(CONSUMERS)}}


@dataclass
class _State:
    stages: int
    tiles: list
    k_block: dict = field(default_factory=dict)  # slot -> block in it
    v_block: dict = field(default_factory=dict)
    qk: dict = field(default_factory=dict)       # block -> consumers whose QK of it has completed
    pv: dict = field(default_factory=dict)       # block -> consumers whose PV of it has completed
    staged: dict = field(default_factory=dict)   # (tile, where) -> consumers that staged O there
    q_tile: int = -1


def _apply_use(state: _State, what: str) -> None:
    w = what.split()
    starts = [sum(state.tiles[:t]) for t in range(len(state.tiles))]
    if w[0] == "write" and w[1] == "Q":
        t = int(w[2])
        if t > 0:
            prev, r = state.tiles[t - 1], starts[t - 1]
            if any(len(state.qk.get(G, ())) < CONSUMERS for G in range(r, r + prev)):
                raise ProtocolError(f"Q of tile {t} loaded before both consumers' QKs of tile {t - 1} read theirs")
            if prev == 0 and len(state.staged.get((t - 1, "Q"), ())) < CONSUMERS:
                raise ProtocolError(f"Q of tile {t} loaded over tile {t - 1}'s O staged in the Q tile")
        state.q_tile = t
    elif w[0] == "write":
        op, s, G = w[1], int(w[2]), int(w[3])
        prev = G - state.stages
        if prev >= 0:
            readers = (state.qk if op == "K" else state.pv).get(prev, ())
            if len(readers) < CONSUMERS:
                raise ProtocolError(f"{op} slot {s} loaded with block {G} before both consumers read block {prev}")
            if op == "K":
                t = next(t for t, r in enumerate(starts) if r <= prev < r + state.tiles[t])
                if prev == starts[t] + state.tiles[t] - 1 and len(state.staged.get((t, f"K{s}"), ())) < CONSUMERS:
                    raise ProtocolError(f"K slot {s} loaded with block {G} while tile {t}'s O is staged there")
        (state.k_block if op == "K" else state.v_block)[s] = G
    elif w[0] in ("QK", "PV") and w[1] == "done":  # the wgmma group completed (wgmma.wait_group)
        (state.qk if w[0] == "QK" else state.pv).setdefault(int(w[3]), set()).add(int(w[2]))
    elif w[0] == "QK":
        c, t, G = int(w[1]), int(w[2]), int(w[3])
        if state.q_tile != t:
            raise ProtocolError(f"consumer {c}'s QK {G} ran without tile {t}'s Q")
        if state.k_block.get(G % state.stages) != G:
            raise ProtocolError(f"consumer {c}'s QK {G} ran before K block {G} was loaded")
    elif w[0] == "PV":
        c, G = int(w[1]), int(w[2])
        if state.v_block.get(G % state.stages) != G:
            raise ProtocolError(f"consumer {c}'s PV {G} ran before V block {G} was loaded")
    elif w[0] == "stage":
        c, t, where = int(w[2]), int(w[3]), w[4]
        if where.startswith("K"):
            G = starts[t] + state.tiles[t] - 1
            if len(state.qk.get(G, ())) < CONSUMERS:
                raise ProtocolError(f"consumer {c} staged tile {t}'s O in K slot {where[1:]} before both last QKs "
                                    "read it")
            if state.k_block.get(int(where[1:])) != G:
                raise ProtocolError(f"K slot {where[1:]} was reloaded before tile {t}'s O was staged there")
        state.staged.setdefault((t, where), set()).add(c)


def check(stages: int, tiles, *, persistent: bool, overlap: bool, pingpong: bool = True, schedules: int = 100,
          seed: int = 0) -> None:
    tile_list = [tiles] if isinstance(tiles, int) else list(tiles)
    run(lambda: programs(stages, tile_list, persistent=persistent, overlap=overlap, pingpong=pingpong),
        lambda name: ARRIVALS[name.split("[")[0]], lambda: _State(stages, tile_list), _apply_use,
        what=f"tiles {tile_list}, {stages} stages, persistent={persistent}, overlap={overlap}",
        schedules=schedules, seed=seed)


def pair_programs(stages: int, tiles0, tiles1, *, persistent: bool = False, overlap: bool = False,
                  pingpong: bool = True) -> dict:
    """Both CTAs' roles ("cta0.producer", ...): each CTA's program (`programs`, the code the kernel's pair shares
    with a lone CTA) with its steps rewritten for the pair, after the cluster barrier, the producer ending with
    its tail (the last release of each slot its ring used: `wait_last_releases`). One tile per CTA
    (tiles0 and tiles1 its key blocks; tiles1 None: CTA 1 is the idle one past an odd last tile, which only meets
    the cluster barrier, and CTA 0 shares nothing), or persistent: both CTAs' tile lists, alike (a persistent
    pair's rings advance together; every block is shared)."""
    tiles = [None if t is None else [t] if isinstance(t, int) else list(t) for t in (tiles0, tiles1)]
    if persistent:
        assert tiles[0] == tiles[1], "a persistent pair's tiles are alike"
    else:
        assert len(tiles[0]) == 1 and (tiles[1] is None or len(tiles[1]) == 1), "one tile per CTA"
    n_shared = (sum(tiles[0]) if persistent else 0 if tiles[1] is None else min(tiles[0][0], tiles[1][0]))
    starts = [sum(tiles[0][:t]) for t in range(len(tiles[0]))]
    pair = {}
    for r in range(CTAS):
        peer = 1 - r
        own = (programs(stages, tiles[r], persistent=persistent, overlap=overlap, pingpong=pingpong)
               if tiles[r] is not None else {role: [] for role in ("producer", "consumer0", "consumer1")})
        for role, steps in own.items():
            out = [use(f"cta{r} init")] if role == "producer" else []
            out += [arrive("ClusterInit"), wait("ClusterInit", 0)]
            block = None  # the block whose slot a release frees: read by the wgmma wait, or staging its tile's O
            for s in steps:
                name = f"cta{r}.{s.barrier}"
                if s.kind in ("wait", "sync", "signal"):
                    out.append(Step(s.kind, name, s.phase))
                elif s.kind == "use" and s.use.startswith("write") and s.use.split()[1] in ISSUER:
                    out += _pair_load(r, s.use, n_shared)
                elif s.kind == "use":
                    w = s.use.split()
                    if s.use.startswith(("QK done", "PV done")):
                        block = int(w[-1])
                    elif s.use.startswith("stage O") and w[-1].startswith("K"):
                        t = int(w[3])
                        block = starts[t] + tiles[r][t] - 1
                    out.append(use(f"cta{r} {s.use}"))
                elif s.barrier.split("[")[0] in ("KFull", "VFull"):
                    continue  # _pair_load made the load's arrivals
                elif s.barrier == "QFull":
                    out.append(arrive(name, engine="tma"))
                elif s.barrier == "QEmpty":  # Q is each CTA's own
                    out.append(arrive(name, s.count))
                    block = None
                else:  # a consumer's release of the block it just read
                    assert s.barrier.split("[")[0] in ("KEmpty", "VEmpty") and block is not None, s
                    if block < n_shared:
                        out += [arrive(name, s.count),
                                arrive(f"cta{peer}.{s.barrier}", s.count, use=f"cta{peer} remote arrival")]
                    else:
                        out.append(arrive(name, 2 * s.count))
                    block = None
            if role == "producer":
                out += _producer_tail(r, stages, sum(tiles[r] or ()))
            out.append(use(f"cta{r} exit"))
            pair[f"cta{r}.{role}"] = out
    return pair


def _producer_tail(r: int, stages: int, blocks: int) -> list:
    """CTA r's producer waiting, as if to load ring positions blocks .. blocks + stages - 1, for the last release
    of each K and V slot its ring used (the kernel's wait_last_releases)."""
    return [wait(f"cta{r}.{op}Empty[{g % stages}]", g // stages - 1)
            for g in range(max(blocks, stages), blocks + stages) for op in ("K", "V")]


def _pair_load(r: int, write: str, n_shared: int) -> list:
    """CTA r's producer loading block G of an operand into slot s: its own expect_tx arrival, then its copy into
    its own slot, or for a shared block the issuer's copy into both CTAs' slots (the other rank copies nothing)."""
    _, op, s, G = write.split()
    full = f"{op}Full[{s}]"
    steps = [arrive(f"cta{r}.{full}")]
    if int(G) >= n_shared:
        targets = [r]
    elif r == ISSUER[op]:
        targets = list(range(CTAS))
    else:
        return steps
    steps.append(use(f"cta{r} load {op} {s} {G} into {''.join(map(str, targets))}"))
    return steps + [arrive(f"cta{t}.{full}", engine="tma", use=f"cta{t} {op} copy") for t in targets]


@dataclass
class _PairState:
    ctas: list  # a _State per CTA
    ready: set = field(default_factory=set)      # CTAs whose barriers are initialized
    exited: list = field(default_factory=lambda: [0] * CTAS)  # per CTA: roles that have exited


def _apply_pair_use(state: _PairState, what: str) -> None:
    w = what.split()
    r, rest = int(w[0][3:]), w[1:]
    if rest == ["init"]:
        state.ready.add(r)
    elif rest == ["exit"]:
        state.exited[r] += 1
    elif rest[0] in ("remote", "K", "V"):  # a peer's arrival or a copy's bytes reach CTA r
        if r not in state.ready:
            raise ProtocolError(f"a {' '.join(rest)} reaches CTA {r} before it initialized its barriers")
        if state.exited[r] == ROLES:
            raise ProtocolError(f"a {' '.join(rest)} reaches CTA {r} after it exited")
    elif rest[0] == "load":  # a copy writes every target CTA's slot from its issue on
        op, s, G, targets = rest[1], rest[2], rest[3], rest[5]
        by = f" (multicast by CTA {r})" if len(targets) > 1 else ""
        for t in map(int, targets):
            _apply_cta_use(state, t, f"write {op} {s} {G}", by)
    else:
        _apply_cta_use(state, r, " ".join(rest), "")


def _apply_cta_use(state: _PairState, r: int, what: str, by: str) -> None:
    try:
        _apply_use(state.ctas[r], what)
    except ProtocolError as e:
        raise ProtocolError(f"CTA {r}{by}: {e}") from None


def check_pair(stages: int, tiles0, tiles1, *, persistent: bool = False, overlap: bool = False, pingpong: bool = True,
               async_completions=True, schedules: int = 100, seed: int = 0) -> None:
    """A multicast pair whose tiles visit tiles0 and tiles1 key blocks (persistent: lists of alike tiles; tiles1
    None: an idle CTA 1), by default with the copies (and Q's loads) landing in any order after their issue: they
    are marked engine="tma"."""
    lists = [[0] if t is None else [t] if isinstance(t, int) else list(t) for t in (tiles0, tiles1)]
    run(lambda: pair_programs(stages, tiles0, tiles1, persistent=persistent, overlap=overlap, pingpong=pingpong),
        lambda name: PAIR_ARRIVALS[name.split(".")[-1].split("[")[0]],
        lambda: _PairState([_State(stages, lists[0]), _State(stages, lists[1])]), _apply_pair_use,
        what=f"multicast pair of {lists[0]} and {lists[1]} key blocks, {stages} stages, persistent={persistent}, "
             f"overlap={overlap}", schedules=schedules, seed=seed, async_completions=async_completions)
