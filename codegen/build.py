"""Spec -> family plan -> rendered source -> NVRTC cubin, plus the manifest that describes how to launch it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from . import families
from .nvrtc import CompileResult, compile_cuda
from .render import RenderedKernel, render
from .spec import KernelSpec


@dataclass(frozen=True)
class BuiltKernel:
    plan: object  # the family's plan
    family: families.Family
    rendered: RenderedKernel
    compiled: CompileResult
    render_seconds: float

    @property
    def spec(self) -> KernelSpec:
        return self.plan.spec

    def manifest(self) -> dict:
        plan, spec = self.plan, self.plan.spec
        if hasattr(plan, "manifest_tensor_maps"):  # a family whose maps are not its operands' own (decode's pages)
            tensor_maps = plan.manifest_tensor_maps()
        else:
            tensor_maps = {}
            operands = getattr(plan, "mapped_operands", ("q", "k", "v", "o"))
            for name in (op for op in operands if hasattr(plan, op)):  # the operands the kernel maps
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
            "family": self.family.name,
            "arguments": plan.abi.manifest(),
            "tensor_maps": tensor_maps,
            "global_layout": self.global_layout(),
            "registers": self.compiled.registers.get(kernel),
            "spill_stores": self.compiled.spill_stores.get(kernel, 0),
            "spill_loads": self.compiled.spill_loads.get(kernel, 0),
            # The module's other entry points, each with its own arguments (decode's append, the backward's rows).
            "other_kernels": [k.manifest() for k in getattr(plan, "sibling_kernels", lambda: ())()],
            "source_sha256": self.rendered.sha256,
            "nvrtc_version": ".".join(map(str, self.compiled.nvrtc_version)),
        }

    def grid_description(self) -> dict:
        spec, plan = self.spec, self.plan
        if hasattr(plan, "grid_description"):  # a family with its own launch shape (decode)
            return plan.grid_description()
        tiles_m = "ceil(max_seqlen_q / block_m)" if spec.varlen else "ceil(S / block_m) = %d" % plan.m_blocks
        return plan.abi.grid.describe(tiles_m, "sequences" if spec.varlen else "batch")

    def global_layout(self) -> str:
        spec = self.spec
        if hasattr(self.plan, "global_layout"):
            return self.plan.global_layout()
        if spec.varlen:
            return (f"q, o: (total_q, {spec.heads}, {spec.head_dim}); k, v: (total_k, {spec.kv_heads}, "
                    f"{spec.head_dim}), sequences packed back to back and each at most {spec.seq_len} queries and "
                    f"{spec.keys} keys long; tensor maps see them as one batch entry of total rows; "
                    f"lse: ({spec.heads}, total_q) float32")
        return (f"q, o: (B, {spec.seq_len}, {spec.heads}, {spec.head_dim}); k, v: (B, {spec.keys}, "
                f"{spec.kv_heads or spec.heads}, {spec.head_dim}); any strides with the head dim "
                f"contiguous; lse: (B, {spec.heads}, {spec.seq_len}) float32")


def build(spec: KernelSpec, *, family: str | None = None, use_cache: bool = True) -> BuiltKernel:
    """Resolve, plan, render and compile `spec`'s kernel in `family` (by name; default: the spec's own)."""
    fam = families.get(family) if family else families.family_for(spec)
    plan = fam.make_plan(fam.resolve(spec))
    t0 = time.perf_counter()
    rendered = render(plan, fam)
    render_seconds = time.perf_counter() - t0
    compiled = compile_cuda(rendered.source, arch=plan.spec.arch, name=rendered.kernel_name + ".cu",
                            use_cache=use_cache)
    return BuiltKernel(plan, fam, rendered, compiled, render_seconds)
