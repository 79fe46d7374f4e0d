"""The decode family on the CPU: its plan's numbers, its compiles and its launcher (the API's refusals and the
float64 reference: test_decode_inputs.py)."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import pytest

from codegen.build import build
from codegen.families.decode_sm90 import DecodeSpec, Plan, resolve, summary
from codegen.spec import SpecError
from layouts import LayoutError


def plan_of(**kw) -> Plan:
    return Plan(resolve(DecodeSpec(**kw)))


def test_small_tiles_take_two_key_groups_and_an_even_ring():
    p = plan_of(heads=32, kv_heads=8, head_dim=128)
    assert (p.row_groups, p.key_groups, p.block_m, p.tiles_m, p.threads) == (1, 2, 64, 1, 384)
    assert p.spec.stages % 2 == 0 and p.spec.block_n == 128
    assert {b.name: b for b in p.abi.barriers.barriers}["KEmpty"].arrivals == 4  # one key group's warps release a slot


def test_wide_tiles_take_two_row_groups_and_chunked_prefill_more_tiles():
    p = plan_of(heads=64, kv_heads=8, head_dim=128, q_len=16)  # 128 rows
    assert (p.row_groups, p.key_groups, p.block_m, p.tiles_m) == (2, 1, 128, 1)
    assert {b.name: b for b in p.abi.barriers.barriers}["KEmpty"].arrivals == 8  # both row groups read every slot
    assert plan_of(heads=16, kv_heads=4, head_dim=96, q_len=40).tiles_m == 2  # 160 rows


def test_an_odd_ring_with_key_groups_is_refused():
    with pytest.raises(SpecError, match="multiple of 2"):
        resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=128, block_n=64, stages=3))


@pytest.mark.parametrize("bad, match", [(dict(kv_heads=5), "multiple of kv_heads"), (dict(head_dim=80), "head_dim"),
                                        (dict(page_size=3), "pages of"), (dict(page_size=512), "pages of"),
                                        (dict(q_len=0), "q_len"),
                                        (dict(arch="sm_100a"), "sm_90a")])
def test_bad_specs_say_why(bad, match):
    with pytest.raises(SpecError, match=match):
        DecodeSpec(**{**dict(heads=32, kv_heads=8, head_dim=128), **bad})


@pytest.mark.parametrize("kw", [dict(heads=32, kv_heads=8, head_dim=128), dict(heads=64, kv_heads=8, head_dim=128, q_len=16),
                                dict(heads=8, kv_heads=1, head_dim=256, q_len=3, dtype="f16"),
                                dict(heads=32, kv_heads=8, head_dim=64, window=(100, -1), softcap=30.0)])
def test_kernels_compile_without_spills(kw):
    built = build(DecodeSpec(**kw), family="decode_sm90")
    for name in (built.rendered.kernel_name, built.rendered.kernel_name + "_append"):
        assert name in built.compiled.registers, name
        assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0
    manifest = built.manifest()
    assert manifest["family"] == "decode_sm90" and set(manifest["tensor_maps"]) == {"k", "v"}
    assert manifest["grid"]["x"] == "splits"


def test_tiles_of_few_rows_take_the_swapped_products_with_verified_reads():
    p = plan_of(heads=32, kv_heads=8, head_dim=128)  # 4 packed rows
    assert p.spec.swap and p.swap_n == 8 and p.spec.name.endswith("_st2_swap")
    assert plan_of(heads=32, kv_heads=8, head_dim=128, q_len=4).swap_n == 16
    assert plan_of(heads=4, kv_heads=1, head_dim=128, q_len=3).swap_n == 16  # 12 rows, 4 padding columns
    for plain in (dict(heads=32, kv_heads=8, head_dim=128, q_len=5), dict(heads=32, kv_heads=8, head_dim=96),
                  dict(heads=32, kv_heads=8, head_dim=128, page_size=4, gather=True, ctas_per_sm=2, swap=False)):
        assert not plan_of(**plain).spec.swap and plan_of(**plain).swap_n == 0, plain
        assert plan_of(**plain).q.coords == {"m": 64, "k": plain["head_dim"]}  # Q as the A of S: wgmma's 64 rows
    # gathered at two CTAs: 80-key blocks for plain products, 64 (S^T's M) when swapped
    gathered = dict(heads=32, kv_heads=8, head_dim=128, page_size=4, gather=True, ctas_per_sm=2)
    assert plan_of(**gathered, swap=False).spec.block_n == 80
    assert (plan_of(**gathered).spec.swap, plan_of(**gathered).spec.block_n, plan_of(**gathered).spec.stages) == (True, 64, 2)
    resolve(DecodeSpec(**gathered, stages=3))  # a third slot fits beside the 8-row Q (raises if not; two by default)
    assert not plan_of(heads=32, kv_heads=8, head_dim=128, swap=False).spec.swap
    # the four reads: K and V in 64-row windows as A, Q and P^T as B with N = 8
    assert [r.major for r in p.k_as_a] == ["K", "K"] and [r.row0 for r in p.k_as_a] == [0, 64]
    assert [(r.major, r.transpose) for r in p.v_as_a] == [("MN", 1), ("MN", 1)]
    assert (p.q_as_b.major, p.q_as_b.rows, p.pt_as_b.major, p.pt_as_b.rows) == ("K", 8, "K", 8)
    # Q as the B of S^T holds only the swap_n rows that wgmma reads: 8 x 128, a K tile's layout
    assert p.q_rows == 8 and p.q.coords == {"n": 8, "k": 128} and p.q.smem_bytes == p.smem.q_bytes == 8 * 128 * 2
    source = build(p.spec, family="decode_sm90").rendered.source
    assert "constexpr int kQRows = 8;" in source and "u32 q_tile_offset(u32 n, u32 k)" in source
    plain_source = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128, swap=False), family="decode_sm90").rendered.source
    assert "constexpr int kQRows = 64;" in plain_source and "u32 q_tile_offset(u32 m, u32 k)" in plain_source
    assert p.pt.coords == {"n": 8, "k": 128} and p.pt.smem_bytes == 8 * 128 * 2
    # K's second window starts 64 rows (8 KB of 128-byte rows) into the tile, V's second 64 columns one atom block in
    assert p.k_as_a[1].descriptor_objects()[0].start_address == 64 * 128
    assert p.v_as_a[1].descriptor_objects()[0].start_address == 128 * 128
    # each consumer's region (P^T, the column maxima and sums) sits past the rings, aligned for the P^T swizzle
    smem = p.smem
    assert smem.swap_offset >= smem.v_offset + p.spec.stages * smem.v_bytes and smem.swap_offset % p.pt.smem_align == 0
    assert smem.swap_bytes == 2048 + 2 * 4 * 8 * 4 + 768 and smem.bar_offset >= smem.swap_offset + 2 * smem.swap_bytes
    assert p.swap_stage_bytes == 8 * 128 * 4 <= smem.k_bytes


@pytest.mark.parametrize("bad, match", [(dict(q_len=5), "at most 16 packed rows"), (dict(head_dim=96), "64-column"),
                                        (dict(block_n=80), "64-row windows"), (dict(swap=1.5), "swap must be")])
def test_swapped_products_refuse_tiles_they_do_not_fit(bad, match):
    with pytest.raises(SpecError, match=match):
        resolve(DecodeSpec(**{**dict(heads=32, kv_heads=8, head_dim=128, swap=True), **bad}))


@pytest.mark.parametrize("kw", [dict(heads=32, kv_heads=8, head_dim=128), dict(heads=32, kv_heads=8, head_dim=128, q_len=4),
                                dict(heads=8, kv_heads=8, head_dim=64, page_size=16, window=(100, -1), softcap=30.0),
                                dict(heads=16, kv_heads=8, head_dim=256, q_len=8, dtype="f16"),
                                dict(heads=12, kv_heads=4, head_dim=192, ctas_per_sm=1),
                                dict(heads=32, kv_heads=8, head_dim=128, ctas_per_sm=2),
                                dict(heads=32, kv_heads=8, head_dim=128, page_size=4, gather=True, ctas_per_sm=2)])
def test_swapped_kernels_compile_without_spills(kw):
    built = build(DecodeSpec(**kw), family="decode_sm90")
    name = built.rendered.kernel_name
    assert name.endswith("_swap") or "_swap_" in name
    assert name in built.compiled.registers, name
    assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0
    source = built.rendered.source
    assert "wgmma.mma_async.sync.aligned.m64n%dk16" % built.plan.swap_n in source
    assert "Swapped here" in source and "static __device__ __forceinline__ void finish_rows(" in source


def test_paged_tiles_are_gathered_by_verified_loads():
    import layouts
    from layouts.paged import SubLoad, paged_tile

    k = layouts.derive_operand("k", arch="sm_90a", head_dim=128, block_rows=128, dtype="bf16")
    small = paged_tile(k, 16)  # 8 pages x 2 atom column blocks, each 16 x 64
    assert len(small.loads) == 16 and small.box == (64, 16, 1, 1, 1)
    assert small.loads[:3] == (SubLoad(0, 0, 0), SubLoad(0, 1, 16384), SubLoad(16, 0, 2048))
    assert paged_tile(k, 256).loads == (SubLoad(0, 0, 0),) and paged_tile(k, 256).box == k.tensor_map.box
    # A load placed one page off is caught by the TMA model.
    wrong = dataclasses.replace(small, loads=(SubLoad(0, 0, 2048),) + small.loads[1:])
    assert wrong.verify()
    assert found_by_tma(wrong)
    p = plan_of(heads=32, kv_heads=8, head_dim=128, page_size=16)
    assert p.k_pages.loads == small.loads and p.v_pages is not None
    assert (small.pages, small.cols, small.page_stride, small.col_stride) == (8, 2, 2048, 16384)


def test_a_head_packs_pages_are_one_box_over_its_heads_rows():
    """Four heads a tile: a 16-row page's rows of all four are one 8 KB box per column block (a head's alone is 2
    KB), placed as tile rows 4 x key + head; a page holding the block is the tile's own box from the page's row."""
    import layouts
    from layouts.paged import SubLoad, paged_tile

    k = layouts.derive_operand("k", arch="sm_90a", head_dim=128, block_rows=128, dtype="bf16", head_pack=4)
    paged = paged_tile(k, 16)  # 32 keys of 4 heads: 2 pages x 2 column blocks
    assert (paged.keys, paged.box, paged.load_bytes) == (32, (64, 4, 16, 1, 1), 8192)
    assert paged.loads == (SubLoad(0, 0, 0), SubLoad(0, 1, 16384), SubLoad(64, 0, 8192), SubLoad(64, 1, 24576))
    assert paged.origin(page=7, token=0, col_block=1, head=4) == (0, 4, 0, 1, 7)  # (cols, head, row, atom, page)
    whole = paged_tile(k, 64)
    assert whole.loads == (SubLoad(0, 0, 0),) and whole.box == k.tensor_map.box == (64, 4, 32, 2, 1)
    small = paged_tile(k, 4)
    assert small.box == (64, 4, 4, 1, 1) and (small.pages, small.page_stride) == (8, 2048)
    for one in (paged, small):  # a load placed one page off, or on the next head, is caught by the TMA model
        moved = (SubLoad(0, 0, one.page_stride),) + one.loads[1:]
        assert found_by_tma(dataclasses.replace(one, loads=moved))
        assert found_by_tma(dataclasses.replace(one, loads=(SubLoad(0, 0, 128),) + one.loads[1:]))
    p = plan_of(heads=32, kv_heads=8, head_dim=128, page_size=16, head_pack=4)
    assert not p.spec.gather and (p.spec.block_n, p.tile_rows) == (32, 128) and p.k_pages.loads == paged.loads
    source = build(p.spec, family="decode_sm90").rendered.source
    assert "map, bar, 0, head, key % cfg::kPageRowsOr1, c, pages.page[n]);" in source  # load_origin's order
    assert "map, bar, 0, key % cfg::kPageRowsOr1, c, head, pages.page[n]);" in \
        build(plan_of(heads=32, kv_heads=8, head_dim=128, page_size=16).spec, family="decode_sm90").rendered.source


def found_by_tma(paged) -> list:
    """The mismatches of the TMA model's check alone (verify also checks the loads' affine form)."""
    return [m for m in paged.verify() if m.check.startswith("paged TMA")]


def k_tile(head_dim=128, rows=128):
    import layouts

    return layouts.derive_operand("k", arch="sm_90a", head_dim=head_dim, block_rows=rows, dtype="bf16")


@pytest.mark.parametrize("page, loads, stride", [(1, 256, 128), (2, 128, 256), (4, 64, 512)])
def test_small_pages_are_tma_loads_at_their_rows_start(page, loads, stride):
    """Pages of 1-4 rows start inside the 128-byte swizzle's 8-line pattern: each load's destination is the row
    start of its first row (the copy packs densely and swizzles the absolute address: the ISA's swizzle base
    offset), not the byte where the tile keeps its first element, which the swizzle moves off it."""
    from layouts.paged import SubLoad, paged_tile

    k = k_tile()
    paged = paged_tile(k, page)
    assert len(paged.loads) == loads and paged.box == (64, page, 1, 1, 1) and paged.load_bytes == 128 * page
    assert (paged.pages, paged.cols, paged.page_stride, paged.col_stride) == (128 // page, 2, stride, 16384)
    assert paged.loads[:3] == (SubLoad(0, 0, 0), SubLoad(0, 1, 16384), SubLoad(page, 0, stride))
    first = int(k.layout.apply_flat({"n": page, "k": 0}))
    assert first == page * 128 + page % 8 * 16 != paged.loads[2].smem_offset  # swizzled off its row start
    for off_by in (stride, -stride):  # a load one page off is caught by the TMA model, not only by the form
        moved = paged.loads[:2] + (SubLoad(page, 0, stride + off_by),) + paged.loads[3:]
        assert found_by_tma(dataclasses.replace(paged, loads=moved))
    with pytest.raises(LayoutError, match="128-byte aligned"):  # the first element's byte: no TMA destination
        dataclasses.replace(paged, loads=paged.loads[:2] + (SubLoad(page, 0, first),) + paged.loads[3:]).verify()


def test_small_pages_depend_on_the_swizzle_following_the_absolute_address(monkeypatch):
    """A TMA model that started every copy's swizzle pattern afresh at its destination (no base offset) would
    misplace pages of fewer than 8 rows and agree on whole patterns: the check exercises the ISA's rule."""
    from layouts import paged as paged_module
    from layouts.tma import place_box

    def pattern_at_destination(params, origin, smem_address=0):
        return place_box(params, origin, 0)

    k = k_tile()
    small, whole = paged_module.paged_tile(k, 2), paged_module.paged_tile(k, 8)
    monkeypatch.setattr(paged_module, "place_box", pattern_at_destination)
    assert found_by_tma(small) and not whole.verify()


