import random

import numpy as np
import pytest
import sympy

from layouts import LayoutError, LinearLayout, Swizzle
from layouts.cexpr import compile_c_expr
from layouts.derive import band, bxor, closed_form, coord_symbol, shr, to_c


def swizzled_rows(rows, cols, span=128):
    tile = LinearLayout.from_function({"r": rows, "c": cols}, {"byte": rows * cols * 2},
                                      lambda x: x["r"] * cols * 2 + x["c"] * 2)
    return Swizzle(span).layout(rows * cols * 2).compose(tile)


def test_closed_form_of_128b_swizzled_rows():
    m, k = coord_symbol("r"), coord_symbol("c")
    # c has 6 bits, so c >> 3 needs no mask; r has 4, so its swizzle bits do.
    expected = band(k, 7) * 2 + bxor(shr(k, 3), band(m, 7)) * 16 + m * 128
    assert sympy.expand(closed_form(swizzled_rows(16, 64)) - expected) == 0
    assert to_c(closed_form(swizzled_rows(16, 64))) == "(c & 7) * 2 + ((r & 7) ^ (c >> 3)) * 16 + r * 128"


def test_closed_form_keeps_constant_offset():
    layout = LinearLayout({"x": [{"y": 2}]}, {"x": 2}, {"y": 8}, {"y": 1})
    assert to_c(closed_form(layout)) == "1 + x * 2"


def test_bitwise_functions_evaluate_on_integers():
    assert bxor(6, 3) == 5 and band(6, 3) == 2 and shr(12, 2) == 3
    assert bxor(coord_symbol("a"), coord_symbol("b")) == bxor(coord_symbol("b"), coord_symbol("a"))


@pytest.mark.parametrize("seed", range(12))
def test_random_layouts_formula_round_trips_through_c(seed):
    rng = random.Random(seed)
    rows, cols = 1 << rng.randint(0, 5), 1 << rng.randint(3, 7)
    layout = swizzled_rows(rows, cols, rng.choice([0, 32, 64, 128]))
    fn = compile_c_expr(to_c(closed_form(layout)), ["r", "c"])
    grid = layout.grid()
    assert np.array_equal(fn(grid), layout.apply_flat(grid))


def test_c_parser_follows_c_semantics():
    f = compile_c_expr("a / 2 + a % 3 - (b << 2) ^ 1 | 8 & c >> 1", ["a", "b", "c"])
    a, b, c = 7, 1, 16
    assert f({"a": a, "b": b, "c": c}) == ((a // 2 + a % 3 - (b << 2)) ^ 1) | (8 & (c >> 1))
    assert compile_c_expr("-7 / 2", [])({}) == -3
    assert compile_c_expr("-7 % 2", [])({}) == -1
    assert compile_c_expr("0x10 + 1", [])({}) == 17


@pytest.mark.parametrize("text,reason", [
    ("__import__('os')", "a function call is not allowed"),
    ("k ** 2", "the operator '\\*\\*' is not allowed"),
    ("k // 2", "the operator '//' is not allowed"),
    ("~k", "the operator '~' is not allowed"),
    ("x + 1", "unknown name 'x'"),
    ("k < 2", "the comparison '<' is not allowed"),
    ("k ? 1 : 2", "not a C integer expression"),
    ("1u + k", "not a C integer expression"),
    ("k.real", "the attribute access '.real' is not allowed"),
    ("1.5 * k", "the constant 1.5 \\(integers only\\) is not allowed"),
    ("k / 0", "division by zero"),
    ("1 << 64", "shift count 64 is over 63"),  # (1 << 99999999999 would be a 12.5 GB integer)
    ("k >> 64", "shift count 64 is over 63"),
    ("99999999999999999999999 * k", "does not fit 64 bits"),
])
def test_c_parser_rejects_everything_else(text, reason):
    with pytest.raises(LayoutError, match=reason):
        compile_c_expr(text, ["k"])({"k": 3})


def test_c_parser_names_operators_not_syntax_nodes():
    for text in ("k ** 2", "k < 2", "f(k)", "k.real", "1.5 * k", "[k]", "k if k else 1", "not k"):
        with pytest.raises(LayoutError) as info:
            compile_c_expr(text, ["k"])({"k": 3})
        for node in ("BinOp", "Compare", "Call", "Attribute", "Constant", "List", "IfExp", "UnaryOp"):
            assert node not in str(info.value), (text, str(info.value))


def test_c_parser_takes_thousands_of_terms_without_recursion():
    text = "+".join(["k"] * 2000)  # 2,000 left-nested additions: deeper than Python's recursion limit
    assert compile_c_expr(text, ["k"])({"k": 3}) == 6000
    assert compile_c_expr("-" * 1000 + "k", ["k"])({"k": 3}) == 3
