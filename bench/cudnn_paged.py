"""cuDNN's own paged-cache attention (the cuDNN frontend's SDPA over a page table), for the paged decode rows.

torch's SDPA reads only dense caches, so the decode matrix times flashgen's paged read against cuDNN's dense one. This
times cuDNN over the very pool and page table flashgen reads, so a paged row can be split into what the pages' scatter
costs any kernel and what it costs flashgen's. Optional and never a dependency: it needs the `nvidia-cudnn-frontend`
package (its pybind build, 1.16; bench/wip/README.md says how to carry it to the GPU machine) and a cuDNN of 9.5 or
later; where either is missing, `paged_sdpa` raises Unavailable with the reason.
"""

from __future__ import annotations

from .peers import Unavailable as PeerUnavailable

PAGED_MIN_CUDNN = 90500  # the first cuDNN whose SDPA takes page tables


class Unavailable(PeerUnavailable):
    """cuDNN's paged SDPA cannot run here (no frontend, an old cuDNN, or a graph it does not support): the reason.
    A bench.peers.Unavailable, so a matrix row says it and is skipped."""


def paged_sdpa(torch, q, pages_k, pages_v, table, lens, scale: float | None = None):
    """cuDNN's attention of q over paged caches, masks off (every key below each sequence's length), as a launch.

    q (B, S_q, H, D); pages_k, pages_v (num_pages, P, H_kv, D), flashgen's paged layout (passed as (num_pages, H_kv, P,
    D) views, no copy); table (B, pages per sequence) int32; lens (B,) int32 on the device. Returns (run, o): run()
    launches on torch's current stream and writes o (B, S_q, H, D)."""
    try:
        import cudnn
    except ImportError as err:
        raise Unavailable(f"the cuDNN frontend does not import ({err}); pip install nvidia-cudnn-frontend") from err
    version = cudnn.backend_version()
    if version < PAGED_MIN_CUDNN:
        raise Unavailable(f"cuDNN {version} has no paged SDPA (it came in {PAGED_MIN_CUDNN})")
    io_types = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}
    if q.dtype not in io_types:
        raise Unavailable(f"cuDNN's SDPA takes bf16 or f16, not {q.dtype}")
    batch, q_len, heads, dim = q.shape
    per_sequence = table.shape[1]
    o = torch.empty_like(q)
    # cuDNN's logical order is (batch, head, row, dim) for q and o, (page, head, row, dim) for the pools: views.
    buffers = {"q": q.transpose(1, 2), "k": pages_k.transpose(1, 2), "v": pages_v.transpose(1, 2),
               "o": o.transpose(1, 2), "table_k": table.view(batch, 1, per_sequence, 1),
               "table_v": table.view(batch, 1, per_sequence, 1),
               "len_q": torch.full((batch, 1, 1, 1), q_len, dtype=torch.int32, device=q.device),
               "len_kv": lens.view(batch, 1, 1, 1)}
    handle = cudnn.create_handle()  # kept for the process: a benchmark makes a few, and the graph's plans need it
    graph = cudnn.pygraph(io_data_type=io_types[q.dtype], intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    nodes = {name: graph.tensor_like(buffers[name]) for name in buffers if name != "o"}
    try:
        out, _ = graph.sdpa(q=nodes["q"], k=nodes["k"], v=nodes["v"], generate_stats=False,
                            attn_scale=scale if scale is not None else dim ** -0.5, use_padding_mask=True,
                            seq_len_q=nodes["len_q"], seq_len_kv=nodes["len_kv"],
                            paged_attention_k_table=nodes["table_k"], paged_attention_v_table=nodes["table_v"],
                            paged_attention_max_seq_len_kv=per_sequence * pages_k.shape[1])
        out.set_output(True).set_dim(list(buffers["o"].shape)).set_stride(list(buffers["o"].stride()))
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    except Exception as err:  # the frontend's errors name no common type: its message is the reason
        raise Unavailable(f"cuDNN {version} refuses the paged graph: {err}") from err
    nodes["o"] = out
    pack = {nodes[name]: buffers[name] for name in nodes}
    workspace = torch.empty(max(graph.get_workspace_size(), 1), dtype=torch.uint8, device=q.device)

    def run() -> None:
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        graph.execute(pack, workspace, handle=handle)

    return run, o
