import random

import pytest

from layouts import LayoutError, Swizzle
from layouts.mma import SmemDescriptor, check_footprint, mma_read_byte

SW128 = Swizzle(128)


def test_wgmma_encoding_bit_positions():
    d = SmemDescriptor("wgmma", start_address=0x100, lbo=16, sbo=1024, swizzle=SW128, base_offset=5)
    value = d.encode()
    assert value & 0x3FFF == 0x10
    assert value >> 16 & 0x3FFF == 1
    assert value >> 32 & 0x3FFF == 64
    assert value >> 49 & 7 == 5
    assert value >> 62 == 1
    assert value == 0x10 | 1 << 16 | 64 << 32 | 5 << 49 | 1 << 62


@pytest.mark.parametrize("span,code", [(0, 0), (128, 1), (64, 2), (32, 3)])
def test_wgmma_swizzle_codes(span, code):
    assert SmemDescriptor("wgmma", 0, 16, 16, Swizzle(span)).encode() >> 62 == code


@pytest.mark.parametrize("span,code", [(0, 0), (128, 2), (64, 4), (32, 6)])
def test_tcgen05_swizzle_codes_and_fixed_bits(span, code):
    value = SmemDescriptor("tcgen05", 0, 16, 16, Swizzle(span)).encode()
    assert value >> 61 == code
    assert value >> 46 & 7 == 0b001
    assert value >> 53 & 0xFF == 0


def test_tcgen05_lbo_mode_bit():
    assert SmemDescriptor("tcgen05", 0, 16, 16, SW128, lbo_mode=1).encode() >> 52 & 1 == 1


@pytest.mark.parametrize("seed", range(30))
def test_encode_decode_round_trip(seed):
    rng = random.Random(seed)
    kind = rng.choice(["wgmma", "tcgen05"])
    swz = Swizzle(rng.choice([0, 32, 64, 128]))
    d = SmemDescriptor(kind, rng.randrange(1 << 14) << 4, rng.randrange(1 << 14) << 4, rng.randrange(1 << 14) << 4,
                       swz, base_offset=rng.randrange(8) if swz.span_bytes else 0,
                       lbo_mode=rng.randrange(2) if kind == "tcgen05" else 0)
    assert SmemDescriptor.decode(kind, d.encode()) == d


@pytest.mark.parametrize("field,value,reason", [
    ("start_address", 8, "multiple of 16"), ("lbo", 1 << 18, "2\\^18"), ("sbo", -16, "2\\^18"),
    ("base_offset", 8, "0..7"), ("lbo_mode", 2, "bit 52"),
])
def test_field_ranges(field, value, reason):
    kwargs = dict(kind="tcgen05", start_address=0, lbo=16, sbo=16, swizzle=SW128)
    kwargs[field] = value
    with pytest.raises(LayoutError, match=reason):
        SmemDescriptor(**kwargs)


def test_kind_specific_rules():
    with pytest.raises(LayoutError, match="only in tcgen05"):
        SmemDescriptor("wgmma", 0, 16, 16, SW128, lbo_mode=1)
    with pytest.raises(LayoutError, match="only valid with a swizzle"):
        SmemDescriptor("wgmma", 0, 16, 16, Swizzle(0), base_offset=1)
    with pytest.raises(LayoutError, match="expected one of"):
        SmemDescriptor("hgmma", 0, 16, 16, SW128)


def test_decode_rejects_bad_bits():
    good = SmemDescriptor("tcgen05", 0, 16, 16, SW128).encode()
    with pytest.raises(LayoutError, match="fixed value 0b001"):
        SmemDescriptor.decode("tcgen05", good & ~(1 << 46))
    with pytest.raises(LayoutError, match="53-60"):
        SmemDescriptor.decode("tcgen05", good | 1 << 55)
    with pytest.raises(LayoutError, match="invalid"):
        SmemDescriptor.decode("tcgen05", (good & ~(7 << 61)) | 3 << 61)
    with pytest.raises(LayoutError, match="not modelled"):
        SmemDescriptor.decode("tcgen05", (good & ~(7 << 61)) | 1 << 61)
    with pytest.raises(LayoutError, match="reserved bits 14-15"):
        SmemDescriptor.decode("wgmma", 1 << 14)
    with pytest.raises(LayoutError, match="unused wgmma bits"):
        SmemDescriptor.decode("wgmma", 1 << 46)


