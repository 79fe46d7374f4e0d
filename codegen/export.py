"""Export a self-contained bundle of one kernel for C++/CUDA builds with no Python at run time.

The bundle: the kernel source (CUDA toolkit headers only), a C header and launcher that build the tensor maps
through the driver API and launch with the manifest's grid/block/shared memory, the manifest, the NVRTC PTX
and cubin for sm_90a, an example program that checks the kernel against a float32 reference, and a minimal
CMakeLists.txt. The tensor-map dims, strides and boxes in the launcher are the layouts/ recipes' own
expressions, rendered, not retyped.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from layouts.dtypes import DTYPES
from layouts.tma import TMA_DTYPE_NAMES, TMA_SWIZZLE_NAMES

from .build import BuiltKernel, build
from .files import OutputError, check_writable, write_all
from .families.fwd_sm90 import abi as fwd_abi
from .render import environment
from .spec import KernelSpec, SpecError

# The example passes when its error against the float32 reference is below this (bf16 inputs give ~3e-3).
_EXAMPLE_TOLERANCE = {"f16": 2e-3, "bf16": 1e-2}


@dataclass(frozen=True)
class Bundle:
    directory: pathlib.Path
    files: tuple[pathlib.Path, ...]
    built: BuiltKernel


def export_bundle(spec: KernelSpec, directory: pathlib.Path) -> Bundle:
    """Build `spec`'s kernel (a KernelSpec, or a DecodeSpec) and write its bundle into `directory` (all files or
    none; codegen.files)."""
    built = build(spec)
    directory = pathlib.Path(directory)
    written = write_all({directory / filename: content for filename, content in bundle_files(built).items()})
    return Bundle(directory, tuple(written), built)


def is_bundle_of(directory: pathlib.Path, kernel_name: str) -> bool:
    """Whether `directory` holds a bundle of this kernel (its manifest names it)."""
    manifest = pathlib.Path(directory) / f"{kernel_name}.json"
    try:
        return json.loads(manifest.read_text()).get("kernel") == kernel_name
    except (OSError, ValueError, AttributeError):
        return False


def check_destination(directory: pathlib.Path, kernel_name: str, *, force: bool = False) -> None:
    """Refuse (OutputError) to export into a file, or into a non-empty folder that is not a previous bundle of
    the same kernel (unless `force`), so a bundle never silently overwrites someone's CMakeLists.txt."""
    directory = pathlib.Path(directory)
    check_writable(directory, "--export")
    if force or not directory.is_dir() or is_bundle_of(directory, kernel_name):
        return
    try:
        entries = sorted(p.name for p in directory.iterdir())
    except OSError as e:
        raise OutputError(f"--export {directory}: cannot list it ({e.strerror})") from None
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutputError(f"--export {directory} is not empty ({shown}) and holds no bundle of {kernel_name}; "
                          "name a new or empty folder, or pass --force to write over it")


EXPORTABLE = ("fwd_sm90", "fwd_sm100", "decode_sm90")
# The decode example's cache capacity per sequence: several key blocks and pages, a part block at the end.
DECODE_EXAMPLE_CAPACITY = 1024 + 256


def gencode(arch: str) -> str:
    """nvcc's -gencode value for an architecture-specific target: sm_103a -> arch=compute_103a,code=sm_103a."""
    return f"arch=compute_{arch[3:]},code={arch}"


def bundle_files(built: BuiltKernel) -> dict[str, str | bytes]:
    """The bundle of a built kernel, file name -> content (nothing is written)."""
    if built.family.name not in EXPORTABLE:
        raise SpecError(f"export bundles are built for the forward kernels ({', '.join(EXPORTABLE)}), not "
                        f"{built.family.name}")
    if built.family.name == "decode_sm90":
        return _decode_bundle_files(built)
    plan, name = built.plan, built.rendered.kernel_name
    spec = plan.spec
    operands = []
    for op in (op for op in ("q", "k", "v", "o") if hasattr(plan, op)):  # the operands the kernel maps
        described = getattr(plan, op).tensor_map.describe()
        kv = op in ("k", "v")
        operands.append({"name": op, "rank": described["rank"], "describe": described,
                         "key_groups": getattr(plan, op).tensor_map.kind == "key_group_atoms",
                         "swizzle_enum": TMA_SWIZZLE_NAMES[getattr(plan, op).tensor_map.swizzle.span_bytes],
                         "seq": plan.spec.keys if kv else plan.spec.seq_len,
                         "heads": plan.spec.kv_heads if kv else plan.spec.heads})
    context = {
        "summary": built.family.context(plan)["summary"],
        "arch": spec.arch,
        "gencode": gencode(spec.arch),
        "abi": plan.abi,
        "log2e": repr(fwd_abi.LOG2E),
        "kernel_name": name,
        "launch_fn": f"{name}_launch",
        "seq_len": plan.spec.seq_len,
        "seq_len_k": plan.spec.keys,
        "kv_heads": plan.spec.kv_heads,
        "heads": plan.spec.heads,
        "head_dim": plan.spec.head_dim,
        "causal": plan.spec.causal,
        "window_left": spec.window[0],
        "window_right": 0 if spec.causal else spec.window[1],
        "softcap_c": f"{float(plan.spec.softcap)!r}f",
        "dtype": plan.spec.dtype,
        "dtype_c": DTYPES[plan.spec.dtype].c,
        "elem_bytes": plan.spec.elem_bytes,
        "tma_dtype": TMA_DTYPE_NAMES[plan.spec.dtype],
        "operands": operands,
        "smem_bytes": plan.smem.total,
        "threads": plan.threads,
        "grid_x": plan.m_blocks,
        "persistent": plan.spec.persistent,
        "varlen": plan.spec.varlen,
        "sinks": "sinks" in plan.abi.names,
        "sinks_param": "const float* sinks, " if "sinks" in plan.abi.names else "",
        "block_m": plan.spec.block_m,
        "tolerance": _EXAMPLE_TOLERANCE[plan.spec.dtype],
    }
    env = environment()
    files: dict[str, str | bytes] = {
        f"{name}.cu": built.rendered.source,
        f"{name}.h": env.get_template("export/launch.h.j2").render(**context),
        f"{name}_launch.cu": env.get_template("export/launch.cu.j2").render(**context),
        "example.cu": env.get_template("export/example_varlen.cu.j2" if plan.spec.varlen
                                       else "export/example.cu.j2").render(**context),
        "CMakeLists.txt": env.get_template("export/CMakeLists.txt.j2").render(**context),
        f"{name}.json": json.dumps(built.manifest(), indent=2) + "\n",
        f"{name}.ptx": built.compiled.ptx,
    }
    files[f"{name}.cubin"] = bytes(built.compiled.cubin)
    return files


