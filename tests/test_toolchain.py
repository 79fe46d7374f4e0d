"""The toolchain layer: NVRTC compile + ptxas report, disk cache, SASS, packaging. CPU only (one GPU test)."""

from __future__ import annotations

import multiprocessing as mp
import re
import time
from pathlib import Path

import pytest

from codegen import cuda_env
from codegen.cache import CacheKey, DiskCache, source_sha256
from codegen.nvrtc import (
    CompileResult,
    NvrtcError,
    SetmaxnregIgnoredError,
    WgmmaSerializedError,
    SpillError,
    compile_cuda,
    parse_ptxas_log,
    parse_warnings,
)
from codegen.sass import disassemble, opcode_counts

REPO = Path(__file__).resolve().parent.parent

# One warpgroup: an mbarrier, a 2-D TMA load into shared memory, and a wgmma (SS) on it.
# The tensor map is passed by value as an opaque 64-byte-aligned 128-byte struct.
WGMMA_TMA_SRC = r"""
#include <cuda/std/cstdint>
struct __align__(64) TensorMap { unsigned long long v[16]; };

extern "C" __global__ void __launch_bounds__(128, 1)
probe(const __grid_constant__ TensorMap tmap, float* out) {
  __shared__ __align__(1024) unsigned short tile[64 * 64];
  __shared__ __align__(8) cuda::std::uint64_t bar;
  const unsigned bar_addr = (unsigned)__cvta_generic_to_shared(&bar);
  const unsigned tile_addr = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_addr));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar_addr), "r"(8192) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        :: "r"(tile_addr), "l"(&tmap), "r"(0), "r"(0), "r"(bar_addr) : "memory");
  }
  __syncthreads();
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}"
      :: "r"(bar_addr), "r"(0) : "memory");
  const cuda::std::uint64_t desc =
      ((tile_addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc), "l"(desc), "r"(0));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
"""

