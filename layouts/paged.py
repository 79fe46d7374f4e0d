"""K and V tiles gathered from a paged cache, verified against the TMA model.

A paged cache holds each sequence's keys in pages of `page_rows` rows, (num_pages, page_rows, H, D), and a
page table says which page holds keys [p * page_rows, (p + 1) * page_rows) of a sequence. A tile of
`block_rows` keys is then one TMA load where a page holds the whole block (page_rows >= block_rows: the
tile's own box, from row key0 % page_rows of its page), and otherwise one load per (page, swizzle-atom
column block): the tile's box spans the column blocks as a tensor-map dimension, so a box of fewer rows would
pack the column blocks `page_rows` rows apart instead of `block_rows`. Each such load writes a page_rows x
atom_cols sub-box at the tile's own byte offset of its first element; the hardware swizzle is a function of
the shared address, so the sub-boxes land exactly where the tile's layout puts them when every one starts on
the swizzle pattern's boundary (page_rows a multiple of 8 for the 128-byte swizzle). `verify` proves it with
the TMA model on a small cache whose page table is a permutation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import LayoutError
from .operands import OperandDerivation
from .tma import TensorMapParams, place_box
from .verify import Mismatch, compare_maps

MIN_PAGE_ROWS, MAX_PAGE_ROWS = 8, 256  # the swizzle atom's 8 rows; a TMA box dimension's 256


@dataclass(frozen=True)
class SubLoad:
    row: int          # the tile's first row this load writes (a multiple of page_rows, or 0)
    col_block: int    # the atom column block (0 where one load writes them all)
    smem_offset: int  # byte offset in the tile of its first element


@dataclass(frozen=True)
class PagedTile:
    tile: OperandDerivation
    page_rows: int
    loads: tuple[SubLoad, ...]
    box: tuple

    @property
    def whole_block(self) -> bool:
        """One load per tile (a page holds the whole block)."""
        return len(self.loads) == 1

    @property
    def load_bytes(self) -> int:
        return int(np.prod(self.box)) * self.tile.elem_bytes

    def instantiate(self, *, num_pages: int, heads: int, stride_page: int, stride_row: int, stride_h: int,
                    base_address: int = 0) -> TensorMapParams:
        """The cuTensorMapEncodeTiled arguments for a (num_pages, page_rows, H, D) cache; strides in elements."""
        recipe = self.tile.tensor_map
        params = recipe.instantiate(batch=num_pages, seq_len=self.page_rows, heads=heads, stride_b=stride_page,
                                    stride_s=stride_row, stride_h=stride_h, base_address=base_address)
        return TensorMapParams(params.rank, params.dims, params.strides_bytes, self.box, params.elem_strides,
                               params.swizzle_bytes, params.elem_bytes, params.dtype, params.global_address)

    def verify(self) -> list[Mismatch]:
        """Every element of a tile gathered from permuted pages lands where the tile's layout says."""
        t, p = self.tile, self.page_rows
        heads, head = 3, 2
        pages_per_tile = max(1, t.block_rows // p)
        num_pages = 3 * pages_per_tile + 1
        order = list(reversed(range(num_pages)))[:pages_per_tile]  # the tile's pages, out of order
        row0 = p - t.block_rows if p > t.block_rows else 0          # a page's last block, where it has several
        strides = dict(stride_h=t.head_dim, stride_row=heads * t.head_dim, stride_page=p * heads * t.head_dim)
        params = self.instantiate(num_pages=num_pages, heads=heads, base_address=1 << 20, **strides)
        global_addr, smem = [], []
        for load in self.loads:
            page = order[load.row // p] if p < t.block_rows else order[0]
            origin = (0, row0 + (load.row % p if p < t.block_rows else 0), load.col_block, head, page)
            placed = place_box(params, origin, smem_address=load.smem_offset)
            global_addr.append(placed.global_address)
            smem.append(placed.smem_offset + load.smem_offset)
        keys, values = np.concatenate(global_addr), np.concatenate(smem)
        if self.load_bytes * len(self.loads) != t.smem_bytes:
            return [Mismatch({}, t.smem_bytes, self.load_bytes * len(self.loads), None, "paged loads' bytes")]
        sort = np.argsort(keys, kind="stable")
        keys, values = keys[sort], values[sort]
        row_name, col_name = t.coords_names

        def landed(c):
            rows, cols = np.asarray(c[row_name]), np.asarray(c[col_name])
            page = np.asarray(order, dtype=np.int64)[rows // p] if p < t.block_rows else order[0]
            in_page = rows % p if p < t.block_rows else row0 + rows
            addr = params.global_address + t.elem_bytes * (page * strides["stride_page"] + in_page * strides["stride_row"]
                                                           + head * strides["stride_h"] + cols)
            pos = np.clip(np.searchsorted(keys, addr), 0, len(keys) - 1)
            return np.where(keys[pos] == addr, values[pos], -1)

        return compare_maps(t.coords, t.layout.apply_flat, landed, decode=t.layout, check=f"paged TMA, {p}-row pages")


def paged_tile(tile: OperandDerivation, page_rows: int) -> PagedTile:
    """The loads that fill `tile` (a K or V tile of block_rows keys) from `page_rows`-row pages, verified."""
    if tile.operand not in ("k", "v") or tile.tensor_map.kind != "row_tiles":
        raise LayoutError(f"{tile.operand}: paged loads are for K and V row tiles")
    if page_rows & (page_rows - 1) or not MIN_PAGE_ROWS <= page_rows <= MAX_PAGE_ROWS:
        raise LayoutError(f"page size {page_rows}: a power of two in {MIN_PAGE_ROWS}..{MAX_PAGE_ROWS} (pages of "
                          "fewer rows than the swizzle atom's 8 would start off its pattern)")
    recipe = tile.tensor_map
    if page_rows >= tile.block_rows:
        if page_rows % tile.block_rows:
            raise LayoutError(f"page size {page_rows} is not a multiple of the {tile.block_rows}-key block")
        loads, box = (SubLoad(0, 0, 0),), recipe.box
    else:
        if tile.block_rows % page_rows:
            raise LayoutError(f"the {tile.block_rows}-key block is not a whole number of {page_rows}-row pages")
        row_name, col_name = tile.coords_names
        loads = tuple(SubLoad(r, c, int(tile.layout.apply_flat({row_name: r, col_name: c * recipe.atom_cols})))
                      for r in range(0, tile.block_rows, page_rows) for c in range(recipe.col_blocks))
        box = (recipe.atom_cols, page_rows, 1, 1, 1)
    paged = PagedTile(tile, page_rows, loads, box)
    found = paged.verify()
    if found:
        raise LayoutError(f"{tile.operand} from {page_rows}-row pages: {len(found)} mismatches, first {found[0]}")
    return paged
