"""The measured defaults: one table of choices, each beside the measurement that chose it.

In the manner of FlashAttention's `hopper/tile_size.h`: every tuning decision of the plan is a `Choice` row of
`POLICY` (a knob, its value, the domain where it applies, the bench/results/ file(s) and the bench/LOG.md version
that chose it, and a one-line reason). Rows are tried in order and the first whose domain matches wins, so the
table reads top to bottom as the policy. The measurements themselves are in bench/LOG.md ("Policy evidence
(moved from codegen/plan.py)" and the version sections the rows name).

The lookup functions (`default_block_n`, `default_pv_split`, `pingpong_by_default`, `persistent_by_default`,
`tile_overlap_by_default`, `alike_tiles`) and the constants (`MAX_STAGES`, ..., `PLAIN_BOUNDARY_MAX_KEYS`) are
read off the table and keep the names, signatures and results the plan had before it read them from here
(codegen/families/fwd_sm90/plan.py). `describe()` renders the table for docs.

This module depends on `codegen.spec` only: no plan, no trace, no torch.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from .spec import PERSISTENT_MAX_HEAD_DIM, KernelSpec

# ----------------------------------------------------------------------------------------------------------------
# Conditions: what a row's domain can test. A subject is a KernelSpec (or, for pv_split, just a key-block size).


def _dense(s: Any) -> bool:
    """Dense attention: no causal or window bound, fixed lengths."""
    return not s.causal and not s.varlen and s.window == (-1, -1)


# The fields a condition may read: the spec's own, and a few named derived ones.
FIELDS: dict[str, Callable[[Any], Any]] = {
    "head_dim": lambda s: s.head_dim,
    "keys": lambda s: s.keys,                    # seq_len_k, or seq_len where that is 0
    "block_n": lambda s: s.block_n,
    "causal": lambda s: s.causal,
    "varlen": lambda s: s.varlen,
    "window": lambda s: s.window,
    "window_right": lambda s: s.window[1],       # -1: no right bound
    "persistent": lambda s: s.persistent,
    "multicast": lambda s: bool(s.multicast),
    # a spec whose query tiles can go in two-CTA clusters (KernelSpec.multicast_refusal says why not)
    "pairable": lambda s: s.multicast_refusal() is None,
    "pairs_alike": lambda s: s.pairs_alike_tiles,        # a pair of tiles that do the same work (no idle peer)
    "dense": _dense,
    "trace": lambda s: s.trace,                  # the instrumented build (codegen/trace.py)
    # a persistent kernel whose tiles all do the same work (dense): where the tile boundary can overlap and the
    # next tile's Q can be prefetched
    "alike_tiles": lambda s: bool(s.persistent and _dense(s)),
}

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
    "in": lambda a, b: a in b,
}


@dataclass(frozen=True)
class Cond:
    """One test of a row's domain: FIELDS[field](subject) <op> value."""
    field: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.field not in FIELDS:
            raise ValueError(f"unknown policy field {self.field!r}; known: {sorted(FIELDS)}")
        if self.op not in _OPS:
            raise ValueError(f"unknown policy operator {self.op!r}; known: {sorted(_OPS)}")

    def __call__(self, subject: Any) -> bool:
        return bool(_OPS[self.op](FIELDS[self.field](subject), self.value))

    def __str__(self) -> str:
        if self.op == "==" and isinstance(self.value, bool):
            return self.field if self.value else f"not {self.field}"
        return f"{self.field} {self.op} {self.value}"


def eq(field: str, value: Any) -> Cond:
    return Cond(field, "==", value)


def ge(field: str, value: Any) -> Cond:
    return Cond(field, ">=", value)


def le(field: str, value: Any) -> Cond:
    return Cond(field, "<=", value)


def gt(field: str, value: Any) -> Cond:
    return Cond(field, ">", value)


def lt(field: str, value: Any) -> Cond:
    return Cond(field, "<", value)


def is_(field: str) -> Cond:
    return Cond(field, "==", True)


def not_(field: str) -> Cond:
    return Cond(field, "==", False)


@dataclass(frozen=True)
class Formula:
    """A value computed from the subject (printed as its text)."""
    text: str
    fn: Callable[[Any], Any]

    def __str__(self) -> str:
        return self.text


