"""Every input check of codegen.attention raises a clear InputError before any launch (CPU tensors)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from codegen.api import InputError, attention  # noqa: E402


def qkv(shape=(1, 128, 2, 128), dtype=torch.float16):
    return [torch.randn(shape, dtype=dtype) for _ in range(3)]


def test_rank():
    q, k, v = qkv()
    with pytest.raises(InputError, match="rank 4"):
        attention(q[0], k[0], v[0])


def test_dtype_unsupported():
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(InputError, match="float32"):
        attention(q, k, v)


def test_dtype_mismatch():
    q, k, v = qkv()
    with pytest.raises(InputError, match="one dtype"):
        attention(q, k.bfloat16(), v)


def test_k_and_v_shapes_differ():
    q, k, v = qkv()
    with pytest.raises(InputError, match="k and v must have the same shape"):
        attention(q, k[:, :64], v)


def test_batch_or_head_dim_disagree():
    q, k, v = qkv()
    with pytest.raises(InputError, match="batch and head dim"):
        attention(q, torch.cat([k, k]), torch.cat([v, v]))


def test_heads_not_a_multiple_of_kv_heads():
    q = torch.randn(1, 128, 6, 128, dtype=torch.float16)
    k = torch.randn(1, 128, 4, 128, dtype=torch.float16)
    with pytest.raises(InputError, match="multiple of k and v's 4"):
        attention(q, k, k)


def test_window_and_softcap_values():
    q, k, v = qkv()
    with pytest.raises(InputError, match="window"):
        attention(q, k, v, window=(-3, 0))
    with pytest.raises(InputError, match="softcap"):
        attention(q, k, v, softcap=float("inf"))


def test_head_dim_unsupported():
    q, k, v = qkv(shape=(1, 128, 2, 80))
    with pytest.raises(InputError, match="head_dim 80"):
        attention(q, k, v)


def test_innermost_dimension_not_contiguous():
    q, k, v = qkv(shape=(1, 128, 2, 256))
    with pytest.raises(InputError, match="contiguous"):
        attention(q[..., ::2], k[..., ::2], v[..., ::2])


def test_stride_not_a_multiple_of_16_bytes():
    base = torch.randn(1, 128, 2, 129, dtype=torch.float16)
    q = base[..., :128]
    with pytest.raises(InputError, match="multiple of 16 bytes"):
        attention(q, q, q)


def test_expanded_tensor():
    q, k, v = qkv()
    with pytest.raises(InputError, match="stride\\(1\\) is 0"):
        attention(q, k[:, :1].expand(-1, 128, -1, -1), v)


def test_inputs_that_need_gradients():
    q, k, v = qkv()
    with pytest.raises(InputError, match="no backward pass"):
        attention(q.requires_grad_(), k, v)


def test_misaligned_pointer():
    flat = torch.randn(1 * 128 * 2 * 128 + 1, dtype=torch.float16)
    q = flat[1:].view(1, 128, 2, 128)
    with pytest.raises(InputError, match="16-byte aligned"):
        attention(q, q, q)


def test_layout_name():
    q, k, v = qkv()
    with pytest.raises(InputError, match="layout"):
        attention(q, k, v, layout="sbhd")


def test_scale():
    q, k, v = qkv()
    with pytest.raises(InputError, match="scale"):
        attention(q, k, v, scale=float("nan"))


def test_split_that_does_not_fit_the_block():
    q, k, v = qkv(shape=(1, 128, 2, 256))
    with pytest.raises(InputError, match="add up to block_n"):
        attention(q, k, v, pv_split=(96, 32))


def test_cpu_tensors_are_refused_last():
    q, k, v = qkv()
    with pytest.raises(InputError, match="CUDA device"):
        attention(q, k, v)


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(InputError, match="torch.Tensor"):
        attention(q.numpy(), k, v)
