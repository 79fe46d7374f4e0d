"""The tensor API: `attention(q, k, v, ...)` on torch tensors, with every input checked before launch."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from layouts import LayoutError

from . import build as _build
from .plan import resolve
from .spec import KernelSpec, SpecError

LOG2E = 1.4426950408889634
LAYOUTS = ("bshd", "bhsd")
_TORCH_DTYPES = {"float16": "f16", "bfloat16": "bf16"}
MAX_GRID_YZ = 65535


class InputError(ValueError):
    """An input the kernel cannot take; raised before anything is launched."""


@dataclass(frozen=True)
class KernelKey:
    spec: KernelSpec
    device_index: int


@functools.lru_cache(maxsize=64)
def _loaded(key: KernelKey):
    from . import driver

    built = _build.build(key.spec)
    kernel = driver.load(built.compiled.cubin, built.rendered.kernel_name, built.plan.smem.total, key.device_index)
    return built, kernel


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, return_lse: bool = False,
              layout: str = "bshd", window: tuple[int, int] | None = None, softcap: float = 0.0,
              pv_split: tuple[int, ...] | None = None, **tuning):
    """Softmax(q k^T * scale) v for q of shape (B, S_q, H, D) and k, v of shape (B, S_k, H_kv, D), or the
    (B, H, S, D) layouts with layout="bhsd".

    H must be a multiple of H_kv (grouped-query attention; H_kv = 1 is multi-query); K and V are read in
    place, never repeated. `causal` and `window=(left, right)` (-1 for unbounded) are aligned to the bottom
    right when S_q != S_k: query i sees keys up to i + S_k - S_q. `softcap` > 0 caps the scaled scores as
    softcap * tanh(scores / softcap). A row that sees no key at all outputs 0 with logsumexp -inf.
    Returns o in q's layout (and, with return_lse, the (B, H, S_q) float32 natural-log logsumexp). The kernel
    specialized for these shapes and options is generated, compiled and cached on first use.
    """
    call = prepare(q, k, v, causal=causal, scale=scale, layout=layout, window=window, softcap=softcap,
                   pv_split=pv_split, **tuning)
    call()
    return (call.o, call.lse) if return_lse else call.o


class PreparedAttention:
    """One attention call with its kernel loaded, outputs allocated and tensor maps encoded.

    Calling it launches the kernel on the current stream and nothing else, so a benchmark times the kernel
    and not the checks; the inputs must stay alive and unmoved while it is used.
    """

    def __init__(self, built, kernel, args, grid: tuple[int, int, int], o, lse, device):
        self.built, self.kernel, self.args, self.grid = built, kernel, args, grid
        self.o, self.lse, self.device = o, lse, device

    @property
    def spec(self) -> KernelSpec:
        return self.built.spec

    def __call__(self):
        import torch

        from . import driver

        stream = torch.cuda.current_stream(self.device).cuda_stream
        driver.launch(self.kernel, self.grid, self.built.plan.threads, stream, self.args)
        return self.o


def prepare(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
            window: tuple[int, int] | None = None, softcap: float = 0.0, pv_split: tuple[int, ...] | None = None,
            out=None, block_n: int = 0, stages: int = 0, pingpong: bool = True) -> PreparedAttention:
    """Check the inputs, get the specialized kernel, allocate o and lse, encode the tensor maps.

    pv_split, block_n, stages and pingpong are the tuning knobs of KernelSpec; the defaults are the measured
    choices of codegen.plan.
    """
    import torch

    from . import driver

    shape = _check_inputs(q, k, v, layout)
    if scale is None:
        scale = 1.0 / math.sqrt(shape.dim)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale must be a positive finite number, got {scale!r}")
    try:
        spec = resolve(KernelSpec(seq_len=shape.seq_q, heads=shape.heads, head_dim=shape.dim, causal=bool(causal),
                                  dtype=_TORCH_DTYPES[str(q.dtype).split(".")[-1]], pv_split=tuple(pv_split or ()),
                                  block_n=block_n, stages=stages, pingpong=pingpong, seq_len_k=shape.seq_k,
                                  kv_heads=shape.kv_heads, window=tuple(window) if window else (-1, -1),
                                  softcap=float(softcap)))
    except (SpecError, TypeError) as e:
        raise InputError(str(e)) from None
    _check_device(q)

    built, kernel = _loaded(KernelKey(spec, q.device.index or 0))
    plan = built.plan
    o = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    if out is not None:
        _check_inputs(q, q, out, layout)  # the same shape, dtype, device and stride rules as the inputs
    lse = torch.empty((shape.batch, shape.heads, shape.seq_q), dtype=torch.float32, device=q.device)
    maps = []
    for name, tensor, seq, heads in (("q", q, shape.seq_q, shape.heads), ("k", k, shape.seq_k, shape.kv_heads),
                                     ("v", v, shape.seq_k, shape.kv_heads), ("o", o, shape.seq_q, shape.heads)):
        sb, ss, sh = _strides_bshd(tensor, layout)
        try:
            params = getattr(plan, name).tensor_map.instantiate(
                batch=shape.batch, seq_len=seq, heads=heads, stride_b=sb, stride_s=ss, stride_h=sh)
        except LayoutError as e:  # a stride or extent the tensor memory accelerator cannot express
            raise InputError(f"{name}: {e}") from None
        maps.append(driver.encode_tensor_map(params, tensor.data_ptr()))
    args = driver.pack_args(maps + [lse.data_ptr(), float(scale * LOG2E)])
    return PreparedAttention(built, kernel, args, plan.grid(shape.batch), o, lse, q.device)


def _strides_bshd(t, layout: str) -> tuple[int, int, int]:
    """Element strides of (batch, seq, head) whatever the layout. An axis of extent 1 is never stepped, so
    its stride is replaced by the head dim, which always satisfies the tensor map's 16-byte rule."""
    axes = (0, 1, 2) if layout == "bshd" else (0, 2, 1)
    return tuple(t.stride(a) if t.shape[a] > 1 else t.shape[3] for a in axes)


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_q: int
    seq_k: int
    heads: int
    kv_heads: int
    dim: int