# ----------------------------------------------------------------------------------------------------------------
# The row.


@dataclass(frozen=True)
class Choice:
    knob: str                      # what is chosen (a KernelSpec field, or a Plan decision)
    value: Any                     # the choice (a Formula: computed from the subject)
    where: tuple[Cond, ...]        # the domain: all must hold; () is "otherwise"
    results: tuple[str, ...]       # bench/results/ file names that chose it (may be empty: see the version)
    versions: tuple[str, ...]      # bench/LOG.md version sections ("v17b")
    reason: str                    # one line

    @property
    def domain(self) -> str:
        """The domain as a short predicate."""
        return " and ".join(map(str, self.where)) or "otherwise"

    def matches(self, subject: Any) -> bool:
        return all(c(subject) for c in self.where)

    def value_for(self, subject: Any) -> Any:
        return self.value.fn(subject) if isinstance(self.value, Formula) else self.value

    @property
    def evidence(self) -> str:
        return "; ".join(self.results + self.versions)


def _row(knob: str, value: Any, where: tuple[Cond, ...] | Cond, results: str | tuple[str, ...],
         versions: str | tuple[str, ...], reason: str) -> Choice:
    as_tuple = lambda x: (x,) if isinstance(x, (str, Cond)) else tuple(x)  # noqa: E731
    return Choice(knob, value, as_tuple(where), as_tuple(results), as_tuple(versions), reason)


OTHERWISE: tuple[Cond, ...] = ()
DENSE = is_("dense")

# ----------------------------------------------------------------------------------------------------------------
# The table. Per knob, first match wins.

