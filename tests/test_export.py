"""The exported bundle: complete, rendered from the same derivations, and compiled by nvcc for sm_90a.

CI has nvcc but no GPU, so the bundles are compiled and linked here; the example runs in scripts/gpu_check.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import gen
from codegen.export import export_bundle, nvcc_command
from codegen.families import resolve
from codegen.families.decode_sm90 import DecodeSpec
from codegen.families.decode_sm90.plan import KV_L2_PROMOTION_BYTES
from layouts.tma import L2_PROMOTION_BYTES, TMA_L2_PROMOTION_NAMES
from codegen.spec import KernelSpec

CANONICAL = [resolve(KernelSpec(**fields)) for fields in gen.CANONICAL]
# A bundle with every coverage option, so the launcher's K/V shapes and the example's masks are compiled too.
COVERAGE = resolve(KernelSpec(seq_len=300, heads=16, head_dim=128, seq_len_k=1000, kv_heads=4, causal=True,
                              window=(256, -1), softcap=30.0, dtype="bf16"))
# Head dims of three swizzle atoms: 32-column boxes of the 64B swizzle (D=96), 64-column boxes (D=192).
THREE_ATOMS = [resolve(KernelSpec(seq_len=1000, heads=8, head_dim=96)),
               resolve(KernelSpec(seq_len=1000, heads=8, head_dim=192, dtype="bf16", causal=True))]

# Varlen bundles: persistent (causal, grouped-query) and one CTA per tile (D=256 with a window and softcap).
VARLEN = [resolve(KernelSpec(seq_len=2048, heads=16, head_dim=128, varlen=True, causal=True, kv_heads=4, dtype="bf16")),
          resolve(KernelSpec(seq_len=1024, heads=8, head_dim=256, varlen=True, window=(64, 32), softcap=25.0))]


# Multicast bundles: query tiles in two-CTA clusters, launched by cudaLaunchKernelEx; one tile per CTA (causal), and
# persistent pairs (alike tiles), as many clusters as the device holds at once.
MULTICAST = [resolve(KernelSpec(seq_len=1024, heads=8, head_dim=128, causal=True, multicast=True, dtype="bf16")),
             resolve(KernelSpec(seq_len=2048, heads=8, head_dim=128, multicast=True, dtype="bf16"))]


def find_nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="module")
def nvcc():
    path = find_nvcc()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is required in CI to compile the exported bundles")
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return path


def test_bundle_holds_every_piece(tmp_path):
    spec = CANONICAL[0]
    bundle = export_bundle(spec, tmp_path)
    names = {p.name for p in bundle.files}
    assert names == {f"{spec.name}.cu", f"{spec.name}.h", f"{spec.name}_launch.cu", f"{spec.name}.json",
                     f"{spec.name}.ptx", f"{spec.name}.cubin", "example.cu", "CMakeLists.txt"}
    assert (tmp_path / f"{spec.name}.cu").read_text() == (gen.GENERATED / f"{spec.name}.cu").read_text()
    assert (tmp_path / f"{spec.name}.cubin").read_bytes()[:4] == b"\x7fELF"
    assert ".target sm_90a" in (tmp_path / f"{spec.name}.ptx").read_text()
    header = (tmp_path / f"{spec.name}.h").read_text()
    assert f"cudaError_t {spec.name}_launch(" in header


def test_launcher_uses_the_derived_tensor_maps(tmp_path):
    spec = CANONICAL[0]
    bundle = export_bundle(spec, tmp_path)
    launcher = (tmp_path / f"{spec.name}_launch.cu").read_text()
    manifest = json.loads((tmp_path / f"{spec.name}.json").read_text())
    for op in ("q", "k", "v", "o"):
        described = getattr(bundle.built.plan, op).tensor_map.describe()
        named = manifest["tensor_maps"][op]
        assert {k: v for k, v in named.items() if k != "dims"} == {k: v for k, v in described.items() if k != "dims"}
        assert len(named["dims"]) == len(described["dims"])
        dims = ", ".join(f"(cuuint64_t)({d})" for d in described["dims"])
        assert dims in launcher
        assert ", ".join(str(b) for b in described["box"]) in launcher
    assert launcher.count(TMA_L2_PROMOTION_NAMES[L2_PROMOTION_BYTES] + ",") == 4  # each map's, from layouts
    plan = bundle.built.plan
    assert plan.spec.persistent  # the canonical kernels are persistent: one CTA per SM, tiles from a counter
    assert f"<<<dim3(ctas), dim3(384), {plan.smem.total}, stream>>>" in launcher
    # The call passes the ABI's parameters in order, each as its launcher expression; tiles_m is the plan's.
    assert ", ".join(p.launcher for p in plan.abi.params) + ");" in launcher
    assert f"const int tiles_m = {plan.m_blocks};" in launcher


def test_per_tile_launcher_grid(tmp_path):
    spec = KernelSpec(seq_len=5000, heads=8, head_dim=128, causal=True)  # long causal: one CTA per tile
    bundle = export_bundle(spec, tmp_path)
    plan = bundle.built.plan
    assert not plan.spec.persistent
    launcher = (tmp_path / f"{plan.spec.name}_launch.cu").read_text()
    assert f"<<<dim3(tiles_m, {spec.heads}, batch), dim3(384), {plan.smem.total}, stream>>>" in launcher
    assert f"const int tiles_m = {plan.m_blocks};" in launcher


@pytest.mark.parametrize("spec", MULTICAST, ids=lambda s: s.name)
def test_multicast_launcher_launches_clusters_of_two(tmp_path, spec):
    bundle = export_bundle(spec, tmp_path)
    launcher = (tmp_path / f"{spec.name}_launch.cu").read_text()
    assert "cluster.val.clusterDim.x = 2, cluster.val.clusterDim.y = 1" in launcher
    assert f"cudaLaunchKernelEx(&config, {spec.name}, " in launcher and "<<<" not in launcher
    assert bundle.built.manifest()["grid"]["cluster"] == "(2, 1, 1)"
    assert spec.persistent == ("cudaOccupancyMaxActiveClusters" in launcher)
    assert "tile_counter" not in launcher


@pytest.mark.parametrize("spec", THREE_ATOMS, ids=lambda s: s.name)
def test_three_atom_launchers_use_the_derived_tensor_maps(tmp_path, spec):
    bundle = export_bundle(spec, tmp_path)
    launcher = (tmp_path / f"{spec.name}_launch.cu").read_text()
    for op in ("q", "k", "v", "o"):
        described = getattr(bundle.built.plan, op).tensor_map.describe()
        assert ", ".join(f"(cuuint64_t)({d})" for d in described["dims"]) in launcher
        assert ", ".join(str(b) for b in described["box"]) in launcher
    atom = bundle.built.plan.q.tensor_map.atom_cols
    assert f"(cuuint64_t)({atom}), (cuuint64_t)(S), (cuuint64_t)({spec.head_dim // atom})" in launcher
    swizzle = {64: "CU_TENSOR_MAP_SWIZZLE_128B", 32: "CU_TENSOR_MAP_SWIZZLE_64B"}[atom]
    assert launcher.count(swizzle) == 4


def test_two_bundles_headers_in_one_translation_unit(tmp_path, nvcc):
    for spec in CANONICAL:
        export_bundle(spec, tmp_path / spec.name)
    unit = tmp_path / "both.cu"
    unit.write_text("".join(f'#include "{s.name}/{s.name}.h"\n' for s in CANONICAL) + "int main() { return 0; }\n")
    result = subprocess.run([nvcc, "-c", "-I", str(tmp_path), str(unit), "-o", str(tmp_path / "both.o")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("spec", VARLEN, ids=lambda s: s.name)
def test_varlen_launcher_passes_the_offsets_and_sizes_tiles_by_the_longest(tmp_path, spec):
    bundle = export_bundle(spec, tmp_path)
    plan = bundle.built.plan
    header = (tmp_path / f"{spec.name}.h").read_text()
    launcher = (tmp_path / f"{spec.name}_launch.cu").read_text()
    assert "typedef struct flashgen_varlen_strides" in header
    assert f"cudaError_t {spec.name}_check_seqlens(" in header and f"cudaError_t {spec.name}_check_seqlens(" in launcher
    assert "const int* cu_seqlens_q, const int* cu_seqlens_k, int batch,\n    int total_q, int total_k" in header
    # The packed tensors are one batch entry of total rows for the tensor maps.
    assert launcher.count("const long long S = rows") == 4
    assert f"const int tiles_m = (max_seqlen_q + {plan.spec.block_m - 1}) / {plan.spec.block_m};" in launcher
    assert f"max_seqlen_q > {spec.seq_len}" in launcher and f"max_seqlen_k > {spec.keys}" in launcher
    call = "lse, cu_seqlens_q, cu_seqlens_k, static_cast<unsigned char*>(o), o_row_bytes, o_head_bytes"
    if plan.spec.persistent:
        assert f"{call}, tile_counter, tiles_m, batch, scale_log2);" in launcher
    else:
        assert f"<<<dim3(tiles_m, {spec.heads}, batch), dim3(384), {plan.smem.total}, stream>>>" in launcher
        assert f"{call}, scale_log2);" in launcher
    # The launcher's arguments are the kernel's parameters, in order (the manifest lists them).
    names = [a["name"] for a in bundle.built.manifest()["arguments"]]
    assert names[4:10] == ["lse_out", "cu_seqlens_q", "cu_seqlens_k", "o_gmem", "o_row_bytes", "o_head_bytes"]
    assert "varlen" in (tmp_path / "example.cu").read_text().splitlines()[0]


# Bundles of kernels with attention sinks (the launcher takes the (H,) logits after lse): fixed lengths with every
# coverage option, and a persistent varlen one.
SINKS = [COVERAGE.replace(sinks=True), VARLEN[0].replace(sinks=True)]


# Blackwell bundles (the fwd_sm100 ABI: O stored without a tensor map, V by the 5-D key-group map), for nvcc's
# compute_100a and compute_103a targets.
BLACKWELL = [resolve(KernelSpec(seq_len=1024, heads=8, head_dim=128, arch="sm_103a", causal=True, kv_heads=2)),
             resolve(KernelSpec(seq_len=1000, heads=4, head_dim=64, arch="sm_100a", dtype="bf16")),
             resolve(KernelSpec(seq_len=2048, heads=16, head_dim=128, arch="sm_103a", causal=True, kv_heads=4,
                                varlen=True))]


# Decode bundles (the decode_sm90 ABI: the append kernel and the attention kernel; dense and paged caches).
DECODE = [DecodeSpec(heads=32, kv_heads=8, head_dim=128, q_len=4, dtype="bf16"),
          DecodeSpec(heads=16, kv_heads=4, head_dim=64, q_len=1, dtype="f16", page_size=16, window=(300, -1),
                     softcap=20.0),
          DecodeSpec(heads=8, kv_heads=2, head_dim=128, q_len=2, dtype="bf16", page_size=1),  # the producer warp
          DecodeSpec(heads=16, kv_heads=4, head_dim=96, q_len=1, dtype="bf16", page_size=1, gather=True)]


@pytest.mark.parametrize("spec", CANONICAL + [COVERAGE] + MULTICAST + THREE_ATOMS + VARLEN + SINKS + BLACKWELL + DECODE,
                         ids=lambda s: s.name)
def test_bundle_compiles_and_links_with_nvcc(spec, tmp_path, nvcc):
    bundle = export_bundle(spec, tmp_path)
    result = subprocess.run(nvcc_command(bundle, nvcc), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"nvcc failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "example").stat().st_size > 0


@pytest.mark.parametrize("spec", DECODE, ids=lambda s: s.name)
def test_decode_launcher_follows_both_abis(spec, tmp_path):
    bundle = export_bundle(spec, tmp_path)
    plan = bundle.built.plan
    launcher = (tmp_path / f"{plan.spec.name}_launch.cu").read_text()
    assert ", ".join(p.launcher for p in plan.abi.params) + ");" in launcher
    assert ", ".join(p.launcher for p in plan.append_abi.params) + ");" in launcher
    assert f"<<<dim3(splits, {plan.grid(1, 1)[1]}, batch), dim3({plan.threads}), {plan.smem.total}, stream>>>" in launcher
    example = (tmp_path / "example.cu").read_text()
    assert f"kPageRows = {plan.spec.page_size};" in example and "reference<<<" in example
    if plan.spec.gather:  # its cp.async reads the caches by address: no tensor map is encoded
        assert "encode_k(" not in launcher and "TmaDesc maps[2] = {};" in launcher
        return
    pages = plan.k_pages
    box = pages.box if pages else plan.k.tensor_map.box
    assert "const cuuint32_t box[5] = {" + ", ".join(map(str, box)) + "};" in launcher
    # The K/V maps' L2 promotion is the family's (128 B, where the forward's maps take 256), as the launcher's
    promotion = TMA_L2_PROMOTION_NAMES[KV_L2_PROMOTION_BYTES]
    assert launcher.count(promotion + ",") == 2 and "CU_TENSOR_MAP_L2_PROMOTION_L2_256B" not in launcher


@pytest.mark.parametrize("spec", BLACKWELL, ids=lambda s: s.name)
def test_blackwell_launcher_follows_its_abi(spec, tmp_path):
    bundle = export_bundle(spec, tmp_path)
    plan = bundle.built.plan
    launcher = (tmp_path / f"{spec.name}_launch.cu").read_text()
    assert "TmaDesc maps[3];" in launcher and "encode_o" not in launcher  # O is stored without a tensor map
    assert ", ".join(p.launcher for p in plan.abi.params) + ");" in launcher
    assert "st_b.batch != S * st_b.seq" in launcher  # the key-group V map needs back-to-back batch entries
    arch = spec.arch[3:]
    assert f"arch=compute_{arch},code=sm_{arch}" in (tmp_path / "CMakeLists.txt").read_text()
    assert f"<<<dim3(ctas), dim3({plan.threads}), {plan.smem.total}, stream>>>" in launcher  # persistent


@pytest.mark.parametrize("name", ["stream_probe.cu", "stream_probe_heads.cu", "stream_probe_pages.cu"])
def test_stream_probe_compiles(tmp_path, nvcc, name):
    # scripts/stream_probe.cu measured the L2 promotion the decode maps take (bench/LOG.md, "Decode", d5), and
    # stream_probe_heads.cu the two-head boxes (d23); they are built on the GPU machine by hand, so CI keeps them
    # compiling.
    probe = Path(gen.__file__).resolve().parent / "scripts" / name
    result = subprocess.run([nvcc, "-O3", "-arch=sm_90a", "-std=c++17", "-c", str(probe), "-o", str(tmp_path / "probe.o")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"nvcc failed:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("spec", [CANONICAL[0], VARLEN[0], SINKS[0], DECODE[0], DECODE[3]], ids=lambda s: s.name)
def test_every_example_checks_lse_and_fails_on_it(spec, tmp_path):
    """The example poisons lse before the launch, its reference kernel writes the float32 logsumexp, and a value
    off (templates/export/check.j2's lse_off) fails the run as a wrong o does; a decode example passes its sinks."""
    export_bundle(spec, tmp_path)
    example = (tmp_path / "example.cu").read_text()
    assert "static long long lse_off(" in example and "= lse_off(got_lse, want_lse);" in example
    assert "CHECK(cudaMemset(lse, 0xff, n_lse * sizeof(float)));" in example
    assert "= m + logf(l);" in example  # the reference's logsumexp, the sink (if any) joined
    assert "lse_bad == 0 && rel <" in example
    if isinstance(spec, DecodeSpec):
        assert example.count("kn, sn, vn, sn, sinks, batch,") == 2 and "nullptr, batch, s" not in example
