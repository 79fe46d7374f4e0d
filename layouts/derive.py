"""Closed-form offset formulas, derived from a layout's basis images with sympy.

No formula here is typed by hand. ``closed_form`` reads a single-output ``LinearLayout`` one output
bit at a time, asks which input bits feed it, and groups consecutive output bits fed by consecutive
bits of the same coordinates into one bit field. A field fed by one coordinate is a shift and a mask
(``((k >> 3) & 7) * 16``); a field fed by several is their XOR (the swizzle term,
``(((k >> 3) & 7) ^ (m & 7)) * 16``). Fields occupy disjoint output bits, so their sum equals their
XOR and the result is an ordinary integer expression. ``to_c`` prints it with integers and
``+ * & ^ >>`` only, which every C compiler and ``cexpr`` read the same way.

Bitwise operators are sympy ``Function`` subclasses (sympy has no integer XOR) that evaluate on
integer arguments, so ``formula.subs(...)`` gives numbers and two formulas can be compared
symbolically after renaming sub-fields (see ``seed.py``).
"""

from __future__ import annotations

import sympy

from .errors import LayoutError
from .linear import LinearLayout
from .stacked import StackedLayout


class bxor(sympy.Function):
    """Integer bitwise XOR; arguments kept in canonical order so equal formulas compare equal."""

    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) ^ int(b))
        if sympy.default_sort_key(a) > sympy.default_sort_key(b):
            return cls(b, a)
        return None


class band(sympy.Function):
    """Integer bitwise AND."""

    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) & int(b))
        return None


class shr(sympy.Function):
    """Integer right shift."""

    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) >> int(b))
        return None


def coord_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def bit_field(name: str, lo: int, width: int, total_bits: int) -> sympy.Expr:
    """``(name >> lo) & (2**width - 1)``, dropping the shift or mask where they do nothing."""
    expr = coord_symbol(name)
    if lo:
        expr = shr(expr, lo)
    if lo + width < total_bits:
        expr = band(expr, (1 << width) - 1)
    return expr


def _sources(layout: LinearLayout, out_bit: int) -> frozenset:
    """The input bits (dim, i) whose basis image has ``out_bit`` set."""
    (out_name,) = layout.out_dims
    return frozenset((d, i) for d, imgs in layout.bases.items()
                     for i, img in enumerate(imgs) if img[out_name] >> out_bit & 1)


def closed_form(layout: LinearLayout | StackedLayout) -> sympy.Expr:
    """The layout as a sympy integer expression over its input coordinate names.

    A stacked layout is its block's form, with each field masked to the block's bits, plus one
    ``(x >> log2(block extent)) * stride`` term per stacked dim: ``(n >> 5) * 4096`` picks the atom.
    """
    if isinstance(layout, StackedLayout):
        # Fields keep their masks wherever a coordinate runs past the block's extent.
        bits = {d: (e - 1).bit_length() for d, e in layout.in_dims.items()}
        inner = _linear_closed_form(layout.block, bits)
        outer = [shr(coord_symbol(d), layout.block.in_dims[d].bit_length() - 1) * stride
                 for d, stride in layout.strides.items()]
        return sympy.Add(inner, *outer)
    return _linear_closed_form(layout, {d: e.bit_length() - 1 for d, e in layout.in_dims.items()})


def _linear_closed_form(layout: LinearLayout, in_bits: dict[str, int]) -> sympy.Expr:
    """``in_bits``: how many bits each coordinate really has (a mask is dropped only above the top one)."""
    if len(layout.out_dims) != 1:
        raise LayoutError("closed_form needs a single output dim; flatten_outs() first")
    (out_name, out_extent), = layout.out_dims.items()
    nbits = out_extent.bit_length() - 1
    sources = [_sources(layout, j) for j in range(nbits)]
    terms = []
    j = 0
    while j < nbits:
        if not sources[j]:
            j += 1
            continue
        width = 1
        while (j + width < nbits
               and sources[j + width] == frozenset((d, i + width) for d, i in sources[j])
               and all(i + width < in_bits[d] for d, i in sources[j])):
            width += 1
        field = None
        for d, i in sorted(sources[j]):
            part = bit_field(d, i, width, in_bits[d])
            field = part if field is None else bxor(field, part)
        terms.append(field * (1 << j))
        j += width
    offset = layout.offset[out_name]
    return sympy.Add(*terms, sympy.Integer(offset)) if terms else sympy.Integer(offset)


def to_c(expr: sympy.Expr) -> str:
    """Print a closed form as a C expression (integers, + * & ^ >> and parentheses only)."""
    if expr.is_Integer:
        if expr < 0:
            raise LayoutError("negative constants do not occur in layout formulas")
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, bxor):
        return f"({to_c(expr.args[0])} ^ {to_c(expr.args[1])})"
    if isinstance(expr, band):
        return f"({to_c(expr.args[0])} & {to_c(expr.args[1])})"
    if isinstance(expr, shr):
        return f"({to_c(expr.args[0])} >> {to_c(expr.args[1])})"
    if expr.is_Add:
        # Lowest bit field first, the order the fields sit in the address.
        args = sorted(expr.args, key=lambda t: (t.as_coeff_Mul()[0], sympy.default_sort_key(t)))
        return " + ".join(to_c(a) for a in args)
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if coeff == 1:
            raise LayoutError(f"cannot print product {expr} without a constant factor")
        return f"{to_c(rest)} * {to_c(coeff)}"
    raise LayoutError(f"cannot print {type(expr).__name__} as C: {expr}")
