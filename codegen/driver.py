"""The CUDA driver side: context, module loading, tensor maps and launches, through cuda.bindings.driver.

Only this module talks to the driver. It shares PyTorch's primary context, so tensors allocated by torch
and kernels launched here see the same memory and streams.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import weakref
from dataclasses import dataclass

from cuda.bindings import driver as cu

import layouts
from layouts.tma import TMA_DTYPE_NAMES, TMA_L2_PROMOTION_NAMES, TMA_SWIZZLE_NAMES

TENSOR_MAP_BYTES = 128


class DriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


def check(result, what: str):
    """Unpack a cuda.bindings result tuple, raising DriverError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
        raise DriverError(f"{what} failed: {name}: {text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.lru_cache(maxsize=None)
def context(device_index: int):
    """The device's primary context (the one PyTorch uses), retained."""
    check(cu.cuInit(0), "cuInit")
    device = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    return check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")


@contextlib.contextmanager
def current(ctx):
    """`ctx` current on this thread inside the block, and the thread's own context back after it: the caller's
    current device (torch.cuda.current_device(), its streams and allocations) is theirs, whichever device a
    flashgen kernel was loaded or launched on."""
    before = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(before) == int(ctx):
        yield
        return
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    try:
        yield
    finally:
        check(cu.cuCtxSetCurrent(before), "cuCtxSetCurrent")


class DeviceBuffer:
    """Device memory from cuMemAlloc, outside torch's caching allocator: state a launcher keeps across calls (tile
    counters, merge workspaces). Allocated through torch, it could come from a private pool that torch.compile's
    CUDA graphs (mode="reduce-overhead") open around their warm-up and later reclaim, while the launcher still
    launches on its address.

    A dead buffer's memory is retired, not freed: the garbage collector may run its finalizer in the middle of a
    CUDA graph capture (torch no longer collects before one), where cuMemFree invalidates the capture. Retired
    memory is freed when the next buffer is allocated; callers allocate only outside a capture."""

    def __init__(self, nbytes: int, device_index: int):
        release_retired()
        self.context = context(device_index)
        with current(self.context):
            self.address = int(check(cu.cuMemAlloc(max(int(nbytes), 4)), "cuMemAlloc"))
        self.nbytes = int(nbytes)
        weakref.finalize(self, _retired.append, (self.context, self.address))

    def zero(self, stream: int) -> None:
        """Zeros in, ordered on `stream` before whatever is launched on it next."""
        with current(self.context):
            check(cu.cuMemsetD8Async(self.address, 0, max(self.nbytes, 4), stream), "cuMemsetD8Async")


_retired: list[tuple[object, int]] = []  # (context, address) of dead DeviceBuffers; list.append is atomic


def release_retired() -> None:
    """cuMemFree the memory of dead DeviceBuffers. Call it outside any CUDA graph capture (in any thread: a global-mode
    capture forbids frees process-wide)."""
    while True:
        try:
            ctx, address = _retired.pop()  # atomic: another thread may be releasing too
        except IndexError:
            return
        try:
            with current(ctx):
                cu.cuMemFree(address)
        except Exception:  # noqa: BLE001 - at interpreter exit the context may already be gone
            pass


@dataclass(frozen=True)
class LoadedKernel:
    module: object
    function: object
    dynamic_smem: int
    context: object  # the primary context of the device the module was loaded on

    def __post_init__(self):
        # The raw handles, for launches through libcuda's own entry points (codegen.launcher).
        object.__setattr__(self, "function_handle", int(self.function))
        object.__setattr__(self, "context_handle", int(self.context))


def load(cubin: bytes, kernel_name: str, dynamic_smem: int, device_index: int) -> LoadedKernel:
    with current(context(device_index)):
        module = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        function = check(cu.cuModuleGetFunction(module, kernel_name.encode()), f"cuModuleGetFunction({kernel_name})")
        check(cu.cuFuncSetAttribute(function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    dynamic_smem), "cuFuncSetAttribute(max dynamic shared memory)")
    return LoadedKernel(module, function, dynamic_smem, context(device_index))


def sibling(kernel: LoadedKernel, kernel_name: str, dynamic_smem: int = 0) -> LoadedKernel:
    """Another entry point of an already loaded module (a family whose source holds two kernels)."""
    with current(kernel.context):
        function = check(cu.cuModuleGetFunction(kernel.module, kernel_name.encode()),
                         f"cuModuleGetFunction({kernel_name})")
    return LoadedKernel(kernel.module, function, dynamic_smem, kernel.context)


_RESIDENT: dict[tuple[int, int, int], int] = {}  # (function handle, threads, cluster size) -> resident clusters


def resident_clusters(kernel: LoadedKernel, threads: int, size: int) -> int:
    """Clusters of `size` CTAs of `threads` threads of a loaded kernel that the device holds at once
    (cuOccupancyMaxActiveClusters: a GPC takes whole clusters only, so this is below SMs / size where a GPC's SMs
    are not a multiple of the size). Asked once per kernel and shape of cluster."""
    key = (kernel.function_handle, threads, size)
    if key not in _RESIDENT:
        _RESIDENT[key] = _max_active_clusters(kernel, threads, size)
    return _RESIDENT[key]


def _max_active_clusters(kernel: LoadedKernel, threads: int, size: int) -> int:
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = size, 1, 1
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = size, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes, config.attrs, config.numAttrs = kernel.dynamic_smem, [attr], 1
    with current(kernel.context):
        return check(cu.cuOccupancyMaxActiveClusters(kernel.function, config), f"cuOccupancyMaxActiveClusters({size})")


def encode_tensor_map(params: layouts.TensorMapParams, global_address: int) -> bytes:
    """cuTensorMapEncodeTiled from derived, already validated parameters; returns the 128 opaque bytes."""
    tmap = check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, TMA_DTYPE_NAMES[params.dtype]),
        params.rank,
        global_address,
        [cu.cuuint64_t(d) for d in params.dims],
        [cu.cuuint64_t(s) for s in params.strides_bytes],
        [cu.cuuint32_t(b) for b in params.box],
        [cu.cuuint32_t(e) for e in params.elem_strides],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, TMA_SWIZZLE_NAMES[params.swizzle_bytes]),
        getattr(cu.CUtensorMapL2promotion, TMA_L2_PROMOTION_NAMES[params.l2_promotion_bytes]),
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    ), f"cuTensorMapEncodeTiled(dims={params.dims}, strides={params.strides_bytes}, box={params.box})")
    raw = b"".join(int(w).to_bytes(8, "little") for w in tmap.opaque)
    assert len(raw) == TENSOR_MAP_BYTES
    return raw


