"""Spec -> plan -> rendered source -> NVRTC cubin, plus the manifest that describes how to launch it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .nvrtc import CompileResult, compile_cuda
from .plan import Plan, make_plan
from .render import RenderedKernel, render
from .spec import KernelSpec

# Order of the kernel's parameters; the manifest and every launcher follow it.
ARGUMENTS = (
    ("tmap_q", "CUtensorMap (by value, __grid_constant__)"),
    ("tmap_k", "CUtensorMap (by value, __grid_constant__)"),
    ("tmap_v", "CUtensorMap (by value, __grid_constant__)"),
    ("tmap_o", "CUtensorMap (by value, __grid_constant__)"),
    ("lse_out", "float* (B, H, S) contiguous, natural-log logsumexp of each row"),
    ("scale_log2", "float: softmax scale * log2(e)"),
)
VARLEN_ARGUMENTS = (
    ("cu_seqlens_q", "const int* (B + 1): sequence b's queries are packed rows [cu[b], cu[b + 1])"),
    ("cu_seqlens_k", "const int* (B + 1): the same for keys and values"),
    ("o_gmem", "unsigned char*: o's base address, for tiles that end inside a sequence (stored without TMA)"),
    ("o_row_bytes", "long long: o's stride between packed rows, in bytes"),
    ("o_head_bytes", "long long: o's stride between heads, in bytes"),
)
PERSISTENT_ARGUMENTS = (
    ("tile_counter", "int*: zero before the launch (the launch leaves it zero); CTAs take tiles from it"),
    ("tiles_m", "int: query tiles per (head, sequence): ceil(S / block_m), or of max_seqlen_q when varlen"),
    ("batches", "int: batch entries (sequences when varlen)"),
)


@dataclass(frozen=True)
class BuiltKernel:
    plan: Plan
    rendered: RenderedKernel
    compiled: CompileResult
    render_seconds: float

    @property
    def spec(self) -> KernelSpec:
        return self.plan.spec

    def manifest(self) -> dict:
        plan, spec = self.plan, self.plan.spec
        tensor_maps = {}
        for name in ("q", "k", "v", "o"):
            described = getattr(plan, name).tensor_map.describe()
            if name in ("k", "v"):  # the recipe's S and H are the key length and K/V heads here
                described["dims"] = [{"S": "S_k", "H": "H_kv"}.get(d, d) for d in described["dims"]]
            tensor_maps[name] = described
        kernel = self.rendered.kernel_name
        return {
            "kernel": kernel,
            "spec": spec.to_json(),
            "arch": spec.arch,
            "grid": self.grid_description(),
            "block": [plan.threads, 1, 1],
            "dynamic_smem_bytes": plan.smem.total,
            "arguments": [{"name": n, "type": t} for n, t in self.arguments()],
            "tensor_maps": tensor_maps,
            "global_layout": self.global_layout(),
            "registers": self.compiled.registers.get(kernel),
            "spill_stores": self.compiled.spill_stores.get(kernel, 0),
            "spill_loads": self.compiled.spill_loads.get(kernel, 0),
            "source_sha256": self.rendered.sha256,
            "nvrtc_version": ".".join(map(str, self.compiled.nvrtc_version)),
        }


    def arguments(self) -> tuple[tuple[str, str], ...]:
        """The kernel's parameters in order: maps, lse, [varlen], [persistent], the scale."""
        lse = ARGUMENTS[4]
        if self.spec.varlen:
            lse = ("lse_out", "float* (H, total_q) contiguous, natural-log logsumexp of each packed row")
        return (ARGUMENTS[:4] + (lse,) + (VARLEN_ARGUMENTS if self.spec.varlen else ())
                + (PERSISTENT_ARGUMENTS if self.spec.persistent else ()) + ARGUMENTS[5:])

    def grid_description(self) -> dict:
        spec, plan = self.spec, self.plan
        tiles_m = "ceil(max_seqlen_q / block_m)" if spec.varlen else "ceil(S / block_m) = %d" % plan.m_blocks
        batches = "sequences" if spec.varlen else "batch"
        if spec.persistent:
            return {"x": f"min(tiles_m * heads * {batches}, SMs) with tiles_m = {tiles_m}, heads = {spec.heads}",
                    "y": "1", "z": "1"}
        return {"x": tiles_m, "y": "heads = %d" % spec.heads, "z": batches}

    def global_layout(self) -> str:
        spec = self.spec
        if spec.varlen:
            return (f"q, o: (total_q, {spec.heads}, {spec.head_dim}); k, v: (total_k, {spec.kv_heads}, "
                    f"{spec.head_dim}), sequences packed back to back and each at most {spec.seq_len} queries and "
                    f"{spec.keys} keys long; tensor maps see them as one batch entry of total rows; "
                    f"lse: ({spec.heads}, total_q) float32")
        return (f"q, o: (B, {spec.seq_len}, {spec.heads}, {spec.head_dim}); k, v: (B, {spec.keys}, "
                f"{spec.kv_heads or spec.heads}, {spec.head_dim}); any strides with the head dim "
                f"contiguous; lse: (B, {spec.heads}, {spec.seq_len}) float32")


def build(spec: KernelSpec, *, probe: bool = False, use_cache: bool = True) -> BuiltKernel:
    plan = make_plan(spec)
    t0 = time.perf_counter()
    rendered = render(plan, probe=probe)
    render_seconds = time.perf_counter() - t0
    compiled = compile_cuda(rendered.source, arch=spec.arch, name=rendered.kernel_name + ".cu", use_cache=use_cache)
    return BuiltKernel(plan, rendered, compiled, render_seconds)
