"""K and V tiles gathered from a paged cache, verified against the TMA model.

A paged cache holds each sequence's keys in pages of `page_rows` rows, (num_pages, page_rows, H, D), and a
page table says which page holds keys [p * page_rows, (p + 1) * page_rows) of a sequence. A tile of
`block_rows` keys is then one TMA load where a page holds the whole block (page_rows >= block_rows: the
tile's own box, from row key0 % page_rows of its page), and otherwise one load per (page, swizzle-atom
column block): the tile's box spans the column blocks as a tensor-map dimension, so a box of fewer rows would
pack the column blocks `page_rows` rows apart instead of `block_rows`.

Each such load writes a page_rows x atom_cols sub-box: its rows are one run of the tile's bytes, and the copy
packs the box densely from its destination, then swizzles the absolute shared address. So the destination
is the run's lowest byte (the row start of its first row, not the byte of its first element, which the
swizzle moves), and the sub-box lands where the tile's layout puts it whether it starts on the swizzle
pattern's boundary (pages of 8 rows or more under the 128-byte swizzle) or inside the pattern (pages of 1, 2
or 4 rows: the copy's "swizzle base offset", PTX ISA "Swizzling Modes"; layouts.hw_swizzle). What the
hardware does not allow is a destination off 128 bytes: 1-row pages of the 64-byte swizzle's 64-byte rows
(D = 96) would need it, and are refused. `verify` proves every load with the TMA model on a small cache whose
page table is a permutation.

The loads are affine in (page of the block i, column block c): load (i, c) writes from tile byte
i * page_stride + c * col_stride, the form the kernel computes (templates/decode_sm90/kernel.cu.j2); `verify`
checks the load list is that form too.

A tile of a head pack (layouts.operands: row head_pack * key + h is head h of the pack) takes the same loads over
its keys: a page's rows of all the pack's heads are one box (head_pack x page_rows rows of the tile), so a
page of 16 rows at 4 heads is one 8 KB box per column block where one head's is 2 KB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import LayoutError
from .operands import OperandDerivation, TensorMapRecipe
from .tma import SMEM_ALIGN, TensorMapParams, place_box
from .verify import Mismatch, compare_maps

MIN_PAGE_ROWS, MAX_PAGE_ROWS = 1, 256  # a row; a TMA box dimension's 256


@dataclass(frozen=True)
class SubLoad:
    row: int          # the tile's first row this load writes (a multiple of a page's rows, or 0)
    col_block: int    # the atom column block (0 where one load writes them all)
    smem_offset: int  # the tile's byte the load's box starts at: the lowest byte of its rows of the block


@dataclass(frozen=True)
class PagedTile:
    tile: OperandDerivation
    page_rows: int
    loads: tuple[SubLoad, ...]  # page by page, the column blocks of each in order
    box: tuple
    pages: int        # pages one tile spans (1 where a page holds the block)
    cols: int         # loads per page: the atom column blocks, or 1 (the whole tile's box)
    page_stride: int  # tile bytes from one page's loads to the next page's
    col_stride: int   # tile bytes from one column block's load to the next

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
                               params.swizzle_bytes, params.elem_bytes, params.dtype, params.global_address,
                               params.l2_promotion_bytes)

    def describe(self) -> dict:
        """The map as instantiate() encodes it, symbolically (a manifest's entry): the row tile's recipe over a
        (num_pages, page_rows, H, D) cache, and this load's box."""
        recipe = self.tile.tensor_map
        described = recipe.describe()
        names = {"B": "num_pages", "S": str(self.page_rows)}
        described["dims"] = [names.get(d, d) for d in described["dims"]]
        described["strides_bytes"] = [s.replace("stride_b", "stride_page").replace("stride_s", "stride_row")
                                      for s in described["strides_bytes"]]
        described["box"], described["box_bytes"] = list(self.box), self.load_bytes
        return described

    @property
    def head_pack(self) -> int:
        return self.tile.tensor_map.head_pack

    @property
    def keys(self) -> int:
        """Keys of a tile (its rows over the head pack's heads)."""
        return self.tile.block_rows // self.head_pack

    def affine_load(self, page: int, col_block: int) -> SubLoad:
        """Load (page `page` of the tile, column block `col_block`) as the kernel computes it."""
        return SubLoad(page * min(self.page_rows, self.keys) * self.head_pack, col_block,
                       page * self.page_stride + col_block * self.col_stride)

    def origin(self, *, page, token, col_block, head) -> tuple:
        """Tensor-map coordinates (innermost first) of a load of page `page` from its row `token`, column block
        `col_block`, head (the pack's first) `head`: numbers, or the C names the kernel computes them in."""
        return load_origin(self.tile.tensor_map, page=page, token=token, col_block=col_block, head=head)

    def verify(self) -> list[Mismatch]:
        """Where the loads are not the affine (page, column block) form the kernel computes, and where an element
        of a tile gathered from permuted pages lands elsewhere than the tile's layout says (the TMA model)."""
        affine = [self.affine_load(i, c) for i in range(self.pages) for c in range(self.cols)]
        found = [Mismatch({"page": n // self.cols, "col_block": n % self.cols}, want.smem_offset, got.smem_offset,
                          None, "paged loads' affine form")
                 for n, (want, got) in enumerate(zip(affine, self.loads)) if want != got]
        if len(affine) != len(self.loads):
            found.append(Mismatch({}, len(affine), len(self.loads), None, "paged loads' count"))
        return found + self._verify_tma()

    def _verify_tma(self) -> list[Mismatch]:
        t, p, pack, n_keys = self.tile, self.page_rows, self.head_pack, self.keys
        heads, head = 3 * pack, 2 * pack  # the third pack of heads (the third head of three without one)
        pages_per_tile = max(1, n_keys // p)
        num_pages = 3 * pages_per_tile + 1
        order = list(reversed(range(num_pages)))[:pages_per_tile]  # the tile's pages, out of order
        row0 = p - n_keys if p > n_keys else 0                   # a page's last block, where it has several
        strides = dict(stride_h=t.head_dim, stride_row=heads * t.head_dim, stride_page=p * heads * t.head_dim)
        params = self.instantiate(num_pages=num_pages, heads=heads, base_address=1 << 20, **strides)
        global_addr, smem = [], []
        for load in self.loads:
            page = order[load.row // (p * pack)] if p < n_keys else order[0]
            origin = self.origin(page=page, token=row0, col_block=load.col_block, head=head)
            placed = place_box(params, origin, smem_address=load.smem_offset)
            global_addr.append(placed.global_address)
            smem.append(placed.smem_offset + load.smem_offset)
        keys, values = np.concatenate(global_addr), np.concatenate(smem)
        if self.load_bytes * len(self.loads) != t.smem_bytes:
            return [Mismatch({}, t.smem_bytes, self.load_bytes * len(self.loads), None, "paged loads' bytes")]
        sort = np.argsort(keys, kind="stable")
        keys, values = keys[sort], values[sort]
        row_name, col_name = t.coords_names

        def landed(c):  # tile row pack * key + h: key `key` of head `head + h`
            rows, cols = np.asarray(c[row_name]), np.asarray(c[col_name])
            key, h = rows // pack, rows % pack
            page = np.asarray(order, dtype=np.int64)[key // p] if p < n_keys else order[0]
            in_page = key % p if p < n_keys else row0 + key
            addr = params.global_address + t.elem_bytes * (page * strides["stride_page"] + in_page * strides["stride_row"]
                                                           + (head + h) * strides["stride_h"] + cols)
            pos = np.clip(np.searchsorted(keys, addr), 0, len(keys) - 1)
            return np.where(keys[pos] == addr, values[pos], -1)

        return compare_maps(t.coords, t.layout.apply_flat, landed, decode=t.layout, check=f"paged TMA, {p}-row pages")


def paged_tile(tile: OperandDerivation, page_rows: int) -> PagedTile:
    """The loads that fill `tile` (a K or V tile of block_rows keys) from `page_rows`-row pages, verified."""
    if tile.operand not in ("k", "v") or tile.tensor_map.kind != "row_tiles":
        raise LayoutError(f"{tile.operand}: paged loads are for K and V row tiles")
    if page_rows & (page_rows - 1) or not MIN_PAGE_ROWS <= page_rows <= MAX_PAGE_ROWS:
        raise LayoutError(f"page size {page_rows}: a power of two in {MIN_PAGE_ROWS}..{MAX_PAGE_ROWS} (a TMA box "
                          f"holds at most {MAX_PAGE_ROWS} rows)")
    recipe = tile.tensor_map
    pack = recipe.head_pack
    keys = tile.block_rows // pack
    if page_rows >= keys:
        if page_rows % keys:
            raise LayoutError(f"page size {page_rows} is not a multiple of the {keys}-key block")
        loads, box, pages, cols = (SubLoad(0, 0, 0),), recipe.box, 1, 1
    else:
        if keys % page_rows:
            raise LayoutError(f"the {keys}-key block is not a whole number of {page_rows}-row pages")
        pages, cols, rows = keys // page_rows, recipe.col_blocks, page_rows * pack
        loads = tuple(SubLoad(r, c, _lowest_byte(tile, r, rows, c)) for r in range(0, tile.block_rows, rows)
                      for c in range(cols))
        box = list(recipe.box)  # the tile's box, narrowed to one page's keys and one column block
        box[recipe.key_dim], box[recipe.col_block_dim] = page_rows, 1
        box = tuple(box)
        for load in loads:
            if load.smem_offset % SMEM_ALIGN:
                row_bytes = recipe.atom_cols * tile.elem_bytes
                raise LayoutError(
                    f"{tile.operand} from {page_rows}-row pages: the load of tile rows {load.row}.. would start at "
                    f"tile byte {load.smem_offset}, and a TMA destination must be {SMEM_ALIGN}-byte aligned (rows "
                    f"of {row_bytes} bytes under the {recipe.swizzle.name} swizzle need pages of "
                    f"{max(1, SMEM_ALIGN // row_bytes // pack)} rows or more, or a gathered load: the decode kernel's gather=True)")
    page_stride = loads[cols].smem_offset if pages > 1 else 0
    col_stride = loads[1].smem_offset if cols > 1 else 0
    paged = PagedTile(tile, page_rows, loads, box, pages, cols, page_stride, col_stride)
    found = paged.verify()
    if found:
        raise LayoutError(f"{tile.operand} from {page_rows}-row pages: {len(found)} mismatches, first {found[0]}")
    return paged


def load_origin(recipe: TensorMapRecipe, *, page, token, col_block, head) -> tuple:
    """Tensor-map coordinates (innermost first) of a paged load: page `page` (the map's batch) from its row
    `token`, column block `col_block`, head (a pack's first) `head`; numbers or C names alike."""
    origin = list(recipe.box_origin(batch_index=page, seq_start=token, head=head, seq_len=0))
    origin[recipe.col_block_dim] = col_block
    return tuple(origin)


def _lowest_byte(tile: OperandDerivation, row: int, rows: int, col_block: int) -> int:
    """The tile's lowest byte among rows [row, row + rows) of atom column block `col_block`: where a TMA box of
    them starts (the copy packs from there and swizzles; the byte of its first element is swizzled away from
    it on every row but a pattern's first)."""
    row_name, col_name = tile.coords_names
    atom = tile.tensor_map.atom_cols
    r, c = np.meshgrid(np.arange(row, row + rows), np.arange(col_block * atom, (col_block + 1) * atom), indexing="ij")
    return int(np.min(tile.layout.apply_flat({row_name: r.ravel(), col_name: c.ravel()})))