POLICY: tuple[Choice, ...] = (
    # --- block_n: keys per K/V tile (KernelSpec.block_n = 0) -----------------------------------------------------
    _row("block_n", 192, (eq("head_dim", 64), DENSE, ge("keys", 1024)),
         "ab-20261130T1630Z-knob-sweep.json", "v17b",
         "(16,1024,32,64) 192: 1.042x/1.044x vs 128: 1.033x/1.035x; other lengths not measured"),
    _row("block_n", 176, (eq("head_dim", 128), DENSE, ge("keys", 1024)),
         ("ab-20261130T0912Z-d128-block_n-176-192.json", "ab-20261130T1133Z-block_n-1024.json",
          "ab-20261130T1125Z-block_n-short-keys.json"), ("v11", "v13"),
         "FA3's 128 x 176: wins from 2048 keys (v11), from 1024 once a part block runs only its keys; loses at 512"),
    _row("block_n", 80, (eq("head_dim", 256), DENSE, ge("keys", 1024)),
         ("ab-20261130T1630Z-knob-sweep.json", "ab-20261206T1345Z-d256-turns-blocks-h100.md",
          "clocks-20261206T1420Z-d256-turns-blocks-h100.md"), ("v17b", "v40"),
         "(2,4096,16,256) 80: 1.046x/1.136x vs 64: 1.036x/1.092x (v17b); at the cap 1024-3072 keys 2.5-3.4% faster"),
    _row("block_n", 128, eq("head_dim", 96),
         "ab-20261130T0848Z-d96-block_n.json", "v9",
         "as D=128 (S 64 + P 32 + O 48 registers): 1.123x vs block_n 64's 1.027x"),
    _row("block_n", 112, eq("head_dim", 192),
         ("ab-20261130T0802Z-d256-d192-block_n.json", "ab-20261202T1225Z-fa4-knobs.md"), ("v8", "v23"),
         "FA4's 128 x 112: (2,4096,16,192) 1.155x vs 64's 1.054x (FA4 1.129x), causal 1.146x vs 1.076x; 96 1.138x"),
    _row("block_n", 64, eq("head_dim", 256),
         ("ab-20261130T0802Z-d256-d192-block_n.json", "ab-20261130T0904Z-split-release-block_n.json",
          "ab-20261207T0417Z-d256-v46-v47-v48-h100.md"), ("v8", "v10", "v48"),
         "O alone takes 128 registers, so S stays at 32; causal 80 ties 64 (v48: 1.160x/1.152x, 1.101x/1.104x)"),
    _row("block_n", 128, Cond("head_dim", "in", (64, 128)),
         ("ab-20261130T0858Z-wide-key-blocks-d128.json", "ab-20261130T0858Z-wide-key-blocks-d64.json",
          "ab-20261130T0858Z-wide-key-blocks-seed.json", "ab-20261130T0904Z-split-release-block_n.json"), "v10",
         "S 64 + P 32 + O <= 64 fit the consumers' 240 registers; wider blocks did not win (v10) or are unmeasured"),

    # --- pv_split: PV(j-1) in chunks, each its own wgmma group (KernelSpec.pv_split = ()) ------------------------
    _row("pv_split", (96, 32), eq("block_n", 128),
         (), "v2",
         "softmax(j) runs under all of PV(j-1) since v2: splits measure within noise; (96, 32) stays"),
    _row("pv_split", (32, 32), eq("block_n", 64),
         (), "v2",
         "two 32-key chunks (the rule below gives the same)"),
    _row("pv_split", Formula("(block_n - 32, 32)", lambda s: (s.block_n - 32, 32)), OTHERWISE,
         ("ab-20261130T1153Z-pv-split-176.json", "ab-20261130T1630Z-knob-sweep.json",
          "ab-20261130T1640Z-seed-knobs.json"), ("v14", "v17b"),
         "end on a 32-key chunk: 144+32 beat 112+64, 176, 80+96 at 176 keys; 80, 96, 112 not measured"),

    # --- multicast: query tiles in two-CTA clusters sharing their K/V loads (KernelSpec.multicast = None) ---------
    _row("multicast", False, not_("pairable"),
         (), "v33",
         "the pair needs fixed lengths and key ranges that start together (the spec checks)"),
    _row("multicast", False, OTHERWISE,
         "ab-20261205T1145Z-multicast-h100.md", ("v33", "v34"),
         "slower everywhere (H100): pairs 0.956x-1.098x vs 1.143x-1.251x unpaired on the long rows; sharing costs"),

    # --- pingpong: the two consumers take turns issuing their MMAs (KernelSpec.pingpong = None) -----------------
    _row("pingpong", True, OTHERWISE,
         ("ab-20261130T1630Z-knob-sweep.json", "ab-20261206T1345Z-d256-turns-blocks-h100.md",
          "clocks-20261206T1420Z-d256-turns-blocks-h100.md", "ab-20261207T0417Z-d256-v46-v47-v48-h100.md"),
         ("v12", "v17b", "v23", "v39", "v46"),
         "D=256 without turns: short slots +1-6% (v39), level with FA4 as turns are (v46); at the cap 0.5-1.8% slower"),

    # --- persistent: one CTA per SM looping over tiles (from a global counter; pairs: a fixed stride) -------------
    _row("persistent", False, (is_("multicast"), not_("pairs_alike")),
         (), ("v33", "v34"),
         "a persistent pair's rings advance together: alike tiles only (no causal or window bound, an even count)"),
    _row("persistent", False, gt("head_dim", PERSISTENT_MAX_HEAD_DIM),
         (), "v7",
         "the tile loop spills at D=256 (O alone is 128 registers; codegen.spec.PERSISTENT_MAX_HEAD_DIM)"),
    _row("persistent", False, lt("block_n", 128),
         (), "v7",
         "measured only with key blocks of 128 and more (also False while block_n is still 0, unresolved)"),
    _row("persistent", True, is_("varlen"),
         "ab-20261130T0848Z-varlen-persistent.json", "v9",
         "ragged tiles, the counter balances them whatever the mask: causal 1.948x -> 2.001x padded cuDNN"),
    _row("persistent", True, (is_("causal"), eq("head_dim", 128), le("keys", 4096)),
         "ab-20261207T1105Z-persistent-causal-4096-h100.md", "v53",
         "4096 keys: +0.8/+3.0/+1.4% at (4,4096,32,128), +1.0% 2 x 32 heads, -0.4% 8 x 16; at the cap 4% less energy"),
    _row("persistent", True, (is_("causal"), le("keys", 3072)),
         ("ab-20261206T1155Z-persistent-causal-lpt-h100.md", "ab-20261202T1310Z-short-causal-persistent.md"),
         ("v24", "v38"),
         "tiles in LPT order, their starts hidden: 1024-3072 keys +5-15% (H100, 7 shapes); 4096 mixed, 8k/16k lose"),
    _row("persistent", False, is_("causal"),
         "ab-20261130T0742Z-persistent.json", ("v7", "v8"),
         "causal tiles differ in length: causal 16k 1.099x per-tile vs 1.041x with the counter (static 0.768x)"),
    _row("persistent", False, ge("window_right", 0),
         (), "v7",
         "a right window bound moves with the query as causal does (not measured itself)"),
    _row("persistent", False, (eq("head_dim", 128), DENSE, ge("keys", 4096)),
         ("ab-20261205T1237Z-persistent-long-rows-h100.md", "ab-20261205T1400Z-persistent-fa4-h100.md"), "v35",
         "H100: (1,16384,16,128) +1.2-4.4% in four runs, 4096 keys a tie (-1.1 to +1.3%), 2048 -2.9%; no H200 run"),
    _row("persistent", True, OTHERWISE,
         "ab-20261130T0742Z-persistent.json", ("v7", "v8"),
         "alike tiles: the next tile's loads hide under this one's epilogue; seed 0.941x -> 1.019x (v7)"),

    # --- tile_overlap: a persistent tile's O stored under the next tile's first QK (KernelSpec.tile_overlap) -----
    _row("tile_overlap", True, not_("alike_tiles"),
         (), "v12",
         "no overlap possible (not persistent, or tiles not alike): True changes nothing, keeps the name plain"),
    _row("tile_overlap", False, (ge("head_dim", 128), le("keys", 2048)),
         "ab-20261130T1600Z-tile-boundary.json", "v17",
         "plain boundary faster up to 2048 keys at D=128: seed 1.021-1.023x -> 1.044-1.049x"),
    _row("tile_overlap", True, OTHERWISE,
         ("ab-20261130T1150Z-tile-overlap-matrix.json", "ab-20261130T1155Z-d128-long-overlap-bn192.json",
          "ab-20261130T1600Z-tile-boundary.json"), ("v12", "v17"),
         "long D=128 +1-2% (v12), within noise at 4096/16384 keys (v17); D=64 1.034-1.035x vs 1.026-1.027x plain"),

    # --- stages: the deepest K/V ring resolve() tries (as many as fit shared memory; KernelSpec.stages = 0) -------
    _row("max_stages", 3, is_("persistent"),
         (), ("v4", "v7"),
         "the persistent producer's loop state spills its 24 registers next to a 4-deep ring; 3 = 4 at D=64 (v4)"),
    _row("max_stages", 4, OTHERWISE,
         (), ("v3", "v4"),
         "a deeper ring hides load latency: 2 -> 3 stages 0.85x -> 1.04x cuDNN (v3); 4 fit at D=64"),

    # --- Plan decisions with a threshold ------------------------------------------------------------------------
    _row("conditional_rescale", True, (eq("head_dim", 128), not_("causal"), le("keys", 2048)),
         (), "v30",
         "non-causal D=128 kernels up to 2048 keys spill 16-348 bytes without the vote (ptxas): it stays there"),
    _row("conditional_rescale", True, ge("head_dim", 192),
         ("nvidia-h200-20261130T060851Z.json", "nvidia-h200-20261130T061359Z.json"), "v4",
         "skip O's rescale when no row max grew (a warp vote): D=256 +3% (v4); D=192 unmeasured; D=128 see below"),
    _row("conditional_rescale", False, OTHERWISE,
         ("nvidia-h200-20261130T071349Z.json", "ab-20261204T1700Z-unconditional-rescale.md"), ("v4", "v6", "v30"),
         "the vote costs more than it saves: D=64 0.840x -> 0.900x (v6), D=128 +3-10% since the pin (v30); D=96 ?"),
    _row("lazy_rescale", True, (eq("head_dim", 256), DENSE),
         ("ab-20261207T0830Z-lazy-rescale-h100.md",), "v50",
         "the vote skips nearly every rescale: (2,4096,16,256) +0.9-1.4% in three same-run A/Bs (H100)"),
    _row("lazy_rescale", False, OTHERWISE,
         ("ab-20261207T0830Z-lazy-rescale-h100.md",), "v50",
         "D=192 a tie (-1.0 to +0.2%); D <= 128 -1 to -11%, which drop the vote (conditional_rescale's rows)"),
    _row("tail_rescale_vote", True, eq("head_dim", 128),
         (), "v30",
         "without the vote a peeled short last block spills 12 bytes (S=5000: 28 x 176 keys + 80)"),
    _row("tail_rescale_vote", False, OTHERWISE,
         (), "v30",
         "as the steady steps (conditional_rescale)"),
    _row("qk_overwrites", True, ge("head_dim", 128),
         ("ab-20261130T1125Z-short-tail-vs-v12.json", "ab-20261130T1133Z-short-tail-vs-v12.json"), "v13",
         "QK's first k-slice writes S: seed -1.2%, 4k -2.8%, 16k -3.3%; also where a short tail needs it (Plan.tail_n)"),
    _row("qk_overwrites", False, OTHERWISE,
         ("ab-20261130T1125Z-short-tail-vs-v12.json", "ab-20261130T1133Z-short-tail-vs-v12.json"), "v13",
         "(16,1024,32,64) 0.301 -> 0.308 ms with the overwrite, so D=64 reads S unless a short tail needs it"),
    _row("short_tail", True, le("block_n", 192),
         ("ab-20261130T1125Z-short-tail-vs-v12.json", "ab-20261130T1133Z-short-tail-vs-v12.json"), "v13",
         "a part last key block runs only over its keys: (4,4096,32,128) 1.769 -> 1.734 ms"),
    _row("short_tail", False, OTHERWISE,
         (), "v13",
         "at block_n 208 the peeled last step spills at D=64 and D=96 (tests/test_codegen.py compiles them)"),
    _row("pin_softmax", False, (eq("head_dim", 96), ge("block_n", 176)),
         (), "v26b",
         "the pin spills 52 bytes there (ptxas); without it the kernel compiles clean"),
    _row("pin_softmax", False, (eq("head_dim", 256), is_("trace")),
         (), "v26b",
         "the traced D=256 kernel spills 8 bytes with the pin; the trace is for measuring, and compiles clean without"),
    _row("pin_softmax", True, OTHERWISE,
         "ab-20261204T0400Z-softmax-pin.md", ("v26", "v26b"),
         "K's release after the row maxima keeps them before the PV wait: causal +5-15%, D=96/D=64 within 2%"),
    _row("prefetch_next_q", True, (is_("alike_tiles"), le("keys", 1024)),
         ("ab-20261130T1146Z-next-q-prefetch.json", "ab-20261130T1600Z-tile-boundary.json"), ("v14", "v17"),
         "where tiles are short the next Q's DRAM latency shows: without it (8,512,32,128) 0.066 -> 0.068 ms"),
    _row("prefetch_next_q", False, OTHERWISE,
         "ab-20261130T1146Z-next-q-prefetch.json", "v14",
         "without it 4k 1.741 -> 1.706-1.723 ms, 16k 3.45-3.47 -> 3.340 ms (why is not understood); tiles not alike"),
)

