"""GF(2)-linear layouts: maps between named bit-vector spaces, stored as basis images.

Why a linear layout
-------------------
Every tile in a flashgen kernel has power-of-two extents, and every shared-memory swizzle is an XOR of
address bit fields. A map from logical coordinates (row, col) to a byte offset built from such pieces
is therefore *linear over GF(2)*: view each coordinate as a vector of bits; then the output bits are
XORs of input bits. Integer addition of disjoint bit fields (``row * 128 + col * 2`` with ``col < 64``)
is the same thing as XOR, so ordinary strided layouts are linear too. A linear map is fully known
once we know where each *basis vector* goes (a coordinate with exactly one bit set). That is what the
seed's probe measured on silicon: it set one element of V to 1 and watched where it came out.

Representation
--------------
A ``LinearLayout`` has

* ordered **input dims**, each with a power-of-two extent, e.g. ``{"m": 64, "k": 128}``;
* ordered **output dims**, each with a power-of-two extent, e.g. ``{"byte": 16384}``;
* ``bases[in_dim][i]``: the image of the input in which only bit ``i`` of ``in_dim`` is set, as a
  dict ``{out_dim: value}``. There are exactly ``log2(extent)`` images per input dim;
* an ``offset``: a constant output XORed onto every result, making the map affine.

Evaluation XORs the images of all set input bits, then XORs the offset. Because the images are the
whole truth, composition, inversion, rank and equality are plain bit-matrix algebra (Gaussian
elimination over GF(2)) and need no knowledge of where a layout came from.

Why the offset is an XOR, not an addition: affine maps over GF(2) are ``x -> A x ^ b``, and only this
form composes and inverts in closed form. It equals "base address + offset" exactly when the base is
aligned to the layout's span (its set bits lie above every image bit); ``placed_at`` checks that
alignment instead of silently computing a wrong address. That is the same rule as the swizzle anchor:
a 128-byte-swizzled tile must start on a 1024-byte boundary.

Invariants (checked in the constructor, so every instance obeys them)
---------------------------------------------------------------------
* all extents are powers of two >= 1 (a non-power-of-two extent has no bit-vector form; pad the tile);
* each input dim has exactly ``log2(extent)`` images, and every image value lies inside its output
  dim's extent, as does the offset;
* dim names are unique strings.

Outputs are concatenated "first output dim in the lowest bits" whenever a single integer is needed
(``flatten_outs``); inputs likewise. Evaluation accepts Python ints or numpy integer arrays, so the
same object is used for one probe and for an exhaustive check of a 256 x 256 tile.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from .errors import LayoutError


def log2_exact(extent: int, what: str) -> int:
    """log2 of a power of two, or LayoutError explaining why anything else is refused."""
    if not isinstance(extent, (int, np.integer)) or isinstance(extent, bool):
        raise LayoutError(f"{what}: extent {extent!r} is not an integer")
    if extent < 1 or extent & (extent - 1):
        raise LayoutError(
            f"{what}: extent {extent} is not a power of two; a GF(2)-linear layout maps bit vectors, "
            "so every extent must be 2**n (pad the tile to the next power of two)"
        )
    return int(extent).bit_length() - 1


def index_grid(extents: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Every point of a box with these extents as flat numpy arrays, the first dim varying fastest."""
    names = list(extents)
    # np.indices varies its last axis fastest, so list the dims in reverse.
    idx = np.indices([extents[d] for d in reversed(names)], dtype=np.int64).reshape(len(names), -1)
    return {d: idx[len(names) - 1 - p] for p, d in enumerate(names)}


