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


MAX_SHIFT = 63  # C shifts of a 64-bit value by 64 or more are undefined


def _shift_count(b):
    if np.any(np.asarray(b) < 0):
        raise LayoutError("negative shift count")
    if np.any(np.asarray(b) > MAX_SHIFT):
        raise LayoutError(f"shift count {int(np.max(b))} is over {MAX_SHIFT} (a 64-bit value)")
    return b


def _shift_left(a, b):
    return a << _shift_count(b)


def _shift_right(a, b):
    return a >> _shift_count(b)


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


# How an error names what it refuses: the operator as written, not Python's name for its syntax node.
_OPERATOR_TEXT = {
    ast.Pow: "**", ast.FloorDiv: "//", ast.MatMult: "@", ast.Invert: "~", ast.Not: "not", ast.And: "and",
    ast.Or: "or", ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
}
_ALLOWED = "only integers, the coordinate names, parentheses and + - * / % & | ^ << >>"
MAX_CONSTANT = 1 << 64


def _refuse(node, text: str) -> LayoutError:
    op = getattr(node, "op", None)
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp)) and type(op) in _OPERATOR_TEXT:
        what = f"the operator {_OPERATOR_TEXT[type(op)]!r}"
    elif isinstance(node, ast.Compare):
        what = f"the comparison {_OPERATOR_TEXT.get(type(node.ops[0]), '?')!r}"
    elif isinstance(node, ast.Call):
        what = "a function call"
    elif isinstance(node, ast.Attribute):
        what = f"the attribute access '.{node.attr}'"
    elif isinstance(node, ast.Constant):
        what = f"the constant {node.value!r} (integers only)"
    elif isinstance(node, ast.Subscript):
        what = "indexing with []"
    elif isinstance(node, ast.IfExp):
        what = "a conditional (if/else) expression"
    else:
        segment = ast.get_source_segment(text, node)
        what = repr(segment) if segment else "this syntax"
    return LayoutError(f"{what} is not allowed in a formula: {_ALLOWED}")


def compile_c_expr(text: str, names: Iterable[str]) -> Callable[[dict], object]:
    """Return ``f(coords) -> value`` for a C integer expression over the given coordinate names.

    The tree is turned into a postfix program and run on a stack, so an expression of thousands of terms needs
    no recursion; constants are at most 64-bit and shift counts 0..63, so no value can exhaust memory."""
    allowed = set(names)
    if len(text) > MAX_LENGTH:
        raise LayoutError(f"formula of {len(text)} characters is longer than {MAX_LENGTH}")
    source = text.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        shown = text if len(text) <= 80 else text[:60] + "..." + text[-10:]
        raise LayoutError(f"not a C integer expression: {shown!r} ({exc.msg})") from None
    except (RecursionError, MemoryError):
        raise LayoutError(f"formula nests too deeply to parse: {text[:40]!r}...") from None  # pragma: no cover

    # Postfix program: ("c", value) pushes a constant, ("n", name) a coordinate, ("u", sign) negates the top,
    # ("b", fn) pops two and pushes fn(left, right).
    program: list[tuple[str, object]] = []
    todo: list[tuple[ast.AST, bool]] = [(tree.body, False)]
    while todo:
        node, ready = todo.pop()
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            if ready:
                program.append(("b", _BINARY[type(node.op)]))
            else:
                todo += [(node, True), (node.right, False), (node.left, False)]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            if ready:
                program.append(("u", -1 if isinstance(node.op, ast.USub) else 1))
            else:
                todo += [(node, True), (node.operand, False)]
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            if node.value >= MAX_CONSTANT:
                raise LayoutError(f"the constant {node.value} does not fit 64 bits")
            program.append(("c", node.value))
        elif isinstance(node, ast.Name):
            if node.id not in allowed:
                raise LayoutError(f"unknown name {node.id!r} in formula; the coordinates are {sorted(allowed)}")
            program.append(("n", node.id))
        else:
            raise _refuse(node, source)

    def evaluate(env: dict):
        stack: list = []
        try:
            for kind, arg in program:
                if kind == "c":
                    stack.append(arg)
                elif kind == "n":
                    stack.append(env[arg])
                elif kind == "u":
                    stack.append(arg * stack.pop())
                else:
                    right = stack.pop()
                    stack.append(arg(stack.pop(), right))
        except (OverflowError, MemoryError) as exc:
            raise LayoutError(f"the formula's value overflows ({exc})") from None
        return stack[0]

    return evaluate
