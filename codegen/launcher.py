"""Cached launches: what an `attention()` call needs that does not change between calls of the same shapes.

A `Launcher` belongs to one checked call signature (shapes, strides, dtypes, device, options; codegen.api keys
it): the loaded kernel, its grid, block and shared memory, each operand's tensor-map parameters, the kernel's
arguments laid out once (codegen.abi) with only the pointers rewritten per call, and each pointer's encoded
tensor map (a CUtensorMap holds its tensor's address, so it is encoded once per address and reused while the
caching allocator hands the same address back). Launches go straight to the driver through ctypes.

Safety: an argument buffer is rewritten and launched under the launcher's lock (threads); the persistent
kernels' tile counter is one per (device, stream), never shared by two streams and never freed, so launches
in flight always find theirs, and each launch leaves it zero for the next; a launch captured into a CUDA graph
gets a counter of its own (stream_counter).
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import torch

from . import driver

MAPS_PER_OPERAND = 8  # addresses remembered per operand (o alternates between two in a loop `o = attention(...)`)


class _Lib:
    """cuLaunchKernel, cuCtxGetCurrent and cuCtxSetCurrent from libcuda itself (cuda.bindings costs microseconds per
    call)."""

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            self.launch = None
            return
        self.set_ctx = lib.cuCtxSetCurrent
        self.set_ctx.argtypes = [ctypes.c_void_p]
        self.set_ctx.restype = ctypes.c_int
        self.get_ctx = lib.cuCtxGetCurrent
        self.get_ctx.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.get_ctx.restype = ctypes.c_int
        self.launch = lib.cuLaunchKernel
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.launch.restype = ctypes.c_int
        self.launch_ex = getattr(lib, "cuLaunchKernelEx", None)  # CUDA 12 and later
        if self.launch_ex is not None:
            self.launch_ex.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            self.launch_ex.restype = ctypes.c_int


# cuLaunchKernelEx's configuration (CUDA driver API, cuda.h: CUlaunchConfig, CUlaunchAttribute), for cluster launches.
class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster_dim", _Dim3), ("flag", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", _Dim3), ("block", _Dim3), ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("num_attrs", ctypes.c_uint)]


assert ctypes.sizeof(_LaunchAttr) == 72  # an id, 4 bytes of padding, a 64-byte union
assert _LaunchConfig.stream.offset == 32  # seven unsigned ints, then the stream at 8-byte alignment
assert ctypes.sizeof(_LaunchConfig) == 56


_remember_lock = threading.Lock()


def remember(cache: dict, key, value, limit: int) -> None:
    """cache[key] = value, the oldest entries dropped past `limit`: the launcher caches' insert, made on a miss,
    under one lock so that threads missing at once do not evict the same entry twice (lookups take no lock)."""
    with _remember_lock:
        while len(cache) >= limit:
            cache.pop(next(iter(cache)))
        cache[key] = value


_lib_launch = _lib_set_ctx = _lib_get_ctx = _lib_launch_ex = None
_counters: dict[tuple[int, int], tuple[object, int]] = {}  # (device, stream) -> (driver.DeviceBuffer, its address)
_counter_lock = threading.Lock()


def _load_driver_lib() -> None:
    global _lib_launch, _lib_set_ctx, _lib_get_ctx, _lib_launch_ex
    if _lib_launch is None:
        lib = _Lib()
        _lib_launch, _lib_set_ctx, _lib_get_ctx = lib.launch, getattr(lib, "set_ctx", None), getattr(lib, "get_ctx", None)
        _lib_launch_ex = getattr(lib, "launch_ex", None)


def stream_counter(device, stream: int) -> tuple[int, object]:
    """(address, what holds it) of the tile counter of persistent kernels on (device, stream): zero, and left zero by
    every launch. Eager launches share one per (device, stream), outside torch's allocator (driver.DeviceBuffer).
    Under CUDA graph capture each launch gets its own from the capture's memory pool, zeroed by a captured memset
    before every replay, so a graph never shares one with eager launches (nor with another graph); the caller
    holds it until the launch is captured, and the graph owns it from then on."""
    if torch.cuda.is_current_stream_capturing():
        tensor = torch.zeros(1, dtype=torch.int32, device=device)
        return tensor.data_ptr(), tensor
    key = (device.index or 0, stream)
    counter = _counters.get(key)
    if counter is None:
        with _counter_lock:
            counter = _counters.get(key)
            if counter is None:
                buffer = driver.DeviceBuffer(4, device.index or 0)
                buffer.zero(stream)
                counter = _counters[key] = (buffer, buffer.address)
    return counter[1], counter[0]


class TensorMapCache:
    """The encoded tensor maps of one operand's shape and strides, by address, the `limit` latest kept."""

    def __init__(self, params, limit: int):
        self.params, self.limit = params, limit
        self._encoded: OrderedDict[int, bytes] = OrderedDict()

    def get(self, address: int) -> bytes:
        encoded = self._encoded.get(address)
        if encoded is None:
            encoded = self._encoded[address] = driver.encode_tensor_map(self.params, address)
            if len(self._encoded) > self.limit:
                self._encoded.popitem(last=False)
        return encoded


