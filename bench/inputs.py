"""The timed tensors: Inputs (the rotated input sets and, for a varlen case, their packing, zero-padded twins and
masks), make_inputs, the padding helpers and the float64 references."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from codegen.check import reference, torch_dtype
from .cases import Case

ROTATE_BELOW_BYTES = 200 * 2**20  # rotate input copies until the working set is past L2 (50 MB) by far
MAX_INPUT_SETS = 8


def input_set_count(case: Case) -> int:
    """Copies of (q, k, v, o) to rotate through so that a small problem is not timed out of L2."""
    return max(1, min(MAX_INPUT_SETS, -(-ROTATE_BELOW_BYTES // case.set_bytes)))


@dataclass(frozen=True)
class Inputs:
    sets: tuple  # ((q, k, v), ...): q (B, S, H, D), k and v (B, S, KV, D); varlen: packed (T, H, D), (T, KV, D)
    ref: object  # float64 o of sets[0] (varlen: packed (T, H, D))
    # varlen only:
    padded: tuple = ()  # the sets zero-padded to (B, S, H, D) and (B, S, KV, D), for the cudnn-padded yardstick
    cu_seqlens: object = None  # int32 (B + 1,) on the device: sequence b is packed rows cu[b]:cu[b + 1]
    valid: object = None  # int64 (T,): the row of the flattened padded (B * S) batch holding each packed token
    key_mask: object = None  # non-causal: (B, 1, 1, S) additive bias in q's dtype, 0 on tokens, -inf on padding
    doc_ids: object = None  # int32 (T,): each packed token's sequence


def make_inputs(torch, case: Case) -> Inputs:
    if case.varlen:
        return make_varlen_inputs(torch, case)
    dtype = torch_dtype(case.dtype)
    q_shape = (case.batch, case.seq, case.heads, case.dim)
    kv_shape = (case.batch, case.seq_k, case.kv_heads, case.dim)  # S_k: chunked prefill (reference: bottom-right)
    sets = tuple(tuple(torch.randn(shape, dtype=dtype, device="cuda") for shape in (q_shape, kv_shape, kv_shape))
                 for _ in range(input_set_count(case)))
    return Inputs(sets, reference(*sets[0], causal=case.causal)[0])


def cu_seqlens_of(lens: Sequence[int]) -> list[int]:
    """[0, L0, L0 + L1, ...]: where each sequence starts in the packed tensors, and the total last."""
    return [0, *itertools.accumulate(lens)]


def padded_rows(torch, lens: Sequence[int], max_len: int, device=None):
    """For each packed token, its row in the flattened zero-padded (len(lens) * max_len) batch."""
    return torch.cat([b * max_len + torch.arange(n, device=device) for b, n in enumerate(lens)])


def pad_packed(torch, packed, lens: Sequence[int], max_len: int, rows=None):
    """(T, ...) packed -> (len(lens), max_len, ...) with zeros after each sequence's tokens."""
    rows = padded_rows(torch, lens, max_len, packed.device) if rows is None else rows
    out = packed.new_zeros((len(lens) * max_len, *packed.shape[1:]))
    out[rows] = packed
    return out.view(len(lens), max_len, *packed.shape[1:])


def unpad(padded, rows):
    """(B, S, ...) -> the packed (T, ...) rows that hold tokens (a copy)."""
    return padded.reshape(padded.shape[0] * padded.shape[1], *padded.shape[2:])[rows]


def varlen_reference(q, k, v, lens: Sequence[int], *, causal: bool, lens_k: Sequence[int] | None = None):
    """Float64 o, packed (T_q, H, D), of attention over each sequence alone: codegen.check.reference on
    q[cu_q[b]:cu_q[b+1]] against k, v[cu_k[b]:cu_k[b+1]], with its bottom-right causal alignment."""
    import torch

    from codegen.check import reference_varlen

    cu_q, cu_k = (torch.tensor(cu_seqlens_of(x), dtype=torch.int32) for x in (lens, lens if lens_k is None else lens_k))
    return reference_varlen(q, k, v, cu_q, cu_k, causal=causal)[0]


def key_padding_bias(torch, lens: Sequence[int], max_len: int, dtype, device=None):
    """(B, 1, 1, max_len) additive mask: 0 on each sequence's keys, -inf on its padding."""
    keep = torch.arange(max_len, device=device)[None, :] < torch.tensor(list(lens), device=device)[:, None]
    bias = torch.zeros(len(lens), max_len, dtype=dtype, device=device).masked_fill_(~keep, float("-inf"))
    return bias[:, None, None, :]


def make_varlen_inputs(torch, case: Case, device="cuda") -> Inputs:
    """Packed random q, k, v (rotated like the dense sets), their zero-padded twins for the padded yardstick,
    cu_seqlens, and the float64 reference computed one sequence at a time."""
    dtype = torch_dtype(case.dtype) if device == "cuda" else torch.float32
    total = case.total_tokens
    sets = tuple(tuple(torch.randn(shape, dtype=dtype, device=device)
                       for shape in ((total, case.heads, case.dim),) + ((total, case.kv_heads, case.dim),) * 2)
                 for _ in range(input_set_count(case)))
    rows = padded_rows(torch, case.lens, case.seq, device)
    padded = tuple(tuple(pad_packed(torch, t, case.lens, case.seq, rows) for t in qkv) for qkv in sets)
    cu = torch.tensor(cu_seqlens_of(case.lens), dtype=torch.int32, device=device)
    docs = torch.repeat_interleave(torch.arange(case.batch, dtype=torch.int32, device=device),
                                   torch.tensor(list(case.lens), device=device))
    mask = None if case.causal else key_padding_bias(torch, case.lens, case.seq, dtype, device)
    ref = varlen_reference(*sets[0], case.lens, causal=case.causal)
    return Inputs(sets, ref, padded=padded, cu_seqlens=cu, valid=rows, key_mask=mask, doc_ids=docs)