TRIVIAL_SRC = r"""
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

# A local array indexed at run time, squeezed into 32 registers: ptxas must spill.
SPILL_SRC = r"""
extern "C" __global__ void spiller(float* x, int n) {
  float a[96];
#pragma unroll
  for (int i = 0; i < 96; i++) a[i] = x[i * n + threadIdx.x];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 96; i++) s += a[(i * n) % 96] * a[i];
  x[threadIdx.x] = s;
}
"""

SETMAXNREG_SRC = r"""
extern "C" __global__ void %s ws(float* x) {
  if (threadIdx.x < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  x[threadIdx.x] = 1.f;
}
"""


@pytest.fixture
def cache(tmp_path) -> DiskCache:
    return DiskCache(tmp_path / "cache")


# ---------------------------------------------------------------------------------------------
# environment
# ---------------------------------------------------------------------------------------------


def test_nvrtc_is_the_pinned_13_0_line():
    assert cuda_env.nvrtc_version() == (13, 0), cuda_env.toolchain_summary()
    archs = cuda_env.supported_archs()
    assert {90, 100, 103} <= set(archs)


def test_include_dirs_have_runtime_and_cccl_headers():
    dirs = [Path(d) for d in cuda_env.include_dirs()]
    assert any((d / "cuda_fp16.h").is_file() for d in dirs)
    assert any((d / "cuda" / "std" / "cstdint").is_file() for d in dirs)
    hv = cuda_env.header_versions()
    assert hv["cudart"].startswith("130"), hv


def test_driver_status_is_computed_once_and_never_raises():
    a = cuda_env.driver_status()
    b = cuda_env.driver_status()
    assert a is b
    ok, reason = a
    assert isinstance(ok, bool) and isinstance(reason, str) and reason


def test_templates_dir_found():
    if not (REPO / "templates").is_dir():
        pytest.skip("this checkout has no templates/ yet")
    d = cuda_env.templates_dir()
    assert d.is_dir()
    assert d.samefile(REPO / "templates") or d.name == "templates"
    assert list(d.rglob("*.j2")), f"no *.j2 templates under {d}"


def test_pyproject_ships_every_package_and_template():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    st = cfg["tool"]["setuptools"]
    listed = set(st["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for top in ("codegen", "layouts")
        for p in (REPO / top).rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    missing = on_disk - listed
    assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {sorted(missing)}"
    # The benchmark harness (bench/, beside its results) runs from a checkout and is not installed.
    assert not any(p == "bench" or p.startswith("bench.") or ".bench" in p for p in listed), sorted(listed)
    assert not list((REPO / "codegen").glob("bench/*.py")), "the benchmark package is bench/, at the top"
    assert st["package-dir"]["codegen.templates"] == "templates"
    globs = st["package-data"]["codegen.templates"]
    tdir = REPO / "templates"
    if tdir.is_dir():
        for f in tdir.rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                rel = f.relative_to(tdir)
                assert any(rel.match(g) or (len(rel.parts) == 1 and Path(rel.name).match(g)) for g in globs), (
                    f"templates/{rel} would not be installed: add its pattern to package-data"
                )


# ---------------------------------------------------------------------------------------------
# compile + report + SASS
# ---------------------------------------------------------------------------------------------


def test_wgmma_tma_kernel_compiles_to_hgmma_and_utmaldg(cache):
    res = compile_cuda(WGMMA_TMA_SRC, arch="sm_90a", name="probe.cu", cache=cache)
    assert isinstance(res, CompileResult)
    assert res.cubin[:4] == b"\x7fELF"
    assert ".target sm_90a" in res.ptx and "wgmma.mma_async" in res.ptx
    k = res.kernel("probe")
    assert k.registers > 0 and not k.spills
    assert k.static_smem >= 64 * 64 * 2
    assert res.nvrtc_version == (13, 0)
    ops = opcode_counts(disassemble(res.cubin))
    assert ops["HGMMA"] >= 1, ops
    assert ops["UTMALDG"] >= 1, ops
    assert ops["SYNCS"] >= 1, ops  # mbarrier


def test_trivial_kernel_for_each_arch(cache):
    for arch in ("sm_90a", "sm_100a", "sm_103a"):
        res = compile_cuda(TRIVIAL_SRC, arch=arch, cache=cache)
        assert f".target {arch}" in res.ptx
        assert res.kernel("axpy").registers > 0
        assert "FFMA" in opcode_counts(disassemble(res.cubin)) or arch != "sm_90a"


def test_bad_arch_is_rejected():
    with pytest.raises(ValueError, match="sm_90a"):
        compile_cuda(TRIVIAL_SRC, arch="hopper", use_cache=False)
    with pytest.raises(ValueError, match="cannot compile for sm_42"):
        compile_cuda(TRIVIAL_SRC, arch="sm_42", use_cache=False)
    with pytest.raises(ValueError, match="arch="):
        compile_cuda(TRIVIAL_SRC, arch="sm_90a", extra_options=["-arch=sm_80"], use_cache=False)


def test_syntax_error_raises_with_full_log(cache):
    bad = 'extern "C" __global__ void broken(int* x) { x[0] = 1 }\n'
    with pytest.raises(NvrtcError) as ei:
        compile_cuda(bad, arch="sm_90a", name="broken_kernel.cu", cache=cache)
    msg = str(ei.value)
    assert "broken_kernel.cu" in msg
    assert 'expected a ";"' in msg
    assert ei.value.log and ei.value.log in msg
    assert not list(cache.directory.rglob("*.fgc")), "failed compiles must not be cached"


def test_ptxas_error_raises_with_log(cache):
    bad = 'extern "C" __global__ void k(int* x) { asm volatile("bogus.instr;"); }\n'
    with pytest.raises(NvrtcError, match="ptxas") as ei:
        compile_cuda(bad, arch="sm_90a", name="bad_ptx.cu", cache=cache)
    assert "bogus" in str(ei.value) and "bad_ptx.cu" in str(ei.value)


def test_spills_are_detected_and_rejected(cache):
    opts = ["-maxrregcount=32"]
    with pytest.raises(SpillError) as ei:
        compile_cuda(SPILL_SRC, arch="sm_90a", extra_options=opts, cache=cache)
    msg = str(ei.value)
    assert "spiller" in msg and "bytes spill stores" in msg
    res = ei.value.result
    assert res.kernel("spiller").spill_stores > 0 and res.kernel("spiller").spill_loads > 0
    assert res.kernel("spiller").registers <= 32
    assert re.search(rf"{res.kernel('spiller').spill_stores} bytes spill stores", msg)
    # the verdict is re-applied to cached results; allowing spills returns the same compile
    ok = compile_cuda(SPILL_SRC, arch="sm_90a", extra_options=opts, allow_spills=True, cache=cache)
    assert ok.cached and ok.spill_stores["spiller"] == res.spill_stores["spiller"]
    with pytest.raises(SpillError):
        compile_cuda(SPILL_SRC, arch="sm_90a", extra_options=opts, cache=cache)


def test_setmaxnreg_ignored_raises_unless_allowed(cache):
    with pytest.raises(SetmaxnregIgnoredError, match="C7508"):
        compile_cuda(SETMAXNREG_SRC % "", arch="sm_90a", cache=cache)
    res = compile_cuda(SETMAXNREG_SRC % "", arch="sm_90a", allow_setmaxnreg_ignored=True, cache=cache)
    assert any("C7508" in w for w in res.warnings)
    good = compile_cuda(SETMAXNREG_SRC % "__launch_bounds__(384, 1)", arch="sm_90a", cache=cache)
    assert not any("setmaxnreg" in w for w in good.warnings)


# One wgmma; EARLY is code between its commit and its wait.
WGMMA_SRC = r"""
extern "C" __global__ void __launch_bounds__(128, 1) mma(float* out, unsigned long long da, unsigned long long db) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  EARLY
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
"""


def test_serialized_wgmma_raises_unless_allowed(cache):
    """Reading an accumulator before its wgmma's wait makes ptxas inject a wait of its own: correct, but the
    pipeline the kernel was written for is gone, so the build refuses it."""
    early = WGMMA_SRC.replace("EARLY", "out[threadIdx.x + 128] = d[0];")
    with pytest.raises(WgmmaSerializedError, match="warpgroup.wait is injected"):
        compile_cuda(early, arch="sm_90a", cache=cache)
    res = compile_cuda(early, arch="sm_90a", allow_wgmma_serialized=True, cache=cache)
    assert any("C7517" in w for w in res.warnings)
    good = compile_cuda(WGMMA_SRC.replace("EARLY", ""), arch="sm_90a", cache=cache)
    assert not any("wgmma" in w or "warpgroup" in w for w in good.warnings)


def test_empty_nvrtc_log_falls_back_to_ptxas_report(cache, monkeypatch):
    """NVRTC 13.0.88 on the GPU image sometimes returns an empty log despite -Xptxas=-v."""
    import codegen.nvrtc as nv

    if cuda_env.ptxas_path() is None:
        pytest.skip("no ptxas executable for the fallback report")
    real = nv._nvrtc_compile
    monkeypatch.setattr(nv, "_nvrtc_compile", lambda *a: real(*a)[:2] + ("",))
    opts = ["-maxrregcount=32"]
    with pytest.raises(SpillError, match="spiller"):
        compile_cuda(SPILL_SRC, arch="sm_90a", extra_options=opts, cache=cache)
    res = compile_cuda(SETMAXNREG_SRC % "__launch_bounds__(384, 1)", arch="sm_90a", cache=cache)
    assert res.kernel("ws").registers > 0 and "[flashgen]" in res.log
    with pytest.raises(SetmaxnregIgnoredError):
        compile_cuda(SETMAXNREG_SRC % "", arch="sm_90a", cache=cache)


def test_parse_ptxas_log():
    log = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 3.262 ms
ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at entry.
ptxas info    : Compiling entry function '_Z5spillPfi' for 'sm_90a'
ptxas info    : Function properties for _Z5spillPfi
ptxas         .     4656 bytes stack frame, 5000 bytes spill stores, 5728 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 4656 bytes cumulative stack size
k.cu(3): warning #177-D: variable "y" was declared but never referenced
"""
    kernels, functions = parse_ptxas_log(log)
    assert set(kernels) == {"k2", "_Z5spillPfi"}
    assert kernels["k2"].registers == 10 and kernels["k2"].static_smem == 1024 and kernels["k2"].barriers == 1
    s = kernels["_Z5spillPfi"]
    assert (s.registers, s.spill_stores, s.spill_loads, s.stack_bytes, s.static_smem) == (32, 5000, 5728, 4656, 0)
    assert functions["_Z6helperv"].spill_stores == 8 and not functions["_Z6helperv"].entry
    w = parse_warnings(log)
    assert len(w) == 2 and "C7508" in w[0] and "#177-D" in w[1]


# ---------------------------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------------------------


def test_cache_hit_on_second_compile(cache):
    src = TRIVIAL_SRC + "\n// cache-hit test\n"
    first = compile_cuda(src, arch="sm_90a", cache=cache)
    t0 = time.perf_counter()
    second = compile_cuda(src, arch="sm_90a", cache=cache)
    warm = time.perf_counter() - t0
    assert not first.cached and second.cached
    assert second.cubin == first.cubin and second.ptx == first.ptx and second.log == first.log
    assert second.kernels == first.kernels
    assert warm < 0.05, f"cache hit took {warm:.3f} s"
    # a different arch, option or source is a different entry
    assert not compile_cuda(src, arch="sm_100a", cache=cache).cached
    assert not compile_cuda(src, arch="sm_90a", extra_options=["-lineinfo"], cache=cache).cached
    assert not compile_cuda(src + " ", arch="sm_90a", cache=cache).cached
    assert not compile_cuda(src, arch="sm_90a", use_cache=False).cached


def test_cache_key_is_a_frozen_dataclass_without_host_paths(cache):
    res = compile_cuda(TRIVIAL_SRC, arch="sm_90a", cache=cache)
    (entry_file,) = cache.directory.rglob("*.fgc")
    blob = entry_file.read_bytes()
    for d in cuda_env.include_dirs():
        assert d.encode() not in blob, "include paths must not enter the cache key"
    key = CacheKey(source_sha256(TRIVIAL_SRC), "sm_90a", (13, 0), ("-std=c++17",))
    with pytest.raises(Exception):
        key.arch = "sm_100a"  # frozen
    assert hash(key) == hash(CacheKey(source_sha256(TRIVIAL_SRC), "sm_90a", [13, 0], ["-std=c++17"]))
    with pytest.raises(TypeError):
        cache.get((source_sha256(TRIVIAL_SRC), "sm_90a"))
    assert res.cubin


def test_corrupt_entries_are_removed_and_recompiled(cache):
    src = TRIVIAL_SRC + "\n// corrupt-entry test\n"
    good = compile_cuda(src, arch="sm_90a", cache=cache)
    (path,) = cache.directory.rglob("*.fgc")
    data = path.read_bytes()
    corruptions = [
        data[: len(data) // 2],  # truncated
        data[:-100] + bytes([data[-100] ^ 0x01]) + data[-99:],  # one flipped bit
        b"",  # empty
        b"garbage" * 10,
    ]
    for bad in corruptions:
        path.write_bytes(bad)
        again = compile_cuda(src, arch="sm_90a", cache=cache)
        assert not again.cached, "a corrupt entry must never be returned"
        assert again.cubin == good.cubin
        hit = compile_cuda(src, arch="sm_90a", cache=cache)
        assert hit.cached and hit.cubin == good.cubin, "the entry is rewritten whole"


def test_disk_cache_roundtrip_and_wrong_key(tmp_path):
    c = DiskCache(tmp_path)
    k1 = CacheKey("a" * 64, "sm_90a", (13, 0), ("x",))
    k2 = CacheKey("b" * 64, "sm_90a", (13, 0), ("x",))
    assert c.get(k1) is None
    p = c.put(k1, {"cubin": b"\x00\x01", "ptx": b"ptx"}, {"n": 1})
    e = c.get(k1)
    assert e.blobs == {"cubin": b"\x00\x01", "ptx": b"ptx"} and e.meta == {"n": 1}
    # an entry whose stored key differs (e.g. copied over) is a miss and is removed
    p2 = c.path_for(k2)
    p2.parent.mkdir(parents=True, exist_ok=True)
    p2.write_bytes(p.read_bytes())
    assert c.get(k2) is None and not p2.exists()
    assert not [f for f in tmp_path.rglob("*") if f.name.endswith(".tmp")]


def _compile_in_child(cache_dir: str, src: str, barrier, queue):
    import hashlib

    from codegen.cache import DiskCache as _DC
    from codegen.nvrtc import compile_cuda as _cc

    barrier.wait(timeout=60)
    r = _cc(src, arch="sm_90a", cache=_DC(cache_dir))
    queue.put((hashlib.sha256(r.cubin).hexdigest(), r.cached, r.ptx))


def test_two_processes_compile_the_same_kernel_at_once(tmp_path):
    src = WGMMA_TMA_SRC + "\n// concurrency test\n"
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child, args=(str(tmp_path), src, barrier, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0][0] == results[1][0] and results[0][2] == results[1][2]
    entries = list(tmp_path.rglob("*.fgc"))
    assert len(entries) == 1
    assert not [f for f in tmp_path.rglob("*") if f.name.endswith(".tmp")], "temp files left behind"
    again = compile_cuda(src, arch="sm_90a", cache=DiskCache(tmp_path))
    assert again.cached
    import hashlib

    assert hashlib.sha256(again.cubin).hexdigest() == results[0][0]


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu(needs_torch=False)
def test_nvrtc_cubin_loads_on_the_driver(cache):
    from cuda.bindings import driver as cu

    def ok(res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else rest

    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    major = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    res = compile_cuda(WGMMA_TMA_SRC if arch == "sm_90a" else TRIVIAL_SRC, arch=arch, cache=cache)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(res.cubin))
    fn = ok(cu.cuModuleGetFunction(module, b"probe" if arch == "sm_90a" else b"axpy"))
    regs = ok(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
    assert regs == res.kernel().registers
    ok(cu.cuModuleUnload(module))
    ok(cu.cuDevicePrimaryCtxRelease(dev))