class Launcher:
    def __init__(self, built, kernel, map_params: dict, fixed: dict, grid: tuple[int, int, int], device):
        """map_params: operand -> TensorMapParams of its (fixed) shape and strides; fixed: the other kernel
        arguments that do not change between calls (the scale, tiles_m, batches, a varlen kernel's o strides)."""
        self.built, self.kernel, self.grid, self.device = built, kernel, grid, device
        plan = built.plan
        self.block, self.smem = plan.threads, plan.smem.total
        self._launch = kernel_launch(kernel, grid, self.block, plan.abi.grid.cluster_dims)
        self.map_params = map_params
        self._maps = {op: TensorMapCache(params, MAPS_PER_OPERAND) for op, params in map_params.items()}
        values = dict(fixed)
        values.update({f"tmap_{op}": bytes(driver.TENSOR_MAP_BYTES) for op in map_params})
        for p in plan.abi.params:
            values.setdefault(p.name, 0)  # pointers, rewritten per call
        self._args = plan.abi.pack(values)
        holder = dict(zip(plan.abi.names, self._args.holders))
        self._map_holders = tuple(holder[f"tmap_{op}"] for op in ("q", "k", "v", "o"))
        self._loaded_maps = [None] * 4
        self._lse = holder["lse_out"]
        self._sinks = holder.get("sinks")
        self._counter = holder.get("tile_counter")
        # A varlen kernel's offsets, and o by address for a partial tile's plain stores.
        self._varlen = ((holder["cu_seqlens_q"], holder["cu_seqlens_k"], holder["o_gmem"])
                        if "cu_seqlens_q" in holder else None)
        self._lock = threading.Lock()
        _load_driver_lib()

    def _map(self, op: str, address: int) -> bytes:
        return self._maps[op].get(address)

    def __call__(self, stream: int, q: int, k: int, v: int, o: int, lse: int, sinks: int = 0, cu_seqlens_q: int = 0,
                 cu_seqlens_k: int = 0) -> None:
        """Launch on `stream` over the tensors at these addresses (lse 0: the kernel skips the logsumexp; sinks:
        the (H,) logits of a kernel with sinks; cu_seqlens: a varlen kernel's offsets, read on the device)."""
        maps = (self._map("q", q), self._map("k", k), self._map("v", v), self._map("o", o))
        counter, held = stream_counter(self.device, stream) if self._counter is not None else (0, None)
        with self._lock:
            for slot, (holder, encoded) in enumerate(zip(self._map_holders, maps)):
                if self._loaded_maps[slot] is not encoded:  # the same map as the last launch: already in place
                    ctypes.memmove(ctypes.addressof(holder), encoded, driver.TENSOR_MAP_BYTES)
                    self._loaded_maps[slot] = encoded
            self._lse.value = lse
            if self._sinks is not None:
                self._sinks.value = sinks
            if self._counter is not None:
                self._counter.value = counter
            if self._varlen is not None:
                cu_q, cu_k, o_gmem = self._varlen
                cu_q.value, cu_k.value, o_gmem.value = cu_seqlens_q, cu_seqlens_k, o
            self._launch(stream, self._args)
            del held  # launched (or captured: the graph's from here)


