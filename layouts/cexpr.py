"""Parse and evaluate a C integer expression safely (no ``eval``).

Formulas cross a trust boundary twice: templates render ``formula_c`` into CUDA, and
``gen.py layout --check-formula`` accepts one from a user. Both are checked by evaluating the text
itself. Python's parser reads these expressions with C's meaning because the two languages rank
``* / %`` above ``+ -`` above ``<< >>`` above ``&`` above ``^`` above ``|`` identically; anything
outside that small grammar (calls, names we did not declare, casts, ``?:``, ``**``, comparisons,
suffixes like ``1u``) is rejected by a whitelist walk of the syntax tree. ``/`` and ``%`` follow C:
quotient truncated toward zero, remainder with the sign of the dividend.
"""

from __future__ import annotations

import ast
from typing import Callable, Iterable

import numpy as np

from .errors import LayoutError

MAX_LENGTH = 4096


def _c_div(a, b):
    q = abs(a) // abs(b)
    return np.where((a < 0) != (b < 0), -q, q) if np.ndim(a) or np.ndim(b) else (-q if (a < 0) != (b < 0) else q)


def _c_mod(a, b):
    return a - _c_div(a, b) * b


def _shift_left(a, b):
    if np.any(np.asarray(b) < 0):
        raise LayoutError("negative shift count")
    return a << b


def _shift_right(a, b):
    if np.any(np.asarray(b) < 0):
        raise LayoutError("negative shift count")
    return a >> b


def _check_divisor(b):
    if np.any(np.asarray(b) == 0):
        raise LayoutError("division by zero in the formula")
    return b


_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: _c_div(a, _check_divisor(b)),
    ast.Mod: lambda a, b: _c_mod(a, _check_divisor(b)),
    ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitXor: lambda a, b: a ^ b,
    ast.LShift: _shift_left,
    ast.RShift: _shift_right,
}


def compile_c_expr(text: str, names: Iterable[str]) -> Callable[[dict], object]:
    """Return ``f(coords) -> value`` for a C integer expression over the given coordinate names."""
    allowed = set(names)
    if len(text) > MAX_LENGTH:
        raise LayoutError(f"formula of {len(text)} characters is longer than {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise LayoutError(f"not a C integer expression: {text!r} ({exc.msg})") from None

    def build(node) -> Callable[[dict], object]:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            op, left, right = _BINARY[type(node.op)], build(node.left), build(node.right)
            return lambda env: op(left(env), right(env))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner, sign = build(node.operand), -1 if isinstance(node.op, ast.USub) else 1
            return lambda env: sign * inner(env)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
            return lambda env: value
        if isinstance(node, ast.Name):
            if node.id not in allowed:
                raise LayoutError(f"unknown name {node.id!r} in formula; the coordinates are {sorted(allowed)}")
            name = node.id
            return lambda env: env[name]
        raise LayoutError(
            f"{type(node).__name__} is not allowed in a formula: only integers, the coordinate names, "
            "parentheses and + - * / % & | ^ << >>"
        )

    return build(tree.body)
