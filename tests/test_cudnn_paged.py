"""bench.cudnn_paged off the GPU: the graph it builds, read by a stand-in cuDNN frontend (tests.cpu_stand_ins) that
computes what cuDNN's paged SDPA computes from the tensors it is handed, so the views over flashgen's layout are
checked against the float64 reference; and each reason it is unavailable."""

from __future__ import annotations

import sys
import types

import pytest

from bench import cudnn_paged
from bench.decode import paged_copy
from bench.peers import Unavailable as PeerUnavailable
from codegen import check
from tests.cpu_stand_ins import CpuTorch, FakeCudnnGraph as Graph, fake_cudnn

torch = pytest.importorskip("torch")


@pytest.fixture
def cudnn(monkeypatch):
    Graph.refuse, Graph.made = None, []
    module = fake_cudnn()
    monkeypatch.setitem(sys.modules, "cudnn", module)
    return module


def _paged(batch=3, length=24, heads=4, kv_heads=2, dim=16, page=4, q_len=2, dtype=torch.bfloat16):
    q = torch.randn(batch, q_len, heads, dim, dtype=dtype)
    k, v = (torch.randn(batch, length, kv_heads, dim, dtype=dtype) for _ in range(2))
    (pk, table), (pv, _) = paged_copy(torch, k, page), paged_copy(torch, v, page)
    return q, k, v, pk, pv, table


@pytest.mark.parametrize("lengths", [[24, 24, 24], [1, 13, 24]])
def test_cudnn_reads_flashgen_pools_and_tables_as_they_are(cudnn, lengths):
    q, k, v, pk, pv, table = _paged()
    lens = torch.tensor(lengths, dtype=torch.int32)
    run, o = cudnn_paged.paged_sdpa(CpuTorch(torch), q, pk, pv, table, lens)
    o.fill_(float("nan"))
    run()
    ref = check.kvcache_reference(q, k, v, lengths, causal=False)[0]
    assert o.shape == q.shape and not o.isnan().any()
    assert ((o.double() - ref).abs().max() / ref.abs().max()).item() < 1e-2
    graph = Graph.made[-1]
    kw = graph.sdpa_kwargs
    assert kw["k"].dim == [18, 2, 4, 16]  # 3 sequences of 6 pages, as (pages, H_kv, P, D)
    assert kw["k"].stride == [4 * 2 * 16, 16, 2 * 16, 1]  # the (pages, P, H_kv, D) pool, no copy
    assert kw["paged_attention_k_table"].dim == [3, 1, 6, 1] and kw["paged_attention_max_seq_len_kv"] == 24
    assert kw["use_padding_mask"] and kw["attn_scale"] == 16 ** -0.5 and kw["generate_stats"] is False
    assert graph.kwargs["io_data_type"] == "bf16"
    assert graph.steps == ["validate", "build_operation_graph", "create_execution_plans", "check_support",
                           "build_plans"]


def test_what_makes_it_unavailable_is_said(cudnn, monkeypatch):
    q, _, _, pk, pv, table = _paged()
    lens = torch.full((3,), 24, dtype=torch.int32)
    Graph.refuse = "no engine supports this graph"
    with pytest.raises(cudnn_paged.Unavailable, match="refuses the paged graph: no engine supports"):
        cudnn_paged.paged_sdpa(torch, q, pk, pv, table, lens)
    with pytest.raises(cudnn_paged.Unavailable, match="takes bf16 or f16"):
        cudnn_paged.paged_sdpa(torch, q.float(), pk.float(), pv.float(), table, lens)
    monkeypatch.setitem(sys.modules, "cudnn", fake_cudnn(version=90400))
    with pytest.raises(cudnn_paged.Unavailable, match="cuDNN 90400 has no paged SDPA"):
        cudnn_paged.paged_sdpa(torch, q, pk, pv, table, lens)
    monkeypatch.setitem(sys.modules, "cudnn", None)  # not installed
    with pytest.raises(PeerUnavailable, match="frontend does not import"):  # a matrix row skips with the reason
        cudnn_paged.paged_sdpa(torch, q, pk, pv, table, lens)
