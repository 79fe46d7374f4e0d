"""Mixed-radix layouts: a linear block repeated a whole number of times at an integer stride.

A ``LinearLayout`` needs power-of-two extents. Head dim 96 is three 32-column swizzle atoms and head dim 192
three 64-column atoms: each atom (a block of rows x atom columns) is GF(2)-linear, but the atom index runs over
{0, 1, 2} and block 2 sits at 2 * stride, which no XOR of basis images reaches. So the tile is written the way
the hardware walks it, as a mixed-radix number:

    col = blk * atom_cols + col_in,   byte = block(row, col_in) + blk * stride

``StackedLayout`` holds that: a single-output ``LinearLayout`` block, the logical extent of each of its input
dims, and for each dim whose extent is a multiple of the block's, the byte stride of the outer digit. A dim
may also stop short of the block's extent (80 key rows of a 128-row block): a restricted domain, on which the
block is still linear. Everything that consumes a layout (evaluation, ``solve`` to decode a byte, the closed
form in ``derive``, the exhaustive comparisons in ``verify``) works on it, and ``stack`` returns a plain
``LinearLayout`` whenever the stack happens to be GF(2)-linear, so power-of-two tiles are unchanged.

The constructor proves the stack injective on its whole domain (tiles are small: exhaustive), so blocks that
overlap are refused with the first collision. Whether the stride keeps a swizzle anchored is not this
module's business: the derivations compare against the TMA and MMA models, which swizzle absolute addresses.
"""

from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np

from .errors import LayoutError
from .linear import LinearLayout, index_grid, log2_exact

EXHAUSTIVE_LIMIT = 1 << 20