def test_one_row_pages_of_64_byte_rows_are_refused_with_the_reason():
    from layouts.paged import paged_tile

    with pytest.raises(LayoutError, match="tile byte 64, and a TMA destination must be 128-byte aligned"):
        paged_tile(k_tile(head_dim=96), 1)
    assert paged_tile(k_tile(head_dim=96), 2).page_stride == 128  # two 64-byte rows: one 128-byte line
    with pytest.raises(SpecError, match="pages of 2 rows or more"):
        resolve(DecodeSpec(heads=16, kv_heads=4, head_dim=96, page_size=1))


@pytest.mark.parametrize("kw, lanes, pages", [
    (dict(head_dim=128, page_size=1), 32, 128), (dict(head_dim=128, page_size=2), 32, 64),
    (dict(head_dim=128, page_size=4), 32, 32), (dict(head_dim=128, page_size=8), 32, 16),
    (dict(head_dim=128, page_size=16), 32, 8), (dict(head_dim=128, page_size=128), 1, 1), (dict(head_dim=128), 1, None),
    (dict(head_dim=256, page_size=4), 32, 16), (dict(head_dim=256, page_size=64), 1, 1),  # 64-key blocks
    (dict(head_dim=128, page_size=1, block_n=176), 32, 176)])
def test_blocks_of_many_pages_are_issued_by_the_producer_warp(kw, lanes, pages):
    p = plan_of(heads=32, kv_heads=8, **kw)
    assert p.page_lanes == lanes and (p.k_pages.pages if p.k_pages else None) == pages


