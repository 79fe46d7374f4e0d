"""layouts.tcgen05: the Blackwell instruction descriptor, TMEM column plan and TMEM load map (CPU only)."""

from __future__ import annotations

import itertools

import pytest

from layouts import LayoutError
from layouts.tcgen05 import (InstrDescriptor, TmemPlan, tmem_address, tmem_load_32x32b, tmem_plan,
                             warp_lane_base)


def test_the_seed_qk_descriptor_encodes_field_by_field():
    """S = Q K^T at M=128, N=128, bf16 -> f32, both K-major: written out from the PTX ISA table bit by bit."""
    d = InstrDescriptor(m=128, n=128, ab_type="bf16")
    expected = (1 << 4) | (1 << 7) | (1 << 10) | ((128 >> 3) << 17) | ((128 >> 4) << 24)
    assert d.encode() == expected == 0x08200490
    # PV with V MN-major (the seed's V), f16, N = head dim 128.
    pv = InstrDescriptor(m=128, n=128, ab_type="f16", b_major="MN")
    assert pv.encode() == (1 << 4) | (1 << 16) | (16 << 17) | (8 << 24)


@pytest.mark.parametrize("m, n, ab, d_type, a_major, b_major", [
    (m, n, ab, dt, am, bm) for m, n in ((64, 8), (64, 256), (128, 16), (128, 176), (128, 256))
    for ab, dt, am, bm in itertools.product(("f16", "bf16"), ("f32", "f16"), ("K", "MN"), ("K", "MN"))])
def test_encode_decode_round_trip(m, n, ab, d_type, a_major, b_major):
    d = InstrDescriptor(m=m, n=n, ab_type=ab, d_type=d_type, a_major=a_major, b_major=b_major)
    value = d.encode()
    assert 0 <= value < 1 << 32 and not value >> 23 & 1 and not value >> 6 & 1 and not value >> 29 & 1
    assert InstrDescriptor.decode(value) == d


@pytest.mark.parametrize("kwargs, message", [
    (dict(m=256, n=128, ab_type="f16"), "M = 256"),
    (dict(m=128, n=8, ab_type="f16"), "multiple of 16"),
    (dict(m=64, n=260, ab_type="f16"), "multiple of 8"),
    (dict(m=128, n=128, ab_type="f32"), "f16 or bf16"),
    (dict(m=128, n=128, ab_type="f16", b_major="N"), "majors"),
])
def test_bad_descriptors_are_refused(kwargs, message):
    with pytest.raises(LayoutError, match=message):
        InstrDescriptor(**kwargs)


def test_decode_refuses_reserved_and_unmodelled_bits():
    good = InstrDescriptor(m=128, n=128, ab_type="f16").encode()
    for bit, message in ((6, "reserved bit 6"), (23, "reserved bit 23"), (2, "sparse"), (13, "negate_a")):
        with pytest.raises(LayoutError, match=message):
            InstrDescriptor.decode(good | 1 << bit)
    with pytest.raises(LayoutError, match="A and B types differ"):
        InstrDescriptor.decode(good | 1 << 7)


@pytest.mark.parametrize("block_n, head_dim, alloc", [(128, 128, 512), (128, 64, 512), (64, 128, 256),
                                                      (128, 256, 512), (64, 64, 256)])
def test_tmem_plan_fits_and_places_p_over_s(block_n, head_dim, alloc):
    plan = tmem_plan(block_n, head_dim, "bf16")
    assert plan.alloc_columns == alloc and plan.used_columns <= alloc
    s0, s1, o = plan.regions
    assert (s0.first_column, s1.first_column, o.first_column) == (0, block_n, 2 * block_n)
    assert plan.p_columns(1).first_column == block_n and plan.p_columns(1).columns == block_n // 2


def test_tmem_plan_over_512_columns_is_refused():
    with pytest.raises(LayoutError, match="over the 512"):
        tmem_plan(256, 256, "f16")  # 2 x 256 + 256


def test_a_p_region_that_leaves_its_s_is_caught(monkeypatch):
    plan = TmemPlan(128, 128, 2)
    monkeypatch.setattr(TmemPlan, "p_columns", lambda self, b: type(plan.regions[0])("p", 64 + 128 * b, 64 + 1))
    with pytest.raises(LayoutError, match="P of buffer 0 leaves its S"):
        plan.check()


def test_tmem_addresses_and_lane_quarters():
    assert tmem_address(0, 0) == 0 and tmem_address(97, 300) == 97 << 16 | 300
    with pytest.raises(LayoutError):
        tmem_address(128, 0)
    assert [warp_lane_base(w) for w in range(8)] == [0, 32, 64, 96, 0, 32, 64, 96]


def test_tmem_load_map_covers_the_tile_once_and_keeps_each_warp_in_its_quarter():
    for columns in (1, 32, 128):
        layout = tmem_load_32x32b(columns)
        assert layout.is_bijective()
        for warp in range(4):
            for lane in (0, 31):
                cell = {k: int(v) for k, v in layout.apply({"lane": lane, "warp": warp, "reg": columns - 1}).items()}
                assert cell == {"row": 32 * warp + lane, "col": columns - 1}
                assert warp_lane_base(warp) <= cell["row"] < warp_lane_base(warp) + 32
