"""The benchmarked problems: Case (dense or variable-length), the --shape and --varlen parsers, the ragged
lengths of a COUNTxMAX batch, the built-in shape matrices, and the generator's kernel spec and block_n for a case."""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from typing import Sequence

VARLEN_SEED = 0  # the ragged lengths of COUNTxMAX: one fixed draw, so the same command benchmarks the same batch


class BenchUsageError(ValueError):
    """A command line the benchmark cannot run."""


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: q of shape (batch, seq, heads, dim), k and v (batch, seq_k, kv_heads, dim).

    A varlen case has `lens`, the per-sequence lengths (q and k alike): q is packed (sum(lens), heads, dim),
    k and v (sum(lens), kv_heads, dim); batch is then len(lens) and seq max(lens) (build it with varlen_case).
    seq_k, the key length of a dense case, defaults to seq; a longer one is a chunked prefill (S_q queries over
    S_k keys), causal aligned to the bottom right as in codegen.check.reference: query i sees keys up to
    i + S_k - S_q.
    """

    batch: int
    seq: int
    heads: int
    dim: int
    dtype: str = "f16"
    causal: bool = False
    kv_heads: int | None = None  # None: as many as heads. Normalized here so equal problems compare equal.
    lens: tuple[int, ...] | None = None  # varlen: the sequences' lengths, in batch order
    seq_k: int | None = None  # keys of a dense case; None: seq. Normalized here, as kv_heads is.

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.seq_k is None:
            object.__setattr__(self, "seq_k", self.seq)
        if self.seq_k < 1:
            raise BenchUsageError(f"the key length S_k must be at least 1, got {self.seq_k}")
        if self.lens is not None and self.seq_k != self.seq:
            raise BenchUsageError("a varlen case has q lengths = k lengths; S_k is for dense cases")
        problem = kv_heads_problem(self.heads, self.kv_heads)
        if problem:
            raise BenchUsageError(problem)
        if self.lens is not None:
            lens = tuple(self.lens)
            if not lens or min(lens) < 1:
                raise BenchUsageError(f"a varlen batch needs at least one sequence, each of length >= 1, got {lens}")
            if (self.batch, self.seq) != (len(lens), max(lens)):
                raise BenchUsageError(f"a varlen case has batch = {len(lens)} sequences and seq = the longest, "
                                      f"{max(lens)}; got batch {self.batch}, seq {self.seq}")
            object.__setattr__(self, "lens", lens)

    @property
    def varlen(self) -> bool:
        return self.lens is not None

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    @property
    def seq_lens(self) -> tuple[int, ...]:
        """Every sequence's length: lens, or seq repeated batch times for a dense case."""
        return self.lens if self.lens is not None else (self.seq,) * self.batch

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def chunked(self) -> bool:
        """S_k != S_q (a dense case only)."""
        return self.seq_k != self.seq

    @property
    def flops(self) -> float:
        """Sum over sequences of 4 * H * L^2 * D (QK^T and PV, 2 flops a multiply-add), halved for causal.

        K/V heads do not change the arithmetic: every query head still meets all its keys. With S_k != S_q:
        4 * B * H * S_q * S_k * D, and under causal (bottom-right) the pairs the mask keeps, counted as the square
        case is: S_q * S_k - min(S_q, S_k)^2 / 2 (the full rectangle less half of the diagonal square)."""
        if self.chunked:
            return 4.0 * self.batch * self.heads * _pairs(self.seq, self.seq_k, self.causal) * self.dim
        flops = sum(4.0 * self.heads * n * n * self.dim for n in self.seq_lens)
        return flops / 2 if self.causal else flops

    @property
    def padded_flops(self) -> float:
        """The FLOPs of the dense (batch, seq) problem: what a padded batch computes."""
        if self.chunked:
            return self.flops
        flops = 4.0 * self.batch * self.heads * self.seq * self.seq * self.dim
        return flops / 2 if self.causal else flops

    @property
    def padding_efficiency(self) -> float:
        """Useful FLOPs over padded FLOPs: 1 for a dense case."""
        return self.flops / self.padded_flops

    @property
    def scores(self) -> int:
        """Entries of the full S x S (S_q x S_k) score matrices over all sequences and heads."""
        if self.chunked:
            return self.batch * self.heads * self.seq * self.seq_k
        return sum(self.heads * n * n for n in self.seq_lens)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of q (and of o)."""
        return self.total_tokens * self.heads * self.dim * 2  # f16 and bf16 alike

    @property
    def set_bytes(self) -> int:
        """Bytes of one input set with its output: q, o, and the smaller k and v under GQA (longer with S_k)."""
        if self.chunked:
            return 2 * self.tensor_bytes + 2 * self.batch * self.seq_k * self.kv_heads * self.dim * 2
        return 2 * self.tensor_bytes + 2 * self.tensor_bytes // self.group

    @property
    def yardstick(self) -> str:
        """What ratio_to_cudnn divides: cuDNN on the problem itself, or on the zero-padded batch (varlen)."""
        return "cudnn-padded" if self.varlen else "cudnn"

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "non-causal"
        kv = f" kv{self.kv_heads}" if self.gqa else ""
        if self.varlen:
            return (f"varlen({self.batch} seqs, {self.total_tokens} tok, max {self.seq}; {self.heads},{self.dim})"
                    f"{kv} {self.dtype} {mask}")
        keys = f" S_k {self.seq_k}" if self.chunked else ""
        return f"({self.batch},{self.seq},{self.heads},{self.dim}){keys}{kv} {self.dtype} {mask}"


def _pairs(seq_q: int, seq_k: int, causal: bool) -> float:
    """(query, key) pairs of one head: all of them, or under bottom-right causal the rectangle less half of the
    min(S_q, S_k) square (seq_q == seq_k: S^2 / 2, the square cases' convention)."""
    return seq_q * seq_k - (min(seq_q, seq_k) ** 2 / 2 if causal else 0)


def varlen_case(lens: Sequence[int], heads: int, dim: int, dtype: str = "bf16", causal: bool = False,
                kv_heads: int | None = None) -> Case:
    """A variable-length batch of these sequence lengths (q lengths = k lengths)."""
    lens = tuple(int(n) for n in lens)
    if not lens:
        raise BenchUsageError("a varlen batch needs at least one sequence")
    return Case(len(lens), max(lens), heads, dim, dtype, causal, kv_heads, lens=lens)


def ragged_lengths(count: int, max_len: int, total: int | None = None, *, seed: int = VARLEN_SEED,
                   min_len: int | None = None) -> tuple[int, ...]:
    """COUNT sequence lengths, deterministic for a seed: one of max_len, the others drawn uniformly from
    [min_len, max_len] (min_len defaults to max_len / 4), then, when total is given, moved evenly toward it
    (never out of that range) so that they sum to exactly total; finally shuffled, so the longest is not
    always first. Python's own Mersenne Twister: the same lengths on every machine and version."""
    lo = max(1, max_len // 4) if min_len is None else min_len
    if count < 1 or max_len < 1 or not 1 <= lo <= max_len:
        raise BenchUsageError(f"ragged lengths need count >= 1 and 1 <= min <= max, got count {count}, "
                              f"min {lo}, max {max_len}")
    least, most = max_len + (count - 1) * lo, count * max_len
    if total is not None and not least <= total <= most:
        raise BenchUsageError(f"{count} sequences of {lo}..{max_len} tokens with the longest {max_len} sum to "
                              f"{least}..{most} tokens, not {total}")
    rng = random.Random(seed)
    lens = [max_len] + [rng.randint(lo, max_len) for _ in range(count - 1)]
    diff = 0 if total is None else total - sum(lens)
    while diff:
        up = diff > 0
        movable = [i for i in range(1, count) if (lens[i] < max_len if up else lens[i] > lo)]
        share = max(1, abs(diff) // len(movable))
        for i in rng.sample(movable, len(movable)):
            step = min(share, abs(diff), max_len - lens[i] if up else lens[i] - lo)
            lens[i] += step if up else -step
            diff -= step if up else -step
            if not diff:
                break
    rng.shuffle(lens)
    return tuple(lens)


VARLEN_USAGE = ("--varlen expects the sequence lengths L1,L2,... (e.g. 1000,4096,2311) or COUNTxMAX[=TOTAL] "
                "(COUNT ragged lengths between MAX/4 and MAX, the longest MAX, summing to TOTAL; e.g. 16x4096=40960)")


def parse_varlen(text: str) -> tuple[int, ...]:
    """'1000,4096,2311' -> those lengths; '16x4096' or '16x4096=40960' -> ragged_lengths(16, 4096[, 40960])."""
    spec = text.strip().lower()
    m = re.fullmatch(r"\s*(\d+)\s*[x*]\s*(\d+)\s*(?:=\s*(\d+)\s*)?", spec)
    if m:
        count, max_len = int(m[1]), int(m[2])
        if count < 1 or max_len < 1:
            raise BenchUsageError(f"{VARLEN_USAGE}; COUNT and MAX must be at least 1, got {text!r}")
        try:
            return ragged_lengths(count, max_len, int(m[3]) if m[3] else None)
        except BenchUsageError as e:
            raise BenchUsageError(f"--varlen {text!r}: {e}") from None
    parts = [p.strip() for p in spec.split(",")]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise BenchUsageError(f"{VARLEN_USAGE}; got {text!r}")
    lens = tuple(int(p) for p in parts)
    if min(lens) < 1:
        raise BenchUsageError(f"--varlen {text!r}: every sequence length must be at least 1")
    return lens


def kv_heads_problem(heads: int, kv_heads: int) -> str | None:
    """Why heads and kv_heads cannot be a grouped-query problem, or None when they can."""
    if kv_heads < 1:
        return f"K/V heads must be at least 1, got {kv_heads}"
    if heads % kv_heads:
        return f"heads {heads} must be a multiple of K/V heads {kv_heads} (grouped-query attention)"
    return None


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """'4,4096,32,128' (or 4x4096x32x128) -> (4, 4096, 32, 128, 32); '4,4096,32,128:8' -> (4, 4096, 32, 128, 8).

    The fifth number is the K/V heads, the same as H when ':KV' is left out."""
    dims, colon, kv_text = text.strip().partition(":")
    parts = [p.strip() for p in re.split(r"[,x]", dims)]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise BenchUsageError(f"--shape expects four integers B,S,H,D, then optionally :KV, got {text!r}") from None
    if len(values) != 4:
        raise BenchUsageError(f"--shape expects four numbers B,S,H,D before any ':KV', got {len(values)} in {text!r}")
    if min(values) < 1:
        raise BenchUsageError(f"every dimension of --shape must be at least 1, got {text!r}")
    if not colon:
        return (*values, values[2])
    try:
        kv_heads = int(kv_text)
    except ValueError:
        raise BenchUsageError(f"--shape expects the K/V heads after ':' as one integer (B,S,H,D:KV), "
                              f"got {text!r}") from None
    problem = kv_heads_problem(values[2], kv_heads)
    if problem:
        raise BenchUsageError(f"--shape {text!r}: {problem}")
    return (*values, kv_heads)


def case_from(shape: Sequence[int], dtype: str, causal: bool) -> Case:
    """A Case from parse_shape's (B, S, H, D, KV)."""
    b, s, h, d, kv = shape
    return Case(b, s, h, d, dtype, causal, kv)


def _bf16(b, s, h, d, causal=False, kv_heads=None, seq_k=None) -> Case:
    return Case(b, s, h, d, "bf16", causal, kv_heads, seq_k=seq_k)


def _ragged_bf16(count, max_len, total, h, d, causal=False, kv_heads=None) -> Case:
    return varlen_case(ragged_lengths(count, max_len, total), h, d, "bf16", causal, kv_heads)


# Issue 5's variable-length batches: 16 sequences of 1024..4096 tokens (40960 in all, about what 10 full
# 4096-token sequences hold) and 8 of 4096..16384 (65536 in all), as packed pretraining and long-context
# fine-tuning batches look.
VARLEN_4K = dict(count=16, max_len=4096, total=40960)
VARLEN_16K = dict(count=8, max_len=16384, total=65536)


MATRICES: dict[str, tuple[Case, ...]] = {
    # The targets: the seed's shape, the bf16 geomean set, and two causal shapes.
    "default": (
        Case(1, 1024, 64, 128, "f16"),
        _bf16(4, 4096, 32, 128), _bf16(1, 16384, 16, 128), _bf16(16, 1024, 32, 64),
        _bf16(2, 4096, 16, 256), _bf16(8, 512, 32, 128),
        _bf16(4, 4096, 32, 128, causal=True), _bf16(1, 16384, 16, 128, causal=True),
    ),
    # A smoke run: one short and one long shape.
    "quick": (Case(1, 1024, 64, 128, "f16"), _bf16(4, 4096, 32, 128)),
    # Issue 5: causal and grouped-query shapes (8 and 2 K/V heads) against cuDNN.
    "coverage": (
        _bf16(4, 4096, 32, 128, causal=True),
        _bf16(4, 4096, 32, 128, kv_heads=8), _bf16(4, 4096, 32, 128, causal=True, kv_heads=8),
        _bf16(1, 16384, 16, 128, causal=True, kv_heads=2),
        _bf16(16, 1024, 32, 64, kv_heads=8),
        _ragged_bf16(**VARLEN_4K, h=32, d=128),
        _ragged_bf16(**VARLEN_4K, h=32, d=128, causal=True, kv_heads=8),
    ),
    # Issue 5: variable-length batches, against cuDNN on the padded batch and torch's own ragged kernels.
    "varlen": (
        _ragged_bf16(**VARLEN_4K, h=32, d=128),
        _ragged_bf16(**VARLEN_4K, h=32, d=128, causal=True),
        _ragged_bf16(**VARLEN_4K, h=32, d=128, causal=True, kv_heads=8),
        _ragged_bf16(**VARLEN_16K, h=16, d=128),
        _ragged_bf16(**VARLEN_16K, h=16, d=128, causal=True),
    ),
    # Issue 22: flashgen against FlashAttention-4 (the `fa4` peer) and cuDNN: the default matrix's shapes, grouped
    # query, head dims 96 and 192, short sequences, and chunked prefill (S_q queries over a longer K/V, causal
    # bottom-right). Results go to h200-latest-fa4.* (OWN_LATEST); default peers MATRIX_DEFAULT_PEERS["fa4"].
    "fa4": (
        Case(1, 1024, 64, 128, "f16"),
        _bf16(4, 4096, 32, 128), _bf16(4, 4096, 32, 128, causal=True),
        _bf16(1, 16384, 16, 128), _bf16(1, 16384, 16, 128, causal=True),
        _bf16(16, 1024, 32, 64), _bf16(2, 4096, 16, 256),
        _bf16(1, 8192, 32, 128, causal=True, kv_heads=8),
        _bf16(4, 2048, 24, 96), _bf16(2, 4096, 16, 192),
        _bf16(8, 512, 32, 128), _bf16(32, 256, 32, 128),
        _bf16(1, 512, 32, 128, causal=True, kv_heads=8, seq_k=8192),
        _bf16(4, 1024, 32, 128, causal=True, kv_heads=8, seq_k=8192),
    ),
}

# Matrices whose result files are their own, <gpu>-<stamp>-<name>.* and h200-latest-<name>.* (as decode's are),
# rather than the default matrix's h200-latest.* (bench/report.py save_results reads this).
OWN_LATEST = ("fa4",)


def kernel_spec(case: Case):
    """The KernelSpec of a case (unresolved). A varlen case asks for the varlen kernel where KernelSpec has that
    field, specialized as the API does on the longest sequence (rounded up to the API's length bucket where it
    has one), and for the dense kernel of its longest sequence where it has not: both have the block_n the
    bench's PV splits need."""
    from codegen.spec import KernelSpec

    seq, extra = case.seq, {}
    if case.varlen and "varlen" in {f.name for f in dataclasses.fields(KernelSpec)}:
        try:
            from codegen.api import _length_bucket
        except ImportError:
            _length_bucket = None
        seq, extra = (_length_bucket(case.seq) if _length_bucket else case.seq), {"varlen": True}
    if case.chunked:
        extra["seq_len_k"] = case.seq_k
    return KernelSpec(seq_len=seq, heads=case.heads, head_dim=case.dim, dtype=case.dtype, causal=case.causal,
                      kv_heads=case.kv_heads, **extra)


def resolved_spec(case: Case):
    """The kernel spec codegen.families resolves for this shape, with the generator's block_n and PV split (what
    attention() runs): the bench follows the generator's choices."""
    from codegen.families import resolve

    return resolve(kernel_spec(case))


def block_n_for(case: Case) -> int:
    return resolved_spec(case).block_n
