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


def test_row_rel_err_sees_one_wrong_row_that_the_global_error_hides():
    torch = pytest.importorskip("torch")
    from codegen.check import rel_err, row_rel_err

    ref = torch.ones(2, 1000, 4, 8, dtype=torch.float64)  # (B, S, H, D): rows of norm sqrt(8)
    x = ref.clone()
    x[1, 500, 2] = -1.0  # one row of 8000 negated: its own error is 2
    assert row_rel_err(x, ref) == 2.0
    assert rel_err(x, ref) < 0.03
    x = ref.clone()
    x[0, 0, 0, 0] += 0.5
    assert row_rel_err(x, ref) == pytest.approx(0.5 / 8 ** 0.5)
    ref[0, 7, 1] = 0.0  # a row without keys: its absolute error counts
    x = ref.clone()
    assert row_rel_err(x, ref) == 0.0
    x[0, 7, 1, 3] = 1e-3
    assert row_rel_err(x, ref) == pytest.approx(1e-3)
    x[0, 7, 1, 3] = float("nan")
    assert row_rel_err(x, ref) == float("inf")
    assert row_rel_err(ref[:, :0], ref[:, :0]) == 0.0


def test_accuracy_failure_bounds_the_whole_tensor_and_the_worst_row():
    torch = pytest.importorskip("torch")
    from codegen.check import accuracy_failure, reference, same_dtype_output

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 300, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    ref, _ = reference(q, k, v, causal=True)
    same_dtype = same_dtype_output(q, k, v, causal=True)
    assert accuracy_failure(same_dtype, ref, same_dtype) is None
    off_row = same_dtype.clone()
    off_row[0, 123, 2] *= 1.03  # one row in 1200: the global error stays within 2x, the row's does not
    failure = accuracy_failure(off_row, ref, same_dtype)
    assert failure is not None and failure.startswith("worst row's rel err") and "worst at (0, 123, 2," in failure
    off_all = (same_dtype.double() * 1.01).to(torch.bfloat16)
    assert accuracy_failure(off_all, ref, same_dtype).startswith("rel err")
    assert accuracy_failure(same_dtype, ref, ref.to(torch.bfloat16), floor=0.5) is None  # the floor holds