SMALL_PAGES = [dict(heads=32, kv_heads=8, head_dim=128, page_size=1), dict(heads=32, kv_heads=8, head_dim=128, page_size=2),
               dict(heads=32, kv_heads=8, head_dim=128, page_size=4, window=(100, -1), softcap=30.0),
               dict(heads=8, kv_heads=8, head_dim=64, page_size=1, dtype="f16"),
               dict(heads=16, kv_heads=4, head_dim=96, page_size=2, q_len=2),
               dict(heads=8, kv_heads=1, head_dim=256, page_size=4, q_len=3),
               dict(heads=12, kv_heads=4, head_dim=192, page_size=1, q_len=2),
               dict(heads=64, kv_heads=8, head_dim=128, page_size=1, q_len=16),
               dict(heads=32, kv_heads=8, head_dim=128, page_size=1, block_n=176)]


@pytest.mark.parametrize("kw", SMALL_PAGES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_small_page_kernels_compile_without_spills(kw):
    built = build(DecodeSpec(**kw), family="decode_sm90")
    for name in (built.rendered.kernel_name, built.rendered.kernel_name + "_append"):
        assert name in built.compiled.registers, name
        assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0
    plan, source = built.plan, built.rendered.source
    assert f"kPageLanes = {plan.page_lanes};" in source and f"kPageRows = {kw['page_size']};" in source
    pages = plan.k_pages
    assert (f"constexpr int kPages = {pages.pages}, kCols = {pages.cols};\n"
            f"  constexpr u32 kPageStride = {pages.page_stride}, kColStride = {pages.col_stride};") in source
    manifest = built.manifest()
    assert manifest["spec"]["page_size"] == kw["page_size"]


def test_splits_fill_one_wave_where_tiles_are_few():
    from codegen.decode import choose_splits

    assert choose_splits(8, 16, 132) == 8      # B=1, 2k keys: 2 blocks a split
    assert choose_splits(8, 256, 132) == 8     # a wave would be 16: one cluster of 8 merges faster
    assert choose_splits(8, 256, 132, gathered=True) == 16  # gathered pages: the streams are the limit
    assert choose_splits(8, 12, 132, gathered=True) == 6 and choose_splits(1, 256, 132, gathered=True) == 128
    assert choose_splits(8, 12, 132) == 6      # 2 blocks a split
    assert choose_splits(1, 256, 132) == 128   # multi-query B=1: a wave of splits, far past a cluster
    assert choose_splits(24, 64, 132) == 5     # B=3, 8k: a wave of splits (fit_clusters then takes 4 on an H200)
    assert choose_splits(32, 16, 132) == 4     # B=4, 2k: 4 blocks a split (3 once the clusters fit)
    assert choose_splits(44, 64, 132) == 3     # a third of the SMs: still a wave
    assert choose_splits(45, 64, 132) == 2     # past it, splits of 32 blocks
    assert choose_splits(64, 16, 132) == 1     # B=8, 2k: the merge does not pay
    assert choose_splits(64, 16, 132, gathered=True) == 2  # ... but for gathered pages a wave of two-block splits does
    assert choose_splits(48, 16, 132, gathered=True) == 2 and choose_splits(64, 3, 132, gathered=True) == 1
    assert choose_splits(128, 16, 132, gathered=True) == 1  # a wave of tiles already
    # Where two CTAs a SM fit, gathered tiles of more than a third of a wave split in two, and past a wave stay whole.
    assert choose_splits(96, 16, 132, gathered=True, two_ctas=True) == 2
    assert choose_splits(128, 64, 132, gathered=True, two_ctas=True) == 2
    assert choose_splits(64, 16, 132, gathered=True, two_ctas=True) == 2
    assert choose_splits(136, 64, 132, gathered=True, two_ctas=True) == 1
    assert choose_splits(136, 64, 132, gathered=True) == 2 == choose_splits(136, 64, 132)  # (d24)
    # ... pages by TMA split in two over a third of a wave, where two CTAs a SM fit (d39); a dense cache does not
    assert choose_splits(48, 16, 132, small_pages=True, two_ctas=True) == 2
    assert choose_splits(48, 16, 132, two_ctas=True) == 1
    assert choose_splits(48, 16, 132, small_pages=True) == 1
    # Gathered tiles under a third of a wave fill a wave of two CTAs a SM (d39).
    assert choose_splits(8, 256, 132, gathered=True, two_ctas=True) == 33
    assert choose_splits(16, 256, 132, gathered=True, two_ctas=True) == 16
    assert choose_splits(32, 64, 132, gathered=True, two_ctas=True) == 8  # fit_clusters trims what is not resident
    assert choose_splits(8, 16, 132, gathered=True, two_ctas=True) == 8   # 2 blocks a split
    assert choose_splits(8, 256, 132, small_pages=True, two_ctas=True) == 16  # by TMA: one CTA a SM's wave, unfolded
    assert choose_splits(8, 16, 132, small_pages=True, two_ctas=True) == 8    # 2 blocks a split: one cluster
    assert choose_splits(64, 256, 132) == 2
    assert choose_splits(256, 64, 132) == 1
    # Dense tiles over half a wave and up to 7/8 of one split in two where two CTAs a SM fit (d41).
    assert choose_splits(72, 16, 132, two_ctas=True) == 2 == choose_splits(72, 256, 132, two_ctas=True)
    assert choose_splits(115, 16, 132, two_ctas=True) == 2 and choose_splits(116, 16, 132, two_ctas=True) == 1
    assert choose_splits(66, 16, 132, two_ctas=True) == 1   # half a wave: B=8 x 2k keeps one
    assert choose_splits(72, 16, 132) == 1                  # one CTA a SM only: no
    assert choose_splits(72, 3, 132, two_ctas=True) == 1    # too few blocks to split
    # Past a wave, tiles over small pages take two splits up to 1.4 waves, a dense cache's to 1.25 (d42, d24).
    assert choose_splits(176, 64, 132, small_pages=True, two_ctas=True) == 2 and choose_splits(176, 64, 132) == 1
    assert choose_splits(184, 64, 132, small_pages=True) == 2 and choose_splits(185, 64, 132, small_pages=True) == 1
    assert choose_splits(176, 16, 132, small_pages=True) == 1  # short caches keep splits of 32 blocks or none


def test_gathered_pages_are_a_paged_option_of_their_own_barriers_and_registers():
    with pytest.raises(SpecError, match="needs a page_size"):
        DecodeSpec(heads=32, kv_heads=8, head_dim=128, gather=True)
    p = plan_of(heads=32, kv_heads=8, head_dim=128, page_size=4, gather=True)
    tma = plan_of(heads=32, kv_heads=8, head_dim=128, page_size=4)
    assert p.spec.name.endswith("_page4_gather") and p.k_pages is None and p.v_pages is None
    assert p.producer_threads == 128 and tma.producer_threads == tma.page_lanes == 32
    full = {b.name: b.arrivals for b in p.abi.barriers.barriers}
    assert full["KFull"] == full["VFull"] == 128 and {b.name: b.arrivals for b in tma.abi.barriers.barriers}["KFull"] == 1
    # Only the gathering kernel takes the caches' addresses and strides (the TMA kernels' ABI is unchanged by it).
    assert {"k_cache_gmem", "v_cache_row_bytes"} <= set(p.abi.names) and "k_cache_gmem" not in tma.abi.names
    # The setmaxnreg split stays within what a 384-thread CTA is launched with (168 a thread).
    assert p.producer_regs + 2 * p.consumer_regs <= 3 * 168 and p.producer_regs > tma.producer_regs
    # D=96's 1-row pages, refused to TMA (64-byte rows put every second copy off 128 bytes), are gathered.
    assert resolve(DecodeSpec(heads=16, kv_heads=4, head_dim=96, page_size=1, gather=True)).gather
    # A producer warp's lanes hold one row's page each: gathered blocks are at most 128 keys.
    with pytest.raises(SpecError, match="at most 128 keys"):
        resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=64, page_size=4, gather=True, block_n=192))


