"""The hardware models' own swizzle (layouts.hw_swizzle): it agrees with the tiles' swizzle, matches the
PTX ISA's tables, and, being separate code, catches a wrong tile swizzle that a shared one would hide."""

import ast
from pathlib import Path

import numpy as np
import pytest

import layouts
from layouts import LayoutError
from layouts.hw_swizzle import check_pattern_start, hw_swizzle, pattern_bytes, swizzle_base_offset
from layouts.swizzle import Swizzle

LAYOUTS = Path(layouts.__file__).parent

# PTX ISA, "Tensors" > "Swizzling Modes": one row per 128-byte line, each entry a 16-byte cell. Typed in from
# the ISA, not computed, so they check hw_swizzle's arithmetic. (Each permutation is its own inverse, so
# "cell at position" and "position of cell" read the same.)
PTX_TABLES = {
    32: [[0, 1, 2, 3, 4, 5, 6, 7],
         [1, 0, 3, 2, 5, 4, 7, 6]],
    64: [[0, 1, 2, 3, 4, 5, 6, 7],
         [1, 0, 3, 2, 5, 4, 7, 6],
         [2, 3, 0, 1, 6, 7, 4, 5],
         [3, 2, 1, 0, 7, 6, 5, 4]],
    128: [[0, 1, 2, 3, 4, 5, 6, 7],
          [1, 0, 3, 2, 5, 4, 7, 6],
          [2, 3, 0, 1, 6, 7, 4, 5],
          [3, 2, 1, 0, 7, 6, 5, 4],
          [4, 5, 6, 7, 0, 1, 2, 3],
          [5, 4, 7, 6, 1, 0, 3, 2],
          [6, 7, 4, 5, 2, 3, 0, 1],
          [7, 6, 5, 4, 3, 2, 1, 0]],
}


@pytest.mark.parametrize("span", sorted(PTX_TABLES))
@pytest.mark.parametrize("base", [0, 3 * 1024, 1 << 16])
def test_reproduces_the_ptx_tables_on_every_pattern(span, base):
    table = PTX_TABLES[span]
    assert pattern_bytes(span) == len(table) * 128
    for line, cells in enumerate(table):
        for position, cell in enumerate(cells):
            for byte in (0, 5, 15):
                address = base + line * 128 + position * 16 + byte
                assert hw_swizzle(span, address) == base + line * 128 + cell * 16 + byte


# PTX ISA, "Swizzling Modes": the swizzle base offset of a tensor copy to dstMem off its pattern boundary.
ISA_BASE_OFFSET = {128: lambda dst: (dst // 128) % 8, 64: lambda dst: (dst // 128) % 4, 32: lambda dst: (dst // 128) % 2}


@pytest.mark.parametrize("span", sorted(PTX_TABLES))
def test_the_base_offset_is_the_absolute_address_swizzle(span):
    """Every 128-byte aligned destination in two patterns: the ISA's base offset formula, and the line of the
    ISA's table its first 128 bytes take under hw_swizzle of the absolute address, are the same."""
    for dst in range(0, 2 * pattern_bytes(span), 128):
        base = swizzle_base_offset(span, dst)
        assert base == ISA_BASE_OFFSET[span](dst) and (base == 0) == (dst % pattern_bytes(span) == 0)
        for position, cell in enumerate(PTX_TABLES[span][base]):
            assert hw_swizzle(span, dst + position * 16) == dst + cell * 16
    assert swizzle_base_offset(0, 384) == 0


@pytest.mark.parametrize("span", [0, 32, 64, 128])
def test_agrees_with_the_tile_swizzle_on_every_address(span):
    """The agreement we expect: the two independent writings are the same map."""
    address = np.arange(4 * 1024 + 16 * 1024, dtype=np.int64)  # several whole patterns, from 0
    address = np.concatenate([address, address + (5 << 20)])      # and far from 0
    assert np.array_equal(hw_swizzle(span, address), Swizzle(span).apply(address))
    assert all(hw_swizzle(span, int(a)) == Swizzle(span).apply(int(a)) for a in range(0, 2048, 7))


def test_pattern_start_and_bad_modes():
    check_pattern_start(128, 3072, "tile")
    check_pattern_start(0, 16, "tile")
    with pytest.raises(LayoutError, match="not aligned to 1024"):
        check_pattern_start(128, 512, "tile")
    check_pattern_start(64, 512, "tile")
    with pytest.raises(LayoutError, match="not aligned to 256"):
        check_pattern_start(32, 128, "tile")
    with pytest.raises(LayoutError, match="hardware modes"):
        hw_swizzle(96, 0)


def test_hw_swizzle_shares_no_code_with_the_tiles():
    """hw_swizzle imports nothing but errors; the models reach the swizzle only through it."""
    tree = ast.parse((LAYOUTS / "hw_swizzle.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert imported <= {"__future__", "errors"}, imported
    for model in ("tma.py", "mma.py"):
        text = (LAYOUTS / model).read_text()
        assert ".apply(" not in text and "check_placement" not in text, model


# ----- the decisive test: a wrong tile swizzle must be reported ------------------------------------------
# With models that called Swizzle.apply themselves, the seed's bug passed every derivation here silently,
# and the shifted-row swizzle was caught only where its period (twice the atom's) broke a descriptor
# stride, so never for o.

def _shifted_rows(self, address):
    """XORs the chunk with the row bits one place too high (bits 8.. instead of 7..)."""
    if not self.bits:
        return address
    return address ^ (((address >> 8) & ((1 << self.bits) - 1)) << 4)


def _seed_bug(self, address):
    """The seed's ``n_vec ^ (k & 6)``: the row's low bit never enters the XOR."""
    if not self.bits:
        return address
    return address ^ (((address >> 7) & ((1 << self.bits) - 1) & 6) << 4)


@pytest.mark.parametrize("wrong", [_shifted_rows, _seed_bug], ids=["shifted_rows", "seed_bug"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("operand", ["q", "k", "v", "o"])
def test_a_wrong_tile_swizzle_fails_verification(monkeypatch, wrong, operand, head_dim):
    # Every tile gets its swizzle from Swizzle.apply: Swizzle.layout() takes its basis images from it.
    # layouts keeps no functools caches, so the patched method is what the next derivation uses.
    monkeypatch.setattr(Swizzle, "apply", wrong)
    assert Swizzle(128).apply(1 << 7) != (1 << 7) + (1 << 4)  # row 1 no longer moves chunk 0 to chunk 1
    with pytest.raises(LayoutError, match="fails verification"):
        layouts.derive_operand(operand, arch="sm_90a", head_dim=head_dim, block_rows=128, dtype="f16")


@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
@pytest.mark.parametrize("operand", ["q", "k", "v", "o"])
def test_a_wrong_tile_swizzle_fails_on_tcgen05_too(monkeypatch, arch, operand):
    monkeypatch.setattr(Swizzle, "apply", _seed_bug)
    with pytest.raises(LayoutError, match="fails verification"):
        layouts.derive_operand(operand, arch=arch, head_dim=128, block_rows=128, dtype="bf16")
