"""attention_with_kvcache on the GPU against float64 (skipped with a reason where there is no GPU).

Every cache row past a sequence's length holds NaN, so a kernel that reads (or multiplies by) a key it should
not see fails; outputs are poisoned with NaN before each call; o is held to 2x the same-dtype yardstick's
error, globally and on its worst row (check.accuracy_failure), and lse elementwise.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from codegen import check  # noqa: E402
from codegen.api import InputError  # noqa: E402
from codegen.decode import attention_with_kvcache  # noqa: E402

TINY = 1e-6


def make_cache(batch, capacity, kv_heads, dim, lengths, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(batch, capacity, kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(batch, capacity, kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    for b, n in enumerate(lengths):  # what no query may see
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    return k, v


def run_and_check(q, k, v, lengths, *, causal=True, window=None, softcap=0.0, sinks=None, num_splits=0,
                  k_new=None, v_new=None, **knobs):
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o, lse = attention_with_kvcache(q, k, v, seqlens, k_new=k_new, v_new=v_new, causal=causal, window=window,
                                    softcap=softcap, sinks=sinks, return_lse=True, num_splits=num_splits, out=out,
                                    check=True, **knobs)
    assert o.data_ptr() == out.data_ptr()
    attended = [n + (0 if k_new is None else q.shape[1]) for n in lengths]
    options = dict(causal=causal, window=window, softcap=softcap, sinks=sinks)
    assert_matches_float64(o, lse, q, k, v, attended, options)
    # lse comes from the call's own allocation (the API takes no lse out=): poison it before it is freed, so a
    # next call handed the same block by the caching allocator fails where its kernel writes no lse.
    lse.fill_(float("nan"))
    return o


def assert_matches_float64(o, lse, q, k, v, attended, options):
    """o within 2x the same-dtype error of float64 (globally and per row), no NaN, and lse elementwise, over the
    first attended[b] keys of each dense cache."""
    ref, ref_lse = check.kvcache_reference(q, k, v, attended, **options)
    yardstick, _ = check.kvcache_reference(q, k, v, attended, same_dtype=True, **options)
    assert not torch.isnan(o).any(), check.worst_element(o.double(), ref)
    failure = check.accuracy_failure(o, ref, yardstick, floor=TINY)
    assert failure is None, failure
    failure = check.lse_failure(lse, ref_lse)
    assert failure is None, failure


CASES = [
    # batch, S_q, H, H_kv, D, dtype, lengths (ragged: 0, 1, block edges, the whole cache)
    (4, 1, 32, 8, 128, torch.bfloat16, [0, 1, 128, 1000]),
    (3, 1, 8, 8, 64, torch.float16, [129, 777, 1000]),
    (2, 4, 32, 8, 128, torch.bfloat16, [127, 1000]),
    (2, 16, 64, 8, 128, torch.bfloat16, [256, 999]),    # 128 packed rows: two consumers
    (2, 3, 8, 1, 256, torch.bfloat16, [5, 1000]),       # multi-query, D=256
    (1, 40, 16, 4, 96, torch.float16, [900]),           # 160 rows: two row tiles (chunked prefill)
    (2, 2, 12, 4, 192, torch.bfloat16, [64, 513]),
]


@pytest.mark.parametrize("batch, sq, heads, kv_heads, dim, dtype, lengths", CASES)
@pytest.mark.parametrize("num_splits", [1, 0, 7])
def test_decode_matches_float64(batch, sq, heads, kv_heads, dim, dtype, lengths, num_splits):
    k, v = make_cache(batch, 1000, kv_heads, dim, lengths, dtype)
    q = torch.randn(batch, sq, heads, dim, device="cuda", dtype=dtype)
    run_and_check(q, k, v, lengths, num_splits=num_splits)


SWAPPED = [
    # batch, S_q, H, H_kv, D, dtype, lengths, options: tiles of at most 16 packed rows (plan.SWAP_MAX_ROWS)
    (4, 1, 32, 8, 128, torch.bfloat16, [0, 1, 128, 1000], {}),
    (3, 4, 16, 4, 128, torch.float16, [1, 300, 1000], dict(window=(100, -1))),
    (2, 2, 32, 8, 64, torch.bfloat16, [129, 1000], dict(softcap=30.0)),
    (2, 1, 64, 8, 256, torch.bfloat16, [5, 1000], dict(causal=False)),
    (2, 16, 8, 8, 192, torch.float16, [640, 1000], dict(window=(300, 0), softcap=10.0)),
    (2, 3, 4, 1, 128, torch.bfloat16, [0, 999], {}),  # 12 rows: N = 16 with four padding columns
]


@pytest.mark.parametrize("batch, sq, heads, kv_heads, dim, dtype, lengths, options", SWAPPED)
@pytest.mark.parametrize("swap", [True, False])
@pytest.mark.parametrize("num_splits", [1, 0, 5])
def test_swapped_and_plain_products_match_float64(batch, sq, heads, kv_heads, dim, dtype, lengths, options, swap,
                                                  num_splits):
    from codegen import decode

    k, v = make_cache(batch, 1000, kv_heads, dim, lengths, dtype, seed=7)
    q = torch.randn(batch, sq, heads, dim, device="cuda", dtype=dtype)

    def ran_swapped(**knobs):
        decode._LAUNCHERS.clear()  # so that the call's launcher is the only one
        run_and_check(q, k, v, lengths, num_splits=num_splits, **options, **knobs)
        (launcher,) = decode._LAUNCHERS.values()
        return launcher.plan.spec.swap

    assert ran_swapped(swap=swap) is swap
    assert ran_swapped() is True  # the default for a tile of at most 16 rows


@pytest.mark.parametrize("options", [dict(causal=False), dict(window=(100, -1)), dict(window=(0, 0)),
                                     dict(softcap=30.0), dict(window=(300, -1), softcap=10.0)])
def test_decode_masks_and_softcap(options):
    lengths = [1, 300, 640, 1000]
    k, v = make_cache(4, 1000, 4, 128, lengths, torch.bfloat16, seed=1)
    for splits in (1, 5):
        q = torch.randn(4, 8, 16, 128, device="cuda", dtype=torch.bfloat16)
        run_and_check(q, k, v, lengths, num_splits=splits, **options)


def test_decode_sinks_join_the_denominator():
    lengths = [0, 50, 1000]
    k, v = make_cache(3, 1000, 8, 128, lengths, torch.bfloat16, seed=2)
    sinks = torch.randn(32, device="cuda", dtype=torch.float32) * 2
    for splits in (1, 4):
        q = torch.randn(3, 2, 32, 128, device="cuda", dtype=torch.bfloat16)
        o = run_and_check(q, k, v, lengths, sinks=sinks, num_splits=splits)
        assert o[0].abs().max().item() == 0.0  # no key: the sink takes all the weight


@pytest.mark.parametrize("new", [1, 5, 16])
def test_append_writes_the_new_tokens_and_nothing_else(new):
    lengths = [0, 100, 1000 - new]
    k, v = make_cache(3, 1000, 8, 128, lengths, torch.bfloat16, seed=3)
    q = torch.randn(3, new, 32, 128, device="cuda", dtype=torch.bfloat16)
    k_new = torch.randn(3, new, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)
    before_k, before_v = k.clone(), v.clone()
    run_and_check(q, k, v, lengths, k_new=k_new, v_new=v_new, num_splits=3)
    for b, n in enumerate(lengths):
        assert torch.equal(k[b, n:n + new], k_new[b]) and torch.equal(v[b, n:n + new], v_new[b])
        before_k[b, n:n + new], before_v[b, n:n + new] = k_new[b], v_new[b]
    # Bitwise (NaN rows included): nothing else in either cache changed.
    assert torch.equal(k.view(torch.int16), before_k.view(torch.int16))
    assert torch.equal(v.view(torch.int16), before_v.view(torch.int16))


def test_every_split_count_up_to_the_blocks_agrees():
    from codegen import decode

    lengths = [1000, 517]
    k, v = make_cache(2, 1000, 8, 128, lengths, torch.bfloat16, seed=4)
    for splits in (1, 2, 3, 8, 16, 128):  # 128: most splits see no block at all
        q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        run_and_check(q, k, v, lengths, num_splits=splits)
        # 2..8 splits launch as one cluster per tile (the shared addresses there carry bits above 17).
        launchers = [c for c in decode._LAUNCHERS.values() if c.splits == splits]
        assert launchers and all(c.cluster == ((splits, 1, 1) if 1 < splits <= 8 else None) for c in launchers)


@pytest.mark.parametrize("sq, heads, kv_heads, dim, push", [
    (1, 32, 8, 128, True),    # 4 rows: the splits push their rows into split 0's shared memory
    (2, 32, 8, 256, True),
    (4, 32, 8, 64, False),    # 16 rows at D=64: the slots do not fit beside its six-slot ring, the workspace merges
    (16, 64, 8, 128, False),  # 128 rows
])
def test_clustered_splits_merge_in_split_0_or_through_the_workspace(sq, heads, kv_heads, dim, push):
    from codegen import decode

    lengths = [1, 700, 1000]  # at 8 splits of the first sequence only split 0 sees a key
    k, v = make_cache(3, 1000, kv_heads, dim, lengths, torch.bfloat16, seed=sq)
    sinks = torch.randn(heads, device="cuda", dtype=torch.float32)
    for splits in (2, 3, 5, 8):
        q = torch.randn(3, sq, heads, dim, device="cuda", dtype=torch.bfloat16)
        run_and_check(q, k, v, lengths, num_splits=splits, causal=False, sinks=sinks if splits == 3 else None,
                      ctas_per_sm=1)  # the layout the push decision above is for (two CTAs a SM: its own tests)
        launchers = [c for c in decode._LAUNCHERS.values() if c.splits == splits and c.plan.spec.q_len == sq
                     and c.plan.spec.head_dim == dim and c.plan.spec.ctas_per_sm == 1]
        assert launchers and all(c.cluster == (splits, 1, 1) and c.plan.push_merge == push for c in launchers)


def test_repeated_calls_reuse_the_launcher():
    lengths = [700, 1000]
    k, v = make_cache(2, 1000, 8, 128, lengths, torch.bfloat16, seed=5)
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        run_and_check(q, k, v, lengths, num_splits=4)


@pytest.mark.parametrize("new", [False, True])
def test_a_call_reads_the_output_the_kernel_before_it_writes(new):
    """Under programmatic dependent launch the second call's CTAs may start while the first call runs (it triggers
    at entry and leaves SMs free): they must wait for its o, poisoned before it, before reading it as q."""
    from codegen import decode

    batch, capacity, lengths = 8, 8192, [8192 - 16] * 8  # 64 one-split tiles: most SMs free for the second call
    k, v = make_cache(batch, capacity, 8, 128, lengths, torch.bfloat16, seed=6)  # NaN from row 8176
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    kv_new = [torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)] if new else [None] * 2
    attended = [n + 1 for n in lengths] if new else lengths  # the second call sees the first's appended token
    seqlens_after = torch.tensor(attended, dtype=torch.int32, device="cuda")
    first, second = torch.empty(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16), None
    for _ in range(3):
        q = torch.randn_like(first)
        first.fill_(float("nan"))
        second = torch.full_like(first, float("nan"))
        _, lse_first = attention_with_kvcache(q, k, v, seqlens, k_new=kv_new[0], v_new=kv_new[1], causal=False,
                                              num_splits=1, out=first, return_lse=True)
        o, lse = attention_with_kvcache(first, k, v, seqlens_after, causal=False, num_splits=1, out=second,
                                        return_lse=True)
        assert all(c.overlap for c in decode._LAUNCHERS.values() if c.batch == batch and c.splits == 1)
        torch.cuda.synchronize()
        if new:
            assert torch.equal(k[:, lengths[0]], kv_new[0][:, 0]) and torch.equal(v[:, lengths[0]], kv_new[1][:, 0])
        assert_matches_float64(first, lse_first, q, k, v, attended, dict(causal=False))
        assert_matches_float64(o, lse, first, k, v, attended, dict(causal=False))


def test_lengths_past_the_capacity_are_refused_with_check():
    k, v = make_cache(1, 256, 8, 128, [256], torch.bfloat16)
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="outside the cache"):
        attention_with_kvcache(q, k, v, torch.tensor([257], dtype=torch.int32, device="cuda"), check=True)


def to_pages(k, page, seed=0):
    """A dense (B, S_max, H_kv, D) cache as a paged one: pages shuffled, one spare NaN page; (cache, table)."""
    batch, capacity = k.shape[:2]
    per = capacity // page
    g = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(batch * per + 1, generator=g)
    paged = torch.full((batch * per + 1, page) + tuple(k.shape[2:]), float("nan"), dtype=k.dtype, device=k.device)
    table = order[:batch * per].view(batch, per).to(torch.int32).cuda()
    paged[table.flatten().long()] = k.reshape(batch * per, page, *k.shape[2:])
    return paged, table


def from_pages(paged, table):
    batch, per = table.shape
    return paged[table.flatten().long()].reshape(batch, per * paged.shape[1], *paged.shape[2:])


@pytest.mark.parametrize("page", [1, 2, 4, 8, 16, 64, 128, 256])
@pytest.mark.parametrize("sq, num_splits", [(1, 0), (4, 3)])
def test_paged_caches_match_float64(page, sq, num_splits):
    lengths = [0, 1, page, 1024 - 1, 1024, page + 1]
    k, v = make_cache(6, 1024, 8, 128, lengths, torch.bfloat16, seed=7)
    pk, table = to_pages(k, page, seed=1)
    pv, _ = to_pages(v, page, seed=1)
    q = torch.randn(6, sq, 32, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o = attention_with_kvcache(q, pk, pv, seqlens, page_table=table, num_splits=num_splits, out=out, check=True)
    ref, _ = check.kvcache_reference(q, k, v, lengths)
    yardstick, _ = check.kvcache_reference(q, k, v, lengths, same_dtype=True)
    assert not torch.isnan(o).any()
    failure = check.accuracy_failure(o, ref, yardstick, floor=TINY)
    assert failure is None, failure


@pytest.mark.parametrize("page, sq, heads, num_splits", [
    (16, 1, 32, 0), (16, 4, 32, 5), (128, 1, 32, 3), (64, 2, 32, 8), (32, 1, 32, 1),
    (16, 16, 64, 3),   # 128 packed rows: the plain consumer (the others are swapped)
])
def test_page_table_entries_past_a_sequence_are_never_trusted(page, sq, heads, num_splits):
    """A split's first block is loaded before the length is read (plan.early_load), by page-table entries the
    length may rule out. Past each sequence's pages the table holds what a user's unused entries may: -1, a huge
    index, another sequence's page, the pool's NaN spare page; none of it may reach o or lse (check=True reads
    only the entries the lengths use, so it accepts them)."""
    from codegen import decode

    decode._LAUNCHERS.clear()
    lengths = [0, 1, page, 3 * page + 5, 1024 - sq]
    k, v = make_cache(5, 1024, 8, 128, lengths, torch.bfloat16, seed=9)
    pk, table = to_pages(k, page, seed=3)
    pv, _ = to_pages(v, page, seed=3)
    spare = (set(range(pk.shape[0])) - set(table.flatten().tolist())).pop()
    junk = [-1, 2**31 - 1, int(table[4, 0]), spare]
    for b, n in enumerate(lengths):
        for i in range(-(-n // page), table.shape[1]):
            table[b, i] = junk[(b + i) % len(junk)]
    q = torch.randn(5, sq, heads, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o, lse = attention_with_kvcache(q, pk, pv, seqlens, page_table=table, num_splits=num_splits, out=out,
                                    return_lse=True, check=True)
    assert_matches_float64(o, lse, q, k, v, lengths, dict(causal=True))
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.plan.early_load and bool(launcher.plan.spec.swap) == (heads == 32)  # 4-16 rows swapped

@pytest.mark.parametrize("page", [1, 4, 16, 128])
def test_paged_append_writes_its_pages_only(page):
    lengths = [0, page - 1, 1024 - 5]
    k, v = make_cache(3, 1024, 8, 128, lengths, torch.bfloat16, seed=8)
    pk, table = to_pages(k, page, seed=2)
    pv, _ = to_pages(v, page, seed=2)
    q = torch.randn(3, 5, 32, 128, device="cuda", dtype=torch.bfloat16)
    k_new = torch.randn(3, 5, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)
    before_k, before_v = pk.clone(), pv.clone()
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o = attention_with_kvcache(q, pk, pv, seqlens, k_new=k_new, v_new=v_new, page_table=table, check=True, out=out)
    assert not torch.isnan(o).any()
    for b, n in enumerate(lengths):  # the expected caches, dense
        k[b, n:n + 5], v[b, n:n + 5] = k_new[b], v_new[b]
    assert torch.equal(from_pages(pk, table).view(torch.int16), k.view(torch.int16))
    assert torch.equal(from_pages(pv, table).view(torch.int16), v.view(torch.int16))
    spare = [p for p in range(pk.shape[0]) if p not in set(table.flatten().tolist())]
    assert torch.equal(pk[spare].view(torch.int16), before_k[spare].view(torch.int16))
    assert torch.equal(pv[spare].view(torch.int16), before_v[spare].view(torch.int16))
    attended = [n + 5 for n in lengths]
    ref, _ = check.kvcache_reference(q, k, v, attended)
    yardstick, _ = check.kvcache_reference(q, k, v, attended, same_dtype=True)
    failure = check.accuracy_failure(o, ref, yardstick, floor=TINY)
    assert failure is None, failure


def test_a_page_table_naming_no_page_is_refused_with_check():
    k, v = make_cache(1, 256, 8, 128, [200], torch.bfloat16)
    pk, table = to_pages(k, 64)
    pv, _ = to_pages(v, 64)
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    table[0, 1] = 99
    with pytest.raises(InputError, match="page 99"):
        attention_with_kvcache(q, pk, pv, torch.tensor([200], dtype=torch.int32, device="cuda"), page_table=table,
                               check=True)


# Pages of 1, 2 and 4 rows: a TMA load per page and column block, inside the swizzle pattern (layouts/paged.py),
# issued by the producer warp's lanes where a block spans more than 16 pages. The capacity, 1000, is not a multiple
# of the key block, so the last block's pages run past the page table's row (read as the sequence's last page).
SMALL_PAGES = [
    # page, S_q, H, H_kv, D, dtype, block_n
    (1, 1, 32, 8, 128, torch.bfloat16, 0),
    (2, 4, 32, 8, 128, torch.bfloat16, 0),
    (4, 1, 32, 8, 128, torch.bfloat16, 0),
    (1, 1, 8, 8, 64, torch.float16, 0),      # one column block
    (2, 2, 16, 4, 96, torch.bfloat16, 0),    # the 64-byte swizzle: two 64-byte rows a load
    (4, 3, 8, 1, 256, torch.bfloat16, 0),    # 64-key blocks of 16 pages: one producer thread
    (2, 2, 12, 4, 192, torch.bfloat16, 0),   # three column blocks
    (1, 16, 64, 8, 128, torch.bfloat16, 0),  # 128 packed rows: two row groups
    (1, 1, 32, 8, 128, torch.bfloat16, 176),  # 176 pages a block: the warp's last lanes idle on the 6th round
]


def run_paged_and_check(q, k, v, lengths, page, *, num_splits=0, block_n=0, seed=0, gather=False, ctas_per_sm=0,
                        head_pack=0, **options):
    """attention_with_kvcache over shuffled paged copies of the dense (NaN past each length) caches k, v; `options`
    are the call's masks (the reference takes them too), the others its tuning."""
    from codegen.decode_run import paged_caches

    (pk, pv), table = paged_caches(torch, (k, v), page, generator=torch.Generator().manual_seed(seed))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o, lse = attention_with_kvcache(q, pk, pv, seqlens, page_table=table, num_splits=num_splits, block_n=block_n,
                                    out=out, return_lse=True, check=True, gather=gather, ctas_per_sm=ctas_per_sm,
                                    head_pack=head_pack, **options)
    assert_matches_float64(o, lse, q, k, v, lengths, options)
    lse.fill_(float("nan"))  # as run_and_check: the freed block poisoned for the next call


