"""A kernel family's ABI: the one declaration of what crosses from the host into a kernel.

A family declares, once, in its plan:

* ``Param``s, in the kernel's parameter order: name, C type, how the host packs the value (``Pack``), what
  it means, and the C expression an exported launcher passes for it;
* a ``BarrierMap``: the kernel's mbarriers, in shared-memory order, each with its slot count and the
  arrivals that complete a phase;
* a ``Grid``: how many CTAs a launch takes, in Python (the API), in C (the export launcher) and in words
  (the manifest), from one rule.

Everything else is generated from these: the kernel signature and barrier indices (rendered by
``templates/common/abi.j2``), the Python packing of a launch (``KernelABI.pack``), the manifest's argument
list and the export launcher's call. A name declared twice, a value missing or a value left over is an
error, so the copies cannot drift.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

# An mbarrier object is 64 bits, 8-byte aligned (PTX ISA: "Size and alignment of mbarrier object").
MBARRIER_BYTES = 8
MAX_DEVICES = 64  # devices whose resident-cluster count an exported launcher remembers (more: asked every launch)


class Pack(enum.Enum):
    """How the host lays out a parameter's value for cuLaunchKernel (codegen.driver.pack_args)."""
    TENSOR_MAP = "tensor_map"  # 128 opaque bytes, by value (a __grid_constant__ CUtensorMap)
    POINTER = "pointer"        # a device address, 64 bits
    I64 = "i64"                # long long
    I32 = "i32"                # int
    F32 = "f32"                # float


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str      # as declared in the kernel signature
    pack: Pack
    doc: str        # what the value is (the manifest's description)
    launcher: str   # the C expression templates/export/launch.cu.j2 passes (its own local names)

    @property
    def declaration(self) -> str:
        if self.pack is Pack.TENSOR_MAP:
            return f"const __grid_constant__ {self.ctype} {self.name}"
        return f"{self.ctype} {self.name}"


@dataclass(frozen=True)
class Barrier:
    name: str       # C enum name, kBar<name>
    slots: int      # consecutive mbarriers (one per ring stage)
    arrivals: int   # arrivals that complete a phase (mbarrier.init count)
    doc: str


@dataclass(frozen=True)
class BarrierMap:
    barriers: tuple[Barrier, ...]

    def __post_init__(self):
        names = [b.name for b in self.barriers]
        assert len(set(names)) == len(names), f"barrier declared twice: {names}"
        assert all(b.slots >= 1 and b.arrivals >= 1 for b in self.barriers), self.barriers

    @property
    def first(self) -> dict[str, int]:
        """Barrier name -> index of its first slot."""
        index, first = 0, {}
        for b in self.barriers:
            first[b.name] = index
            index += b.slots
        return first

    @property
    def ring_slots(self) -> int:
        """The slot count every multi-slot barrier shares (one per ring stage), 1 if there are none."""
        counts = {b.slots for b in self.barriers if b.slots > 1}
        assert len(counts) <= 1, f"ring barriers of different depths: {self.barriers}"
        return counts.pop() if counts else 1

    @property
    def count(self) -> int:
        return sum(b.slots for b in self.barriers)

    @property
    def bytes(self) -> int:
        return MBARRIER_BYTES * self.count


def strided_tensor(name: str, what: str, layout: str) -> tuple[Param, ...]:
    """A (B, S, H, D) tensor read or written without a tensor map: its address and three byte strides."""
    return (Param(f"{name}_gmem", "unsigned char* __restrict__", Pack.POINTER, f"{what}'s base address {layout}",
                  f"static_cast<unsigned char*>({name})"),
            Param(f"{name}_batch_bytes", "long long", Pack.I64, f"{what}'s batch stride in bytes", f"{name}_batch_bytes"),
            Param(f"{name}_row_bytes", "long long", Pack.I64, f"{what}'s token stride in bytes", f"{name}_row_bytes"),
            Param(f"{name}_head_bytes", "long long", Pack.I64, f"{what}'s head stride in bytes", f"{name}_head_bytes"))


