"""Compile CUDA C++ to PTX and CUBIN with NVRTC (no GPU needed), with a disk cache.

    res = compile_cuda(src, arch="sm_90a", name="fwd.cu")
    res.cubin, res.ptx, res.kernels["my_kernel"].registers

Always passes ``-Xptxas=-v`` and parses its report (registers, spills, stack, static shared memory,
barriers) per kernel.  Spills raise ``SpillError`` unless ``allow_spills=True``; ptxas's C7508
"'setmaxnreg' ignored" raises ``SetmaxnregIgnoredError`` unless ``allow_setmaxnreg_ignored=True``; a
serialized wgmma pipeline (C7514-C7518) raises ``WgmmaSerializedError`` unless ``allow_wgmma_serialized=True``;
compile errors raise ``NvrtcError`` with the whole program log.  The policy checks run on cached
results too (the cache stores what the compiler produced, not the verdict).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from . import cuda_env
from .cache import CacheKey, DiskCache, source_sha256

__all__ = [
    "CompileError",
    "NvrtcError",
    "SpillError",
    "SetmaxnregIgnoredError",
    "WgmmaSerializedError",
    "KernelInfo",
    "CompileResult",
    "compile_cuda",
    "base_options",
    "parse_ptxas_log",
    "parse_warnings",
]

_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


class CompileError(RuntimeError):
    """Base of everything compile_cuda raises about the kernel itself."""

    def __init__(self, message: str, *, log: str = "", name: str = "", result: "CompileResult | None" = None):
        super().__init__(message)
        self.log = log
        self.name = name
        self.result = result


class NvrtcError(CompileError):
    """NVRTC (front end or ptxas) rejected the program, or an NVRTC call failed."""


class SpillError(CompileError):
    """ptxas spilled registers to local memory (and spills were not allowed)."""


class SetmaxnregIgnoredError(CompileError):
    """ptxas ignored setmaxnreg (C7508), so the register split the kernel relies on is not in effect."""


class WgmmaSerializedError(CompileError):
    """ptxas serialized the kernel's wgmma pipeline (C7514-C7518: it waits after every wgmma, or injected a wait
    of its own), because some code touches a wgmma's registers where ptxas cannot prove the wgmma finished. The
    kernel would still be correct, at a fraction of its speed."""


@dataclass(frozen=True)
class KernelInfo:
    """One function's resources as ptxas reported them (``-Xptxas=-v``).  Names are as in the PTX
    (mangled unless the kernel is ``extern "C"``)."""

    name: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    static_smem: int = 0
    barriers: int = 0
    entry: bool = True

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    ptx: str
    log: str
    arch: str
    name: str
    options: tuple[str, ...]
    kernels: Mapping[str, KernelInfo]
    warnings: tuple[str, ...]
    compile_seconds: float  # wall time of this call (a cache lookup when cached=True)
    cached: bool
    nvrtc_version: tuple[int, int]
    functions: Mapping[str, KernelInfo] = field(default_factory=dict)  # non-entry functions with a frame

    def kernel(self, name: str | None = None) -> KernelInfo:
        """The named kernel; with no name, the only kernel (error if there are several)."""
        if name is None:
            if len(self.kernels) != 1:
                raise KeyError(f"{len(self.kernels)} kernels in {self.name}: {sorted(self.kernels)}; name one")
            return next(iter(self.kernels.values()))
        try:
            return self.kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in {self.name}; kernels: {sorted(self.kernels)}") from None

    @property
    def registers(self) -> dict[str, int]:
        return {k: v.registers for k, v in self.kernels.items()}

    @property
    def spill_stores(self) -> dict[str, int]:
        return {k: v.spill_stores for k, v in self.kernels.items()}

    @property
    def spill_loads(self) -> dict[str, int]:
        return {k: v.spill_loads for k, v in self.kernels.items()}

    @property
    def stack_bytes(self) -> dict[str, int]:
        return {k: v.stack_bytes for k, v in self.kernels.items()}

    @property
    def static_smem(self) -> dict[str, int]:
        return {k: v.static_smem for k, v in self.kernels.items()}


# --------------------------------------------------------------------------------------------------
# log parsing
# --------------------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_WARNING_RE = re.compile(r"(\bwarning\b|\(C\d{4}\)|Potential Performance Loss)", re.I)
_SETMAXNREG_RE = re.compile(r"setmaxnreg'?\s+ignored", re.I)
_WGMMA_SERIALIZED_RE = re.compile(r"wgmma\.mma_async instructions are serialized|warpgroup\.wait is injected", re.I)


def parse_ptxas_log(log: str) -> tuple[dict[str, KernelInfo], dict[str, KernelInfo]]:
    """Parse a ``ptxas -v`` report.  Returns (entry kernels, other functions with properties).

    The report looks like::

        ptxas info    : Compiling entry function 'k' for 'sm_90a'
        ptxas info    : Function properties for k
        ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 72 registers, used 1 barriers, 1024 bytes smem
    """
    props: dict[str, dict] = {}
    entries: list[str] = []
    current_entry: str | None = None
    props_for: str | None = None
    for line in log.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            current_entry = m.group(1)
            entries.append(current_entry)
            props.setdefault(current_entry, {})
            props_for = None
            continue
        m = _PROPS_RE.search(line)
        if m:
            props_for = m.group(1)
            props.setdefault(props_for, {})
            continue
        m = _FRAME_RE.search(line)
        if m and props_for is not None:
            d = props[props_for]
            d["stack_bytes"], d["spill_stores"], d["spill_loads"] = (int(x) for x in m.groups())
            continue
        m = _USED_RE.search(line)
        if m and current_entry is not None:
            d = props[current_entry]
            d["registers"] = int(m.group(1))
            b = _BARRIERS_RE.search(line)
            if b:
                d["barriers"] = int(b.group(1))
            s = _SMEM_RE.search(line)
            d["static_smem"] = int(s.group(1)) if s else 0
    kernels = {n: KernelInfo(name=n, entry=True, **props.get(n, {})) for n in entries}
    others = {n: KernelInfo(name=n, entry=False, **d) for n, d in props.items() if n not in kernels}
    return kernels, others


def parse_warnings(log: str) -> tuple[str, ...]:
    """Every warning-like line of the log (front-end warnings, ptxas warnings, ptxas (Cxxxx) notes)."""
    return tuple(line.strip() for line in log.splitlines() if _WARNING_RE.search(line))


# --------------------------------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------------------------------


def _validate_arch(arch: str) -> str:
    m = _ARCH_RE.match(arch or "")
    if not m:
        raise ValueError(f"arch must look like 'sm_90a' / 'sm_100a' / 'sm_103a', got {arch!r}")
    cc = int(m.group(1))
    supported = cuda_env.supported_archs()
    if cc not in supported:
        major, minor = cuda_env.nvrtc_version()
        raise ValueError(
            f"NVRTC {major}.{minor} cannot compile for {arch}; it supports sm_"
            + ", sm_".join(str(a) for a in supported)
        )
    return arch


def base_options(arch: str, *, lineinfo: bool = False) -> list[str]:
    """The options compile_cuda passes before ``extra_options`` (include dirs included)."""
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "-Xptxas=-v", "-default-device"]
    if lineinfo:
        opts.append("-lineinfo")
    opts += [f"-I{d}" for d in cuda_env.include_dirs()]
    return opts


def _key_options(options: list[str], name: str) -> tuple[str, ...]:
    """Options as they enter the cache key: include paths replaced by the header versions."""
    out = [o for o in options if not (o.startswith("-I") or o.startswith("--include-path"))]
    hv = cuda_env.header_versions()
    out.append(f"#headers=cudart:{hv['cudart']},cccl:{hv['cccl']}")
    out.append(f"#name={name}")
    return tuple(out)


def _nvrtc_compile(source: str, name: str, options: list[str]) -> tuple[bytes, str, str]:
    """Run NVRTC.  Returns (cubin, ptx, log); raises NvrtcError with the full log on failure."""
    from cuda.bindings import nvrtc  # cuda_env already checked it imports

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS

    def check(res, what):
        err = res[0] if isinstance(res, tuple) else res
        if err != ok:
            _, msg = nvrtc.nvrtcGetErrorString(err)
            raise NvrtcError(f"{what} failed for {name}: {msg.decode()}", name=name)
        return res[1:] if isinstance(res, tuple) else ()

    (prog,) = check(nvrtc.nvrtcCreateProgram(source.encode("utf-8"), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        bopts = [o.encode() for o in options]
        res = nvrtc.nvrtcCompileProgram(prog, len(bopts), bopts)
        err = res[0] if isinstance(res, tuple) else res
        (size,) = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # bytearray, not b" " * size: NVRTC writes into the buffer, and for size 1 (an empty log)
        # b" " * 1 is CPython's shared one-byte bytes object, which would be corrupted.
        buf = bytearray(size)
        check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = bytes(buf).decode("utf-8", errors="replace").replace("\x00", "").rstrip()
        if err != ok:
            _, msg = nvrtc.nvrtcGetErrorString(err)
            raise NvrtcError(
                f"NVRTC failed to compile {name} ({msg.decode()}) for "
                f"{next((o.split('=', 1)[1] for o in options if o.startswith('--gpu-architecture=')), '?')}"
                f"\noptions: {' '.join(options)}\n--- program log ---\n{log}\n--- end of log ---",
                log=log,
                name=name,
            )
        (size,) = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        (size,) = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = bytearray(size)
        check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return bytes(cubin), bytes(ptx).decode("utf-8", errors="replace").rstrip("\x00"), log


def _ptxas_options(options: list[str]) -> list[str]:
    """The subset of NVRTC options that change what ptxas does, in ptxas's spelling."""
    out = []
    for o in options:
        if o.startswith("-Xptxas="):
            out += [x for x in o.split("=", 1)[1].split(",") if x and x != "-v"]
        elif o.startswith(("-maxrregcount=", "--maxrregcount=")):
            out += ["--maxrregcount", o.split("=", 1)[1]]
        elif o in ("-lineinfo", "--generate-line-info"):
            out.append("-lineinfo")
    return out