KNOBS: tuple[str, ...] = tuple(dict.fromkeys(c.knob for c in POLICY))


def rows(knob: str) -> tuple[Choice, ...]:
    found = tuple(c for c in POLICY if c.knob == knob)
    if not found:
        raise KeyError(f"no policy rows for knob {knob!r}; knobs: {KNOBS}")
    return found


def choice(knob: str, subject: Any) -> Choice:
    """The first row of `knob` whose domain holds for `subject`."""
    for c in rows(knob):
        if c.matches(subject):
            return c
    raise LookupError(f"no {knob} policy row matches {subject!r}")


def choose(knob: str, subject: Any) -> Any:
    """The value of `knob` for `subject` (a KernelSpec; for pv_split anything with a block_n)."""
    return choice(knob, subject).value_for(subject)


def _bound(knob: str, value: Any, field: str, op: str) -> Any:
    """Read a threshold off the table: the `field op X` test of the row that gives `knob` `value`."""
    for c in rows(knob):
        if c.value == value:
            tests = [t.value for t in c.where if t.field == field and t.op == op]
            if len(tests) == 1:
                return tests[0]
    raise LookupError(f"no {knob} = {value!r} row tests {field} {op}")


# ----------------------------------------------------------------------------------------------------------------
# The lookups and constants the forward plan reads (the names and results it had before this table).