def _decode_bundle_files(built: BuiltKernel) -> dict[str, str | bytes]:
    """The decode kernel's bundle: its launcher encodes the K/V cache maps (dense, or the paged loads' box)."""
    from .families.decode_sm90 import append_name, context as decode_context
    from .families.decode_sm90.plan import MAX_CLUSTER_SPLITS, MAX_SPLITS

    plan, name = built.plan, built.rendered.kernel_name
    spec = plan.spec
    kernel_values = decode_context(plan)
    operands = []  # the K/V tensor maps; none for a kernel that gathers its pages by cp.async
    for op in () if spec.gather else ("k", "v"):
        recipe = getattr(plan, op).tensor_map
        described = recipe.describe()
        pages = getattr(plan, f"{op}_pages")
        operands.append({"name": op, "rank": described["rank"], "dims": described["dims"],
                         "strides_bytes": described["strides_bytes"], "box": list(pages.box if pages else recipe.box),
                         "swizzle": described["swizzle"], "swizzle_enum": TMA_SWIZZLE_NAMES[recipe.swizzle.span_bytes],
                         "l2_promotion": described["l2_promotion"]})
    capacity = DECODE_EXAMPLE_CAPACITY - DECODE_EXAMPLE_CAPACITY % max(spec.page_size, 1)
    context = {
        "summary": kernel_values["summary"], "arch": spec.arch, "gencode": gencode(spec.arch), "abi": plan.abi,
        "append_abi": plan.append_abi, "append_name": append_name(spec), "append_threads": plan.append_threads,
        "log2e": repr(fwd_abi.LOG2E), "kernel_name": name, "launch_fn": f"{name}_launch", "q_len": spec.q_len,
        "heads": spec.heads, "kv_heads": spec.kv_heads, "head_dim": spec.head_dim, "causal": spec.causal,
        "window_left": kernel_values["window_left"], "window_right": kernel_values["window_right"],
        "softcap_c": kernel_values["softcap_c"], "page_rows": spec.page_size, "dtype": spec.dtype,
        "dtype_c": DTYPES[spec.dtype].c, "elem_bytes": spec.elem_bytes, "tma_dtype": TMA_DTYPE_NAMES[spec.dtype],
        "operands": operands, "smem_bytes": plan.smem.total, "threads": plan.threads, "block_m": plan.block_m,
        "grid_y": plan.grid(1, 1)[1], "max_splits": MAX_SPLITS,
        "max_cluster_splits": MAX_CLUSTER_SPLITS, "example_capacity": capacity,
        "tolerance": _EXAMPLE_TOLERANCE[spec.dtype],
    }
    env = environment()
    files: dict[str, str | bytes] = {
        f"{name}.cu": built.rendered.source,
        f"{name}.h": env.get_template("export/decode_launch.h.j2").render(**context),
        f"{name}_launch.cu": env.get_template("export/decode_launch.cu.j2").render(**context),
        "example.cu": env.get_template("export/decode_example.cu.j2").render(**context),
        "CMakeLists.txt": env.get_template("export/CMakeLists.txt.j2").render(**context),
        f"{name}.json": json.dumps(built.manifest(), indent=2) + "\n",
        f"{name}.ptx": built.compiled.ptx,
    }
    files[f"{name}.cubin"] = bytes(built.compiled.cubin)
    return files


def nvcc_command(bundle: Bundle, nvcc: str = "nvcc", output: str = "example") -> list[str]:
    """The one-line build of the example (the same flags as the bundle's CMakeLists.txt)."""
    name = bundle.built.rendered.kernel_name
    return [nvcc, "-O2", "-std=c++17", "-gencode", gencode(bundle.built.spec.arch), "-I", str(bundle.directory),
            str(bundle.directory / "example.cu"), str(bundle.directory / f"{name}_launch.cu"),
            "-o", str(bundle.directory / output)]