def _ptxas_report(ptx: str, arch: str, options: list[str]) -> str | None:
    """Run the toolkit's ptxas -v on the PTX and return its report, or None if ptxas is unavailable.

    Used when NVRTC's program log comes back without the -Xptxas=-v report (seen on the GPU image:
    the same NVRTC 13.0.88 sometimes returns an empty log).
    """
    import subprocess
    import tempfile

    exe = cuda_env.ptxas_path()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="flashgen-ptxas-") as d:
        src = f"{d}/kernel.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [exe, "-v", f"-arch={arch}", *_ptxas_options(options), src, "-o", f"{d}/kernel.cubin"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError):
            return None
    if proc.returncode != 0:
        return None
    return (proc.stdout + proc.stderr).strip()


def _enforce(result: CompileResult, *, allow_spills: bool, allow_setmaxnreg_ignored: bool,
             allow_wgmma_serialized: bool) -> None:
    if not allow_spills:
        bad = [k for k in list(result.kernels.values()) + list(result.functions.values()) if k.spills]
        if bad:
            detail = "; ".join(
                f"{k.name}: {k.spill_stores} bytes spill stores, {k.spill_loads} bytes spill loads"
                f" ({k.registers} registers, {k.stack_bytes} bytes stack)"
                for k in bad
            )
            raise SpillError(
                f"register spills in {result.name} for {result.arch}: {detail}\n--- ptxas report ---\n{result.log}",
                log=result.log,
                name=result.name,
                result=result,
            )
    if not allow_wgmma_serialized:
        bad_lines = [w for w in result.warnings if _WGMMA_SERIALIZED_RE.search(w)]
        if bad_lines:
            raise WgmmaSerializedError(
                f"ptxas serialized the wgmma pipeline in {result.name} for {result.arch}: " + " | ".join(bad_lines)
                + f"\n--- ptxas report ---\n{result.log}",
                log=result.log,
                name=result.name,
                result=result,
            )
    if not allow_setmaxnreg_ignored:
        bad_lines = [w for w in result.warnings if _SETMAXNREG_RE.search(w)]
        if bad_lines:
            raise SetmaxnregIgnoredError(
                f"ptxas ignored setmaxnreg in {result.name} for {result.arch} (the kernel needs "
                "__launch_bounds__(threads, 1) so ptxas knows the register count at entry): "
                + " | ".join(bad_lines)
                + f"\n--- ptxas report ---\n{result.log}",
                log=result.log,
                name=result.name,
                result=result,
            )