class StackedLayout:
    """``byte = block(c % E) + sum((c // E) * stride)`` over logical extents (see the module docstring)."""

    def __init__(self, block: LinearLayout, extents: Mapping[str, int], strides: Mapping[str, int] | None = None):
        if len(block.out_dims) != 1:
            raise LayoutError("a stacked layout needs a block with a single output dim; flatten_outs() first")
        strides = dict(strides or {})
        unknown = (set(extents) | set(strides)) - set(block.in_dims)
        if unknown:
            raise LayoutError(f"dims {sorted(unknown)} are not input dims of the block {list(block.in_dims)}")
        self._block = block
        self._extents: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._strides: dict[str, int] = {}
        for d, inner in block.in_dims.items():  # a stride on a dim that holds one block is never used
            extent = int(extents.get(d, inner))
            if extent > inner:
                if d not in strides:
                    raise LayoutError(f"dim {d!r}: extent {extent} exceeds the block's {inner} but has no stride")
                if extent % inner:
                    raise LayoutError(f"dim {d!r}: extent {extent} is not a whole number of {inner}-wide blocks")
                stride = int(strides[d])
                if stride <= 0:
                    raise LayoutError(f"dim {d!r}: stride {stride} must be positive")
                self._counts[d], self._strides[d] = extent // inner, stride
            elif extent < 1:
                raise LayoutError(f"dim {d!r}: extent {extent} must be at least 1")
            self._extents[d] = extent
        size = int(np.prod(list(self._extents.values()), dtype=np.int64))
        if size > EXHAUSTIVE_LIMIT:
            raise LayoutError(f"domain of {size} points exceeds the exhaustive-check limit {EXHAUSTIVE_LIMIT}")
        values = np.asarray(self.apply_flat(self.grid()), dtype=np.int64)
        unique, counts = np.unique(values, return_counts=True)
        if unique.size != values.size:
            byte = int(unique[np.nonzero(counts > 1)[0][0]])
            hits = np.nonzero(values == byte)[0][:2]
            grid = self.grid()
            a, b = ({d: int(grid[d][i]) for d in self._extents} for i in hits)
            raise LayoutError(f"stacked blocks overlap: {a} and {b} both map to byte {byte}")
        self._size = int(values.max()) + 1

    # ----- accessors -------------------------------------------------------------------------

    @property
    def block(self) -> LinearLayout:
        return self._block

    @property
    def in_dims(self) -> dict[str, int]:
        """Logical extents (any positive integers)."""
        return dict(self._extents)

    @property
    def out_dims(self) -> dict[str, int]:
        return {self._out_name: self._size}

    @property
    def strides(self) -> dict[str, int]:
        """Byte stride of the outer digit of each stacked dim."""
        return dict(self._strides)

    @property
    def counts(self) -> dict[str, int]:
        """How many blocks each stacked dim holds."""
        return dict(self._counts)

    @property
    def in_size(self) -> int:
        return int(np.prod(list(self._extents.values()), dtype=np.int64))

    @property
    def out_size(self) -> int:
        """One past the largest byte the domain reaches."""
        return self._size

    @property
    def _out_name(self) -> str:
        return next(iter(self._block.out_dims))

    def grid(self) -> dict[str, np.ndarray]:
        """Every point of the logical domain as flat numpy arrays, first dim varying fastest."""
        return index_grid(self._extents)

    # ----- evaluation ------------------------------------------------------------------------

    def apply_flat(self, coords: Mapping[str, object]):
        if set(coords) != set(self._extents):
            raise LayoutError(f"coordinates {sorted(coords)} do not match input dims {list(self._extents)}")
        inner, outer = {}, 0
        for d, extent in self._extents.items():
            v = coords[d]
            lo, hi = (int(np.min(v)), int(np.max(v))) if np.ndim(v) else (int(v), int(v))
            if lo < 0 or hi >= extent:
                raise LayoutError(f"coordinate {d} out of range [0, {extent})")
            if d in self._counts:
                e = self._block.in_dims[d]
                inner[d], outer = v % e, outer + (v // e) * self._strides[d]
            else:
                inner[d] = v
        return self._block.apply_flat(inner) + outer

    def apply(self, coords: Mapping[str, object]) -> dict[str, object]:
        return {self._out_name: self.apply_flat(coords)}

    def __call__(self, **coords):
        return self.apply_flat(coords)

    def solve(self, output) -> dict[str, int] | None:
        """The point mapping to ``output`` (an int or ``{out: int}``), or None: the decoder of a byte read."""
        value = int(output[self._out_name] if isinstance(output, Mapping) else output)
        names = list(self._counts)
        for digits in itertools.product(*(range(self._counts[d]) for d in names)):
            rest = value - sum(k * self._strides[d] for d, k in zip(names, digits))
            if not 0 <= rest < self._block.out_size:
                continue
            point = self._block.solve(rest)
            if point is None or any(point[d] >= self._extents[d] for d in self._extents if d not in self._counts):
                continue
            for d, k in zip(names, digits):
                point[d] += k * self._block.in_dims[d]
            return point
        return None

    def is_injective(self) -> bool:
        return True  # proven exhaustively by the constructor

    def contiguous_run(self, dim: str, unit: int) -> int:
        """The largest 2**r such that, from every point whose ``dim`` is a multiple of 2**r, the next 2**r values
        of ``dim`` land on consecutive ``unit``-sized slots starting at a multiple of ``unit << r``: the widest
        vector a thread may move along ``dim`` (8 halves under the 64 B and 128 B swizzles). Checked on every
        point; a run never crosses a block, whose extent is a power of two."""
        log2_exact(unit, "contiguous_run unit")
        grid = self.grid()
        base = np.asarray(self.apply_flat(grid))
        r = self._block.in_dims[dim].bit_length() - 1
        while r:
            step = 1 << r
            starts = np.nonzero((grid[dim] % step == 0) & (grid[dim] + step <= self._extents[dim]))[0]
            ok = starts.size and not np.any(base[starts] % (unit << r))
            for i in range(1, step):
                if not ok:
                    break
                moved = {d: v[starts] + (i if d == dim else 0) for d, v in grid.items()}
                ok = np.array_equal(np.asarray(self.apply_flat(moved)), base[starts] + i * unit)
            if ok:
                break
            r -= 1
        return 1 << r

    # ----- the linear case -------------------------------------------------------------------

    def as_linear(self) -> LinearLayout | None:
        """The equal ``LinearLayout``, if this stack is one: power-of-two extents whose outer digits land on
        bits no block image uses. Checked on every point, not inferred."""
        if any(e & (e - 1) for e in self._extents.values()):
            return None
        out = self._out_name
        bases = {}
        for d, images in self._block.bases.items():
            if d in self._counts:
                bases[d] = images + [{out: self._strides[d] << j} for j in range(log2_exact(self._counts[d], d))]
            else:  # a power-of-two restriction keeps the low bits
                bases[d] = images[:log2_exact(self._extents[d], d)]
        extent = 1 << max(self._size - 1, 1).bit_length()
        try:
            linear = LinearLayout(bases, self._extents, {out: extent}, self._block.offset)
        except LayoutError:
            return None
        grid = self.grid()
        if not np.array_equal(np.asarray(linear.apply_flat(grid)), np.asarray(self.apply_flat(grid))):
            return None
        return linear

    # ----- comparison ------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StackedLayout):
            return NotImplemented
        return (self._block == other._block and list(self._extents.items()) == list(other._extents.items())
                and self._strides == other._strides)

    def __hash__(self) -> int:
        return hash((self._block, tuple(self._extents.items()), tuple(sorted(self._strides.items()))))

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}[{e}]" + (f" = {self._counts[d]} x {self._block.in_dims[d]} @ {self._strides[d]} B"
                                         if d in self._counts else "") for d, e in self._extents.items())
        return f"StackedLayout({dims}; block {self._block!r})"


def stack(block: LinearLayout, extents: Mapping[str, int],
          strides: Mapping[str, int] | None = None) -> LinearLayout | StackedLayout:
    """The block stacked to ``extents``; a plain ``LinearLayout`` when that is what it is."""
    stacked = StackedLayout(block, extents, strides)
    return stacked.as_linear() or stacked