def test_small_pages_are_gathered_unless_the_caller_says_otherwise():
    from codegen.families.decode_sm90.plan import GATHER_MAX_PAGE_ROWS, gather_by_default

    assert [gather_by_default(p) for p in (0, 1, 2, 4, 8, 16, 256)] == [False, True, True, True, True, False, False]
    assert GATHER_MAX_PAGE_ROWS == 8
    assert gather_by_default(1, False) is False and gather_by_default(16, True) is True


@pytest.mark.parametrize("dim", [64, 96, 128, 256])
def test_gathered_pieces_tile_the_k_and_v_tiles(dim):
    # Each thread copies 16 bytes: piece c of key row r to the tile's byte of element (r, c * vec). The pieces must
    # be 16-byte runs of the verified layout that cover each tile once.
    p = plan_of(heads=32, kv_heads=8, head_dim=dim, page_size=1, gather=True)
    for tile, row, col, vec in ((p.k, "n", "k", p.k_row_vector_elems), (p.v, "k", "n", p.v_row_vector_elems)):
        e = tile.elem_bytes
        assert vec * e == 16
        starts = set()
        for r in range(p.spec.block_n):
            for c in range(dim // vec):
                offs = [int(tile.layout.apply_flat({row: r, col: c * vec + i})) for i in range(vec)]
                assert offs == list(range(offs[0], offs[0] + 16, e)), (tile.operand, r, c)
                starts.add(offs[0])
        assert len(starts) == p.spec.block_n * dim // vec and all(s % 16 == 0 for s in starts)
        assert max(starts) + 16 == tile.smem_bytes


def test_gathered_kernels_fence_the_generic_writes_before_the_wgmma():
    gathered = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128, page_size=2, gather=True)).rendered.source
    tma = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128, page_size=2)).rendered.source
    assert "constexpr bool kGather = true;" in gathered and "constexpr bool kGather = false;" in tma
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in gathered
    assert "if constexpr (cfg::kGather) fence_proxy_async();" in gathered
    assert "regs_dec<40>" in gathered and "regs_inc<232>" in gathered and "regs_dec<24>" in tma


class _Tensor:
    """What DecodeLauncher reads of a tensor: its address, strides (in elements) and shape."""

    device = "cuda:0"

    def __init__(self, address: int, strides: tuple = (), shape: tuple = (2, 3, 32, 128)):
        self.address, self.strides, self.shape = address, strides, shape

    def data_ptr(self) -> int:
        return self.address

    def stride(self, axis: int) -> int:
        return self.strides[axis]


@pytest.mark.parametrize("gather", [True, False])
def test_the_launcher_writes_each_call_s_pointers_and_strides_into_the_abi(gather, monkeypatch):
    pytest.importorskip("torch")  # codegen.launcher's
    from codegen import decode, launcher

    launches = []
    monkeypatch.setattr(launcher, "launch_now", lambda kernel, grid, threads, stream, args: launches.append(kernel))
    built = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128, q_len=3, page_size=4, gather=gather))
    call = decode.DecodeLauncher(built, "attend", "append", {} if gather else {"k": None, "v": None}, 2, 1, 0.1)
    if not gather:  # the TMA kernel's maps, one encoding per cache address
        call._maps = {op: type("Maps", (), {"get": lambda self, address: bytes(128)})() for op in ("k", "v")}
    monkeypatch.setattr(call, "_workspace_for", lambda stream, device: ((7, 8, 9), ()))
    q, k, v = _Tensor(100, (999, 99, 9)), _Tensor(300, (1000, 100, 10)), _Tensor(400, (2000, 200, 20))
    k_new, v_new, table = _Tensor(500, (11, 12, 13)), _Tensor(600, (21, 22, 23)), _Tensor(700, (77,), (2, 66))
    for o, lengths in ((_Tensor(200, (555, 55, 5)), _Tensor(800)), (_Tensor(201, (444, 44, 4)), _Tensor(801))):
        call(0, q, k, v, lengths, k_new, v_new, None, o, None, table)
        h = {name: holder.value for name, holder in call._holder.items() if hasattr(holder, "value")}
        a = {name: holder.value for name, holder in call._append_holder.items()}
        e = 2  # bf16 bytes
        assert (h["q_gmem"], h["q_batch_bytes"], h["q_row_bytes"], h["q_head_bytes"]) == (100, 999 * e, 99 * e, 9 * e)
        # out= may change its strides from call to call; the other strides are fixed by the call's key.
        assert (h["o_gmem"], h["o_batch_bytes"], h["o_row_bytes"], h["o_head_bytes"]) == (
            o.address, o.strides[0] * e, o.strides[1] * e, o.strides[2] * e)
        assert (h["cache_seqlens"], h["page_table"], h["page_table_stride"], h["new_tokens"]) == (lengths.address, 700, 77, 3)
        assert h["page_table_cols"] == 66  # the early load's bound: the table's columns, not its stride
        assert (h["ws_o"], h["ws_lse"], h["split_counter"], h["lse_out"], h["sinks"]) == (7, 8, 9, 0, 0)
        if gather:
            assert (h["k_cache_gmem"], h["v_cache_gmem"], h["v_cache_row_bytes"]) == (300, 400, 200 * e)
        assert (a["k_new_gmem"], a["v_new_head_bytes"], a["k_cache_gmem"], a["k_cache_batch_bytes"]) == (
            500, 23 * e, 300, 1000 * e)
        assert (a["cache_seqlens"], a["page_table"], a["page_table_stride"]) == (lengths.address, 700, 77)
    assert launches == ["append", "attend"] * 2


def test_a_tiles_splits_launch_as_one_cluster_up_to_the_portable_size(monkeypatch):
    pytest.importorskip("torch")  # codegen.launcher's
    from codegen import decode, launcher
    from codegen.families.decode_sm90.plan import MAX_CLUSTER_SPLITS

    built = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128))
    plan = built.plan
    assert MAX_CLUSTER_SPLITS == 8  # the portable cluster size (CUDA programming guide: thread block clusters)
    assert [plan.cluster_dims(n) for n in (1, 2, 3, 8, 9, 16)] == [None, (2, 1, 1), (3, 1, 1), (8, 1, 1), None, None]
    assert plan.grid(3, 5)[0] == 5  # the grid's x is the split, so a cluster of x holds one tile's splits
    clusters, plain = [], []

    class FakeConfiguredLaunch:
        def __init__(self, kernel, grid, block, cluster, overlap):
            self.shape = (kernel, grid, block, cluster, overlap)

        def __call__(self, stream, args):
            clusters.append(self.shape)

    monkeypatch.setattr(launcher, "ConfiguredLaunch", FakeConfiguredLaunch)
    monkeypatch.setattr(launcher, "launch_now", lambda kernel, grid, threads, stream, args: plain.append((kernel, grid)))
    q, o = _Tensor(100, (999, 99, 9)), _Tensor(200, (555, 55, 5))
    for splits in (1, 4, 16):
        call = decode.DecodeLauncher(built, "attend", "append", {}, 2, splits, 0.1)
        monkeypatch.setattr(call, "_workspace_for", lambda stream, device: ((7, 8, 9), ()))
        call(0, q, _Tensor(300, (1, 1, 1)), _Tensor(400, (1, 1, 1)), _Tensor(800), None, None, None, o, None)
    assert clusters == [("attend", plan.grid(2, 4), plan.threads, (4, 1, 1), False)]
    assert plain == [("attend", plan.grid(2, 1)), ("attend", plan.grid(2, 16))]
    clusters.clear()
    for splits in (1, 4, 16):  # overlapped (the API's default): every launch by cuLaunchKernelEx
        call = decode.DecodeLauncher(built, "attend", "append", {}, 2, splits, 0.1, overlap=True)
        monkeypatch.setattr(call, "_workspace_for", lambda stream, device: ((7, 8, 9), ()))
        call(0, q, _Tensor(300, (1, 1, 1)), _Tensor(400, (1, 1, 1)), _Tensor(800), None, None, None, o, None)
    # a cluster launch is not overlapped (slower back to back: bench/LOG.md d14)
    assert clusters == [("attend", plan.grid(2, n), plan.threads, c, c is None)
                        for n, c in ((1, None), (4, (4, 1, 1)), (16, None))]
    clusters.clear()  # with appends: the append kernel is overlapped too, launched first
    call = decode.DecodeLauncher(built, "attend", "append", {}, 2, 1, 0.1, overlap=True)
    monkeypatch.setattr(call, "_workspace_for", lambda stream, device: ((7, 8, 9), ()))
    new = _Tensor(500, (11, 12, 13))
    call(0, q, _Tensor(300, (1, 1, 1)), _Tensor(400, (1, 1, 1)), _Tensor(800), new, new, None, o, None)
    assert clusters == [("append", plan.append_grid(2), plan.append_threads, None, True),
                        ("attend", plan.grid(2, 1), plan.threads, None, True)]