def test_k_major_128b_read_model():
    d = SmemDescriptor("wgmma", 32, 16, 1024, SW128)  # second k-slice of a K-major tile
    # row 1, k 0: pre-swizzle 32 + 128 = 160 -> chunk 2 ^ row 1 = chunk 3
    assert mma_read_byte(d, major="K", elem_bytes=2, row=1, k=0) == 128 + 3 * 16
    assert mma_read_byte(d, major="K", elem_bytes=2, row=8, k=3) == 1024 + 32 + 6


def test_mn_major_128b_read_model_uses_lbo_between_atoms_and_sbo_between_k_groups():
    d = SmemDescriptor("tcgen05", 0, lbo=1024, sbo=2048, swizzle=SW128)
    assert mma_read_byte(d, major="MN", elem_bytes=2, row=64, k=0) == 1024
    assert mma_read_byte(d, major="MN", elem_bytes=2, row=0, k=8) == 2048
    assert mma_read_byte(d, major="MN", elem_bytes=2, row=0, k=1) == 128 + 16


def test_unswizzled_core_matrix_models():
    d = SmemDescriptor("wgmma", 0, lbo=256, sbo=512, swizzle=Swizzle(0))
    assert mma_read_byte(d, major="K", elem_bytes=2, row=9, k=9) == 16 + 512 + 256 + 2
    # Apart (at 9, 9 both terms are in, so an LBO/SBO swap would not show): PTX ISA, the matrix descriptor, K-major:
    # LBO steps between core matrices adjacent in K, SBO between those adjacent in M/N.
    assert mma_read_byte(d, major="K", elem_bytes=2, row=8, k=0) == 512
    assert mma_read_byte(d, major="K", elem_bytes=2, row=0, k=8) == 256
    assert mma_read_byte(d, major="MN", elem_bytes=2, row=9, k=9) == 2 + 16 + 512 + 256


def test_footprint_limits():
    d = SmemDescriptor("wgmma", 0, 16, 1024, SW128)
    check_footprint(d, major="K", elem_bytes=2, rows=64, k=16)
    with pytest.raises(LayoutError, match="32 bytes of K"):
        check_footprint(d, major="K", elem_bytes=2, rows=64, k=32)
    with pytest.raises(LayoutError, match="groups of 8 rows"):
        check_footprint(d, major="K", elem_bytes=2, rows=12, k=16)
    with pytest.raises(LayoutError, match="fit in one swizzle row"):
        check_footprint(SmemDescriptor("wgmma", 16, 16, 1024, Swizzle(32)), major="K", elem_bytes=2, rows=8, k=16)
    with pytest.raises(LayoutError, match="base offset"):
        check_footprint(SmemDescriptor("wgmma", 0, 16, 1024, SW128, base_offset=1), major="K", elem_bytes=2, rows=8, k=16)


@pytest.mark.parametrize("kind, bit, message", [("wgmma", 46, "unused wgmma bits"), ("wgmma", 55, "unused wgmma bits"),
                                                ("wgmma", 61, "unused wgmma bits"), ("tcgen05", 53, "bits 53-60"),
                                                ("tcgen05", 60, "bits 53-60"), ("wgmma", 15, "reserved bits 14-15")])
def test_decode_refuses_a_descriptor_with_a_bit_it_does_not_model(kind, bit, message):
    good = SmemDescriptor(kind, 1024, 16, 1024, SW128).encode()
    assert SmemDescriptor.decode(kind, good).encode() == good
    with pytest.raises(LayoutError, match=message):
        SmemDescriptor.decode(kind, good | 1 << bit)