class _Aligned128(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_uint8 * TENSOR_MAP_BYTES)]
    _align_ = 128


@dataclass(frozen=True)
class PackedArgs:
    """Kernel arguments laid out for cuLaunchKernel: storage for each value and the array of pointers to them."""
    holders: tuple
    pointers: object

    @functools.cached_property
    def address(self) -> int:  # looked up on every launch
        return ctypes.addressof(self.pointers)


class I32(int):
    """A kernel parameter of C type int; a plain Python int is passed as 64 bits (a pointer, a long long)."""


def pack_args(args: list) -> PackedArgs:
    """`args` in the kernel's parameter order: bytes (a tensor map), I32, int (a pointer or long long), float."""
    holders = []
    for arg in args:
        if isinstance(arg, bytes):
            holder = _Aligned128()
            ctypes.memmove(ctypes.addressof(holder), arg, TENSOR_MAP_BYTES)
        elif isinstance(arg, float):
            holder = ctypes.c_float(arg)
        elif isinstance(arg, I32):
            if not -2**31 <= arg < 2**31:
                raise ValueError(f"{int(arg)} does not fit a 32-bit kernel parameter")
            holder = ctypes.c_int32(arg)
        elif isinstance(arg, int):
            holder = ctypes.c_uint64(arg)
        else:
            raise TypeError(f"unsupported kernel argument {arg!r}")
        holders.append(holder)
    pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    return PackedArgs(tuple(holders), pointers)


def launch(kernel: LoadedKernel, grid: tuple[int, int, int], block: int, stream: int, args: PackedArgs) -> None:
    with current(kernel.context):  # the module lives in its device's context
        check(cu.cuLaunchKernel(kernel.function, *grid, block, 1, 1, kernel.dynamic_smem, stream, args.address, 0),
              "cuLaunchKernel")