def fake_device_buffers(monkeypatch) -> list:
    """driver.DeviceBuffer as a recorder: each buffer's size, a made-up address (4096 apart) and the streams it was
    zeroed on, in the order they were made (the list returned)."""
    from codegen import driver

    made = []

    class Buffer:
        def __init__(self, nbytes, device_index):
            self.nbytes, self.address, self.zeroed = nbytes, 4096 * (len(made) + 1), []
            made.append(self)

        def zero(self, stream):
            self.zeroed.append(stream)

    monkeypatch.setattr(driver, "DeviceBuffer", Buffer)
    return made


def test_a_launchers_workspace_lives_outside_torch_and_a_captured_launch_gets_its_own(monkeypatch):
    """Eager launches on a stream share one workspace in driver.DeviceBuffers (not torch's pools, which CUDA-graph
    warm-ups reclaim), its counter zeroed on that stream; a launch under capture gets fresh tensors every time
    (the graph's); a cluster of pushing splits needs none."""
    torch = pytest.importorskip("torch")
    from codegen import decode, launcher

    made = fake_device_buffers(monkeypatch)

    class FakeConfiguredLaunch:
        def __init__(self, *args):
            pass

    monkeypatch.setattr(launcher, "ConfiguredLaunch", FakeConfiguredLaunch)
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    built = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128))
    plan, cpu = built.plan, torch.device("cpu")
    assert plan.push_merge
    plain = decode.DecodeLauncher(built, "attend", "append", {}, 2, 16, 0.1)  # 16 splits: no cluster, the workspace
    first, again = plain._workspace_for(5, cpu), plain._workspace_for(5, cpu)
    tiles = 2 * plan.grid(2, 16)[1]
    assert first[0] == again[0] == (4096, 8192, 12288) and len(made) == 3
    assert [b.nbytes for b in made] == [tiles * 16 * plan.block_m * 128 * 4, tiles * 16 * plan.block_m * 4, tiles * 4]
    assert [b.zeroed for b in made] == [[], [], [5]]  # the counter, on the launch's stream
    assert plain._workspace_for(6, cpu)[0] == (16384, 20480, 24576)  # another stream, its own
    capturing["on"] = True
    one, two = plain._workspace_for(5, cpu), plain._workspace_for(5, cpu)
    assert len(made) == 6 and one[0] != two[0] and all(isinstance(x, torch.Tensor) for x in one[1])
    assert not one[1][2].any()  # a captured counter starts at zero (a memset in the graph)
    capturing["on"] = False
    pushed = decode.DecodeLauncher(built, "attend", "append", {}, 2, 4, 0.1)  # a cluster of 4 that push
    assert pushed.cluster == (4, 1, 1) and pushed._workspace_for(5, cpu) == ((0, 0, 0), ()) and len(made) == 6


def test_clustered_splits_push_their_rows_to_split_0_where_the_slots_fit_beside_the_ring():
    from codegen.families.decode_sm90.plan import MAX_CLUSTER_SPLITS

    p = plan_of(heads=32, kv_heads=8, head_dim=128, q_len=1)
    slot = 4 * (128 + 1) * 4  # 4 rows of 128 floats, then their 4 logsumexps: 2064 bytes, a multiple of 16
    assert p.push_merge and p.merge_slot_bytes == slot and slot % 16 == 0
    smem = p.smem
    ring_end = smem.v_offset + p.spec.stages * smem.v_bytes
    assert smem.merge_offset >= max(ring_end, smem.swap_offset + p.consumers * smem.swap_bytes)
    assert smem.merge_offset % 16 == 0 and smem.merge_bytes == MAX_CLUSTER_SPLITS * slot
    assert smem.bar_offset >= smem.merge_offset + smem.merge_bytes and smem.total <= p.smem_limit
    names = [b.name for b in p.abi.barriers.barriers]
    assert names[:2] == ["MergeFull", "MergeDone"] and all(b.arrivals == 1 for b in p.abi.barriers.barriers[:2])
    # The slots never cost a ring slot: D=64's six-slot ring keeps its six, with them at 4 rows, without at 16.
    assert [(q.spec.stages, q.push_merge) for q in (plan_of(heads=32, kv_heads=8, head_dim=64, q_len=n) for n in (1, 4))] \
        == [(6, True), (6, False)]
    # Where they do not fit (128 rows: 8 slots of 66 KB), or a tile is one of several row tiles, the workspace.
    for kw in (dict(heads=64, kv_heads=8, head_dim=128, q_len=16), dict(heads=16, kv_heads=4, head_dim=96, q_len=40),
               dict(heads=32, kv_heads=8, head_dim=64, q_len=4)):
        other = plan_of(**kw)
        assert not other.push_merge and other.smem.merge_bytes == 0
        assert "MergeFull" not in [b.name for b in other.abi.barriers.barriers]
    source = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128)).rendered.source
    assert "constexpr bool kPushMerge = true;" in source
    assert "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes" in source
    assert f"kMergeSlotBytes = {slot};" in source


def test_only_the_cluster_launched_family_masks_descriptor_addresses_to_the_field():
    from codegen.families.decode_sm90 import context
    from layouts import mma

    built = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128))
    mask = f"(tile & {mma.FIELD_LIMIT - 1:#x}u)"
    assert f"return desc + ({mask} >> {built.plan.desc_address_shift}); }}" in built.rendered.source
    forward = next((Path(__file__).resolve().parent.parent / "generated").glob("flashgen_fwd_*.cu")).read_text()
    assert "u64 desc_at" in forward and mask not in forward  # no cluster launch there: no extra instruction
    # P V's descriptor reaches V's second 64-column block through its leading-byte offset. A shared address with
    # bits above the field's (a CTA of a cluster) must move the start address only.
    v0 = context(built.plan)["v_desc"][0]
    lbo = mma.SmemDescriptor.decode("wgmma", v0).lbo
    address = (1 << 24) | 0x14000
    moved = mma.SmemDescriptor.decode("wgmma", v0 + ((address & (mma.FIELD_LIMIT - 1)) >> 4))
    assert (moved.start_address, moved.lbo) == (0x14000, lbo) and lbo == 128 * 128
    assert mma.SmemDescriptor.decode("wgmma", v0 + (address >> 4)).lbo != lbo  # unmasked: the offset moves