MAX_STAGES: int = next(c.value for c in rows("max_stages") if not c.where)
PERSISTENT_MAX_STAGES: int = next(c.value for c in rows("max_stages") if c.where == (is_("persistent"),))
QK_OVERWRITES_MIN_HEAD_DIM: int = _bound("qk_overwrites", True, "head_dim", ">=")  # Plan.qk_overwrites
SHORT_TAIL_MAX_BLOCK_N: int = _bound("short_tail", True, "block_n", "<=")  # Plan.tail_n
PREFETCH_Q_MAX_KEYS: int = _bound("prefetch_next_q", True, "keys", "<=")  # Plan.prefetch_next_q
PLAIN_BOUNDARY_MIN_HEAD_DIM: int = _bound("tile_overlap", False, "head_dim", ">=")
PLAIN_BOUNDARY_MAX_KEYS: int = _bound("tile_overlap", False, "keys", "<=")


def _block_n_tables() -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    narrow: dict[int, int] = {}
    wide: dict[int, tuple[int, int]] = {}
    for c in rows("block_n"):
        dims = [t.value for t in c.where if t.field == "head_dim"]
        dims = [d for t in dims for d in (t if isinstance(t, tuple) else (t,))]
        keys = [t.value for t in c.where if t.field == "keys" and t.op == ">="]
        for d in dims:
            if keys:
                wide.setdefault(d, (c.value, keys[0]))
            else:
                narrow.setdefault(d, c.value)
    return dict(sorted(narrow.items())), dict(sorted(wide.items()))