class LinearLayout:
    """An affine map over GF(2) between named, ordered, power-of-two dims (see module docstring)."""

    def __init__(
        self,
        bases: Mapping[str, Sequence[Mapping[str, int]]],
        in_dims: Mapping[str, int],
        out_dims: Mapping[str, int],
        offset: Mapping[str, int] | None = None,
    ):
        self._in = {str(k): int(v) for k, v in in_dims.items()}
        self._out = {str(k): int(v) for k, v in out_dims.items()}
        self._in_bits = {d: log2_exact(e, f"input dim {d!r}") for d, e in self._in.items()}
        self._out_bits = {d: log2_exact(e, f"output dim {d!r}") for d, e in self._out.items()}
        if set(bases) != set(self._in):
            raise LayoutError(f"bases name dims {sorted(bases)} but the input dims are {list(self._in)}")
        self._bases: dict[str, tuple[dict[str, int], ...]] = {}
        for d in self._in:
            images = [self._check_out_value(img, f"image of {d}=2**{i}") for i, img in enumerate(bases[d])]
            if len(images) != self._in_bits[d]:
                raise LayoutError(
                    f"input dim {d!r} of extent {self._in[d]} needs {self._in_bits[d]} basis images, "
                    f"got {len(images)}"
                )
            self._bases[d] = tuple(images)
        self._offset = self._check_out_value(offset or {}, "offset")
        # Flat forms (first out dim in the low bits) make the GF(2) algebra one-integer-per-vector.
        self._out_shift: dict[str, int] = {}
        shift = 0
        for d in self._out:
            self._out_shift[d] = shift
            shift += self._out_bits[d]
        self._flat_images = {d: [self._flatten(img) for img in self._bases[d]] for d in self._in}
        self._flat_offset = self._flatten(self._offset)

    def _check_out_value(self, value: Mapping[str, int], what: str) -> dict[str, int]:
        unknown = set(value) - set(self._out)
        if unknown:
            raise LayoutError(f"{what} names unknown output dims {sorted(unknown)}")
        checked = {}
        for d, extent in self._out.items():
            v = int(value.get(d, 0))
            if not 0 <= v < extent:
                raise LayoutError(f"{what}: {d}={v} lies outside the output extent {extent}")
            checked[d] = v
        return checked

    def _flatten(self, value: Mapping[str, int]) -> int:
        return sum(int(value.get(d, 0)) << self._out_shift[d] for d in self._out)

    def _unflatten(self, flat):
        return {d: (flat >> self._out_shift[d]) & (self._out[d] - 1) for d in self._out}

    # ----- construction helpers -------------------------------------------------------------

    @classmethod
    def identity(cls, dims: Mapping[str, int]) -> "LinearLayout":
        """The map sending every dim to itself."""
        bases = {d: [{d: 1 << i} for i in range(log2_exact(e, f"dim {d!r}"))] for d, e in dims.items()}
        return cls(bases, dims, dims)

    @classmethod
    def from_function(
        cls,
        in_dims: Mapping[str, int],
        out_dims: Mapping[str, int],
        fn: Callable[[dict], object],
        *,
        exhaustive_limit: int = 1 << 20,
    ) -> "LinearLayout":
        """Read the basis images off ``fn`` and prove ``fn`` is affine on every point.

        ``fn`` takes ``{in_dim: value}`` (ints or numpy arrays) and returns ``{out_dim: value}`` or,
        with one output dim, a bare integer. A formula whose bit fields overlap (``row * 96 + col``)
        is not GF(2)-linear; it is rejected here with the first point where it disagrees with the
        linear map its basis vectors predict. Domains larger than ``exhaustive_limit`` points are
        refused rather than checked partially.
        """
        out_names = list(out_dims)

        def call(coords):
            result = fn(coords)
            if not isinstance(result, Mapping):
                if len(out_names) != 1:
                    raise LayoutError("fn returned a bare value but there are several output dims")
                result = {out_names[0]: result}
            return result

        zero = {d: 0 for d in in_dims}
        origin = call(zero)
        offset = {d: int(v) for d, v in origin.items()}
        bases = {}
        for d, extent in in_dims.items():
            images = []
            for i in range(log2_exact(extent, f"input dim {d!r}")):
                image = call({**zero, d: 1 << i})
                images.append({o: int(image.get(o, 0)) ^ offset.get(o, 0) for o in out_names})
            bases[d] = images
        layout = cls(bases, in_dims, out_dims, offset)
        size = int(np.prod([int(e) for e in in_dims.values()], dtype=np.int64))
        if size > exhaustive_limit:
            raise LayoutError(f"domain of {size} points exceeds the exhaustive-check limit {exhaustive_limit}")
        grid = layout.grid()
        want = call(grid)
        got = layout.apply(grid)
        for o in out_names:
            bad = np.nonzero(np.asarray(want[o]) != got[o])[0]
            if bad.size:
                at = {d: int(grid[d][bad[0]]) for d in in_dims}
                raise LayoutError(
                    f"not GF(2)-linear: at {at} the function gives {o}={int(np.asarray(want[o])[bad[0]])} "
                    f"but its basis vectors predict {int(got[o][bad[0]])} (bit fields overlap or carry)"
                )
        return layout

    # ----- accessors -------------------------------------------------------------------------

    @property
    def in_dims(self) -> dict[str, int]:
        return dict(self._in)

    @property
    def out_dims(self) -> dict[str, int]:
        return dict(self._out)

    @property
    def bases(self) -> dict[str, list[dict[str, int]]]:
        return {d: [dict(img) for img in imgs] for d, imgs in self._bases.items()}

    @property
    def offset(self) -> dict[str, int]:
        return dict(self._offset)

    @property
    def in_size(self) -> int:
        return 1 << sum(self._in_bits.values())

    @property
    def out_size(self) -> int:
        return 1 << sum(self._out_bits.values())

    def grid(self) -> dict[str, np.ndarray]:
        """Every input point as flat numpy arrays, first input dim varying fastest."""
        return index_grid(self._in)

    # ----- evaluation ------------------------------------------------------------------------

    def apply_flat(self, coords: Mapping[str, object]):
        """Evaluate to the flattened output integer (or array of them)."""
        if set(coords) != set(self._in):
            raise LayoutError(f"coordinates {sorted(coords)} do not match input dims {list(self._in)}")
        acc = self._flat_offset
        for d, images in self._flat_images.items():
            v = coords[d]
            lo, hi = (int(np.min(v)), int(np.max(v))) if np.ndim(v) else (int(v), int(v))
            if lo < 0 or hi >= self._in[d]:
                raise LayoutError(f"coordinate {d} out of range [0, {self._in[d]})")
            for i, img in enumerate(images):
                if img:
                    acc = acc ^ (((v >> i) & 1) * img)
        return acc

    def apply(self, coords: Mapping[str, object]) -> dict[str, object]:
        """Evaluate; returns ``{out_dim: value}`` (ints, or numpy arrays for array inputs)."""
        return self._unflatten(self.apply_flat(coords))

    def __call__(self, **coords):
        """Shorthand for single-output layouts: ``layout(m=3, k=5) -> int``."""
        if len(self._out) != 1:
            raise LayoutError("call syntax needs exactly one output dim; use apply()")
        return self.apply_flat(coords)

    # ----- algebra ---------------------------------------------------------------------------

    def _columns(self) -> list[int]:
        return [img for d in self._in for img in self._flat_images[d]]

    def rank(self) -> int:
        """Dimension of the image of the linear part (Gaussian elimination over GF(2))."""
        pivots: dict[int, int] = {}
        for col in self._columns():
            while col:
                top = col.bit_length() - 1
                if top not in pivots:
                    pivots[top] = col
                    break
                col ^= pivots[top]
        return len(pivots)

    def is_injective(self) -> bool:
        return self.rank() == sum(self._in_bits.values())

    def is_surjective(self) -> bool:
        return self.rank() == sum(self._out_bits.values())

    def is_bijective(self) -> bool:
        return self.is_injective() and self.is_surjective()

    def contiguous_run(self, dim: str, unit: int) -> int:
        """The largest 2**r such that, for every input, the 2**r values of ``dim`` from a multiple of 2**r land
        on consecutive ``unit``-sized slots of the flat output: ``dim``'s bit i maps to ``unit << i`` for
        i < r, and nothing else (other bits, other dims, the offset) touches those low output bits. This is
        the widest vector a thread may move along ``dim`` (e.g. 8 halves = 16 bytes under a 128 B swizzle)."""
        log2_exact(unit, "contiguous_run unit")
        images = self._flat_images[dim]
        r = 0
        while r < len(images) and images[r] == unit << r:
            r += 1
        while r:
            low = (unit << r) - 1
            others = [img for d in self._in for i, img in enumerate(self._flat_images[d]) if d != dim or i >= r]
            if not any(img & low for img in others + [self._flat_offset]):
                break
            r -= 1
        return 1 << r

    def compose(self, inner: "LinearLayout") -> "LinearLayout":
        """``self o inner``: first apply ``inner``, then ``self``. ``inner``'s outputs feed ``self``."""
        if inner.out_dims != self.in_dims:
            raise LayoutError(
                f"cannot compose: inner outputs {inner.out_dims} differ from outer inputs {self.in_dims}"
            )
        linear_self = LinearLayout(self._bases, self._in, self._out)
        bases = {d: [linear_self.apply(img) for img in imgs] for d, imgs in inner._bases.items()}
        offset = self.apply(inner.offset)
        return LinearLayout(bases, inner.in_dims, self.out_dims, offset)

    def _pivots(self) -> dict[int, tuple[int, int]]:
        """Row-reduced columns: top output bit -> (image, set of input bits producing it)."""
        pivots: dict[int, tuple[int, int]] = {}
        for j, col in enumerate(self._columns()):
            combo = 1 << j
            while col:
                top = col.bit_length() - 1
                if top not in pivots:
                    pivots[top] = (col, combo)
                    break
                col, combo = col ^ pivots[top][0], combo ^ pivots[top][1]
        return pivots

    def _solve_linear(self, pivots, target: int) -> dict[str, int] | None:
        combo = 0
        while target:
            top = target.bit_length() - 1
            if top not in pivots:
                return None
            col, c = pivots[top]
            target, combo = target ^ col, combo ^ c
        coords, shift = {}, 0
        for d in self._in:
            coords[d] = (combo >> shift) & (self._in[d] - 1)
            shift += self._in_bits[d]
        return coords

    def solve(self, output) -> dict[str, int] | None:
        """An input mapping to ``output`` (an int for one output dim, else a dict), or None if none does.

        For an injective layout the answer is the unique preimage: this is how a byte the hardware
        read is decoded back to the element stored there.
        """
        flat = self._flatten(output if isinstance(output, Mapping) else {next(iter(self._out)): output})
        return self._solve_linear(self._pivots(), flat ^ self._flat_offset)

    def invert(self) -> "LinearLayout":
        """The inverse map; only bijective layouts have one."""
        if not self.is_bijective():
            raise LayoutError(
                f"layout is not bijective (rank {self.rank()}, {sum(self._in_bits.values())} input bits, "
                f"{sum(self._out_bits.values())} output bits); it has no inverse"
            )
        pivots = self._pivots()
        bases = {d: [self._solve_linear(pivots, 1 << (self._out_shift[d] + i)) for i in range(self._out_bits[d])]
                 for d in self._out}
        return LinearLayout(bases, self._out, self._in, self._solve_linear(pivots, self._flat_offset))

    def flatten_outs(self, name: str = "byte") -> "LinearLayout":
        """Merge all output dims into one (first output dim in the lowest bits)."""
        bases = {d: [{name: f} for f in fl] for d, fl in self._flat_images.items()}
        return LinearLayout(bases, self._in, {name: self.out_size}, {name: self._flat_offset})

    def placed_at(self, base: int, *, out_dim: str | None = None) -> "LinearLayout":
        """Add ``base`` to every output, allowed only when that equals XOR (base aligned to the span)."""
        if len(self._out) != 1:
            raise LayoutError("placed_at needs a single output dim; flatten_outs() first")
        (name, extent), = self._out.items()
        if base % extent:
            raise LayoutError(
                f"base {base} is not a multiple of the layout span {extent}: adding it would carry into "
                "the layout's bits, which an XOR offset cannot express (and which would shift any swizzle)"
            )
        new_extent = 1 << max(extent.bit_length() - 1, (base + extent - 1).bit_length())
        bases = {d: [dict(img) for img in imgs] for d, imgs in self._bases.items()}
        return LinearLayout(bases, self._in, {out_dim or name: new_extent},
                            {out_dim or name: self._offset[name] ^ base})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinearLayout):
            return NotImplemented
        return (list(self._in.items()) == list(other._in.items())
                and list(self._out.items()) == list(other._out.items())
                and self._bases == other._bases and self._offset == other._offset)

    def __hash__(self) -> int:
        return hash((tuple(self._in.items()), tuple(self._out.items()), self._flat_offset,
                     tuple(tuple(v) for v in self._flat_images.values())))

    def __repr__(self) -> str:
        parts = []
        for d, imgs in self._bases.items():
            shown = ", ".join(str(self._flatten(i)) if len(self._out) == 1 else str(i) for i in imgs)
            parts.append(f"{d}[{self._in[d]}]: [{shown}]")
        off = f", offset={self._offset}" if self._flat_offset else ""
        return f"LinearLayout({'; '.join(parts)} -> {self._out}{off})"