@dataclass(frozen=True)
class SiblingKernel:
    """Another entry point of a family's module (decode's append kernel, the backward's row kernels): its name,
    ABI, threads per CTA and grid, in words, for the manifest."""

    name: str
    abi: "KernelABI"
    threads: int
    grid: dict

    def manifest(self) -> dict:
        return {"kernel": self.name, "block": [self.threads, 1, 1], "grid": self.grid, "dynamic_smem_bytes": 0,
                "arguments": self.abi.manifest()}


class GridError(ValueError):
    """A launch the grid rule cannot express."""


@dataclass(frozen=True)
class Grid:
    """One CTA per (query tile, head, batch entry), or, persistent, at most one per SM, the CTAs taking the
    tiles from a 32-bit counter (which the kernel advances past the last tile by up to one per CTA). `cluster` > 1:
    that many consecutive query tiles launch as one cluster (the last one's CTAs past the tiles stay idle); a
    persistent grid of clusters is as many clusters as the device holds at once, each taking the same tiles at every
    step (tile blockIdx.x, then blockIdx.x + gridDim.x, ...: no counter, which cannot hand one index to a whole
    cluster; the tile count must fill the clusters)."""

    persistent: bool
    heads: int
    cluster: int = 1

    @property
    def cluster_dims(self) -> tuple[int, int, int] | None:
        """The launch's cluster shape, or None for a launch without clusters."""
        return (self.cluster, 1, 1) if self.cluster > 1 else None

    @property
    def counter(self) -> bool:
        """Whether the CTAs take their tiles from a counter (a persistent grid without clusters)."""
        return self.persistent and self.cluster == 1

    def dims(self, *, tiles_m: int, batch: int, sms: int = 0, clusters: int = 0) -> tuple[int, int, int]:
        """`sms`: the device's SM count (a persistent grid); `clusters`: the clusters of this kernel the device
        holds at once (a persistent grid of clusters)."""
        if not self.persistent:
            return (-(-tiles_m // self.cluster) * self.cluster, self.heads, batch)
        if tiles_m % self.cluster:
            raise GridError(f"{tiles_m} query tiles do not fill clusters of {self.cluster}")
        tiles = tiles_m * self.heads * batch
        if self.cluster > 1:
            if clusters < 1:
                raise ValueError("a persistent grid of clusters needs the clusters the device holds at once")
            ctas = self.cluster * min(tiles // self.cluster, clusters)
        elif sms < 1:
            raise ValueError("a persistent kernel's grid needs the device's SM count")
        else:
            ctas = min(tiles, sms)
        if tiles >= 2**31 - 1 - ctas:
            raise GridError(f"{tiles} query tiles overflow the persistent kernel's 32-bit tile index; "
                            "pass persistent=False")
        return (ctas, 1, 1)

    def c_launch(self, kernel: str, threads: int, smem_bytes: int, args: str) -> str:
        """C statements that launch `kernel` on `stream` over the launcher's tiles_m and batch and return the
        launch's error (`err` is declared): triple chevrons, or for clusters cudaLaunchKernelEx with the
        cluster-dimension attribute."""
        tiles = [f"const long long tiles = (long long)tiles_m * {self.heads} * batch;"]
        overflow = "if (tiles >= 2147483647LL - ctas) return cudaErrorInvalidValue;  // the kernel's 32-bit tile index"
        if self.cluster == 1:
            lines = []
            dims = f"dim3(tiles_m, {self.heads}, batch)"
            if self.persistent:
                lines += ["int device = 0, sms = 0;",
                          "if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;",
                          "if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != "
                          "cudaSuccess) return err;",
                          *tiles, "const int ctas = (int)(tiles < sms ? tiles : sms);", overflow]
                dims = "dim3(ctas)"
            lines += [f"{kernel}<<<{dims}, dim3({threads}), {smem_bytes}, stream>>>({args});",
                      "return cudaGetLastError();"]
            return "\n  ".join(lines)
        # Persistent: a first grid of one cluster, for the occupancy query; else tiles_m rounded up to whole clusters.
        dims = (f"dim3({self.cluster})" if self.persistent else
                f"dim3((tiles_m + {self.cluster - 1}) / {self.cluster} * {self.cluster}, {self.heads}, batch)")
        lines = [
            f"// Query tiles in clusters of {self.cluster} (consecutive tiles of one head): they share their key blocks' loads.",
            "cudaLaunchAttribute cluster;",
            "cluster.id = cudaLaunchAttributeClusterDimension;",
            f"cluster.val.clusterDim.x = {self.cluster}, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;",
            "cudaLaunchConfig_t config = {};",
            f"config.gridDim = {dims}, "
            f"config.blockDim = dim3({threads}), config.dynamicSmemBytes = {smem_bytes};",
            "config.stream = stream, config.attrs = &cluster, config.numAttrs = 1;"]
        if self.persistent:
            lines += [
                "// Clusters of this kernel resident at once (the persistent grid), per device: fixed by the kernel, its",
                "// block, shared memory and cluster, so asked once.",
                f"static std::atomic<int> resident[{MAX_DEVICES}];",
                "int device = 0;",
                "if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;",
                f"int clusters = device < {MAX_DEVICES} ? resident[device].load(std::memory_order_relaxed) : 0;",
                "if (clusters == 0) {",
                f"  if ((err = cudaOccupancyMaxActiveClusters(&clusters, {kernel}, &config)) != cudaSuccess) return err;",
                "  if (clusters < 1) return cudaErrorInvalidConfiguration;",
                f"  if (device < {MAX_DEVICES}) resident[device].store(clusters, std::memory_order_relaxed);",
                "}",
                *tiles,
                f"const long long groups = tiles / {self.cluster};",
                f"const int ctas = {self.cluster} * (int)(groups < clusters ? groups : clusters);",
                overflow,
                "config.gridDim = dim3(ctas);"]
        return "\n  ".join(lines + [f"return cudaLaunchKernelEx(&config, {kernel}, {args});"])

    def describe(self, tiles_m: str, batches: str) -> dict:
        cluster = {"cluster": f"({self.cluster}, 1, 1)"} if self.cluster > 1 else {}
        if self.persistent:
            ctas = ("min(tiles_m * heads * " + batches + ", SMs)" if self.cluster == 1 else
                    f"{self.cluster} x min(tiles_m * heads * {batches} / {self.cluster}, resident clusters)")
            return {"x": f"{ctas} with tiles_m = {tiles_m}, heads = {self.heads}", "y": "1", "z": "1"} | cluster
        x = tiles_m if self.cluster == 1 else f"{tiles_m} rounded up to a multiple of {self.cluster}"
        return {"x": x, "y": f"heads = {self.heads}", "z": batches} | cluster


@dataclass(frozen=True)
class KernelABI:
    params: tuple[Param, ...]
    barriers: BarrierMap
    grid: Grid

    def __post_init__(self):
        names = [p.name for p in self.params]
        assert len(set(names)) == len(names), f"parameter declared twice: {names}"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def manifest(self) -> list[dict]:
        return [{"name": p.name, "type": p.ctype, "pack": p.pack.value, "doc": p.doc} for p in self.params]

    def ordered(self, values: Mapping[str, object]) -> list:
        """The values in parameter order, typed for codegen.driver.pack_args; every name exactly once."""
        from .driver import I32

        missing = [n for n in self.names if n not in values]
        extra = [n for n in values if n not in self.names]
        if missing or extra:
            raise ValueError(f"kernel arguments do not match the ABI: missing {missing}, unexpected {extra}")
        typed = {Pack.TENSOR_MAP: bytes, Pack.POINTER: int, Pack.I64: int, Pack.I32: I32, Pack.F32: float}
        return [typed[p.pack](values[p.name]) for p in self.params]

    def pack(self, values: Mapping[str, object]):
        from .driver import pack_args

        return pack_args(self.ordered(values))
