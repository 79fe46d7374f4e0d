"""Stand-ins that let the benchmark's GPU path run on CPU tensors in the tests: CpuTorch is real torch with a
torch.cuda of wall-clock events, no sleep, no-op synchronization and as much free memory as asked; fake_cudnn is a
cuDNN frontend whose paged SDPA graph runs on the CPU (bench.cudnn_paged's)."""

from __future__ import annotations

import time
import types


class WallEvent:
    def __init__(self, enable_timing=True):
        self.t = 0.0

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class CpuTorch:
    """Real torch (CPU tensors, CPU SDPA) with a stand-in torch.cuda: wall-clock events, no sleep, free memory."""

    def __init__(self, torch, free: int = 64 * 2**30):
        self._torch = torch
        self.cuda = types.SimpleNamespace(Event=WallEvent, synchronize=lambda: None, _sleep=lambda cycles: None,
                                          empty_cache=lambda: None, mem_get_info=lambda: (free, 2 * free),
                                          memory_reserved=lambda: 0, memory_allocated=lambda: 0,
                                          current_stream=lambda: types.SimpleNamespace(cuda_stream=0))

    def __getattr__(self, name):
        return getattr(self._torch, name)


class FakeCudnnNode:
    """A graph tensor: the dims and strides it was declared with."""

    def __init__(self, tensor=None):
        self.dim = None if tensor is None else list(tensor.shape)
        self.stride = None if tensor is None else list(tensor.stride())
        self.output = False

    def set_output(self, value):
        self.output = value
        return self

    def set_dim(self, dim):
        self.dim = list(dim)
        return self

    def set_stride(self, stride):
        self.stride = list(stride)
        return self


class FakeCudnnGraph:
    """The cuDNN frontend's pygraph as bench.cudnn_paged uses it: the calls recorded, and execute computing paged
    attention from the pack as cuDNN defines it (q and o (B, H, S_q, D), the pools (pages, H_kv, P, D), the tables
    (B, 1, pages, 1), the lengths (B, 1, 1, 1)), in float64."""

    refuse = None  # a message: check_support raises it, as the frontend does for a graph no engine supports
    made: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.steps, self.sdpa_kwargs = kwargs, [], None
        FakeCudnnGraph.made.append(self)

    def tensor_like(self, tensor):
        return FakeCudnnNode(tensor)

    def sdpa(self, **kwargs):
        self.sdpa_kwargs = kwargs
        return FakeCudnnNode(), FakeCudnnNode()

    def __getattr__(self, step):  # the build steps, recorded in order
        if step not in ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans"):
            raise AttributeError(step)

        def record(*args):
            if step == "check_support" and FakeCudnnGraph.refuse:
                raise RuntimeError(FakeCudnnGraph.refuse)
            self.steps.append(step)
        return record

    def get_workspace_size(self):
        return 0

    def execute(self, pack, workspace, handle):
        import torch

        kw, self.last_pack = self.sdpa_kwargs, pack
        for node, tensor in pack.items():  # every buffer as the graph was told it is
            assert node.dim == list(tensor.shape) and node.stride == list(tensor.stride())
        q, pool_k, pool_v = (pack[kw[n]].double() for n in ("q", "k", "v"))
        table_k, table_v = (pack[kw[n]] for n in ("paged_attention_k_table", "paged_attention_v_table"))
        lens, o = pack[kw["seq_len_kv"]].flatten().tolist(), pack[next(n for n in pack if n.output)]
        heads, kv_heads = q.shape[1], pool_k.shape[1]
        for b, length in enumerate(lens):  # a sequence's pages in table order, as (H_kv, keys, D), its keys only
            k, v = (pool[table[b, 0, :, 0].long()].transpose(0, 1).flatten(1, 2)[:, :length]
                    .repeat_interleave(heads // kv_heads, dim=0)
                    for pool, table in ((pool_k, table_k), (pool_v, table_v)))
            p = torch.softmax(q[b] @ k.transpose(1, 2) * kw["attn_scale"], dim=-1)
            o[b] = (p @ v).to(o.dtype)


def fake_cudnn(version=91900):
    """A stand-in `cudnn` module (for sys.modules) of the given backend version."""
    module = types.ModuleType("cudnn")
    module.data_type = types.SimpleNamespace(BFLOAT16="bf16", HALF="f16", FLOAT="f32")
    module.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    module.backend_version = lambda: version
    module.create_handle = lambda: 7
    module.set_stream = lambda handle, stream: None
    module.pygraph = FakeCudnnGraph
    return module