def test_two_ctas_per_sm_take_one_consumer_and_half_the_sm():
    from codegen.families.decode_sm90.plan import REGISTERS_PER_SM, SM_SMEM_BYTES

    built = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128, ctas_per_sm=2))
    p, src = built.plan, built.rendered.source
    assert (p.key_groups, p.row_groups, p.threads, p.spec.block_n, p.spec.stages) == (1, 1, 256, 64, 2)
    assert p.smem.total <= p.smem_limit == SM_SMEM_BYTES // 2 - 1024
    # Swapped two-CTA rings are capped (plan.TWO_CTA_SWAPPED_STAGES) though a third slot fits; plain ones are not.
    assert plan_of(heads=32, kv_heads=8, head_dim=64, ctas_per_sm=2).spec.stages == 2
    assert plan_of(heads=32, kv_heads=8, head_dim=64, ctas_per_sm=2, stages=3).fits
    assert plan_of(heads=32, kv_heads=8, head_dim=64, q_len=5, ctas_per_sm=2).spec.stages == 3  # 40 rows: plain
    assert (p.producer_regs + p.consumer_regs) * 128 * 2 == REGISTERS_PER_SM
    assert "__launch_bounds__(256, 2)" in src and "kSetMaxNreg = true" in src
    assert p.spec.name.endswith("_2cta") and "2 CTAs per SM" in summary(p)
    one = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128)).rendered.source
    assert "__launch_bounds__(384, 1)" in one
    with pytest.raises(SpecError, match="64 rows each; this tile packs 128"):
        resolve(DecodeSpec(heads=64, kv_heads=8, head_dim=128, q_len=16, ctas_per_sm=2))
    with pytest.raises(SpecError, match="fit head dims 64, 96, 128, not 256"):
        resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=256, ctas_per_sm=2))


def test_two_ctas_per_sm_are_chosen_where_one_split_tiles_fill_the_sms():
    from codegen.decode import choose_ctas_per_sm

    spec = DecodeSpec(heads=32, kv_heads=8, head_dim=128)
    assert choose_ctas_per_sm(spec, tiles=256, splits=1, sms=132) == 2
    assert choose_ctas_per_sm(spec, tiles=256, splits=1, sms=132, two_ctas=False) == 1  # the caller's answer stands
    assert choose_ctas_per_sm(spec, tiles=245, splits=1, sms=132) == 2
    assert choose_ctas_per_sm(spec, tiles=244, splits=1, sms=132) == 1  # the SMs holding two CTAs would be the tail
    assert choose_ctas_per_sm(spec, tiles=132, splits=1, sms=132) == 1
    assert choose_ctas_per_sm(spec, tiles=1024, splits=1, sms=132) == 1  # a dense cache of many waves
    assert choose_ctas_per_sm(spec.replace(page_size=16), tiles=1024, splits=1, sms=132) == 2
    assert choose_ctas_per_sm(spec, tiles=64, splits=1, sms=132) == 1   # B=8: under a wave
    assert choose_ctas_per_sm(spec, tiles=256, splits=2, sms=132) == 1  # splits: latency counts
    assert choose_ctas_per_sm(spec.replace(head_dim=256), tiles=256, splits=1, sms=132) == 1
    assert choose_ctas_per_sm(spec.replace(q_len=32), tiles=256, splits=1, sms=132) == 1  # 128 packed rows
    gathered = spec.replace(page_size=4, gather=True)
    assert choose_ctas_per_sm(gathered, tiles=192, splits=1, sms=132) == 2   # gathered: from just past a wave
    assert choose_ctas_per_sm(spec.replace(page_size=4), tiles=192, splits=1, sms=132) == 1  # by TMA: from 1.85 waves
    assert choose_ctas_per_sm(gathered, tiles=96, splits=1, sms=132) == 1
    assert choose_ctas_per_sm(gathered, tiles=96, splits=2, sms=132) == 2


