"""`flashgen --shape S_MAX,H,D --kv-heads N --decode S_Q [--page-size P] --run`: the decode kernel on the GPU.

As `--run` does for the forward kernel: fresh random inputs, the call users make
(codegen.decode.attention_with_kvcache) into a NaN-poisoned output, a float64 reference
(codegen.check.kvcache_reference) and the project's accuracy rule (check.accuracy_failure: at most 2x the
same-dtype computation's error, over the whole output and on its worst row), then the time and the K/V bandwidth.

The inputs: caches of S_MAX rows per sequence, ragged lengths (the first sequence fills its cache, the others
are random in 0..S_MAX), every row past a sequence's length NaN (a kernel that reads one fails). With a page
size the caches are paged copies of the dense ones: each sequence's rows, padded to whole pages, in pages of a
shuffled order, with one spare NaN page that no sequence names. `decode_inputs` and `decode_verdict` run on
any torch device (the CPU tests use them); only `run_decode` needs the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import check

WARMUP, ITERS = 10, 100


@dataclass
class DecodeInputs:
    q: object             # (B, S_q, H, D)
    k: object             # the dense caches (B, S_max, H_kv, D), NaN past each length: the reference's
    v: object
    k_cache: object       # what the kernel reads: k and v, or their paged copies
    v_cache: object
    lengths: list         # keys per sequence
    seqlens: object       # int32 (B,) on the device
    page_table: object    # int32 (B, pages per sequence) or None


def paged_caches(torch, caches, page_rows: int, *, generator=None):
    """Dense (B, S_max, H_kv, D) caches (K and V) as paged ones sharing one page table: ([pages, ...], table).
    Sequence b's rows, padded with NaN to ceil(S_max / page_rows) pages, lie in pages of a shuffled order,
    table[b] naming them in key order; one more page (NaN) belongs to no sequence. The table is int32 (B,
    pages per sequence) on the caches' device."""
    batch, rows = caches[0].shape[:2]
    per = -(-rows // page_rows)
    order = torch.randperm(batch * per + 1, generator=generator)
    table = order[:batch * per].view(batch, per).to(torch.int32).to(caches[0].device)
    paged = []
    for dense in caches:
        padded = torch.full((batch, per * page_rows) + tuple(dense.shape[2:]), float("nan"), dtype=dense.dtype,
                            device=dense.device)
        padded[:, :rows] = dense
        pages = torch.full((batch * per + 1, page_rows) + tuple(dense.shape[2:]), float("nan"), dtype=dense.dtype,
                           device=dense.device)
        pages[table.flatten().long()] = padded.reshape(batch * per, page_rows, *dense.shape[2:])
        paged.append(pages)
    return paged, table


def dense_from_pages(pages, page_table):
    """The (B, pages * page_rows, H_kv, D) dense view a page table makes of a paged cache."""
    batch, per = page_table.shape
    return pages[page_table.flatten().long()].reshape(batch, per * pages.shape[1], *pages.shape[2:])


def decode_inputs(torch, spec, batch: int, capacity: int, device, *, generator=None) -> DecodeInputs:
    """Random inputs for `spec` (a resolved DecodeSpec): `batch` sequences over caches of `capacity` rows, made on
    `device` (`generator`: None, or a generator of that device, for inputs a test can repeat)."""
    dtype = check.torch_dtype(spec.dtype)
    lengths = [capacity] + torch.randint(0, capacity + 1, (batch - 1,), generator=generator).tolist()

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype)

    q = randn(batch, spec.q_len, spec.heads, spec.head_dim)
    k, v = (randn(batch, capacity, spec.kv_heads, spec.head_dim) for _ in range(2))
    for b, n in enumerate(lengths):  # what no query may see
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    k_cache, v_cache, table = k, v, None
    if spec.page_size:
        (k_cache, v_cache), table = paged_caches(torch, (k, v), spec.page_size, generator=generator)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return DecodeInputs(q, k, v, k_cache, v_cache, lengths, seqlens, table)