# head_dim -> block_n, and head_dim -> (block_n, from how many keys) for dense attention (no causal or window
# bound, fixed lengths): the block_n rows in the plan's old form.
DEFAULT_BLOCK_N, WIDE_BLOCK_N = _block_n_tables()


class _KeyBlock(NamedTuple):
    block_n: int


def default_block_n(spec: KernelSpec) -> int:
    return choose("block_n", spec)


def default_pv_split(block_n: int) -> tuple[int, ...]:
    return tuple(choose("pv_split", _KeyBlock(block_n)))


def pingpong_by_default(spec: KernelSpec) -> bool:
    """Whether a spec with pingpong=None has its consumers take turns issuing MMAs."""
    return choose("pingpong", spec)


def persistent_by_default(spec: KernelSpec) -> bool:
    """Whether a spec with persistent=None runs persistent CTAs (reads spec.block_n: call it once that is set)."""
    return choose("persistent", spec)


def multicast_by_default(spec: KernelSpec) -> bool:
    """Whether a spec with multicast=None pairs its query tiles (reads spec.block_n: call it once that is set)."""
    return choose("multicast", spec)


def alike_tiles(spec: KernelSpec) -> bool:
    """Whether a persistent kernel's tiles all do the same work (fixed lengths, no causal or window bound): where
    the tile boundary can overlap and the next tile's Q can be prefetched."""
    return FIELDS["alike_tiles"](spec)


def tile_overlap_by_default(spec: KernelSpec) -> bool:
    """Whether a spec with tile_overlap=None overlaps its tile boundary. Where the plan cannot (tiles not alike)
    the answer is True, which changes nothing and keeps the name plain."""
    return choose("tile_overlap", spec)


def max_stages(spec: KernelSpec) -> int:
    """The deepest K/V ring resolve() tries for a spec whose persistent is set."""
    return choose("max_stages", spec)


# ----------------------------------------------------------------------------------------------------------------
# Docs.


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|")


def table_markdown(policy: tuple[Choice, ...] = POLICY) -> str:
    """The table as Markdown: knob, value, domain, evidence (bench/results/ files; bench/LOG.md versions), reason.
    Within a knob the first matching row wins."""
    lines = ["| knob | value | domain | evidence | reason |", "|---|---|---|---|---|"]
    for c in policy:
        results = ", ".join(f"`{r}`" for r in c.results)
        evidence = "; ".join(filter(None, (results, ", ".join(c.versions))))
        lines.append(f"| {c.knob} | {_cell(c.value)} | {_cell(c.domain)} | {evidence} | {_cell(c.reason)} |")
    return "\n".join(lines) + "\n"


describe = table_markdown


if __name__ == "__main__":
    print(table_markdown(), end="")
