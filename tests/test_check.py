"""codegen.check's failure report (CPU torch)."""

import pytest


def test_worst_element_names_the_index_and_whether_the_value_is_misplaced():
    torch = pytest.importorskip("torch")
    from codegen.check import worst_element

    ref = torch.arange(64, dtype=torch.float64).reshape(2, 4, 8) / 8  # distinct, exact in f16
    x = ref.half()
    x[1, 2, 3] = 100.0  # found nowhere in ref
    assert worst_element(x, ref).startswith("worst at (1, 2, 3): 100.0 vs 6.375")
    assert "does not occur elsewhere" in worst_element(x, ref)
    x = ref.half()
    x[1, 2, 3] = x[0, 0, 0]  # another element's value: stale or misplaced data
    assert "worst at (1, 2, 3)" in worst_element(x, ref) and "occurs elsewhere" in worst_element(x, ref)
    x[0, 1, 1] = float("nan")
    assert worst_element(x, ref).startswith("worst at (0, 1, 1): nan")