def test_split_tiles_that_fill_most_sms_take_one_consumer_a_cta():
    from codegen.decode import choose_ctas_per_sm, choose_splits

    spec = DecodeSpec(heads=32, kv_heads=8, head_dim=128)
    for batch, keys, splits, ctas in ((8, 8192, 2, 2), (6, 32768, 2, 2), (4, 8192, 4, 2), (3, 8192, 5, 2),
                                      (2, 32768, 8, 2), (1, 32768, 8, 1), (8, 2048, 1, 1)):
        tiles = batch * 8
        assert choose_splits(tiles, keys // 128, 132) == splits, (batch, keys)
        assert choose_ctas_per_sm(spec, tiles, splits, 132) == ctas, (batch, keys)
    assert choose_ctas_per_sm(spec, tiles=93, splits=1, sms=132) == 1
    assert choose_ctas_per_sm(spec, tiles=46, splits=2, sms=132) == 1   # 92 CTAs: under 0.7 of the SMs
    assert choose_ctas_per_sm(spec, tiles=47, splits=2, sms=132) == 2
    assert choose_ctas_per_sm(spec, tiles=136, splits=2, sms=132) == 1  # over a wave: d24's two splits at one a SM
    assert choose_ctas_per_sm(spec.replace(head_dim=256), tiles=64, splits=2, sms=132) == 1  # no two-CTA layout
    assert choose_ctas_per_sm(spec.replace(q_len=32), tiles=64, splits=2, sms=132) == 1
    # a call's own block_n that two CTAs a SM cannot hold keeps one (it was an error, GPU tests at ad7d5ba)
    assert choose_ctas_per_sm(spec.replace(page_size=1, block_n=176), tiles=64, splits=5, sms=132) == 1
    assert choose_ctas_per_sm(spec.replace(page_size=1, block_n=176), tiles=256, splits=1, sms=132) == 1
    assert choose_ctas_per_sm(spec.replace(page_size=1), tiles=64, splits=5, sms=132) == 2


@pytest.mark.parametrize("bad", [3, 2.0, "2"])
def test_a_ctas_per_sm_the_family_has_no_layout_for_is_refused(bad):
    with pytest.raises(SpecError, match="ctas_per_sm must be one of"):
        DecodeSpec(heads=32, kv_heads=8, head_dim=128, ctas_per_sm=bad)


def thread_context(handle: int):
    """A stand-in for libcuda's cuCtxGetCurrent: the calling thread's current context is `handle` (0: none)."""
    def get(pointer):
        pointer._obj.value = handle or None
        return 0
    return get


def test_a_cluster_launch_passes_cuLaunchKernelEx_its_grid_cluster_and_stream(monkeypatch):
    pytest.importorskip("torch")  # codegen.launcher's
    import ctypes

    from cuda.bindings import driver as cu

    from codegen import launcher

    calls = []
    monkeypatch.setattr(launcher, "_load_driver_lib", lambda: None)
    monkeypatch.setattr(launcher, "_lib_set_ctx", lambda handle: calls.append(("ctx", handle)))
    monkeypatch.setattr(launcher, "_lib_get_ctx", thread_context(0))  # the thread has no current context
    monkeypatch.setattr(launcher, "_lib_launch_ex", lambda config, function, args, extra: calls.append(
        ("launch", ctypes.cast(config, ctypes.POINTER(launcher._LaunchConfig)).contents, function, args)) or 0)
    kernel = type("Kernel", (), {"dynamic_smem": 181584, "context_handle": 11, "function_handle": 22})()
    launch = launcher.ConfiguredLaunch(kernel, (8, 8, 1), 384, (8, 1, 1))
    for stream in (5, 6):
        launch(stream, type("Args", (), {"address": 33})())
    assert [c[0] for c in calls] == ["ctx", "launch", "ctx"] * 2  # the kernel's context, then the thread's back
    assert calls[0] == ("ctx", 11) and calls[2] == ("ctx", 0)
    config = calls[4][1]  # the second launch's
    assert (config.grid.x, config.grid.y, config.grid.z, config.block.x, config.block.y) == (8, 8, 1, 384, 1)
    calls.clear()
    launch(6, type("Args", (), {"address": 33})())
    config = calls[1][1]
    assert (config.shared_mem_bytes, config.stream, config.num_attrs, calls[1][2:]) == (181584, 6, 1, (22, 33))
    attr = config.attrs[0]
    assert attr.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (attr.value.cluster_dim.x, attr.value.cluster_dim.y, attr.value.cluster_dim.z) == (8, 1, 1)
    with pytest.raises(AssertionError):
        launcher.ConfiguredLaunch(kernel, (6, 8, 1), 384, (4, 1, 1))  # a cluster that does not divide the grid
    calls.clear()
    launcher.ConfiguredLaunch(kernel, (8, 8, 1), 384, (8, 1, 1), overlap=True)(7, type("Args", (), {"address": 33})())
    config = calls[1][1]
    assert config.num_attrs == 2 and config.attrs[0].id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    pdl = config.attrs[1]
    assert pdl.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION and pdl.value.flag == 1
    calls.clear()
    launcher.ConfiguredLaunch(kernel, (8, 8, 1), 384, None, overlap=True)(7, type("Args", (), {"address": 33})())
    config = calls[1][1]
    assert config.num_attrs == 1 and config.attrs[0].id == pdl.id


def test_kernel_launch_takes_cuLaunchKernel_unless_a_cluster_or_an_overlap_needs_the_configured_one(monkeypatch):
    """The one place a launch is chosen: forward (attention()'s launcher, prepare()) and decode take it."""
    pytest.importorskip("torch")  # codegen.launcher's
    from types import SimpleNamespace

    from codegen import api, driver, launcher
    from codegen.families import make_plan
    from codegen.spec import KernelSpec

    calls = []
    monkeypatch.setattr(launcher, "_load_driver_lib", lambda: None)
    monkeypatch.setattr(launcher, "_lib_set_ctx", lambda handle: calls.append(("ctx", handle)))
    monkeypatch.setattr(launcher, "_lib_get_ctx", thread_context(11))  # the kernel's context is the thread's already
    monkeypatch.setattr(launcher, "_lib_launch", lambda *a: calls.append(("plain",) + a) or 0)
    monkeypatch.setattr(launcher, "_lib_launch_ex", lambda config, function, args, extra: calls.append(
        ("ex", ctypes.cast(config, ctypes.POINTER(launcher._LaunchConfig)).contents.num_attrs, function, args)) or 0)
    kernel = SimpleNamespace(dynamic_smem=1000, context_handle=11, function_handle=22)
    args = SimpleNamespace(address=33)
    plain = launcher.kernel_launch(kernel, (3, 2, 1), 384)
    assert isinstance(plain, launcher.PlainLaunch)
    assert isinstance(launcher.kernel_launch(kernel, (3, 2, 1), 384, ()), launcher.PlainLaunch)  # no cluster dims
    plain(5, args)
    assert calls == [("plain", 22, 3, 2, 1, 384, 1, 1, 1000, 5, 33, None)]  # no context switch: nothing to give back
    for cluster, overlap, attrs in (((2, 1, 1), False, 1), (None, True, 1), ((2, 1, 1), True, 2)):
        calls.clear()
        launch = launcher.kernel_launch(kernel, (4, 2, 1), 384, cluster, overlap)
        assert isinstance(launch, launcher.ConfiguredLaunch)
        launch(5, args)
        assert calls == [("ex", attrs, 22, 33)]
    # A forward plan's cluster dims choose for attention()'s launcher and prepare()'s kernel alike.
    monkeypatch.setattr(driver, "encode_tensor_map", lambda params, address: bytes(driver.TENSOR_MAP_BYTES))
    for multicast, expected in ((False, "plain"), (True, "ex")):
        spec = KernelSpec(seq_len=2048, heads=8, head_dim=128, multicast=multicast, persistent=False)
        built = SimpleNamespace(plan=make_plan(spec))
        grid = (16, 8, 1)
        call = launcher.Launcher(built, kernel, {op: None for op in "qkvo"}, {}, grid, "cuda:0")
        calls.clear()
        call(5, 100, 200, 300, 400, 0)
        assert [c[0] for c in calls] == [expected]
        calls.clear()
        api.PreparedAttention(built, kernel, args, grid, None, None, "cuda:0")._launch(5, args)
        assert [c[0] for c in calls] == [expected]


@pytest.mark.parametrize("spec", [DecodeSpec(heads=32, kv_heads=8, head_dim=128),
                                  DecodeSpec(heads=32, kv_heads=8, head_dim=64, q_len=4, page_size=4, gather=True)])
def test_both_kernels_wait_for_the_previous_kernel_before_reading_any_input(spec):
    """Launched by programmatic dependent launch, a kernel may run beside the one before it on the stream: every
    input read (q, the lengths, the caches, the page table, k_new) must come after griddepcontrol.wait."""
    src = build(spec).rendered.source
    assert "griddepcontrol.wait;" in src and "griddepcontrol.launch_dependents;" in src
    attend = src[src.index("extern \"C\" __global__"):]
    append = attend[attend.index("extern \"C\" __global__", 10):]
    attend = attend[:len(attend) - len(append)]
    for body, reads in ((attend, ("copy_q(", "measure_work(", "producer(", "consumer(")),
                        (append, ("cache_seqlens[b]", "k_new_gmem +", "page_table["))):
        wait = body.index("griddep_wait();")
        assert all(body.index(read) > wait for read in reads), body


def test_chosen_splits_shrink_until_every_tile_s_cluster_is_resident():
    from codegen.decode import fit_clusters

    plan = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128)).plan
    resident = {8: 14, 7: 15, 6: 16, 5: 24, 4: 32, 3: 40, 2: 66}.get  # 8 GPCs of 16-18 SMs, one CTA per SM
    assert fit_clusters(plan, 8, 8, resident) == 8     # B=1: 8 clusters of 8 fit
    assert fit_clusters(plan, 16, 8, resident) == 6    # B=2: 16 clusters fit at 6 splits, not at 8 or 7
    assert fit_clusters(plan, 64, 2, resident) == 2
    assert fit_clusters(plan, 100, 2, resident) == 1   # no cluster size fits: one split, no cluster
    assert fit_clusters(plan, 16, 16, resident) == 16  # not a cluster launch: unchanged
    assert fit_clusters(plan, 16, 1, resident) == 1


def test_two_head_tiles_halve_the_grid_and_keep_a_slots_bytes():
    one, two = plan_of(heads=32, kv_heads=8, head_dim=64), plan_of(heads=32, kv_heads=8, head_dim=64, head_pack=2)
    assert two.spec.name.endswith("_swap_hp2") and two.spec.swap and (two.spec.block_n, two.tile_rows) == (64, 128)
    assert two.spec.rows == 8 and two.spec.head_rows == 4 and two.swap_n == one.swap_n == 8  # both heads in N = 8
    assert two.k.smem_bytes == one.k.smem_bytes == 128 * 128 and two.v.smem_bytes == one.v.smem_bytes
    assert two.grid(32, 3) == (3, 4, 32) and one.grid(32, 3) == (3, 8, 32)
    assert two.abi.grid.describe("splits", "batch")["y"] == "packs of 2 K/V heads x row tiles = 4 x 1"
    # S^T's M windows and P^T's K run over the tile's 128 interleaved rows
    assert [r.row0 for r in two.k_as_a] == [0, 64] and two.pt.coords == {"n": 8, "k": 128}
    assert two.k.tensor_map.head_pack == 2 and two.k.tensor_map.box == (64, 2, 64, 1, 1)
    assert plan_of(heads=32, kv_heads=8, head_dim=64, head_pack=2, ctas_per_sm=2).spec.block_n == 64
    source = build(two.spec, family="decode_sm90").rendered.source
    assert "constexpr int kHeadPack = 2, kHeadRows = 4, kTileRows = 128;" in source
    assert "t % cfg::kHeadPack != n / cfg::kHeadRows" in source  # the other head's scores are masked


@pytest.mark.parametrize("bad, match", [(dict(heads=12, kv_heads=3), "do not divide"),
                                        (dict(page_size=4, gather=True), "not gathered"),
                                        (dict(swap=False), "swapped products"), (dict(head_pack=3), "head_pack must be"),
                                        (dict(head_pack=4, block_n=8), "at least 64 rows")])