@pytest.mark.parametrize("page, sq, heads, kv_heads, dim, dtype, block_n", SMALL_PAGES)
@pytest.mark.parametrize("num_splits", [1, 0, 5])
def test_small_pages_match_float64(page, sq, heads, kv_heads, dim, dtype, block_n, num_splits):
    lengths = [1000, 0, 1, page, page + 1, 999, 129, 511]  # full, empty, page edges, block edges
    k, v = make_cache(len(lengths), 1000, kv_heads, dim, lengths, dtype, seed=page)
    q = torch.randn(len(lengths), sq, heads, dim, device="cuda", dtype=dtype)
    run_paged_and_check(q, k, v, lengths, page, num_splits=num_splits, block_n=block_n, seed=page)


# The same pages gathered by the producer warpgroup's cp.async (DecodeSpec.gather): rows past a length copy its last
# key, the consumers fence the generic-proxy writes before their wgmma; D=96 takes 1-row pages only this way.
GATHERED = [(1, 1, 32, 8, 128, torch.bfloat16), (4, 4, 32, 8, 128, torch.bfloat16), (8, 1, 32, 8, 128, torch.bfloat16),
            (16, 1, 32, 8, 64, torch.float16), (1, 2, 16, 4, 96, torch.bfloat16), (2, 3, 8, 1, 256, torch.bfloat16),
            (1, 16, 64, 8, 128, torch.bfloat16)]


