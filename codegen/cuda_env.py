"""Where the CUDA toolchain pieces are, and whether a GPU can be used.

Everything here is discovered once per process and cached.  Nothing needs a GPU or a driver except
``driver_status()``, which reports (never raises) whether one is usable.

Search order for the NVRTC headers (NVRTC 13.0 has no built-in headers; kernels need both
``include/`` for ``cuda_fp16.h`` & co. and ``include/cccl/`` for ``cuda/std/...``):

1. ``$FLASHGEN_CUDA_INCLUDE`` (one directory; ``<dir>/cccl`` is used beside it when it exists),
2. ``cuda.pathfinder`` (NVIDIA wheels ``nvidia-cuda-runtime`` / ``nvidia-cuda-cccl``, conda, CUDA_HOME),
3. ``$CUDA_PATH``, ``$CUDA_HOME``, ``/usr/local/cuda`` (``include/`` and ``include/cccl/``).

NVRTC itself is loaded by ``cuda.bindings`` (which uses ``cuda.pathfinder``: wheel, conda, CUDA_HOME,
then the system loader path).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from pathlib import Path

__all__ = [
    "ToolchainMissingError",
    "templates_dir",
    "nvrtc_version",
    "nvrtc_library",
    "include_dirs",
    "header_versions",
    "supported_archs",
    "driver_status",
    "ptxas_path",
    "toolchain_summary",
]

PIP_HINT_NVRTC = "pip install 'cuda-bindings>=13.0,<14' nvidia-cuda-nvrtc==13.0.88"
PIP_HINT_TORCH = "pip install 'flashgen[torch]' (any torch 2.4+ with CUDA)"
PIP_HINT_HEADERS = "pip install nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"


class ToolchainMissingError(RuntimeError):
    """A piece of the CUDA toolchain (NVRTC, its headers, nvdisasm) could not be found."""


# --------------------------------------------------------------------------------------------------
# templates
# --------------------------------------------------------------------------------------------------


def _has_templates(d: Path) -> bool:
    return d.is_dir() and any(d.rglob("*.j2"))


def templates_dir() -> Path:
    """The folder holding the Jinja2 kernel templates (``*.cu.j2`` and fragments).

    Installed (``pip install .``), the repository's ``templates/`` is shipped inside the package as
    ``codegen/templates``.  From the source tree it is ``<repo>/templates``.  ``$FLASHGEN_TEMPLATES_DIR``
    overrides both.
    """
    env = os.environ.get("FLASHGEN_TEMPLATES_DIR")
    if env:
        p = Path(env).expanduser().resolve()
        if not p.is_dir():
            raise FileNotFoundError(f"FLASHGEN_TEMPLATES_DIR={env!r} is not a directory")
        return p
    here = Path(__file__).resolve().parent
    installed = here / "templates"
    if _has_templates(installed):
        return installed
    repo = here.parent
    source = repo / "templates"
    # Only trust a sibling templates/ when it is really our repository (not some other
    # top-level 'templates' folder in site-packages).
    if source.is_dir() and (repo / "pyproject.toml").is_file():
        return source
    if installed.is_dir():
        return installed
    raise FileNotFoundError(
        f"flashgen templates not found: looked in {installed} (installed package) and {source} "
        "(source tree). Reinstall flashgen (pip install .) or set FLASHGEN_TEMPLATES_DIR."
    )


# --------------------------------------------------------------------------------------------------
# NVRTC
# --------------------------------------------------------------------------------------------------


def _import_nvrtc():
    try:
        from cuda.bindings import nvrtc  # type: ignore
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ToolchainMissingError(
            f"cuda.bindings is not importable ({e}). Install it with: {PIP_HINT_NVRTC}"
        ) from e
    return nvrtc


def _check(result, what: str):
    """Unpack a cuda.bindings nvrtc call result, raising on a non-success status."""
    nvrtc = _import_nvrtc()
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that ``cuda.bindings`` loaded, e.g. (13, 0)."""
    nvrtc = _import_nvrtc()
    try:
        major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    except ToolchainMissingError:
        raise
    except Exception as e:  # the library itself could not be loaded
        raise ToolchainMissingError(
            f"NVRTC could not be loaded ({type(e).__name__}: {e}). Install it with: {PIP_HINT_NVRTC} "
            "(or put a CUDA 13.0 toolkit's lib64 on the loader path / set CUDA_HOME)."
        ) from e
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def nvrtc_library() -> str:
    """Absolute path of the libnvrtc in use (best effort; 'unknown' if it cannot be told)."""
    nvrtc_version()  # make sure it is loaded
    try:
        import cuda.pathfinder as pf  # type: ignore

        return str(pf.load_nvidia_dynamic_lib("nvrtc").abs_path)
    except Exception:
        pass
    try:  # fall back to the process's memory map
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnvrtc.so" in line or "libnvrtc.alt.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return "unknown"


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can target, e.g. (75, 80, ..., 90, 100, 103, ...)."""
    nvrtc = _import_nvrtc()
    nvrtc_version()
    return tuple(int(a) for a in _check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


# --------------------------------------------------------------------------------------------------
# headers
# --------------------------------------------------------------------------------------------------


def _is_runtime_include(d: Path) -> bool:
    return (d / "cuda_runtime_api.h").is_file() and (d / "cuda_fp16.h").is_file()


def _is_cccl_include(d: Path) -> bool:
    return (d / "cuda" / "std" / "cstdint").is_file()


def _candidate_roots() -> list[Path]:
    roots = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        v = os.environ.get(var)
        if v:
            roots.append(Path(v))
    roots.append(Path("/usr/local/cuda"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    return roots


def _pathfinder_header(libname: str) -> Path | None:
    try:
        import cuda.pathfinder as pf  # type: ignore
    except ImportError:
        return None
    fn = getattr(pf, "find_nvidia_header_directory", None)
    if fn is None:
        return None
    try:
        d = fn(libname)
    except Exception:  # unsupported libname in an older pathfinder, or a lookup failure
        return None
    return Path(d) if d else None


def _cccl_beside(include: Path) -> Path | None:
    for d in (include / "cccl", include):  # CUDA 13 puts CCCL in include/cccl; CUDA 12 in include/
        if _is_cccl_include(d):
            return d
    return None


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """Include directories to pass to NVRTC: (``.../include``, ``.../include/cccl``), deduplicated.

    Raises ToolchainMissingError, saying what to install, when either is missing.
    """
    tried: list[str] = []
    runtime: Path | None = None
    cccl: Path | None = None

    env = os.environ.get("FLASHGEN_CUDA_INCLUDE")
    if env:
        p = Path(env).expanduser()
        tried.append(f"$FLASHGEN_CUDA_INCLUDE={p}")
        if _is_runtime_include(p):
            runtime, cccl = p, _cccl_beside(p)

    if runtime is None:
        p = _pathfinder_header("cudart")
        tried.append(f"cuda.pathfinder cudart -> {p}")
        if p is not None and _is_runtime_include(p):
            runtime = p
    if cccl is None:
        p = _pathfinder_header("cccl")
        tried.append(f"cuda.pathfinder cccl -> {p}")
        if p is not None and _is_cccl_include(p):
            cccl = p
        elif runtime is not None:
            cccl = _cccl_beside(runtime)

    if runtime is None or cccl is None:
        for root in _candidate_roots():
            inc = root / "include"
            tried.append(str(inc))
            if runtime is None and _is_runtime_include(inc):
                runtime = inc
            if cccl is None:
                cccl = _cccl_beside(inc)
            if runtime is not None and cccl is not None:
                break

    missing = []
    if runtime is None:
        missing.append("the CUDA runtime headers (cuda_runtime_api.h, cuda_fp16.h)")
    if cccl is None:
        missing.append("the CCCL headers (cuda/std/cstdint)")
    if missing:
        raise ToolchainMissingError(
            "NVRTC 13.0 has no built-in headers and flashgen could not find "
            + " nor ".join(missing)
            + f". Install them with: {PIP_HINT_HEADERS} (or set CUDA_HOME to a CUDA 13.0 toolkit, "
            "or FLASHGEN_CUDA_INCLUDE to its include/ directory). Looked in: " + "; ".join(tried)
        )
    out: list[str] = []
    for d in (runtime, cccl):
        s = str(d.resolve())
        if s not in out:
            out.append(s)
    return tuple(out)


def _grep_define(path: Path, name: str) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    m = re.search(rf"^\s*#\s*define\s+{name}\s+(\d+)", text, re.M)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=None)
def header_versions() -> dict[str, str]:
    """Versions of the headers NVRTC will see, e.g. {'cudart': '13000', 'cccl': '3000001'}.

    Part of the compile cache key, so a change of header wheels invalidates cached cubins.
    """
    dirs = [Path(d) for d in include_dirs()]
    out = {"cudart": "unknown", "cccl": "unknown"}
    for d in dirs:
        v = _grep_define(d / "cuda_runtime_api.h", "CUDART_VERSION")
        if v and out["cudart"] == "unknown":
            out["cudart"] = v
        v = _grep_define(d / "cuda" / "std" / "__cccl" / "version.h", "CCCL_VERSION")
        if v and out["cccl"] == "unknown":
            out["cccl"] = v
    return out


@functools.lru_cache(maxsize=None)
def ptxas_path() -> str | None:
    """A ptxas executable (only a fallback for the resource report), or None."""
    env = os.environ.get("FLASHGEN_PTXAS")
    if env and os.access(env, os.X_OK):
        return env
    try:
        import cuda.pathfinder as pf  # type: ignore

        fn = getattr(pf, "find_nvidia_binary_utility", None)
        p = fn("ptxas") if fn is not None else None
        if p:
            return str(p)
    except Exception:
        pass
    for root in _candidate_roots():
        p = root / "bin" / "ptxas"
        if os.access(p, os.X_OK):
            return str(p)
    return shutil.which("ptxas")


# --------------------------------------------------------------------------------------------------
# driver / GPU
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def driver_status() -> tuple[bool, str]:
    """(available, reason): whether the CUDA driver initialises and sees at least one GPU.

    Computed once per process; never raises.  ``FLASHGEN_DISABLE_GPU=1`` forces (False, ...).
    """
    if os.environ.get("FLASHGEN_DISABLE_GPU", "") not in ("", "0"):
        return False, "GPU use disabled by FLASHGEN_DISABLE_GPU"
    try:
        from cuda.bindings import driver  # type: ignore
    except ImportError as e:
        return False, f"cuda.bindings.driver not importable ({e}); {PIP_HINT_NVRTC}"
    try:
        (err,) = driver.cuInit(0)
    except Exception as e:  # libcuda.so missing: cuda.bindings raises instead of returning
        return False, f"no CUDA driver: cuInit could not run ({type(e).__name__}: {e})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return False, f"no usable CUDA driver: cuInit returned {getattr(err, 'name', err)}"
    try:
        err, count = driver.cuDeviceGetCount()
    except Exception as e:  # pragma: no cover
        return False, f"cuDeviceGetCount failed ({type(e).__name__}: {e})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return False, f"cuDeviceGetCount returned {getattr(err, 'name', err)}"
    if count <= 0:
        return False, "the CUDA driver sees no GPU"
    try:
        err, ver = driver.cuDriverGetVersion()
        dv = f"{ver // 1000}.{(ver % 1000) // 10}" if err == driver.CUresult.CUDA_SUCCESS else "?"
    except Exception:  # pragma: no cover
        dv = "?"
    return True, f"CUDA driver {dv}, {count} device(s)"


def toolchain_summary() -> str:
    """One human-readable paragraph: NVRTC version and library, include dirs, header versions, driver."""
    lines = []
    try:
        major, minor = nvrtc_version()
        lines.append(f"NVRTC {major}.{minor} ({nvrtc_library()})")
    except ToolchainMissingError as e:
        lines.append(f"NVRTC: MISSING: {e}")
    try:
        lines.append("include: " + " ".join(include_dirs()))
        hv = header_versions()
        lines.append(f"headers: cudart {hv['cudart']}, cccl {hv['cccl']}")
    except ToolchainMissingError as e:
        lines.append(f"headers: MISSING: {e}")
    ok, why = driver_status()
    lines.append(f"driver: {'available' if ok else 'unavailable'} ({why})")
    return "\n".join(lines)