def compile_cuda(
    source: str,
    *,
    arch: str,
    name: str = "kernel.cu",
    extra_options: Iterable[str] = (),
    allow_spills: bool = False,
    allow_setmaxnreg_ignored: bool = False,
    allow_wgmma_serialized: bool = False,
    lineinfo: bool = False,
    use_cache: bool = True,
    cache: DiskCache | None = None,
) -> CompileResult:
    """Compile CUDA C++ ``source`` for ``arch`` (e.g. ``"sm_90a"``) to CUBIN and PTX.

    Options: ``--gpu-architecture=<arch> -std=c++17 -Xptxas=-v -default-device [-lineinfo]
    -I<include> -I<include/cccl>`` then ``extra_options`` (a ``-std=`` there replaces the default).
    Results are cached on disk (``cache`` or the default ``DiskCache()``) unless ``use_cache=False``.

    Raises NvrtcError (with the full program log) when compilation fails, SpillError when a function
    spills and ``allow_spills`` is False, SetmaxnregIgnoredError on ptxas C7508 unless allowed,
    WgmmaSerializedError when ptxas serialized wgmma (C7514-C7518) unless ``allow_wgmma_serialized``,
    ValueError for an arch NVRTC cannot target, ToolchainMissingError when NVRTC or headers are missing.
    """
    t0 = time.perf_counter()
    if not isinstance(source, str):
        raise TypeError(f"source must be str, got {type(source).__name__}")
    _validate_arch(arch)
    extra = [str(o) for o in extra_options]
    for o in extra:
        if o.startswith(("-arch", "--gpu-architecture")):
            raise ValueError(f"pass the architecture as arch=..., not in extra_options ({o!r})")
    options = base_options(arch, lineinfo=lineinfo)
    if any(o.startswith(("-std", "--std")) for o in extra):
        options = [o for o in options if not o.startswith("-std=")]
    options += extra
    nv = cuda_env.nvrtc_version()

    key = CacheKey(source_sha256=source_sha256(source), arch=arch, nvrtc_version=nv,
                   options=_key_options(options, name))
    store = (cache if cache is not None else DiskCache()) if use_cache else None

    entry = store.get(key) if store is not None else None
    if entry is not None:
        cubin = entry.blobs["cubin"]
        ptx = entry.blobs["ptx"].decode("utf-8")
        log = entry.blobs["log"].decode("utf-8")
        cached = True
    else:
        cubin, ptx, log = _nvrtc_compile(source, name, options)
        cached = False
        if not _ENTRY_RE.search(log) and ".entry" in ptx:
            report = _ptxas_report(ptx, arch, options)
            if report:
                log = (log + "\n" if log else "") + (
                    f"[flashgen] NVRTC returned no ptxas report; this one is from {cuda_env.ptxas_path()}:\n{report}"
                )
        if store is not None:
            try:
                store.put(key, {"cubin": cubin, "ptx": ptx.encode("utf-8"), "log": log.encode("utf-8")},
                          {"name": name, "compile_seconds": time.perf_counter() - t0})
            except OSError:
                pass  # a read-only or full cache directory must not fail the compile

    kernels, functions = parse_ptxas_log(log)
    warnings = parse_warnings(log)
    if not kernels and ".entry" in ptx:
        warnings += ("[flashgen] no ptxas resource report (registers, spills) was available for this compile",)
    result = CompileResult(
        cubin=cubin,
        ptx=ptx,
        log=log,
        arch=arch,
        name=name,
        options=tuple(options),
        kernels=kernels,
        warnings=warnings,
        compile_seconds=time.perf_counter() - t0,
        cached=cached,
        nvrtc_version=nv,
        functions=functions,
    )
    _enforce(result, allow_spills=allow_spills, allow_setmaxnreg_ignored=allow_setmaxnreg_ignored,
             allow_wgmma_serialized=allow_wgmma_serialized)
    return result