@pytest.mark.parametrize("page, sq, heads, kv_heads, dim, dtype", GATHERED)
@pytest.mark.parametrize("num_splits", [1, 0, 5])
def test_gathered_pages_match_float64(page, sq, heads, kv_heads, dim, dtype, num_splits):
    lengths = [1000, 0, 1, page, page + 1, 999, 129, 511]
    k, v = make_cache(len(lengths), 1000, kv_heads, dim, lengths, dtype, seed=page)
    q = torch.randn(len(lengths), sq, heads, dim, device="cuda", dtype=dtype)
    run_paged_and_check(q, k, v, lengths, page, num_splits=num_splits, seed=page, gather=True)


@pytest.mark.parametrize("page", [4, 8])
def test_one_sequence_over_gathered_pages_takes_a_wave_of_splits(page):
    """A gathered CTA streams slower than a TMA one, so at batch 1 the policy keeps a wave of plain splits (merged
    through the workspace) rather than one cluster of 8 (choose_splits' `gathered`)."""
    from codegen import decode
    from codegen.families.decode_sm90.plan import MAX_CLUSTER_SPLITS

    decode._LAUNCHERS.clear()  # the assertion below is about this call's launcher
    lengths = [30001]
    k, v = make_cache(1, 32768, 8, 128, lengths, torch.bfloat16, seed=page)
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    run_paged_and_check(q, k, v, lengths, page, gather=None)
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.plan.spec.gather and launcher.splits > MAX_CLUSTER_SPLITS and launcher.cluster is None


