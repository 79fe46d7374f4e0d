"""KernelSpec: the frozen description of one specialized attention kernel.

A spec is everything that changes the emitted source. Runtime quantities that do not (batch size, the
tensors' strides and addresses, the softmax scale) stay out of it, so one compiled kernel serves every
batch and both (B, S, H, D) and (B, H, S, D) inputs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from layouts.dtypes import DTYPES, HEAD_DIMS

SUPPORTED_ARCHS = ("sm_90a", "sm_100a", "sm_103a")  # Blackwell: layouts and the probe (codegen.families)
SUPPORTED_DTYPES = {name: d.bytes for name, d in DTYPES.items()}
SUPPORTED_HEAD_DIMS = HEAD_DIMS
# Keys per K/V tile: N of QK^T (at most 256 for wgmma) and K of PV, so whole 16-key MMA slices. Non-powers of
# two (80, 96, 112, 144, ...) are stacked layouts, verified like the others.
SUPPORTED_BLOCK_N = tuple(range(64, 257, 16))
# A consumer thread holds S (block_n / 2 f32), P (block_n / 4 packed pairs) and O (head_dim / 2 f32) at once,
# within its 240 registers. ptxas fits 208 of them without spilling (D=128 with block_n 192) and spills at
# 216 (D=96 with block_n 224) and 224 (D=64 with block_n 256).
MAX_ACCUMULATOR_REGISTERS = 208
# One consumer warpgroup owns 64 query rows (the M of one wgmma); the kernel runs two of them.
ROWS_PER_CONSUMER = 64
MMA_K = 16
# The deepest K/V ring each architecture's kernels are written and checked for (the Blackwell protocol check
# runs up to 6 stages, the seed's depth; the Hopper ring logic is tested from 2 to 4).
MAX_STAGES_BY_ARCH = {"sm_90a": 4, "sm_100a": 6, "sm_103a": 6}
PERSISTENT_MAX_HEAD_DIM = 128
# KernelSpec.lazy_rescale: how far (log2 units) a row's max may pass the running max before O is rescaled; P then
# stays below 2^8, which f16/bf16 P and f32 sums hold as precisely as P <= 1 (FA4's Blackwell kernel: 8).
LAZY_RESCALE_LOG2 = 8.0
MULTICAST_CTAS = 2  # KernelSpec.multicast: the query tiles of one cluster, loading their shared key blocks once


class SpecError(ValueError):
    """A spec the generator cannot emit a correct kernel for."""


@dataclass(frozen=True)
class KernelSpec:
    seq_len: int
    heads: int
    head_dim: int
    dtype: str = "f16"
    causal: bool = False
    arch: str = "sm_90a"
    block_m: int = 128
    block_n: int = 0  # 0: the per-head-dim default of codegen.policy
    pv_split: tuple[int, ...] = ()  # () : the default split for this shape
    stages: int = 0  # 0: as many K/V stages as shared memory holds, up to codegen.policy's max_stages
    pingpong: bool | None = None  # the two consumer warpgroups take turns issuing MMAs; None: codegen.policy's choice
    seq_len_k: int = 0  # keys (and values); 0: the same as seq_len
    kv_heads: int = 0  # K/V heads, dividing heads (grouped-query; 1 is multi-query); 0: the same as heads
    window: tuple[int, int] = (-1, -1)  # local attention: keys in [i - left, i + right] (bottom-right aligned); -1: unbounded
    softcap: float = 0.0  # scores become softcap * tanh(scores / softcap); 0: off
    # Variable-length batch: packed (total, H, D) tensors cut by cu_seqlens at run time; seq_len and seq_len_k
    # are then the longest sequence the kernel accepts, not the length of every sequence.
    varlen: bool = False
    # One CTA per SM looping over query tiles, so a tile's epilogue overlaps the next tile's loads.
    # None: codegen.policy decides (measured: on where every tile does the same work).
    persistent: bool | None = None
    # Persistent kernels whose tiles are alike (fixed lengths, no causal or local window): a tile's O is
    # stored under the next tile's first QK. Off: the tile boundary of v7-v11, where O is stored after the last
    # PV. None: codegen.policy decides (measured: off at D=128 up to 2048 keys).
    tile_overlap: bool | None = None
    # Query tiles in pairs (a two-CTA cluster) that load each key block they both visit once: the pair's producers
    # split its K and V copies, each multicast into both CTAs' rings. Fixed lengths, no left window (an odd last
    # tile's cluster has an idle peer); persistent only where the tiles are alike (`pairs_alike_tiles`: the pair's
    # rings then advance together). None: codegen.policy decides.
    multicast: bool | None = None
    # Fixed lengths without a window whose keys end in a part block: that block's QK^T and PV run only over its
    # keys, rounded up to 16 (a narrower wgmma), instead of the whole block_n. Off: the whole block, masked.
    short_tail: bool = True
    # A row's running max is kept until a new one passes it by more than LAZY_RESCALE_LOG2 (log2 units: P then
    # reaches up to 2^8), so O's rescale factor stays exactly 1 and the warp vote skips almost every rescale after
    # a tile's first blocks. None: codegen.policy decides.
    lazy_rescale: bool | None = None
    # Learned attention sinks (gpt-oss): the kernel takes a float (H,) array of logits, natural-log units, that join
    # each row's softmax denominator (never attended: no value) and its logsumexp.
    sinks: bool = False
    # Instrumented build: a few CTAs record the SM clock at each pipeline event (codegen/trace.py reads them).
    trace: bool = False

    def __post_init__(self) -> None:
        _require(isinstance(self.seq_len, int) and self.seq_len >= 1,
                 f"seq_len must be a positive integer, got {self.seq_len!r}")
        _require(self.seq_len < 2**31, f"seq_len {self.seq_len} does not fit the kernel's 32-bit row index")
        _require(isinstance(self.heads, int) and self.heads >= 1, f"heads must be a positive integer, got {self.heads!r}")
        _require(self.head_dim in SUPPORTED_HEAD_DIMS,
                 f"head_dim {self.head_dim} is not supported; choose one of {SUPPORTED_HEAD_DIMS}")
        _require(self.dtype in SUPPORTED_DTYPES, f"dtype {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        _require(self.arch in SUPPORTED_ARCHS,
                 f"arch {self.arch!r} is not supported; choose one of {SUPPORTED_ARCHS} (the Blackwell ones have "
                 "their layouts and probe, not yet a forward kernel)")
        _require(self.block_m == 2 * ROWS_PER_CONSUMER,
                 f"block_m must be {2 * ROWS_PER_CONSUMER} (two consumer warpgroups of {ROWS_PER_CONSUMER} rows)")
        if self.block_n:
            _require(self.block_n in SUPPORTED_BLOCK_N,
                     f"block_n {self.block_n} must be a multiple of {MMA_K} in {SUPPORTED_BLOCK_N[0]}.."
                     f"{SUPPORTED_BLOCK_N[-1]} (16-key MMA slices of P V; at most 256, the widest wgmma)")
            regs = self.block_n // 2 + self.block_n // 4 + self.head_dim // 2
            _require(regs <= MAX_ACCUMULATOR_REGISTERS,
                     f"block_n {self.block_n} with head_dim {self.head_dim} needs {regs} accumulator registers per "
                     f"consumer thread (S {self.block_n // 2} + P {self.block_n // 4} + O {self.head_dim // 2}), over "
                     f"the {MAX_ACCUMULATOR_REGISTERS} that fit without spilling; use a smaller block_n")
        # One stage is not offered: every load would wait for the MMA that frees its only slot, so nothing would
        # load under compute (and the kernel's ring logic is only tested from 2 up).
        deepest = MAX_STAGES_BY_ARCH.get(self.arch, 4)
        _require(self.stages == 0 or 2 <= self.stages <= deepest,
                 f"stages must be 2..{deepest} on {self.arch} (0 for the default), got {self.stages}")
        _require(isinstance(self.seq_len_k, int) and 0 <= self.seq_len_k < 2**31,
                 f"seq_len_k must be a non-negative integer below 2**31 (0: same as seq_len), got {self.seq_len_k!r}")
        _require(isinstance(self.kv_heads, int) and self.kv_heads >= 0,
                 f"kv_heads must be a non-negative integer (0: same as heads), got {self.kv_heads!r}")
        _require(not self.kv_heads or self.heads % self.kv_heads == 0,
                 f"heads {self.heads} must be a multiple of kv_heads {self.kv_heads} (grouped-query attention)")
        _require(len(self.window) == 2 and all(isinstance(w, int) and -1 <= w < 2**31 for w in self.window),
                 f"window must be (left, right) with each in 0..2**31-1, or -1 for unbounded; got {self.window!r}")
        _require(isinstance(self.varlen, bool), f"varlen must be True or False, got {self.varlen!r}")
        _require(isinstance(self.trace, bool), f"trace must be True or False, got {self.trace!r}")
        _require(isinstance(self.short_tail, bool), f"short_tail must be True or False, got {self.short_tail!r}")
        _require(isinstance(self.sinks, bool), f"sinks must be True or False, got {self.sinks!r}")
        for knob in ("pingpong", "persistent", "tile_overlap", "multicast", "lazy_rescale"):
            value = getattr(self, knob)  # a type test: 1 == True would pass `value in (None, True, False)`
            _require(value is None or isinstance(value, bool),
                     f"{knob} must be True, False or None (the default for the shape), got {value!r}")
        _require(not (self.lazy_rescale and self.arch != "sm_90a"), "lazy_rescale is for the sm_90a kernels")
        if self.multicast:
            refusal = self.multicast_refusal()
            _require(refusal is None, refusal)
        # The tile loop's few extra live values spill at D=256, where O alone is 128 registers per thread.
        _require(not (self.persistent is True and self.head_dim > PERSISTENT_MAX_HEAD_DIM and self.arch == "sm_90a"),
                 f"persistent kernels go up to head_dim {PERSISTENT_MAX_HEAD_DIM} (at {self.head_dim} the tile loop "
                 "spills registers)")
        _require(isinstance(self.softcap, (int, float)) and math.isfinite(self.softcap) and self.softcap >= 0,
                 f"softcap must be a finite number >= 0 (0: off), got {self.softcap!r}")
        if self.pv_split:
            _require(all(isinstance(c, int) and c > 0 and c % MMA_K == 0 for c in self.pv_split),
                     f"every pv_split chunk must be a positive multiple of {MMA_K}, got {self.pv_split}")
            if self.block_n:
                _require(sum(self.pv_split) == self.block_n,
                         f"pv_split {self.pv_split} must add up to block_n {self.block_n}")

    def multicast_refusal(self) -> str | None:
        """Why this spec's query tiles cannot pair into clusters (KernelSpec.multicast), or None where they can."""
        if self.arch != "sm_90a":
            return f"multicast is a sm_90a forward mode, not one of {self.arch}"
        if self.varlen:
            return "multicast needs fixed lengths (a pair's tiles must both exist): not varlen"
        if self.window[0] >= 0:
            return "multicast needs the pair's key ranges to start together: no left window"
        if self.persistent is True and not self.pairs_alike_tiles:
            return ("a persistent pair needs alike tiles, whose rings advance together: no causal or window bound and "
                    f"an even number of {self.block_m}-row query tiles; pass persistent=False")
        return None

    @property
    def pairs_alike_tiles(self) -> bool:
        """Whether a multicast pair's tiles always do the same work (fixed lengths, no causal or window bound, an
        even tile count: no tile lacks its peer), so that a persistent pair's rings advance together."""
        return (not self.varlen and not self.causal and self.window == (-1, -1)
                and -(-self.seq_len // self.block_m) % MULTICAST_CTAS == 0)

    @property
    def elem_bytes(self) -> int:
        return SUPPORTED_DTYPES[self.dtype]

    @property
    def name(self) -> str:
        """File-name-safe identifier; also the kernel's symbol name."""
        split = "x".join(str(c) for c in self.pv_split) or "auto"
        mask = "causal" if self.causal else "full"
        bn = self.block_n or "auto"
        stages = self.stages or "auto"
        extras = ""
        if self.seq_len_k and self.seq_len_k != self.seq_len:
            extras += f"_sk{self.seq_len_k}"
        if self.kv_heads and self.kv_heads != self.heads:
            extras += f"_kvh{self.kv_heads}"
        if self.window != (-1, -1):
            extras += "_win" + "_".join("inf" if w < 0 else str(w) for w in self.window)
        if self.varlen:
            extras += "_varlen"
        if self.softcap:
            extras += "_cap" + f"{self.softcap:g}".replace(".", "p").replace("-", "m").replace("+", "")
        if self.sinks:
            extras += "_sinks"
        return (f"flashgen_fwd_{self.arch}_s{self.seq_len}_h{self.heads}_d{self.head_dim}_{self.dtype}_{mask}"
                f"_m{self.block_m}n{bn}_pv{split}_st{stages}" + extras + ("_nopp" if self.pingpong is False else "")
                + ("_persist" if self.persistent is True else "") + ("_noovl" if self.tile_overlap is False else "")
                + ("_mc" if self.multicast is True else "")
                + ("" if self.short_tail else "_fulltail") + ("_lazy" if self.lazy_rescale else "")
                + ("_trace" if self.trace else ""))

    def replace(self, **changes) -> "KernelSpec":
        return dataclasses.replace(self, **changes)

    @property
    def keys(self) -> int:
        return self.seq_len_k or self.seq_len

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // (self.kv_heads or self.heads)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["pv_split"] = list(self.pv_split)
        d["window"] = list(self.window)
        return d


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SpecError(message)


def parse_split(text: str) -> tuple[int, ...]:
    """'96,32' or '96+32' -> (96, 32)."""
    parts = text.replace("+", ",").split(",")
    try:
        return tuple(int(p) for p in parts if p.strip())
    except ValueError:
        raise SpecError(f"--split expects chunk sizes like 96,32; got {text!r}") from None
