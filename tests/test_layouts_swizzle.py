import numpy as np
import pytest

from layouts import LayoutError, Swizzle
from layouts.swizzle import SWIZZLE_128B, SWIZZLE_32B, SWIZZLE_64B, SWIZZLE_NONE


def test_128b_swizzle_xors_bits_4_to_6_with_bits_7_to_9():
    assert SWIZZLE_128B.apply(0b111_000_0000) == 0b111_111_0000
    assert SWIZZLE_128B.apply(0b001_010_0110) == 0b001_011_0110
    assert SWIZZLE_128B.apply(1 << 10) == 1 << 10  # bit 10 is outside the pattern


def test_64b_and_32b_swizzles():
    assert SWIZZLE_64B.apply(0b11_00_0000 << 1) == (0b11_00_0000 << 1) ^ 0b11_0000
    assert SWIZZLE_64B.apply(1 << 9) == 1 << 9
    assert SWIZZLE_32B.apply(1 << 7) == (1 << 7) | (1 << 4)
    assert SWIZZLE_32B.apply(1 << 8) == 1 << 8


@pytest.mark.parametrize("swz,repeat", [(SWIZZLE_NONE, 16), (SWIZZLE_32B, 256), (SWIZZLE_64B, 512), (SWIZZLE_128B, 1024)])
def test_repeat_and_involution(swz, repeat):
    assert swz.repeat_bytes == repeat
    addr = np.arange(4096)
    assert np.array_equal(swz.apply(swz.apply(addr)), addr)
    assert np.array_equal(swz.apply(addr + repeat) - repeat, swz.apply(addr))
    assert np.array_equal(addr & 15, swz.apply(addr) & 15)  # bytes inside a 16-byte chunk never move


@pytest.mark.parametrize("span", [0, 32, 64, 128])
def test_swizzle_layout_bases(span):
    layout = Swizzle(span).layout(2048)
    images = [img["byte"] for img in layout.bases["byte"]]
    bits = Swizzle(span).bits
    expected = [1 << i for i in range(11)]
    for i in range(bits):
        expected[7 + i] |= 1 << (4 + i)
    assert images == expected
    assert layout.is_bijective()
    assert layout.compose(layout) == Swizzle(0).layout(2048)


def test_placement_alignment_asserted():
    SWIZZLE_128B.check_placement(3072, "tile")
    with pytest.raises(LayoutError, match="not aligned to 1024"):
        SWIZZLE_128B.check_placement(512, "tile")
    SWIZZLE_64B.check_placement(512, "tile")


def test_bad_modes_rejected():
    with pytest.raises(LayoutError):
        Swizzle(16)
    with pytest.raises(LayoutError):
        Swizzle.from_name("256B")
    assert Swizzle.from_name("64B") == SWIZZLE_64B and SWIZZLE_NONE.name == "none"