@pytest.mark.parametrize("batch, capacity, page, splits, ctas_per_sm", [
    (8, 2048, 1, 2, 2), (8, 2048, 8, 2, 2), (12, 2048, 4, 2, 2), (24, 2048, 8, 1, 2), (6, 2048, 16, 2, 2),
    (1, 32768, 8, 33, 2), (2, 8192, 4, 16, 2), (1, 8192, 16, 16, 2), (1, 8192, 128, 8, 1), (22, 8192, 16, 2, 1)])
def test_paged_tiles_fill_the_sms_at_small_batch(batch, capacity, page, splits, ctas_per_sm):
    """A paged CTA streams slower than a dense one, so where one-split tiles leave SMs idle the policy runs more CTAs:
    tiles over a third of a wave split in two at two CTAs a SM (B=6-12; by TMA too), where a dense cache keeps one
    split; gathered tiles just past a wave (B=24) run two CTAs a SM, and under a third of a wave (B=1, 2) fill a wave of
    two a SM with plain splits; over 16-row pages batch 1's wave of splits stays plain, over 128-row pages one cluster
    of 8; past a wave (B=22 over 16-row pages, 1.33 waves) two splits at one CTA a SM (bench/LOG.md d37-d40, d42).
    Counts for 132 SMs (H100, H200)."""
    from codegen import decode
    from codegen.families.decode_sm90.plan import GATHER_MAX_PAGE_ROWS

    decode._LAUNCHERS.clear()  # the assertion below is about this call's launcher
    lengths = ([capacity, capacity - 1, 1, capacity // 2 + 1, capacity, 640, 0, capacity - 49] * 3)[:batch]
    k, v = make_cache(batch, capacity, 8, 128, lengths, torch.bfloat16, seed=page + 37)
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    run_paged_and_check(q, k, v, lengths, page, gather=None)
    (launcher,) = decode._LAUNCHERS.values()
    spec = launcher.plan.spec
    assert spec.gather == (page <= GATHER_MAX_PAGE_ROWS)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert (launcher.splits, spec.ctas_per_sm) == (splits, ctas_per_sm), spec.name


@pytest.mark.parametrize("page", [1, 2, 4, 8])
@pytest.mark.parametrize("options", [dict(causal=False), dict(window=(100, -1), softcap=30.0)])
def test_small_pages_with_masks_softcap_and_sinks(page, options):
    lengths = [1, 300, 640, 1000]
    k, v = make_cache(4, 1000, 4, 128, lengths, torch.bfloat16, seed=9)
    q = torch.randn(4, 8, 16, 128, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(16, device="cuda", dtype=torch.float32)
    for splits in (1, 5):
        run_paged_and_check(q, k, v, lengths, page, num_splits=splits, sinks=sinks, **options)


def test_one_row_pages_at_d96_are_gathered_by_default_and_refused_to_tma():
    k, v = make_cache(1, 64, 4, 96, [64], torch.bfloat16)
    pk, table = to_pages(k, 1)
    pv, _ = to_pages(v, 1)
    q = torch.randn(1, 1, 16, 96, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="128-byte aligned"):
        attention_with_kvcache(q, pk, pv, torch.tensor([64], dtype=torch.int32, device="cuda"), page_table=table,
                               gather=False)
    run_paged_and_check(q, k, v, [64], 1, gather=None)  # pages of up to 8 rows are gathered unless told otherwise


@pytest.mark.parametrize("extra", [[], ["--page-size", "4"], ["--page-size", "1", "--causal"],
                                   ["--page-size", "2", "--window", "100,-1", "--softcap", "20"],
                                   ["--page-size", "16", "--decode", "5", "--dtype", "f16"],
                                   ["--shape", "1000,32,64", "--head-pack", "2"]])
def test_cli_run_checks_and_times_the_decode_kernel(extra, tmp_path, capsys):
    import gen

    args = ["--shape", "1000,32,128", "--kv-heads", "8", "--decode", "2", "--dtype", "bf16", "--batch", "6",
            "--out", str(tmp_path), "--run"]
    assert gen.main(args + extra) == 0, capsys.readouterr()
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  run ")]
    assert "B=6" in line and "1000-row caches" in line and " GB/s K+V" in line and line.endswith(": PASS"), line
    assert ("shuffled" in line) == ("--page-size" in extra)


# Two CTAs per SM (DecodeSpec.ctas_per_sm), one consumer warpgroup each: forced at a small batch, dense, paged by
# TMA and gathered, D 64-128, GQA 8 and 4 (up to 64 packed rows), several splits (one split per tile is the policy's
# choice; more exercise the merges under this layout too).
TWO_CTAS = [(1, 32, 8, 128, torch.bfloat16, 0), (2, 16, 4, 96, torch.float16, 0), (1, 8, 8, 64, torch.bfloat16, 16),
            (4, 32, 8, 128, torch.bfloat16, 16), (1, 32, 8, 128, torch.bfloat16, 4), (16, 32, 8, 64, torch.float16, 1),
            (8, 32, 8, 128, torch.bfloat16, 4),  # 32 rows gathered: plain 80-key blocks (the one above swaps)
            (1, 32, 8, 128, torch.bfloat16, 8)]  # 8-row pages, gathered by default


@pytest.mark.parametrize("sq, heads, kv_heads, dim, dtype, page", TWO_CTAS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_two_ctas_per_sm_match_float64(sq, heads, kv_heads, dim, dtype, page, num_splits):
    from codegen import decode

    decode._LAUNCHERS.clear()  # the assertion below is about this call's launcher
    lengths = [1000, 0, 1, 64, 65, 999, 129]
    k, v = make_cache(len(lengths), 1000, kv_heads, dim, lengths, dtype, seed=11)
    q = torch.randn(len(lengths), sq, heads, dim, device="cuda", dtype=dtype)
    if page:
        run_paged_and_check(q, k, v, lengths, page, num_splits=num_splits, gather=None, ctas_per_sm=2)
    else:
        run_and_check(q, k, v, lengths, num_splits=num_splits, ctas_per_sm=2)
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.plan.spec.ctas_per_sm == 2 and launcher.plan.key_groups == 1


def test_a_batch_that_fills_the_sms_runs_two_ctas_per_sm():
    from codegen import decode
    from codegen.api import _sm_count

    batch = -(-2 * _sm_count(0) // 8)  # 8 K/V heads: one tile each, two waves of them at one CTA a SM
    lengths = [1000] * (batch - 2) + [0, 517]
    k, v = make_cache(batch, 1000, 8, 128, lengths, torch.bfloat16, seed=12)
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    run_and_check(q, k, v, lengths)
    chosen = [c for c in decode._LAUNCHERS.values() if c.batch == batch and c.plan.spec.head_dim == 128]
    assert chosen and all(c.plan.spec.ctas_per_sm == 2 and c.splits == 1 for c in chosen)


HEAD_PAIRS = [
    # batch, S_q, H, H_kv, D, dtype, lengths, options: two K/V heads a tile (head_pack=2), their rows sharing N
    (4, 1, 32, 8, 64, torch.bfloat16, [0, 1, 128, 1000], {}),
    (3, 2, 16, 8, 64, torch.float16, [1, 300, 1000], dict(window=(100, -1))),
    (2, 2, 8, 4, 64, torch.bfloat16, [129, 1000], dict(softcap=30.0)),
    (2, 1, 16, 8, 128, torch.bfloat16, [5, 1000], dict(causal=False)),
    (2, 3, 4, 2, 64, torch.bfloat16, [0, 999], {}),   # 12 rows: N = 16 with four padding columns
    (3, 1, 8, 8, 64, torch.float16, [63, 64, 1000], {}),  # one query head per K/V head: 2 rows, 6 padding columns
    (3, 2, 32, 8, 64, torch.bfloat16, [0, 50, 1000], dict(sinks=True)),
]


@pytest.mark.parametrize("batch, sq, heads, kv_heads, dim, dtype, lengths, options", HEAD_PAIRS)
@pytest.mark.parametrize("num_splits, ctas_per_sm", [(1, 0), (0, 0), (5, 0), (1, 2), (3, 2)])
def test_two_heads_a_tile_match_float64(batch, sq, heads, kv_heads, dim, dtype, lengths, options, num_splits,
                                        ctas_per_sm):
    from codegen import decode

    k, v = make_cache(batch, 1000, kv_heads, dim, lengths, dtype, seed=13)
    q = torch.randn(batch, sq, heads, dim, device="cuda", dtype=dtype)
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(heads, device="cuda", dtype=torch.float32) * 2
    decode._LAUNCHERS.clear()
    run_and_check(q, k, v, lengths, num_splits=num_splits, ctas_per_sm=ctas_per_sm, head_pack=2, **options)
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.plan.spec.head_pack == 2 and launcher.plan.grid(batch, 1)[1] == kv_heads // 2


# Head packs over paged caches (d25): a page's rows of the pack's heads one TMA box per column block, or the
# tile's own box from a page that holds the block; tile row pack x key + head, the other heads' scores masked.
PAGED_PACKS = [
    # page, head pack, S_q, H, H_kv, D, dtype, options
    (16, 4, 1, 32, 8, 128, torch.bfloat16, {}),
    (4, 4, 1, 32, 8, 128, torch.bfloat16, {}),
    (1, 4, 1, 16, 8, 128, torch.float16, {}),           # 1-row pages: 4 x 128-byte rows a load
    (64, 4, 2, 16, 8, 128, torch.bfloat16, dict(window=(100, -1))),  # a page holds 32-key blocks
    (16, 2, 1, 32, 8, 64, torch.bfloat16, dict(softcap=30.0)),
    (8, 4, 1, 16, 4, 256, torch.bfloat16, {}),          # 16-key blocks of 64 rows
    (16, 4, 1, 32, 8, 128, torch.bfloat16, dict(sinks=True, causal=False)),
]


@pytest.mark.parametrize("page, pack, sq, heads, kv_heads, dim, dtype, options", PAGED_PACKS)
@pytest.mark.parametrize("num_splits, ctas_per_sm", [(1, 1), (0, 0), (5, 1), (3, 2)])
def test_head_packs_over_pages_match_float64(page, pack, sq, heads, kv_heads, dim, dtype, options, num_splits,
                                             ctas_per_sm):
    from codegen import decode

    lengths = [1000, 0, 1, page, page + 1, 999, 129, 511]  # full, empty, page edges, block edges
    k, v = make_cache(len(lengths), 1000, kv_heads, dim, lengths, dtype, seed=16 + page)
    q = torch.randn(len(lengths), sq, heads, dim, device="cuda", dtype=dtype)
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(heads, device="cuda", dtype=torch.float32) * 2
    decode._LAUNCHERS.clear()
    if dim == 256 and ctas_per_sm == 2:
        with pytest.raises(InputError, match="two CTAs per SM fit head dims"):
            run_paged_and_check(q, k, v, lengths, page, num_splits=num_splits, seed=page, ctas_per_sm=ctas_per_sm,
                                head_pack=pack, **options)
        return
    run_paged_and_check(q, k, v, lengths, page, num_splits=num_splits, seed=page, ctas_per_sm=ctas_per_sm,
                        head_pack=pack, **options)
    (launcher,) = decode._LAUNCHERS.values()
    spec = launcher.plan.spec
    assert spec.head_pack == pack and spec.page_size == page and not spec.gather
    assert launcher.plan.grid(len(lengths), 1)[1] == kv_heads // pack


@pytest.mark.parametrize("batch, sq, heads, kv_heads, dim, dtype, lengths, options", [
    (4, 1, 32, 8, 128, torch.bfloat16, [0, 1, 128, 1000], {}),
    (3, 1, 16, 8, 64, torch.float16, [63, 64, 1000], dict(window=(100, -1))),
    (2, 2, 8, 4, 256, torch.bfloat16, [129, 1000], dict(softcap=30.0)),  # 16-key blocks of 64 rows
])
@pytest.mark.parametrize("num_splits, ctas_per_sm", [(1, 1), (0, 0), (3, 2)])
def test_four_heads_a_tile_over_a_dense_cache_match_float64(batch, sq, heads, kv_heads, dim, dtype, lengths, options,
                                                            num_splits, ctas_per_sm):
    from codegen import decode

    k, v = make_cache(batch, 1000, kv_heads, dim, lengths, dtype, seed=17)
    q = torch.randn(batch, sq, heads, dim, device="cuda", dtype=dtype)
    decode._LAUNCHERS.clear()
    if dim == 256 and ctas_per_sm == 2:
        with pytest.raises(InputError, match="two CTAs per SM fit head dims"):
            run_and_check(q, k, v, lengths, num_splits=num_splits, ctas_per_sm=ctas_per_sm, head_pack=4, **options)
        return
    run_and_check(q, k, v, lengths, num_splits=num_splits, ctas_per_sm=ctas_per_sm, head_pack=4, **options)
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.plan.spec.head_pack == 4 and launcher.plan.grid(batch, 1)[1] == kv_heads // 4


def test_two_heads_a_tile_attend_their_appended_tokens():
    lengths = [0, 7, 900]
    k, v = make_cache(3, 1000, 8, 64, lengths, torch.bfloat16, seed=14)
    q = torch.randn(3, 2, 16, 64, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 2, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    before_k, before_v = k.clone(), v.clone()
    run_and_check(q, k, v, lengths, k_new=k_new, v_new=v_new, head_pack=2)
    for b, n in enumerate(lengths):
        assert torch.equal(k[b, n:n + 2], k_new[b]) and torch.equal(v[b, n:n + 2], v_new[b])
        k[b, n:n + 2], v[b, n:n + 2] = before_k[b, n:n + 2], before_v[b, n:n + 2]
    assert torch.equal(k.view(torch.int16), before_k.view(torch.int16))  # bitwise: NaN rows included
    assert torch.equal(v.view(torch.int16), before_v.view(torch.int16))


def test_a_batch_of_d64_tiles_that_fills_the_sms_takes_two_heads_a_tile():
    from codegen import decode
    from codegen.api import _sm_count

    batch = -(-2 * _sm_count(0) // 8)  # 8 K/V heads: two-head tiles fill the SMs
    lengths = [1000] * (batch - 2) + [0, 517]
    k, v = make_cache(batch, 1000, 8, 64, lengths, torch.bfloat16, seed=15)
    q = torch.randn(batch, 1, 32, 64, device="cuda", dtype=torch.bfloat16)
    decode._LAUNCHERS.clear()
    run_and_check(q, k, v, lengths)
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.plan.spec.head_pack == 2


def run_chosen(batch, seed, capacity=8192):
    """A batch of full 8k caches but for a ragged tail (0, 1, 5000 keys) at D=128, 32/8 heads, with every knob left to
    the policy: checked against float64, and the one launcher it built."""
    from codegen import decode

    lengths = [capacity] * (batch - 3) + [0, 1, min(5000, capacity - 7)]
    k, v = make_cache(batch, capacity, 8, 128, lengths, torch.bfloat16, seed=seed)
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    decode._LAUNCHERS.clear()
    run_and_check(q, k, v, lengths)
    (launcher,) = decode._LAUNCHERS.values()
    return launcher


def test_a_batch_just_over_a_wave_takes_two_splits():
    from codegen.api import _sm_count

    launcher = run_chosen(-(-_sm_count(0) // 8) + 1, seed=16)  # 8 K/V heads: a wave of one-head tiles and a few more
    assert launcher.splits == 2 and launcher.plan.spec.ctas_per_sm == 1


def test_split_tiles_under_a_wave_take_one_consumer_a_cta():
    from codegen import decode
    from codegen.api import _sm_count

    sms = _sm_count(0)
    batch = sms // 16  # 8 K/V heads: about half a wave of tiles, two splits each at 8k keys
    launcher = run_chosen(batch, seed=25)
    assert launcher.splits > 1 and launcher.plan.spec.ctas_per_sm == 2
    assert batch * 8 * launcher.splits >= decode.SPLIT_TWO_CTA_MIN_FILL * sms


@pytest.mark.parametrize("capacity", [2048, 8192])
@pytest.mark.parametrize("fill, splits", [("half", 1), ("past half", 2), ("most", 2), ("past most", 1)])
def test_dense_tiles_over_half_a_wave_split_in_two(capacity, fill, splits):
    """Dense one-head tiles over half a wave and up to DENSE_TWO_SPLIT_MAX_FILL of one take two splits at two CTAs a
    SM (d41); at half a wave (B=8 on 132 SMs, 2k keys) and past that share (B=15) they stay whole at one CTA a SM."""
    from codegen import decode
    from codegen.api import _sm_count

    sms = _sm_count(0)
    most = int(decode.DENSE_TWO_SPLIT_MAX_FILL * sms) // 8  # 8 K/V heads: tiles = 8 x batch
    batch = {"half": sms // 16, "past half": sms // 16 + 1, "most": most, "past most": most + 1}[fill]
    launcher = run_chosen(batch, seed=batch, capacity=capacity)
    if fill == "half" and capacity > 2048:
        splits = 2  # half a wave over long caches: splits of 32 blocks (choose_splits' last rule)
    assert (launcher.splits, launcher.plan.spec.ctas_per_sm) == (splits, 1 if splits == 1 else 2)


# ----------------------------------------------------------------------------------------------------------------
# A decode step as inference engines run it: captured once in a CUDA graph and replayed as the lengths advance, or
# compiled whole by torch.compile (the custom ops; tests/test_decode_compile.py checks the tracing on the CPU).

def decode_steps(step, q, caches, seqlens, outputs, steps, new):
    """Run `step()` `steps` times, advancing the device lengths by `new` after each; each step's (o, lse) =
    outputs() against float64 over the caches as they are then (caches(): K and V as dense tensors, read back
    through the page table where paged), its new rows checked in place and every other row bitwise unchanged.
    A graph's outputs stay at their addresses and are poisoned before each replay; a compiled step allocates
    its own, so there a fresh q each step is what tells a stale output from a written one."""
    for _ in range(steps):
        before = [c.clone() for c in caches()]
        q.copy_(torch.randn_like(q))
        fresh = step.refill()
        for t in outputs() or ():
            t.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        now = caches()
        n = seqlens.tolist()
        for cache, old, rows in zip(now, before, fresh):
            for b in range(q.shape[0]):
                assert torch.equal(cache[b, n[b]:n[b] + new], rows[b])
                old[b, n[b]:n[b] + new] = rows[b]
            assert torch.equal(cache.view(torch.int16), old.view(torch.int16)), "only the new rows change"
        o, lse = outputs()
        assert_matches_float64(o, lse, q, now[0], now[1], [x + new for x in n], dict(causal=True))
        seqlens += new


class Step:
    """One decode step's static buffers (q, k_new, v_new and the lengths stay at their addresses, as a graph needs)."""

    def __init__(self, q, k, v, seqlens, new, **options):
        self.q, self.k, self.v, self.seqlens, self.options = q, k, v, seqlens, options
        self.k_new = torch.empty(q.shape[0], new, k.shape[2], q.shape[3], device="cuda", dtype=q.dtype)
        self.v_new = torch.empty_like(self.k_new)
        self.out = None  # (o, lse) of the last call

    def refill(self):
        self.k_new.copy_(torch.randn_like(self.k_new))
        self.v_new.copy_(torch.randn_like(self.v_new))
        return self.k_new, self.v_new

    def call(self):
        self.out = attention_with_kvcache(self.q, self.k, self.v, self.seqlens, k_new=self.k_new, v_new=self.v_new,
                                          return_lse=True, **self.options)


@pytest.mark.parametrize("batch, new, page, num_splits, capacity", [
    (1, 1, 0, 0, 512),     # clustered splits (2 here): the push merge
    (3, 2, 0, 3, 512),     # 3 clustered splits
    (2, 1, 0, 16, 4096),   # 16 plain splits: the workspace, the last split's counter (the capture's own)
    (2, 1, 16, 0, 512),    # pages by TMA
    (2, 4, 4, 0, 512),     # pages gathered
])
def test_a_decode_step_captured_in_a_cuda_graph_replays_as_the_lengths_advance(batch, new, page, num_splits, capacity):
    """Each replay appends in place at the lengths the device holds then, and attends; the graph replays on another
    stream than the one it was captured on."""
    from codegen import decode

    decode._LAUNCHERS.clear()
    lengths = [100, 300, 7][:batch]
    k, v = make_cache(batch, capacity, 8, 128, lengths, torch.bfloat16, seed=11)  # NaN past the lengths
    pages = None
    if page:
        k, pages = to_pages(k, page, seed=2)
        v, _ = to_pages(v, page, seed=2)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, new, 32, 128, device="cuda", dtype=torch.bfloat16)
    step = Step(q, k, v, seqlens, new, page_table=pages, num_splits=num_splits)
    step.refill()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step.call()  # compiled and loaded outside the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step.call()
    (launcher,) = decode._LAUNCHERS.values()
    if num_splits == 16:
        assert launcher.cluster is None and launcher.splits == 16
    if batch == 1:
        assert launcher.cluster == (launcher.splits, 1, 1) and launcher.plan.push_merge
    caches = (lambda: (from_pages(k, pages), from_pages(v, pages))) if page else (lambda: (k, v))

    class Replay:
        refill = staticmethod(step.refill)

        def __call__(self):
            graph.replay()
    decode_steps(Replay(), q, caches, seqlens, lambda: step.out, steps=3, new=new)


def test_a_launcher_collected_during_a_capture_leaves_the_capture_whole():
    """torch.cuda.graph no longer collects garbage before it captures, so a dead launcher (held by a reference
    cycle, as a traceback's frames hold one) may be finalized mid-capture: its workspace must not be freed there
    (cuMemFree invalidates the capture). Its memory is freed at the next allocation outside the capture."""
    import gc

    from codegen import decode, driver

    decode._LAUNCHERS.clear()
    lengths = [4096, 1000]
    k, v = make_cache(2, 4096, 8, 128, lengths, torch.bfloat16, seed=13)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    gc.disable()  # the cycle below dies in the capture, not at an allocation before it
    gc.collect()  # what earlier tests left (a dead CUDA graph destroyed mid-capture would invalidate it too)
    try:
        with torch.cuda.stream(stream):
            attention_with_kvcache(q, k, v, seqlens, num_splits=16)  # 16 plain splits: a workspace of DeviceBuffers
            (dead,) = decode._LAUNCHERS.values()
            assert dead._workspace and dead.cluster is None
            cycle = [dead]
            cycle.append(cycle)
            del dead, cycle
            decode._LAUNCHERS.clear()
            attention_with_kvcache(q, k, v, seqlens, num_splits=8)  # compiled and loaded outside the capture
        stream.synchronize()
        retired = len(driver._retired)
        graph = torch.cuda.CUDAGraph()
        out = torch.full_like(q, float("nan"))
        with torch.cuda.graph(graph, stream=stream):
            assert gc.collect() > 0
            o, lse = attention_with_kvcache(q, k, v, seqlens, num_splits=8, out=out, return_lse=True)
        assert len(driver._retired) >= retired + 3  # the dead workspace's partial rows, lse and counter
    finally:
        gc.enable()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_float64(o, lse, q, k, v, lengths, dict(causal=True, window=None, softcap=0.0, sinks=None))
    fresh = driver.DeviceBuffer(4, torch.cuda.current_device())
    assert driver._retired == [] and fresh.address


def test_a_compiled_decode_step_matches_float64_and_appends_in_place():
    torch._dynamo.reset()
    batch, new = 2, 2
    k, v = make_cache(batch, 512, 8, 128, [33, 400], torch.bfloat16, seed=12)
    seqlens = torch.tensor([33, 400], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, new, 32, 128, device="cuda", dtype=torch.bfloat16)
    step = Step(q, k, v, seqlens, new)
    compiled = torch.compile(lambda q, k, v, n, kn, vn: attention_with_kvcache(q, k, v, n, k_new=kn, v_new=vn,
                                                                               return_lse=True), fullgraph=True)

    class Compiled:
        refill = staticmethod(step.refill)

        def __call__(self):
            step.out = compiled(q, k, v, seqlens, step.k_new, step.v_new)
    decode_steps(Compiled(), q, lambda: (k, v), seqlens, lambda: step.out, steps=2, new=new)


def test_a_decode_step_compiled_for_cuda_graphs_replays_as_the_lengths_advance():
    """torch.compile(mode="reduce-overhead"): inductor captures the step in its own CUDA graphs (the launcher's
    workspace and counters must not come from a pool the capture reclaims; 16 plain splits use both) and replays it
    with the lengths the device holds then. Rows past a step's lengths are finite but differ from any it may read,
    and NaN past the last step's."""
    torch._dynamo.reset()
    from codegen import decode

    decode._LAUNCHERS.clear()
    start, steps, grow = [130, 7], 4, 97
    k, v = make_cache(2, 2048, 8, 128, [n + grow * (steps - 1) for n in start], torch.bfloat16, seed=13)
    seqlens = torch.tensor(start, dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda q, k, v, n: attention_with_kvcache(q, k, v, n, return_lse=True, num_splits=16),
                             mode="reduce-overhead", fullgraph=True)
    out = ()
    for _ in range(steps):
        q.copy_(torch.randn_like(q))
        for t in out:  # the graph's outputs of the last replay: a replay that writes nothing leaves NaN
            t.fill_(float("nan"))
        out = compiled(q, k, v, seqlens)
        torch.cuda.synchronize()
        assert_matches_float64(*out, q, k, v, seqlens.tolist(), dict(causal=True))
        seqlens += grow
    (launcher,) = decode._LAUNCHERS.values()
    assert launcher.cluster is None and launcher.splits == 16


def test_a_decode_step_with_an_append_compiled_for_cuda_graphs_matches_float64():
    """The same mode with an append: the caches are inputs the step mutates (inductor may run such a graph
    outside CUDA graphs); each step's new rows land in place and nothing else changes."""
    torch._dynamo.reset()
    k, v = make_cache(2, 512, 8, 128, [33, 400], torch.bfloat16, seed=14)
    seqlens = torch.tensor([33, 400], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    step = Step(q, k, v, seqlens, 1)
    compiled = torch.compile(lambda q, k, v, n, kn, vn: attention_with_kvcache(q, k, v, n, k_new=kn, v_new=vn,
                                                                               return_lse=True),
                             mode="reduce-overhead", fullgraph=True)

    class Compiled:
        refill = staticmethod(step.refill)

        def __call__(self):
            step.out = compiled(q, k, v, seqlens, step.k_new, step.v_new)
    decode_steps(Compiled(), q, lambda: (k, v), seqlens, lambda: step.out, steps=4, new=1)