def keys_read(spec, lengths) -> int:
    """Cache rows the queries of every sequence can see (all of its keys, or a left window's band)."""
    left = spec.window[0]
    total = 0
    for n in lengths:
        lo = 0 if left < 0 else max(0, n - spec.q_len - left)
        total += max(0, n - lo)
    return total


def kv_gbs(spec, lengths, ms: float) -> float:
    """GB/s of the K and V rows read (keys_read), at `ms` a call."""
    nbytes = 2 * keys_read(spec, lengths) * spec.kv_heads * spec.head_dim * spec.elem_bytes
    return nbytes / ms / 1e6 if ms > 0 else float("inf")


@dataclass
class Verdict:
    failure: str | None   # why o fails the accuracy rule, or None
    rel_err: float
    yardstick: float      # the same-dtype computation's rel err
    lse_err: float        # the largest |lse - reference| where the reference row sees a key
    lse_failure: str | None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.lse_failure is None


def decode_verdict(torch, spec, inputs: DecodeInputs, o, lse) -> Verdict:
    """o and lse of a call on `inputs` against the float64 reference, by the project's accuracy rule."""
    options = dict(causal=spec.causal, window=spec.window, softcap=spec.softcap)
    ref, ref_lse = check.kvcache_reference(inputs.q, inputs.k, inputs.v, inputs.lengths, **options)
    same_dtype, _ = check.kvcache_reference(inputs.q, inputs.k, inputs.v, inputs.lengths, same_dtype=True, **options)
    failure = check.accuracy_failure(o, ref, same_dtype, floor=1e-6)
    seen = torch.isfinite(ref_lse)
    lse_err = float((lse.double()[seen] - ref_lse[seen]).abs().max()) if bool(seen.any()) else 0.0
    return Verdict(failure, check.rel_err(o, ref), check.rel_err(same_dtype, ref), lse_err,
                   check.lse_failure(lse, ref_lse))


def describe(spec, inputs: DecodeInputs, capacity: int) -> str:
    lengths = inputs.lengths
    pages = (f"pages of {spec.page_size} rows, shuffled" if spec.page_size else "dense cache")
    return (f"B={len(lengths)}, S_q={spec.q_len}, {capacity}-row caches ({pages}), lengths "
            f"{min(lengths)}..{max(lengths)}")


def run_decode(torch, spec, batch: int, capacity: int) -> tuple[int, list[str]]:
    """Run, check and time the decode kernel of `spec` on the GPU: (exit code, lines to print). Raises the API's
    InputError (an input it refuses) and driver errors for the caller to report."""
    from .decode import attention_with_kvcache

    inputs = decode_inputs(torch, spec, batch, capacity, "cuda")
    out = torch.full_like(inputs.q, float("nan"))  # poisoned: an element the kernel never writes fails the check
    options = dict(page_table=inputs.page_table, causal=spec.causal, window=spec.window, softcap=spec.softcap,
                   block_n=spec.block_n, stages=spec.stages, gather=spec.gather,
                   ctas_per_sm=spec.ctas_per_sm, head_pack=spec.head_pack)
    o, lse = attention_with_kvcache(inputs.q, inputs.k_cache, inputs.v_cache, inputs.seqlens, return_lse=True,
                                    out=out, check=True, **options)
    torch.cuda.synchronize()
    verdict = decode_verdict(torch, spec, inputs, o, lse)

    def call():
        attention_with_kvcache(inputs.q, inputs.k_cache, inputs.v_cache, inputs.seqlens, out=out, **options)

    ms = check.time_gpu(torch, call, warmup=WARMUP, iters=ITERS)
    lines = [f"  run        {describe(spec, inputs, capacity)}: {ms:.4f} ms, {kv_gbs(spec, inputs.lengths, ms):.0f} GB/s "
             f"K+V, rel err {verdict.rel_err:.2e} (same-dtype PyTorch {verdict.yardstick:.2e}), lse max err "
             f"{verdict.lse_err:.2e}: {'PASS' if verdict.ok else 'FAIL'}"]
    lines += [f"  {why}" for why in (verdict.failure, verdict.lse_failure) if why]
    return (0 if verdict.ok else 1), lines
