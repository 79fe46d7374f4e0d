"""Compare two coordinate -> byte maps, the way the seed's probe did.

``compare_maps`` first injects the origin and every basis vector (one coordinate bit set), then, for
tiles small enough (all flashgen tiles are), every point at once with numpy. A mismatch says what was
injected, where it should land, where the other map put it, and, decoding that byte with the expected
layout, which element the hardware would see there::

    inject (k=1, n=0): expected byte 144, model reads byte 128 (n off by 8)

Basis-vector mismatches are reported first because for a linear map they are the whole story; the
exhaustive pass catches maps that are not linear at all (a carry between overlapping fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from .errors import LayoutError
from .linear import LinearLayout
from .stacked import StackedLayout

EXHAUSTIVE_LIMIT = 1 << 16


@dataclass(frozen=True)
class Mismatch:
    """One injected coordinate whose two maps disagree."""

    coords: dict
    expected: int
    actual: int
    decoded: dict | None = None  # the element that the expected layout stores at ``actual``
    check: str = ""
    basis: bool = field(default=False)

    def __str__(self) -> str:
        at = ", ".join(f"{k}={v}" for k, v in self.coords.items())
        where = f"model reads byte {self.actual}" if self.actual >= 0 else "model never places it"
        if self.decoded is None:
            note = "no tile element is stored there" if self.actual >= 0 else "not copied"
        else:
            diffs = [f"{k} off by {self.decoded[k] - v}" for k, v in self.coords.items() if self.decoded[k] != v]
            note = ", ".join(diffs) or "same element"
        prefix = f"{self.check}: " if self.check else ""
        return f"{prefix}inject ({at}): expected byte {self.expected}, {where} ({note})"


def basis_points(extents: Mapping[str, int]) -> list[dict]:
    """The origin, then each coordinate with exactly one bit set, in dim order (every power of two below the
    extent, so a 96-wide dim injects 64 too)."""
    zero = {d: 0 for d in extents}
    points = [zero]
    for d, e in extents.items():
        points += [{**zero, d: 1 << i} for i in range((e - 1).bit_length())]
    return points


def compare_maps(
    extents: Mapping[str, int],
    expected: Callable[[dict], object],
    actual: Callable[[dict], object],
    *,
    decode: LinearLayout | StackedLayout | None = None,
    check: str = "",
    max_report: int = 16,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
) -> list[Mismatch]:
    """Mismatches between ``expected`` and ``actual`` over every point of the given extents."""
    names = list(extents)
    def decoded(byte: int):
        if decode is None or not 0 <= byte < decode.out_size:
            return None
        return decode.solve(byte)

    def mismatch(point, e, a, is_basis):
        return Mismatch({d: int(point[d]) for d in names}, int(e), int(a), decoded(int(a)), check, is_basis)

    found = []
    seen = set()
    for p in basis_points(extents):
        e, a = int(expected(p)), int(actual(p))
        seen.add(tuple(p[d] for d in names))
        if e != a:
            found.append(mismatch(p, e, a, True))
    size = int(np.prod(list(extents.values())))
    if size > exhaustive_limit:
        raise LayoutError(f"tile of {size} points exceeds the exhaustive limit {exhaustive_limit}")
    idx = np.indices([extents[d] for d in reversed(names)], dtype=np.int64).reshape(len(names), -1)
    grid = {d: idx[len(names) - 1 - p] for p, d in enumerate(names)}
    e_all = np.broadcast_to(np.asarray(expected(grid), dtype=np.int64), idx.shape[1:])
    a_all = np.broadcast_to(np.asarray(actual(grid), dtype=np.int64), idx.shape[1:])
    for pos in np.nonzero(e_all != a_all)[0]:
        point = {d: int(grid[d][pos]) for d in names}
        if tuple(point[d] for d in names) in seen:
            continue
        if len(found) >= max_report:
            break
        found.append(mismatch(point, e_all[pos], a_all[pos], False))
    return found