def _enter(context: int) -> int | None:
    """Make the kernel's context current for a launch: the thread's context it replaced (0: none), to give back
    after the launch (_leave), or None where it was current already (one device: every launch)."""
    before = ctypes.c_void_p()
    _lib_get_ctx(ctypes.byref(before))
    if (before.value or 0) == context:
        return None
    _lib_set_ctx(context)
    return before.value or 0


def _leave(before: int | None) -> None:
    """The caller's current device stays theirs (torch.cuda.current_device(), its streams and allocations)."""
    if before is not None:
        _lib_set_ctx(before)


def launch_now(kernel, grid: tuple[int, int, int], block: int, stream: int, args) -> None:
    """cuLaunchKernel of a loaded kernel with packed arguments, straight through libcuda where it loads."""
    _load_driver_lib()
    if _lib_launch is None:
        driver.launch(kernel, grid, block, stream, args)
        return
    before = _enter(kernel.context_handle)
    err = _lib_launch(kernel.function_handle, grid[0], grid[1], grid[2], block, 1, 1, kernel.dynamic_smem, stream,
                      args.address, None)
    _leave(before)
    if err:
        from cuda.bindings import driver as cu

        driver.check((cu.CUresult(err),), "cuLaunchKernel")


def kernel_launch(kernel, grid: tuple[int, int, int], block: int, cluster: tuple[int, int, int] | None = None,
                  overlap: bool = False):
    """A loaded kernel's launch, chosen once: `launch(stream, args)`. Clusters and programmatic dependent launch
    need cuLaunchKernelEx's configuration (ConfiguredLaunch); every other launch is a plain cuLaunchKernel."""
    if cluster or overlap:
        return ConfiguredLaunch(kernel, grid, block, cluster or None, overlap)
    return PlainLaunch(kernel, grid, block)


class PlainLaunch:
    """A loaded kernel's cuLaunchKernel with its grid and block fixed; a launch passes the stream and arguments."""

    def __init__(self, kernel, grid: tuple[int, int, int], block: int):
        self.kernel, self.grid, self.block = kernel, grid, block

    def __call__(self, stream: int, args) -> None:
        launch_now(self.kernel, self.grid, self.block, stream, args)


class ConfiguredLaunch:
    """A loaded kernel's cuLaunchKernelEx configuration, built once: its CTAs in clusters of `cluster` (which divides
    `grid`; None: no clusters), and with `overlap` launched by programmatic dependent launch (the kernel may start
    while the stream's previous kernel runs; it must execute griddepcontrol.wait before reading any input). A launch
    sets the stream and passes the packed arguments."""

    def __init__(self, kernel, grid: tuple[int, int, int], block: int, cluster: tuple[int, int, int] | None = None,
                 overlap: bool = False):
        assert cluster is None or all(g % c == 0 for g, c in zip(grid, cluster)), (grid, cluster)
        _load_driver_lib()
        if _lib_launch_ex is None:
            raise RuntimeError("a cluster or overlapped launch needs libcuda's cuLaunchKernelEx (CUDA 12 or later)")
        from cuda.bindings import driver as cu

        ids = cu.CUlaunchAttributeID
        self.kernel, self.cluster, self.overlap = kernel, cluster, overlap
        attrs = []
        if cluster is not None:
            attrs.append(_LaunchAttr(id=int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)))
            attrs[-1].value.cluster_dim = _Dim3(*cluster)
        if overlap:
            attrs.append(_LaunchAttr(id=int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)))
            attrs[-1].value.flag = 1  # programmaticStreamSerializationAllowed
        self._attrs = (_LaunchAttr * max(1, len(attrs)))(*attrs)
        self._config = _LaunchConfig(grid=_Dim3(*grid), block=_Dim3(block, 1, 1), shared_mem_bytes=kernel.dynamic_smem,
                                     attrs=ctypes.cast(self._attrs, ctypes.POINTER(_LaunchAttr)), num_attrs=len(attrs))
        self._config_address = ctypes.addressof(self._config)

    def __call__(self, stream: int, args) -> None:
        self._config.stream = stream
        before = _enter(self.kernel.context_handle)
        err = _lib_launch_ex(self._config_address, self.kernel.function_handle, args.address, None)
        _leave(before)
        if err:
            from cuda.bindings import driver as cu

            driver.check((cu.CUresult(err),), "cuLaunchKernelEx")