def _check_inputs(q, k, v, layout: str) -> Shape:
    import torch

    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must have rank 4 ({'B, S, H, D' if layout == 'bshd' else 'B, H, S, D'}), "
                             f"got shape {tuple(t.shape)}")
        if str(t.dtype).split(".")[-1] not in _TORCH_DTYPES:
            raise InputError(f"{name} has dtype {t.dtype}; supported: torch.float16, torch.bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise InputError("flashgen has no backward pass yet: call under torch.no_grad() or detach the inputs")
    if k.shape != v.shape:
        raise InputError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")

    def bshd(t):
        return tuple(t.shape) if layout == "bshd" else (t.shape[0], t.shape[2], t.shape[1], t.shape[3])

    (batch, seq_q, heads, dim), (batch_k, seq_k, kv_heads, dim_k) = bshd(q), bshd(k)
    if batch_k != batch or dim_k != dim:
        raise InputError(f"q and k must agree on batch and head dim, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if min(batch, seq_q, seq_k, heads, kv_heads, dim) < 1:
        raise InputError(f"every dimension must be at least 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if heads % kv_heads:
        raise InputError(f"q's {heads} heads must be a multiple of k and v's {kv_heads} (grouped-query attention)")
    if batch > MAX_GRID_YZ or heads > MAX_GRID_YZ:
        raise InputError(f"batch and heads must be at most {MAX_GRID_YZ} (grid limits), got {batch}, {heads}")
    elem = q.element_size()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            raise InputError(f"{name}'s head dimension must be contiguous (stride 1), got stride {t.stride(3)}; "
                             "call .contiguous()")
        for axis in range(3):
            if t.shape[axis] > 1 and t.stride(axis) == 0:
                raise InputError(f"{name}.stride({axis}) is 0 (an expanded tensor); call .contiguous()")
            if t.shape[axis] > 1 and (t.stride(axis) * elem) % 16:
                raise InputError(f"{name}.stride({axis}) = {t.stride(axis)} elements is not a multiple of 16 bytes, "
                                 "which the tensor memory accelerator requires")
        if t.data_ptr() % 16:
            raise InputError(f"{name}'s data pointer is not 16-byte aligned")
    return Shape(batch, seq_q, seq_k, heads, kv_heads, dim)


def _check_device(t) -> None:
    """Checked after everything else, so every other check also runs (and is tested) on the CPU."""
    if t.device.type != "cuda":
        raise InputError(f"the inputs are on {t.device}; flashgen kernels run on a CUDA device")
