"""Derive, and verify, every shared-memory layout a flashgen kernel stages.

For one operand tile (Q, K, V or the O epilogue tile) on one architecture this module produces the
layout (coordinates -> byte offset), its closed-form formula, the MMA descriptors that read it and the
TMA tensor map that writes it, and then proves the three agree using the independent hardware models
in ``mma`` and ``tma``. ``derive_operand`` raises ``LayoutError`` unless everything matches, so code
generation can use the numbers without re-checking them.

The staged tiles (global tensors are (B, S, H, D), D contiguous, 16-bit elements):

* Row tiles, used for Q, K and O everywhere and for V on sm_90a: ``[d_blk = col // A][row][col % A]``
  with an S-byte swizzle and A = S / element size columns per atom, i.e. each A-column block is a stack
  of S-byte rows and column blocks are ``rows * S`` bytes apart. K-major for Q and K (rows = M or N,
  cols = K), MN-major for V (rows = keys = K, cols = head dim = N), so V needs no transpose (wgmma's
  transpose bit does it).
* Key-group atoms, V on sm_100a/sm_103a (the seed's V47 layout): 8 keys x A head-dim columns form an
  8 * S-byte atom; atoms along the head dim are adjacent, then the next group of 8 keys.

S is the widest swizzle whose span divides a row of the head dim (``swizzle.widest_swizzle``): 128 B for
D = 64, 128, 192, 256 (A = 64 in 16-bit types) and 64 B for D = 96 (A = 32, 192-byte rows). When the
number of column blocks is not a power of two (3 for D = 96 and 192), or the rows are not (80, 96 or 112
keys: the first rows of a 128-row block, column blocks ``rows * S`` apart), the tile is a ``StackedLayout``
(a linear block repeated at a byte stride); otherwise ``stacked.stack`` returns one ``LinearLayout``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import sympy

from .cexpr import compile_c_expr
from .derive import closed_form, shr, to_c
from .dtypes import DTYPES, HEAD_DIMS
from .errors import LayoutError
from .linear import LinearLayout
from .mma import ARCH_DESCRIPTOR_KIND, MMA_K_BYTES, SmemDescriptor, check_footprint, mma_read_byte
from .stacked import StackedLayout, stack
from .swizzle import Swizzle, widest_swizzle
from .tma import L2_PROMOTION_BYTES, TMA_L2_PROMOTION_NAMES, TensorMapParams, place_box
from .verify import Mismatch, compare_maps

ARCHES = ("sm_90a", "sm_100a", "sm_103a")
OPERANDS = ("q", "k", "v", "o")
DTYPE_BYTES = {name: d.bytes for name, d in DTYPES.items()}
MIN_BLOCK_ROWS, MAX_BLOCK_ROWS = 8, 256
WGMMA_M = 64          # wgmma is always m64
TCGEN05_MAX_M = 128   # cta_group::1 tcgen05.mma goes up to M = 128
COORDS = {"q": ("m", "k"), "k": ("n", "k"), "v": ("k", "n"), "o": ("m", "n")}


@dataclass(frozen=True)
class TensorMapRecipe:
    """How to build the tensor map that writes this tile; ``instantiate`` fills in a real tensor."""

    kind: str                 # "row_tiles" or "key_group_atoms"
    rank: int
    box: tuple
    box_bytes: int
    swizzle: Swizzle
    dtype: str
    elem_bytes: int
    head_dim: int
    block_rows: int
    atom_cols: int            # head-dim columns per swizzle atom: the box's inner extent
    col_blocks: int           # atoms across the head dim
    dims_symbolic: tuple
    strides_symbolic: tuple
    l2_promotion_bytes: int = L2_PROMOTION_BYTES
    head_pack: int = 1        # heads one box spans: tile row p * key + h is head `head + h` of key `seq_start + key`

    def instantiate(self, *, batch: int, seq_len: int, heads: int, stride_b: int, stride_s: int,
                    stride_h: int, base_address: int = 0) -> TensorMapParams:
        """The cuTensorMapEncodeTiled arguments for a (B, S, H, D) tensor; strides in elements."""
        e, a, d_blocks = self.elem_bytes, self.atom_cols, self.col_blocks
        if self.kind == "row_tiles" and self.head_pack > 1:
            # Heads innermost after the atom's columns: a box walks a key's heads, then the next key.
            dims = (a, heads, seq_len, d_blocks, batch)
            strides = (stride_h * e, stride_s * e, a * e, stride_b * e)
        elif self.kind == "row_tiles":
            dims = (a, seq_len, d_blocks, heads, batch)
            strides = (stride_s * e, a * e, stride_h * e, stride_b * e)
        else:
            if seq_len % 8:
                raise LayoutError(f"seq_len {seq_len}: the key-group map walks keys in groups of 8")
            if batch > 1 and stride_b != seq_len * stride_s:
                raise LayoutError("the key-group map folds batch into the key-group dim, so stride_b must be seq_len * stride_s")
            dims = (a, 8, d_blocks, heads, batch * seq_len // 8)
            strides = (stride_s * e, a * e, stride_h * e, 8 * stride_s * e)
        return TensorMapParams(self.rank, dims, strides, self.box, (1,) * self.rank,
                               self.swizzle.span_bytes, e, self.dtype, base_address, self.l2_promotion_bytes)

    def box_origin(self, *, batch_index: int, seq_start: int, head: int, seq_len: int) -> tuple:
        """Tensor-map coordinates (innermost first) of the tile's first element (with a head pack, `head` is the
        pack's first head)."""
        if self.kind == "row_tiles" and self.head_pack > 1:
            return (0, head, seq_start, 0, batch_index)
        if self.kind == "row_tiles":
            return (0, seq_start, 0, head, batch_index)
        if seq_len % 8:
            raise LayoutError(f"seq_len {seq_len}: the key-group map walks keys in groups of 8")
        if isinstance(seq_start, int):
            if seq_start % 8:
                raise LayoutError(f"seq_start {seq_start}: key-group tiles start on a multiple of 8 keys")
            groups = seq_start // 8
        else:  # symbolic (a C expression's variable): the kernel keeps it a multiple of 8
            groups = shr(seq_start, 3)
        return (0, 0, 0, head, batch_index * (seq_len // 8) + groups)

    @property
    def key_dim(self) -> int:
        """The tensor-map dimension that walks a row tile's keys (read off the recipe's dims)."""
        self._need_row_tiles()
        return self.dims_symbolic.index("S")

    @property
    def col_block_dim(self) -> int:
        """The tensor-map dimension that walks the head dim's atoms (a row tile's box spans them all)."""
        self._need_row_tiles()
        return self.dims_symbolic.index(str(self.col_blocks), 1)  # past dim 0, the atom's columns

    def _need_row_tiles(self) -> None:
        if self.kind != "row_tiles":
            raise LayoutError(f"a {self.kind} map has no key and atom dimensions of its own; row tiles do")

    def describe(self) -> dict:
        return {"rank": self.rank, "dims": list(self.dims_symbolic), "strides_bytes": list(self.strides_symbolic),
                "box": list(self.box), "box_bytes": self.box_bytes, "elem_strides": [1] * self.rank,
                "swizzle": self.swizzle.name, "interleave": "none",
                "l2_promotion": TMA_L2_PROMOTION_NAMES[self.l2_promotion_bytes]}


@dataclass(frozen=True, eq=False)
class OperandDerivation:
    """Everything the kernel generator needs about one staged tile (see the module docstring)."""

    operand: str
    arch: str
    dtype: str
    elem_bytes: int
    head_dim: int
    block_rows: int
    coords: dict
    layout: LinearLayout | StackedLayout
    formula: sympy.Expr
    formula_c: str
    smem_bytes: int
    smem_align: int
    swizzle: Swizzle
    mma_major: str | None
    mma_transpose: int | None
    mma_rows: int
    mma_k: int
    tensor_map: TensorMapRecipe
    descriptor_kind: str | None = None
    _slices: tuple = field(default=(), repr=False)

    # ----- MMA descriptors -------------------------------------------------------------------

    def _row_and_k_names(self) -> tuple[str, str]:
        return (self.coords_names[1], self.coords_names[0]) if self.mma_major == "MN" else self.coords_names

    @property
    def coords_names(self) -> tuple[str, str]:
        return tuple(self.coords)

    def descriptor_objects(self) -> list[SmemDescriptor]:
        """One descriptor per K slice of ``mma_k``, for a tile placed at shared address 0."""
        if self.mma_major is None:
            return []
        row_name, k_name = self._row_and_k_names()
        return slice_descriptors(self, major=self.mma_major, row_name=row_name, k_name=k_name, row0=0,
                                 slices=self._slices)

    def descriptors(self) -> list[int]:
        """Encoded 64-bit descriptors, one per K slice; add ``smem_addr >> 4`` to bits 0-13 in the kernel."""
        return [d.encode() for d in self.descriptor_objects()]

    def descriptor_fields(self) -> dict:
        """Fields of the first slice's descriptor, plus every slice's start address (bytes)."""
        descs = self.descriptor_objects()
        if not descs:
            return {}
        fields = descs[0].fields()
        fields.update(major=self.mma_major, transpose=self.mma_transpose, footprint_rows=self.mma_rows,
                      footprint_k=self.mma_k, slice_start_bytes=[d.start_address for d in descs])
        return fields

    # ----- verification ----------------------------------------------------------------------

    def _verify_descriptors(self) -> list[Mismatch]:
        row_name, k_name = self._row_and_k_names()
        return verify_slices(self, self.descriptor_objects(), major=self.mma_major, row_name=row_name, k_name=k_name,
                             rows=self.mma_rows, row0=0, slices=self._slices)

    def check_tensor_map(self, params: TensorMapParams, origin: tuple, *, batch_index: int, seq_start: int,
                         head: int, stride_b: int, stride_s: int, stride_h: int) -> list[Mismatch]:
        """Does one TMA load with ``params`` at ``origin`` write this tile exactly where ``layout`` says?

        Element (row, col) of the tile is Q/K/V/O[batch_index, seq_start + row, head, col] of a (B, S, H, D)
        tensor with the given element strides at ``params.global_address``; the TMA model says which
        shared byte received that global address.
        """
        placed = place_box(params, origin)
        found = []
        if params.box_bytes != self.smem_bytes:
            found.append(Mismatch({}, self.smem_bytes, params.box_bytes, None, "tensor map box bytes"))
        row_name, col_name = self.coords_names
        pack = self.tensor_map.head_pack

        def global_address(c):  # tile row p * key + h: key seq_start + key of head `head + h`
            key, h = c[row_name] // pack, c[row_name] % pack
            return params.global_address + self.elem_bytes * (
                batch_index * stride_b + (seq_start + key) * stride_s + (head + h) * stride_h + c[col_name])

        found += compare_maps(self.coords, self.layout.apply_flat,
                              lambda c: placed.smem_for_global(global_address(c)),
                              decode=self.layout, check="TMA")
        return found

    def _verify_tensor_map(self) -> list[Mismatch]:
        # A small tensor with every index non-trivial: tile 2 of batch 1, head (pack) 2 of 3 or more, at an aligned base.
        pack = self.tensor_map.head_pack
        heads, batch, seq_len = 3 * pack, 2, 4 * self.block_rows
        strides = dict(stride_h=self.head_dim, stride_s=heads * self.head_dim,
                       stride_b=seq_len * heads * self.head_dim)
        params = self.tensor_map.instantiate(batch=batch, seq_len=seq_len, heads=heads, base_address=1 << 20,
                                             **strides)
        where = dict(batch_index=1, seq_start=2 * self.block_rows // pack, head=2 * pack)
        origin = self.tensor_map.box_origin(seq_len=seq_len, **where)
        return self.check_tensor_map(params, origin, **where, **strides)

    def check_formula(self, text: str) -> list[Mismatch]:
        """Mismatches between a C byte-offset formula over the coordinate names and the layout."""
        return compare_maps(self.coords, self.layout.apply_flat, compile_c_expr(text, self.coords),
                            decode=self.layout, check="formula")

    def _verify_formula(self) -> list[Mismatch]:
        return [Mismatch(m.coords, m.expected, m.actual, m.decoded, "formula_c", m.basis)
                for m in self.check_formula(self.formula_c)]

    def verify(self) -> list[Mismatch]:
        """All disagreements between the layout, its formula, the descriptor model and the TMA model."""
        return self._verify_formula() + self._verify_descriptors() + self._verify_tensor_map()


def slice_descriptors(tile: OperandDerivation, *, major: str, row_name: str, k_name: str, row0: int,
                      slices: tuple[int, ...]) -> list[SmemDescriptor]:
    """The descriptors of an MMA reading ``tile`` with ``row_name`` as its M/N and ``k_name`` as its K, from row
    ``row0``: one per K slice starting at each of ``slices``, for a tile placed at shared address 0."""
    at = lambda **c: int(tile.layout(**{row_name: row0, k_name: 0, **c}))
    if major == "K":
        # SBO: next 8-row group along M/N; a footprint of one group (N = 8) never uses it: the atom's own stride.
        sbo = at(**{row_name: row0 + 8}) - at() if tile.coords[row_name] > row0 + 8 else 8 * tile.swizzle.span_bytes
        lbo = 16                                 # unused for swizzled K-major; PTX: "assumed to be 1"
    else:
        sbo = at(**{k_name: 8}) - at()           # next 8-row group along K
        atom_cols = tile.swizzle.span_bytes // tile.elem_bytes
        # LBO: next atom along M/N; with a single atom in the footprint it is never used.
        lbo = at(**{row_name: row0 + atom_cols}) - at() if tile.coords[row_name] > row0 + atom_cols else 16
    return [SmemDescriptor(ARCH_DESCRIPTOR_KIND[tile.arch], at(**{k_name: k0}), lbo, sbo, tile.swizzle)
            for k0 in slices]


def verify_slices(tile: OperandDerivation, descriptors, *, major: str, row_name: str, k_name: str, rows: int,
                  row0: int, slices: tuple[int, ...]) -> list[Mismatch]:
    """Where the MMA model, reading through each slice's descriptor, disagrees with the tile's layout over the
    instruction's footprint (``rows`` along M/N from ``row0``, one K slice)."""
    found = []
    mma_k = MMA_K_BYTES // tile.elem_bytes
    extents = {row_name: rows, k_name: mma_k}
    footprint = {name: extents[name] for name in tile.coords}  # tile coordinate order
    for k0, desc in zip(slices, descriptors):
        check_footprint(desc, major=major, elem_bytes=tile.elem_bytes, rows=rows, k=mma_k)
        expected = lambda c, k0=k0: tile.layout.apply_flat({row_name: c[row_name] + row0, k_name: c[k_name] + k0})
        actual = lambda c, desc=desc: mma_read_byte(desc, major=major, elem_bytes=tile.elem_bytes,
                                                    row=c[row_name], k=c[k_name])
        for m in compare_maps(footprint, expected, actual, check=f"{desc.kind} k-slice {k0}" + (f", rows from {row0}" if row0 else "")):
            # Report tile coordinates, and decode the byte read to the tile element stored there.
            coords = {**m.coords, row_name: m.coords[row_name] + row0, k_name: m.coords[k_name] + k0}
            decoded = tile.layout.solve(m.actual) if 0 <= m.actual < tile.smem_bytes else None
            found.append(Mismatch(coords, m.expected, m.actual, decoded, m.check, m.basis))
    return found


@dataclass(frozen=True, eq=False)
class TileRead:
    """One wgmma operand read of a staged tile, other than the read its derivation was made for.

    The backward kernels read each tile as two operands: Q as the B of S^T = K Q^T (K-major: K runs along the
    head dim) and as the B of dK += dS^T Q (MN-major: K runs along the queries); K as the A of S^T in 64-row
    windows and as the B of dQ = dS K. A read names the tile coordinate the MMA walks as its M or N
    (``row_name``, ``rows`` of it from ``row0``) and as its K (``k_name``, 16-element slices from each of
    ``slices``); ``read_tile`` derives its descriptors and proves them against the tile's layout with the
    MMA model before returning it.
    """

    tile: OperandDerivation
    row_name: str
    k_name: str
    rows: int
    row0: int
    slices: tuple[int, ...]
    major: str

    @property
    def transpose(self) -> int:
        """The wgmma imm-trans bit of this operand: 0 K-major, 1 MN-major (16-bit types)."""
        return 0 if self.major == "K" else 1

    def descriptor_objects(self) -> list[SmemDescriptor]:
        return slice_descriptors(self.tile, major=self.major, row_name=self.row_name, k_name=self.k_name,
                                 row0=self.row0, slices=self.slices)

    def descriptors(self) -> list[int]:
        return [d.encode() for d in self.descriptor_objects()]


def read_tile(tile: OperandDerivation, *, row_name: str, k_name: str, rows: int, row0: int = 0,
              k_first: int = 0, k_extent: int | None = None) -> TileRead:
    """The read of ``tile`` with ``row_name`` as the MMA's M/N (``rows`` of it from ``row0``) and ``k_name`` as its
    K (from ``k_first`` over ``k_extent``, default the rest), verified; raises LayoutError on any mismatch."""
    if {row_name, k_name} != set(tile.coords):
        raise LayoutError(f"a read of the {tile.operand} tile names its coordinates {tuple(tile.coords)}, got "
                          f"({row_name!r}, {k_name!r})")
    if not 0 <= row0 or row0 + rows > tile.coords[row_name] or rows % 8:
        raise LayoutError(f"rows [{row0}, {row0 + rows}) of {row_name}: outside the tile's {tile.coords[row_name]} "
                          "or not whole 8-row core matrices")
    mma_k = MMA_K_BYTES // tile.elem_bytes
    k_extent = tile.coords[k_name] - k_first if k_extent is None else k_extent
    if k_first % mma_k or k_extent % mma_k or k_extent <= 0 or k_first + k_extent > tile.coords[k_name]:
        raise LayoutError(f"K range [{k_first}, {k_first + k_extent}) of {k_name}: not whole {mma_k}-element slices "
                          f"inside the tile's {tile.coords[k_name]}")
    # K-major where the MMA's K is the tile's contiguous (inner) coordinate.
    major = "K" if k_name == tile.coords_names[1] else "MN"
    read = TileRead(tile, row_name, k_name, rows, row0, tuple(range(k_first, k_first + k_extent, mma_k)), major)
    mismatches = verify_slices(tile, read.descriptor_objects(), major=major, row_name=row_name, k_name=k_name,
                               rows=rows, row0=row0, slices=read.slices)
    if mismatches:
        shown = "\n  ".join(str(m) for m in mismatches[:8])
        raise LayoutError(f"{major}-major read of the {tile.operand} tile ({row_name} {row0}+{rows}, {k_name} from "
                          f"{k_first}) fails verification:\n  {shown}")
    return read


def _check_spec(operand, arch, head_dim, block_rows, dtype) -> None:
    if operand not in OPERANDS:
        raise LayoutError(f"operand {operand!r}: expected one of {OPERANDS}")
    if arch not in ARCHES:
        raise LayoutError(f"arch {arch!r}: flashgen targets {ARCHES} (the 'a' suffix is needed for wgmma/tcgen05)")
    if dtype not in DTYPE_BYTES:
        raise LayoutError(f"dtype {dtype!r}: the MMA layouts here are derived for 16-bit {sorted(DTYPE_BYTES)}")
    if head_dim not in HEAD_DIMS:
        raise LayoutError(f"head_dim {head_dim}: supported head dims are {HEAD_DIMS} (whole swizzle atoms per row, "
                          "16-column MMA k-slices)")
    if not isinstance(block_rows, int) or block_rows < 1 or block_rows % 8:
        raise LayoutError(f"block_rows {block_rows}: must be a multiple of 8 (8-row core matrices and swizzle atoms)")
    if not MIN_BLOCK_ROWS <= block_rows <= MAX_BLOCK_ROWS:
        raise LayoutError(f"block_rows {block_rows}: must be {MIN_BLOCK_ROWS}..{MAX_BLOCK_ROWS} (8-row core matrices, TMA box <= 256)")
    if operand == "q" and arch == "sm_90a" and block_rows < WGMMA_M:
        raise LayoutError(f"block_rows {block_rows} for q on sm_90a: wgmma reads M = {WGMMA_M} rows of A")
    if operand == "v" and (block_rows < 16 or block_rows % 16):
        raise LayoutError(f"block_rows {block_rows} for v: one MMA consumes 16 keys of V (its K), so a multiple of 16")


def _tile_layouts(operand, arch, head_dim, rows, elem_bytes, swizzle):
    """(layout, tensor map kind): one swizzled atom block, stacked across the head dim (and key groups)."""
    row_name, col_name = COORDS[operand]
    span = swizzle.span_bytes
    atom_cols = span // elem_bytes
    col_blocks = head_dim // atom_cols
    atom_rows = 8
    if operand == "v" and arch != "sm_90a":
        key, col = row_name, col_name
        atom = LinearLayout.from_function({key: atom_rows, col: atom_cols}, {"byte": atom_rows * span},
                                          lambda c: c[key] * span + c[col] * elem_bytes)
        block = swizzle.layout(atom_rows * span).compose(atom)
        # Atoms along the head dim are adjacent; key groups follow one another.
        layout = stack(block, {key: rows, col: head_dim},
                       {col: atom_rows * span, key: col_blocks * atom_rows * span})
        kind = "key_group_atoms"
    else:
        # 80 rows are the first 80 of a 128-row block (a restricted domain); column blocks are 80 rows apart.
        rows_p2 = 1 << (rows - 1).bit_length()
        tile = LinearLayout.from_function({row_name: rows_p2, col_name: atom_cols}, {"byte": rows_p2 * span},
                                          lambda c: c[row_name] * span + c[col_name] * elem_bytes)
        block = swizzle.layout(rows_p2 * span).compose(tile)
        layout = stack(block, {row_name: rows, col_name: head_dim}, {col_name: rows * span})
        kind = "row_tiles"
    return layout, kind


def _recipe(kind, swizzle, head_dim, rows, elem_bytes, dtype, nbytes, l2_promotion_bytes,
            head_pack: int = 1) -> TensorMapRecipe:
    e = elem_bytes
    a = swizzle.span_bytes // e
    d_blocks = head_dim // a
    if kind == "row_tiles" and head_pack > 1:
        return TensorMapRecipe(kind, 5, (a, head_pack, rows // head_pack, d_blocks, 1), nbytes, swizzle, dtype, e,
                               head_dim, rows, a, d_blocks, (str(a), "H", "S", str(d_blocks), "B"),
                               (f"stride_h*{e}", f"stride_s*{e}", str(a * e), f"stride_b*{e}"), l2_promotion_bytes,
                               head_pack)
    if kind == "row_tiles":
        return TensorMapRecipe(kind, 5, (a, rows, d_blocks, 1, 1), nbytes, swizzle, dtype, e, head_dim, rows, a,
                               d_blocks, (str(a), "S", str(d_blocks), "H", "B"),
                               (f"stride_s*{e}", str(a * e), f"stride_h*{e}", f"stride_b*{e}"), l2_promotion_bytes)
    return TensorMapRecipe(kind, 5, (a, 8, d_blocks, 1, rows // 8), nbytes, swizzle, dtype, e, head_dim, rows, a,
                           d_blocks, (str(a), "8", str(d_blocks), "H", "B*S/8"),
                           (f"stride_s*{e}", str(a * e), f"stride_h*{e}", f"8*stride_s*{e}"), l2_promotion_bytes)


def derive_operand(operand: str, *, arch: str, head_dim: int, block_rows: int, dtype: str,
                   l2_promotion_bytes: int = L2_PROMOTION_BYTES, head_pack: int = 1) -> OperandDerivation:
    """Derive and verify the staged tile of ``operand``; raises LayoutError on any rejection. `l2_promotion_bytes`
    is its tensor map's L2 promotion (layouts.tma.TMA_L2_PROMOTION_NAMES). `head_pack` > 1 stages a K or V tile of
    that many adjacent heads from one box: its rows interleave them (row p * key + h; decode's two-head tiles)."""
    _check_spec(operand, arch, head_dim, block_rows, dtype)
    if l2_promotion_bytes not in TMA_L2_PROMOTION_NAMES:
        raise LayoutError(f"L2 promotion {l2_promotion_bytes} B: expected 0 (none), 64, 128 or 256")
    if not isinstance(head_pack, int) or head_pack < 1 or block_rows % head_pack:
        raise LayoutError(f"head_pack {head_pack!r}: a positive number of heads dividing block_rows {block_rows}")
    if head_pack > 1 and (operand not in ("k", "v") or arch != "sm_90a"):
        raise LayoutError(f"head_pack {head_pack}: only sm_90a's K and V row tiles interleave heads, not "
                          f"{operand} on {arch}")
    e = DTYPE_BYTES[dtype]
    swizzle = widest_swizzle(head_dim * e)
    layout, kind = _tile_layouts(operand, arch, head_dim, block_rows, e, swizzle)
    formula = closed_form(layout)
    nbytes = block_rows * head_dim * e
    last = int(np.max(layout.apply_flat(layout.grid())))
    if last + e != nbytes or not layout.is_injective():
        raise LayoutError(f"{operand}: the tile is not a dense {block_rows} x {head_dim} x {e}-byte buffer "
                          f"(last element at byte {last})")
    mma_k = MMA_K_BYTES // e
    if operand in ("q", "k"):
        major, transpose, slices = "K", 0, tuple(range(0, head_dim, mma_k))
        if operand == "k":
            rows = block_rows
        else:
            rows = WGMMA_M if arch == "sm_90a" else min(block_rows, TCGEN05_MAX_M)
    elif operand == "v":
        major, transpose, rows, slices = "MN", 1, head_dim, tuple(range(0, block_rows, mma_k))
    else:
        major, transpose, rows, mma_k, slices = None, None, 0, 0, ()
    derivation = OperandDerivation(
        operand=operand, arch=arch, dtype=dtype, elem_bytes=e, head_dim=head_dim, block_rows=block_rows,
        coords=dict(zip(COORDS[operand], (block_rows, head_dim))),
        layout=layout, formula=formula, formula_c=to_c(formula), smem_bytes=nbytes,
        # The swizzle pattern repeats from these boundaries; a tile anywhere else is read shifted.
        smem_align=swizzle.repeat_bytes,
        swizzle=swizzle, mma_major=major, mma_transpose=transpose, mma_rows=rows, mma_k=mma_k,
        tensor_map=_recipe(kind, swizzle, head_dim, block_rows, e, dtype, nbytes, l2_promotion_bytes, head_pack),
        descriptor_kind=ARCH_DESCRIPTOR_KIND[arch] if major else None, _slices=slices)
    mismatches = derivation.verify()
    if mismatches:
        shown = "\n  ".join(str(m) for m in mismatches[:8])
        raise LayoutError(f"{operand} on {arch} (D={head_dim}, rows={block_rows}, {dtype}) fails verification:\n  {shown}")
    return derivation