def test_two_head_tiles_refuse_what_they_cannot_load(bad, match):
    with pytest.raises(SpecError, match=match):
        DecodeSpec(**{**dict(heads=32, kv_heads=8, head_dim=64, head_pack=2), **bad})


def test_two_head_tiles_of_more_rows_than_the_swapped_products_take_are_refused():
    with pytest.raises(SpecError, match="at most 16 packed rows"):
        resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=64, q_len=3, head_pack=2))  # 2 x 12 rows


@pytest.mark.parametrize("kw", [dict(), dict(ctas_per_sm=2), dict(q_len=2, window=(100, -1), softcap=30.0),
                                dict(heads=16, head_dim=128, dtype="f16"), dict(page_size=16),
                                dict(head_dim=128, head_pack=4, page_size=4), dict(head_dim=128, head_pack=4, page_size=1),
                                dict(head_dim=128, head_pack=4, page_size=16, ctas_per_sm=2),
                                dict(heads=16, kv_heads=4, head_dim=256, head_pack=4, page_size=8)])
def test_head_pack_kernels_compile_without_spills(kw):
    built = build(DecodeSpec(**{**dict(heads=32, kv_heads=8, head_dim=64, head_pack=2), **kw}), family="decode_sm90")
    name = built.rendered.kernel_name
    assert name.endswith(f"_hp{built.spec.head_pack}") and name in built.compiled.registers
    assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0


def test_two_heads_a_tile_are_chosen_for_128_byte_rows_whose_tiles_fill_the_sms():
    from codegen.decode import choose_head_pack

    d64 = DecodeSpec(heads=32, kv_heads=8, head_dim=64)
    assert choose_head_pack(d64, tiles=256, sms=132) == 2 and choose_head_pack(d64, tiles=248, sms=132) == 2
    assert choose_head_pack(d64, tiles=246, sms=132) == 1 and choose_head_pack(d64, tiles=136, sms=132) == 1  # idle SMs
    assert choose_head_pack(d64.replace(q_len=2), tiles=256, sms=132) == 2  # 16 rows: N's most
    for one in (d64.replace(q_len=4), d64.replace(page_size=16), d64.replace(swap=False),
                DecodeSpec(heads=32, kv_heads=8, head_dim=128), DecodeSpec(heads=9, kv_heads=3, head_dim=64)):
        assert choose_head_pack(one, tiles=1024, sms=132) == 1, one


def test_tiles_just_over_a_wave_take_two_splits():
    from codegen.decode import choose_splits

    assert [choose_splits(t, 64, 132) for t in (136, 160, 164)] == [2] * 3  # 8k keys in 128-key blocks
    assert [choose_splits(t, 64, 132) for t in (132, 165, 192, 256, 1024)] == [1] * 5
    assert choose_splits(136, 16, 132) == 1  # 2k keys: a split would keep fewer than SPLIT_MIN_BLOCKS blocks


def test_the_driver_gives_the_thread_its_own_context_back(monkeypatch):
    """Loading or launching on another device's context must not leave it current: the caller's torch device is
    theirs (driver.current, as the launcher's _enter and _leave on the hot path)."""
    from types import SimpleNamespace

    from cuda.bindings import driver as cu

    from codegen import driver

    ok, log, state = cu.CUresult.CUDA_SUCCESS, [], {"current": 7}

    def set_current(ctx):
        log.append(int(ctx))
        state["current"] = int(ctx)
        return (ok,)

    monkeypatch.setattr(driver, "cu", SimpleNamespace(cuCtxGetCurrent=lambda: (ok, state["current"]),
                                                      cuCtxSetCurrent=set_current, CUresult=cu.CUresult,
                                                      cuGetErrorName=cu.cuGetErrorName,
                                                      cuGetErrorString=cu.cuGetErrorString))
    with driver.current(11):
        assert state["current"] == 11
    assert state["current"] == 7 and log == [11, 7]
    log.clear()
    with driver.current(7):  # already current: no switch
        pass
    assert log == []
    with pytest.raises(RuntimeError, match="boom"), driver.current(11):
        raise RuntimeError("boom")
    assert state["current"] == 7  # given back on an error too


def test_a_dead_device_buffer_is_freed_at_the_next_allocation_never_by_its_finalizer(monkeypatch):
    """The garbage collector may finalize a launcher's buffer during a CUDA graph capture, where cuMemFree
    invalidates the capture: a finalizer makes no driver call, and the next allocation (outside any capture, as its
    callers make sure) frees what died."""
    import gc
    from types import SimpleNamespace

    from cuda.bindings import driver as cu

    from codegen import driver

    ok, calls, addresses = cu.CUresult.CUDA_SUCCESS, [], iter(range(4096, 1 << 20, 4096))
    monkeypatch.setattr(driver, "context", lambda index: 7)
    monkeypatch.setattr(driver, "_retired", [])
    monkeypatch.setattr(driver, "cu", SimpleNamespace(
        cuCtxGetCurrent=lambda: (ok, 7), CUresult=cu.CUresult,
        cuMemAlloc=lambda n: calls.append(("alloc", n)) or (ok, next(addresses)),
        cuMemFree=lambda address: calls.append(("free", address)) or (ok,)))
    a = driver.DeviceBuffer(100, 0)
    cycle = {"buffer": a}
    cycle["self"] = cycle  # freed only by the collector, as a launcher held by a traceback's frames is
    del a, cycle
    gc.collect()
    assert calls == [("alloc", 100)] and driver._retired == [(7, 4096)]
    b = driver.DeviceBuffer(8, 0)
    assert calls == [("alloc", 100), ("free", 4096), ("alloc", 8)] and b.address == 8192 and driver._retired == []


def test_the_forwards_tile_counters_live_outside_torch_and_a_captured_launch_gets_its_own(monkeypatch):
    torch = pytest.importorskip("torch")
    from codegen import launcher

    made = fake_device_buffers(monkeypatch)
    monkeypatch.setattr(launcher, "_counters", {})
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    device = torch.device("cpu")
    assert launcher.stream_counter(device, 5)[0] == launcher.stream_counter(device, 5)[0] == 4096
    assert launcher.stream_counter(device, 6)[0] == 8192 and [b.zeroed for b in made] == [[5], [6]]
    capturing["on"] = True
    (a, held_a), (b, _) = launcher.stream_counter(device, 5), launcher.stream_counter(device, 5)
    assert a != b and held_a.item() == 0 and len(made) == 2  # fresh, zero, from torch (the capture's pool)


@pytest.mark.parametrize("page, gather", [(0, False), (16, False), (4, True)])
def test_the_manifest_gives_the_maps_the_launcher_encodes(page, gather):
    """A paged kernel's maps are a page's, with the page's box; a gathering kernel has none (it reads by address)."""
    built = build(DecodeSpec(heads=32, kv_heads=8, head_dim=128, page_size=page, gather=gather))
    maps, plan = built.manifest()["tensor_maps"], built.plan
    if gather:
        assert maps == {}
        return
    for op in ("k", "v"):
        pages = getattr(plan, f"{op}_pages")
        names = dict(num_pages=7, B_cache=3, S_max=1024, H_kv=8, stride_page=16 * 8 * 128, stride_row=8 * 128,
                     stride_b=1024 * 8 * 128, stride_s=8 * 128, stride_h=128)
        made = (pages.instantiate(num_pages=7, heads=8, stride_page=16 * 8 * 128, stride_row=8 * 128, stride_h=128)
                if pages else getattr(plan, op).tensor_map.instantiate(batch=3, seq_len=1024, heads=8,
                                                                       stride_b=1024 * 8 * 128, stride_s=8 * 128,
                                                                       stride_h=128))
        value = lambda text: int(eval(str(text), {"__builtins__": {}}, names))  # noqa: E731,S307 - our own strings
        assert [value(d) for d in maps[op]["dims"]] == list(made.dims)
        assert [value(s) for s in maps[op]["strides_bytes"]] == list(made.strides_bytes)
        assert maps[op]["box"] == list(made.box)
    assert ("page_table" in built.manifest()["global_layout"]) == bool(page)
