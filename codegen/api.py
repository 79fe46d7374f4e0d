"""The tensor API: `attention(q, k, v, ...)` on torch tensors, with every input checked before launch."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from layouts import LayoutError
from layouts.dtypes import BY_TORCH_NAME

from . import build as _build
from .cuda_env import PIP_HINT_TORCH as TORCH_HINT
from .families import resolve
from .families.fwd_sm90.abi import LOG2E
from .spec import KernelSpec, SpecError

LAYOUTS = ("bshd", "bhsd")
MAX_GRID_YZ = 65535


NO_BACKWARD = ("flashgen has no backward pass for this call yet (decode, prepare()): attention() is differentiable; "
               "else call under torch.no_grad() or detach the inputs")


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
              pv_split: tuple[int, ...] | None = None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, deterministic: bool = False,
              check: bool = False, **tuning):
    """Softmax(q k^T * scale) v for q of shape (B, S_q, H, D) and k, v of shape (B, S_k, H_kv, D), or the
    (B, H, S, D) layouts with layout="bhsd".

    H must be a multiple of H_kv (grouped-query attention; H_kv = 1 is multi-query); K and V are read in
    place, never repeated. `causal` and `window=(left, right)` (-1 for unbounded) are aligned to the bottom
    right when S_q != S_k: query i sees keys up to i + S_k - S_q. `softcap` > 0 caps the scaled scores as
    softcap * tanh(scores / softcap). `sinks`, a float32 (H,) tensor on q's device, holds a learned logit per
    query head (natural-log units, as gpt-oss learns them) that joins each of its rows' softmax denominators:
    o_i = sum_j exp(s_ij) v_j / (exp(sinks[h]) + sum_j exp(s_ij)); it is never attended (it has no value) and the
    logsumexp includes it. A row that sees no key at all outputs 0 with logsumexp -inf (with sinks: sinks[h]).
    Returns o in q's layout (and, with return_lse, the (B, H, S_q) float32 natural-log logsumexp). The kernel
    specialized for these shapes and options is generated, compiled and cached on first use.

    Variable-length batches (FlashAttention's varlen interface): q of shape (total_q, H, D) and k, v of shape
    (total_k, H_kv, D) hold the sequences back to back; int32 tensors cu_seqlens_q and cu_seqlens_k of length
    B + 1 give where each starts (cu[0] = 0, cu[B] = total). Given max_seqlen_q and max_seqlen_k (as FlashAttention's
    interface takes them), the offsets stay on the device: the call neither reads nor checks them, costs no
    synchronization and can be captured in a CUDA graph; they must then be valid (0 first, nondecreasing, the
    packed length last, no sequence longer than its max_seqlen), or rows go uncomputed and stores may land
    outside o and lse. Without them, or with `check=True`, the offsets are copied to the host every call (a
    synchronization) and checked, and the max lengths default to the longest sequence.
    Each sequence is attended on its own (causal and windows aligned to its own bottom right); o is
    (total_q, H, D) and lse (H, total_q). The kernel is specialized on the max lengths rounded up to a power of
    two (at least 128), so batches of similar lengths share one compiled kernel.

    Autograd: where grad mode is on and q, k or v requires grad (sm_90a; variable-length batches at D 64/96/128), o
    is differentiable and its `.backward()` runs flashgen's backward kernels (codegen.backward); lse is not.
    `deterministic=True` gives bit-identical gradients run to run (dQ's key blocks add in a fixed order; D 64 and 128).
    """
    _require_torch("codegen.attention()")
    fixed = cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None
    if torch.compiler.is_compiling():  # torch.compile traces the custom op (codegen.torch_op), not this body
        o, lse = _torch_op.compiled_attention(q, k, v, causal=causal, scale=scale, layout=layout, window=window,
                                    softcap=softcap, pv_split=pv_split, sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                                    cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                    max_seqlen_k=max_seqlen_k, tuning=tuning, deterministic=deterministic,
                                    check=check)
    elif _needs_grad(q, k, v):
        from .backward import differentiable_attention

        o, lse = differentiable_attention(q, k, v, causal=causal, scale=scale, layout=layout, window=window,
                                          softcap=softcap, pv_split=pv_split, sinks=sinks, tuning=tuning,
                                          deterministic=deterministic, check=check,
                                          varlen=None if fixed else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                                     max_seqlen_k))
    elif fixed:
        o, lse = _call(q, k, v, causal, scale, layout, window, softcap, pv_split, tuning, return_lse, sinks)
    else:
        o, lse = _call(q, k, v, causal, scale, layout, window, softcap, pv_split, tuning, return_lse, sinks,
                       varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), check=check)
    return (o, lse) if return_lse else o


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False):
    """A drop-in for torch.nn.functional.scaled_dot_product_attention on (B, H, S, D) tensors: the same
    arguments and result, for what flashgen computes (no attn_mask, no dropout). SDPA aligns a causal mask to
    the top left when S_q != S_k, flashgen to the bottom right, so that case is refused rather than answered
    differently; call `attention` for bottom-right alignment."""
    _require_torch("codegen.scaled_dot_product_attention()")
    if attn_mask is not None:
        raise InputError("attn_mask is not supported: use is_causal, or codegen.attention's window=(left, right)")
    if dropout_p:
        raise InputError(f"dropout_p must be 0 (flashgen has no dropout), got {dropout_p!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if getattr(t, "dim", lambda: 0)() != 4:
            raise InputError(f"{name} must be (B, H, S, D), got shape {tuple(getattr(t, 'shape', ()))}")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise InputError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True for "
                         "grouped-query attention, as SDPA requires")
    if is_causal and query.shape[2] != key.shape[2]:
        raise InputError("is_causal with S_q != S_k: SDPA aligns the mask to the top left, flashgen to the bottom "
                         "right; use codegen.attention(..., causal=True, layout='bhsd') for the bottom-right mask")
    return attention(query, key, value, causal=is_causal, scale=scale, layout="bhsd")


TUNING_KNOBS = ("block_n", "stages", "pingpong", "persistent", "tile_overlap", "multicast", "short_tail",
                "lazy_rescale", "trace")
MAX_LAUNCHERS = 256
VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")  # a varlen tuple's names, in order
PACKED_DIMS = "total, H, D"  # a variable-length batch's tensors, as errors name their dimensions
_LAUNCHERS: dict = {}
# Varlen launchers apart: a packed length or max length new each training step makes a launcher each (no
# synchronization, ~0.1-0.2 ms of host time), which must not push out the fixed-length ones.
MAX_VARLEN_LAUNCHERS = 64
_VARLEN_LAUNCHERS: dict = {}


def reads_offsets(check: bool, max_seqlen_q, max_seqlen_k) -> bool:
    """Whether a varlen call copies its offsets to the host (a synchronization): to check them, or to find a max
    length it was not given."""
    return bool(check) or max_seqlen_q is None or max_seqlen_k is None


def _call(q, k, v, causal, scale, layout, window, softcap, pv_split, tuning, return_lse=True, sinks=None,
          varlen=None, check=False):
    """One call: (o, lse), lse None unless return_lse (the kernel then skips it). The launcher for these shapes,
    strides and options is made (every check run) on the first call and found by a tuple of them afterwards; what
    the tuple does not prove unchanged (grad mode, the data pointers' alignment) is checked again on every call.

    varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k). The offsets are read on the host (and
    checked) only with `check` or where a max length is missing; the max lengths are part of the tuple."""
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        if reads_offsets(check, max_q, max_k):  # a synchronization; the max lengths come from checked offsets
            shape = _check_varlen_inputs(q, k, v, layout, cu_q, cu_k, max_q, max_k)
            max_q, max_k = shape.max_seq_q, shape.max_seq_k
        varlen = (cu_q, cu_k, max_q, max_k)
    try:
        # Values and their types: 1 == 1.0 == True, and a type the first call's checks refuse must not find its
        # launcher (scale=np.float32(0.125) after 0.125).
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
               k.device, v.device, bool(causal), scale, type(scale), layout,
               None if window is None else (tuple(window), tuple(map(type, window))), softcap, type(softcap),
               None if pv_split is None else (tuple(pv_split), tuple(map(type, pv_split))),
               tuple(sorted((name, value, type(value)) for name, value in tuning.items())) if tuning else (),
               None if sinks is None else (sinks.shape, sinks.stride(), sinks.dtype, sinks.device))
        if varlen is not None:
            key += (cu_q.shape, cu_q.stride(), cu_q.dtype, cu_q.device, cu_k.shape, cu_k.stride(), cu_k.dtype,
                    cu_k.device, max_q, max_k, type(max_q), type(max_k))
        cache, limit = ((_LAUNCHERS, MAX_LAUNCHERS) if varlen is None else
                        (_VARLEN_LAUNCHERS, MAX_VARLEN_LAUNCHERS))
        launcher = cache.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: the checks below say what is wrong
        key, launcher = None, None
    if launcher is None:
        lengths = {} if varlen is None else dict(zip(VARLEN_ARGS, varlen))
        call = _resolve_call(q, k, v, causal=causal, scale=scale, layout=layout, window=window, softcap=softcap,
                             pv_split=pv_split, tuning=tuning, sinks=sinks, read_offsets=False, **lengths)
        if call.spec.arch != "sm_90a":  # Blackwell: no cached launcher yet, every call prepared (and checked)
            prepared = prepare(q, k, v, causal=causal, scale=scale, layout=layout, window=window, softcap=softcap,
                               pv_split=pv_split, sinks=sinks, check=False, **lengths, **tuning)
            prepared()
            return prepared.o, prepared.lse if return_lse else None
        built, kernel = _loaded(KernelKey(call.spec, q.device.index or 0))
        o = torch.empty_like(q, memory_format=torch.contiguous_format)  # for its strides: every o has them
        fixed = dict(_fixed_arguments(call, built.plan), **_o_strides(call, built.plan, o))
        launcher = Launcher(built, kernel, _map_params(call, built.plan, q, k, v, o), fixed,
                            _grid(call, built.plan, q.device, kernel), q.device)
        launcher.lse_shape = call.lse_shape
        if key is not None:
            remember(cache, key, launcher, limit)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                    (sinks is not None and sinks.requires_grad)):
        raise InputError(NO_BACKWARD)
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    if (qp | kp | vp) % 16:  # raises the alignment error for the tensor at fault
        _check_inputs(q, k, v, layout) if varlen is None else _check_tensors(q, k, v, rank=3, dims=PACKED_DIMS)
    sp = 0
    if sinks is not None:
        sp = sinks.data_ptr()
        if sp % 4:
            _check_sinks(sinks, q, sinks.shape[0])
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(launcher.lse_shape, dtype=torch.float32, device=q.device) if return_lse else None
    stream, lp = _current_stream(q.device), lse.data_ptr() if return_lse else 0
    if varlen is None:
        launcher(stream, qp, kp, vp, o.data_ptr(), lp, sp)
    else:
        launcher(stream, qp, kp, vp, o.data_ptr(), lp, sp, cu_q.data_ptr(), cu_k.data_ptr())
    return o, lse


def _current_stream(device) -> int:
    try:
        return torch._C._cuda_getCurrentRawStream(device.index or 0)
    except AttributeError:  # a torch without the raw accessor
        return torch.cuda.current_stream(device).cuda_stream


class PreparedAttention:
    """One attention call with its kernel loaded, outputs allocated and tensor maps encoded.

    Calling it launches the kernel on the current stream and nothing else, so a benchmark times the kernel
    and not the checks; the inputs must stay alive and unmoved while it is used.
    """

    def __init__(self, built, kernel, args, grid: tuple[int, int, int], o, lse, device, *, offsets=(),
                 tile_counter=None, sinks=None):
        self.built, self.kernel, self.args, self.grid = built, kernel, args, grid
        self.o, self.lse, self.device = o, lse, device
        self.offsets = offsets  # varlen: (cu_seqlens_q, cu_seqlens_k), read by address at every launch
        self.sinks = sinks  # the (H,) logits, read by address at every launch
        self.tile_counter = tile_counter  # persistent: the device int the CTAs take tiles from
        from .launcher import kernel_launch

        self._launch = kernel_launch(kernel, grid, built.plan.threads, built.plan.abi.grid.cluster_dims)

    @property
    def spec(self) -> KernelSpec:
        return self.built.spec

    def __call__(self):
        import torch

        self._launch(torch.cuda.current_stream(self.device).cuda_stream, self.args)
        return self.o


def prepare(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
            window: tuple[int, int] | None = None, softcap: float = 0.0, pv_split: tuple[int, ...] | None = None,
            sinks=None, out=None, block_n: int = 0, stages: int = 0, pingpong: bool | None = None,
            persistent: bool | None = None, tile_overlap: bool | None = None, multicast: bool | None = None,
            short_tail: bool = True, lazy_rescale: bool | None = None, trace: bool = False, cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
            check: bool = True) -> PreparedAttention:
    """Check the inputs, get the specialized kernel, allocate o and lse, encode the tensor maps.

    pv_split, block_n, stages, pingpong, persistent, tile_overlap, multicast, short_tail and lazy_rescale are the
    tuning knobs of KernelSpec, and trace asks for the instrumented build that codegen/trace.py reads; the defaults are the
    measured choices of codegen.policy. `sinks` as in `attention`. With cu_seqlens (see `attention`) the sequence offsets are
    copied to the host once here, to check them: a wrong offset or max length would otherwise be a wrong answer;
    `check=False` with both max lengths leaves them unread, as `attention()` does by default.
    """
    _require_torch("codegen.prepare()")
    import torch

    from . import driver

    tuning = dict(block_n=block_n, stages=stages, pingpong=pingpong, persistent=persistent,
                  tile_overlap=tile_overlap, multicast=multicast, short_tail=short_tail, lazy_rescale=lazy_rescale,
                  trace=trace)
    call = _resolve_call(q, k, v, causal=causal, scale=scale, layout=layout, window=window, softcap=softcap,
                         pv_split=pv_split, tuning=tuning, sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         read_offsets=reads_offsets(check, max_seqlen_q, max_seqlen_k))
    varlen = call.varlen
    built, kernel = _loaded(KernelKey(call.spec, q.device.index or 0))
    plan = built.plan
    o = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    if out is not None:  # the same shape, dtype, device and stride rules as the inputs
        if varlen:
            _check_tensors(q, q, out, rank=3, dims=PACKED_DIMS)
        else:
            _check_inputs(q, q, out, layout)
        if out.shape != q.shape:
            raise InputError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    lse = torch.empty(call.lse_shape, dtype=torch.float32, device=q.device)
    # The kernel's arguments by name; plan.abi orders, types and checks them (codegen/families/fwd_sm90/abi.py).
    values = dict(_fixed_arguments(call, plan), lse_out=lse.data_ptr())
    if sinks is not None:
        values["sinks"] = sinks.data_ptr()
    for name, params in _map_params(call, plan, q, k, v, o).items():  # the operands the family maps
        values[f"tmap_{name}"] = driver.encode_tensor_map(params, {"q": q, "k": k, "v": v, "o": o}[name].data_ptr())
    strides = _o_strides(call, plan, o)
    values.update(strides)
    if strides:
        values["o_gmem"] = o.data_ptr()
    if varlen:
        values.update(cu_seqlens_q=cu_seqlens_q.data_ptr(), cu_seqlens_k=cu_seqlens_k.data_ptr())
    counter = None
    if "tile_counter" in plan.abi.names:
        # The tile counter: zero before each launch, and each launch leaves it zero. One per prepared call,
        # so two prepared calls may run at once on different streams (one call must not overlap itself).
        counter = torch.zeros(1, dtype=torch.int32, device=q.device)
        values["tile_counter"] = counter.data_ptr()
    args = plan.abi.pack(values)
    offsets = (cu_seqlens_q, cu_seqlens_k) if varlen else ()
    return PreparedAttention(built, kernel, args, _grid(call, plan, q.device, kernel), o, lse, q.device,
                             offsets=offsets, tile_counter=counter, sinks=sinks)


@dataclass(frozen=True)
class ResolvedCall:
    """A checked call: its resolved kernel spec, the problem's shape and the softmax scale."""
    spec: KernelSpec
    shape: "Shape"
    scale: float
    layout: str
    varlen: bool

    @property
    def lse_shape(self) -> tuple[int, ...]:
        s = self.shape
        return (s.heads, s.seq_q) if self.varlen else (s.batch, s.heads, s.seq_q)


def _resolve_call(q, k, v, *, causal, scale, layout, window, softcap, pv_split, tuning, sinks=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, read_offsets=True) -> ResolvedCall:
    """Every input check, then the kernel spec: raises InputError before anything is launched. read_offsets=False
    leaves a varlen batch's offsets on the device (its max lengths given): see _check_varlen_inputs."""
    varlen = any(x is not None for x in (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    if varlen:
        shape = _check_varlen_inputs(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     read_offsets=read_offsets)
    else:
        shape = _check_inputs(q, k, v, layout)
    if scale is None:
        scale = 1.0 / math.sqrt(shape.dim)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale must be a positive finite number, got {scale!r}")
    if sinks is not None:
        _check_sinks(sinks, q, shape.heads)
    unknown = set(tuning) - set(TUNING_KNOBS)
    if unknown:
        raise InputError(f"unknown argument(s) {sorted(unknown)}; the tuning knobs are {TUNING_KNOBS}")
    try:
        arch = _device_arch(q.device) if q.device.type == "cuda" else "sm_90a"  # a CPU tensor is refused below
        spec = resolve(KernelSpec(seq_len=shape.spec_seq_q, heads=shape.heads, head_dim=shape.dim, causal=bool(causal),
                                  arch=arch,
                                  dtype=BY_TORCH_NAME[str(q.dtype).split(".")[-1]].name, pv_split=tuple(pv_split or ()),
                                  seq_len_k=shape.spec_seq_k, kv_heads=shape.kv_heads,
                                  window=tuple(window) if window else (-1, -1), softcap=float(softcap), varlen=varlen,
                                  sinks=sinks is not None, **tuning))
    except (SpecError, TypeError) as e:
        raise InputError(str(e)) from None
    _check_device(q)
    return ResolvedCall(spec, shape, float(scale), layout, varlen)


def _map_params(call: ResolvedCall, plan, q, k, v, o) -> dict:
    """operand -> the tensor-map parameters of that tensor's shape and strides (no address yet)."""
    shape, varlen = call.shape, call.varlen
    params = {}
    for name, tensor, seq, heads in (("q", q, shape.seq_q, shape.heads), ("k", k, shape.seq_k, shape.kv_heads),
                                     ("v", v, shape.seq_k, shape.kv_heads), ("o", o, shape.seq_q, shape.heads)):
        if not hasattr(plan, name):
            continue
        sb, ss, sh = map_strides(tensor, call.layout, varlen)
        try:
            params[name] = getattr(plan, name).tensor_map.instantiate(
                batch=1 if varlen else shape.batch, seq_len=seq, heads=heads, stride_b=sb, stride_s=ss, stride_h=sh)
        except LayoutError as e:  # a stride or extent the tensor memory accelerator cannot express
            raise InputError(f"{name}: {e}") from None
    return params


def _fixed_arguments(call: ResolvedCall, plan) -> dict:
    """The kernel arguments that depend on the call's shape only: the scale, and the persistent tile grid."""
    values = {"scale_log2": float(call.scale * LOG2E)}
    names = plan.abi.names
    if "tiles_m" in names:
        values["tiles_m"] = plan.tiles_m(call.shape.max_seq_q if call.varlen else None)
    if "batches" in names:
        values["batches"] = call.shape.batch
    return values


def _o_strides(call: ResolvedCall, plan, o) -> dict:
    """O's byte strides where the kernel stores O without a tensor map: a varlen tile's rows past its sequence
    (fwd_sm90) or every tile (fwd_sm100); empty where the kernel takes none."""
    e = o.element_size()
    if call.varlen:
        return {"o_row_bytes": o.stride(0) * e, "o_head_bytes": o.stride(1) * e}
    if "o_batch_bytes" in plan.abi.names:
        ob, os_, oh = _strides_bshd(o, call.layout)
        return {"o_batch_bytes": ob * e, "o_row_bytes": os_ * e, "o_head_bytes": oh * e}
    return {}


def _grid(call: ResolvedCall, plan, device, kernel) -> tuple[int, int, int]:
    grid = plan.abi.grid
    resident = {}
    if grid.persistent and grid.cluster_dims:  # a persistent grid of clusters: as many as the device holds at once
        from . import driver

        resident["clusters"] = driver.resident_clusters(kernel, plan.threads, grid.cluster)
    try:
        return plan.grid(call.shape.batch, max_seqlen_q=call.shape.max_seq_q if call.varlen else None,
                         sms=_sm_count(device.index or 0) if call.spec.persistent else 0, **resident)
    except SpecError as e:
        raise InputError(str(e)) from None


# The kernel architecture of each GPU flashgen generates for (its cubins run on that compute capability only).
ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a"}


@functools.lru_cache(maxsize=None)
def _device_arch(device) -> str:
    capability = torch.cuda.get_device_capability(device)
    if capability not in ARCH_BY_CAPABILITY:
        raise InputError(f"{torch.cuda.get_device_name(device)} is compute capability {capability[0]}.{capability[1]}; "
                         f"flashgen generates kernels for {sorted(ARCH_BY_CAPABILITY.values())} "
                         "(H100/H200, B200, B300)")
    return ARCH_BY_CAPABILITY[capability]


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def map_strides(t, layout: str, varlen: bool) -> tuple[int, int, int]:
    """A tensor's (batch, seq, head) element strides as its tensor map takes them: a packed varlen (total, H, D)
    tensor is one batch entry of `total` rows (the batch stride, never stepped, is the head dim)."""
    return (t.shape[-1], t.stride(0), t.stride(1)) if varlen else _strides_bshd(t, layout)


def _strides_bshd(t, layout: str) -> tuple[int, int, int]:
    """Element strides of (batch, seq, head) whatever the layout. An axis of extent 1 is never stepped, so
    its stride is replaced by the head dim, which always satisfies the tensor map's 16-byte rule."""
    axes = (0, 1, 2) if layout == "bshd" else (0, 2, 1)
    return tuple(t.stride(a) if t.shape[a] > 1 else t.shape[3] for a in axes)


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_q: int  # rows of q per batch entry (varlen: all of them, total_q)
    seq_k: int
    heads: int
    kv_heads: int
    dim: int
    max_seq_q: int = 0  # varlen only: the longest sequences
    max_seq_k: int = 0

    @property
    def spec_seq_q(self) -> int:
        return _length_bucket(self.max_seq_q) if self.max_seq_q else self.seq_q

    @property
    def spec_seq_k(self) -> int:
        return _length_bucket(self.max_seq_k) if self.max_seq_k else self.seq_k


VARLEN_MIN_BUCKET = 128


def _length_bucket(n: int) -> int:
    """The max length a varlen kernel is specialized on: n rounded up to a power of two, at least 128."""
    return max(VARLEN_MIN_BUCKET, 1 << (n - 1).bit_length())


def _check_inputs(q, k, v, layout: str) -> Shape:
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    _check_tensors(q, k, v, rank=4, dims=layout_dims(layout))

    def bshd(t):
        return tuple(t.shape) if layout == "bshd" else (t.shape[0], t.shape[2], t.shape[1], t.shape[3])

    (batch, seq_q, heads, dim), (batch_k, seq_k, kv_heads, dim_k) = bshd(q), bshd(k)
    if batch_k != batch or dim_k != dim:
        raise InputError(f"q and k must agree on batch and head dim, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if min(batch, seq_q, seq_k, heads, kv_heads, dim) < 1:
        raise InputError(f"every dimension must be at least 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    _check_heads(heads, kv_heads)
    if batch > MAX_GRID_YZ:
        raise InputError(f"batch must be at most {MAX_GRID_YZ} (grid limits), got {batch}")
    return Shape(batch, seq_q, seq_k, heads, kv_heads, dim)


def _check_heads(heads: int, kv_heads: int) -> None:
    if heads % kv_heads:
        raise InputError(f"q's {heads} heads must be a multiple of k and v's {kv_heads} (grouped-query attention)")
    if heads > MAX_GRID_YZ:
        raise InputError(f"heads must be at most {MAX_GRID_YZ} (grid limits), got {heads}")


def _check_varlen_inputs(q, k, v, layout, cu_q, cu_k, max_q, max_k, read_offsets: bool = True) -> Shape:
    """A packed batch's checks and shape. With read_offsets the offsets are copied to the host (a synchronization)
    and checked, and the max lengths default to the longest sequence; without, they are not read and the max
    lengths, which must then be given, are taken as they are."""
    import torch

    if cu_q is None and cu_k is None:
        raise InputError("max_seqlen_q/max_seqlen_k are for variable-length batches: pass cu_seqlens_q and "
                         "cu_seqlens_k too")
    if layout != "bshd":
        raise InputError(f"variable-length batches take packed (total, H, D) tensors; layout={layout!r} does not "
                         "apply (leave it at its default)")
    _check_tensors(q, k, v, rank=3, dims=PACKED_DIMS)
    (total_q, heads, dim), (total_k, kv_heads, dim_k) = tuple(q.shape), tuple(k.shape)
    if dim_k != dim:
        raise InputError(f"q and k must agree on the head dim, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if min(total_q, total_k, heads, kv_heads, dim) < 1:
        raise InputError(f"every dimension must be at least 1 (an empty batch has nothing to attend), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    if max(total_q, total_k) >= 2**31:
        raise InputError(f"packed lengths must stay below 2**31 rows (32-bit tensor-map coordinates), got "
                         f"{total_q} and {total_k}")
    _check_heads(heads, kv_heads)
    lengths = {}
    for name, cu, total, max_len in (("cu_seqlens_q", cu_q, total_q, max_q), ("cu_seqlens_k", cu_k, total_k, max_k)):
        if cu is None:
            raise InputError("variable-length batches need both cu_seqlens_q and cu_seqlens_k")
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
            raise InputError(f"{name} must be a 1-D torch.int32 tensor, got "
                             f"{cu.dtype if isinstance(cu, torch.Tensor) else type(cu).__name__}"
                             f"{f' of rank {cu.dim()}' if isinstance(cu, torch.Tensor) else ''}")
        if cu.device != q.device:
            raise InputError(f"{name} must be on q's device {q.device}, got {cu.device}")
        if cu.numel() < 2:
            raise InputError(f"{name} must hold B + 1 >= 2 offsets, got {cu.numel()}")
        if cu.stride(0) != 1:
            raise InputError(f"{name} must be contiguous; call .contiguous()")
        if not read_offsets:
            if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
                raise InputError(f"max_seqlen_{name[-1]} must be a positive int where the offsets are not read, got "
                                 f"{max_len!r}")
            lengths[name] = max_len
            continue
        offsets = cu.tolist()
        if offsets[0] != 0 or offsets[-1] != total:
            raise InputError(f"{name} must run from 0 to the packed length {total}, got {offsets[0]} .. {offsets[-1]}")
        seq_lens = [b - a for a, b in zip(offsets, offsets[1:])]
        if min(seq_lens) < 0:
            i = min(range(len(seq_lens)), key=seq_lens.__getitem__)
            raise InputError(f"{name} must be nondecreasing, but sequence {i} has length {seq_lens[i]}")
        longest = max(seq_lens)
        if max_len is not None:
            if not isinstance(max_len, int) or max_len < longest:
                raise InputError(f"max_seqlen_{name[-1]} = {max_len!r} is shorter than sequence "
                                 f"{seq_lens.index(longest)} of length {longest}: rows past it would not be computed")
            longest = max_len
        lengths[name] = max(longest, 1)
    if cu_q.numel() != cu_k.numel():
        raise InputError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got "
                         f"{cu_q.numel() - 1} and {cu_k.numel() - 1}")
    batch = cu_q.numel() - 1
    if batch > MAX_GRID_YZ:
        raise InputError(f"at most {MAX_GRID_YZ} sequences per batch (grid limits), got {batch}")
    return Shape(batch, total_q, total_k, heads, kv_heads, dim, lengths["cu_seqlens_q"], lengths["cu_seqlens_k"])


def layout_dims(layout: str) -> str:
    """A rank-4 tensor's dimensions in `layout`, as errors name them."""
    return "B, S, H, D" if layout == "bshd" else "B, H, S, D"


def check_kinds(q, k, v, *, rank: int, dims: str) -> None:
    """Type, rank and dtype: the rules that read no size, so torch.compile's trace runs them too (torch_op)."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise InputError(f"{name} must have rank {rank} ({dims}), got shape {tuple(t.shape)}")
        if str(t.dtype).split(".")[-1] not in BY_TORCH_NAME:
            raise InputError(f"{name} has dtype {t.dtype}; supported: "
                             + ", ".join(f"torch.{d}" for d in BY_TORCH_NAME))
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_tensors(q, k, v, *, rank: int, dims: str) -> None:
    """The rules every input tensor obeys: type, rank, dtype, device, no grad, TMA-expressible strides."""
    import torch

    check_kinds(q, k, v, rank=rank, dims=dims)
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise InputError(NO_BACKWARD)
    if k.shape != v.shape:
        raise InputError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    elem = q.element_size()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise InputError(f"{name}'s head dimension must be contiguous (stride 1), got stride {t.stride(-1)}; "
                             "call .contiguous()")
        for axis in range(rank - 1):
            if t.shape[axis] > 1 and t.stride(axis) == 0:
                raise InputError(f"{name}.stride({axis}) is 0 (an expanded tensor); call .contiguous()")
            if t.shape[axis] > 1 and (t.stride(axis) * elem) % 16:
                raise InputError(f"{name}.stride({axis}) = {t.stride(axis)} elements is not a multiple of 16 bytes, "
                                 "which the tensor memory accelerator requires")
        if t.data_ptr() % 16:
            raise InputError(f"{name}'s data pointer is not 16-byte aligned")


def _check_sinks(sinks, q, heads: int) -> None:
    """The sinks' rules: a float32 (H,) tensor, one logit per query head, contiguous on q's device."""
    import torch

    if not isinstance(sinks, torch.Tensor):
        raise InputError(f"sinks must be a torch.Tensor of float32 logits, one per query head, got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        raise InputError(f"sinks must be float32 (one logit per query head), got {sinks.dtype}")
    if tuple(sinks.shape) != (heads,):
        raise InputError(f"sinks must have shape ({heads},), one logit per query head, got {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise InputError(f"sinks must be on q's device {q.device}, got {sinks.device}")
    if heads > 1 and sinks.stride(0) != 1:
        raise InputError(f"sinks must be contiguous (stride 1), got stride {sinks.stride(0)}; call .contiguous()")
    if torch.is_grad_enabled() and sinks.requires_grad:
        raise InputError(NO_BACKWARD)
    if sinks.data_ptr() % 4:
        raise InputError("sinks' data pointer is not 4-byte aligned")


def _check_device(t) -> None:
    """Checked after everything else, so every other check also runs (and is tested) on the CPU."""
    if t.device.type != "cuda":
        raise InputError(f"the inputs are on {t.device}; flashgen kernels run on a CUDA device")




KNOB_TYPES = {"block_n": (int,), "stages": (int,), "pingpong": (bool, type(None)), "persistent": (bool, type(None)),
              "tile_overlap": (bool, type(None)), "multicast": (bool, type(None)), "short_tail": (bool,),
              "lazy_rescale": (bool, type(None)), "trace": (bool,)}


def parse_knob(text: str) -> tuple[str, object]:
    """One tuning knob from the command line, KNOB=VALUE, as prepare() takes it: pv_split=96+32, a bool knob as
    0/1 (or true/false, yes/no), an int knob as an int. InputError for an unknown knob or a value of another kind
    (prepare() refuses an int where a bool belongs)."""
    from .spec import parse_split

    key, sep, value = text.partition("=")
    if not sep:
        raise InputError(f"knob {text!r}: expected KNOB=VALUE")
    if key == "pv_split":
        return key, parse_split(value)
    allowed = KNOB_TYPES.get(key)
    if allowed is None:
        raise InputError(f"unknown knob {key!r}; knobs: pv_split, {', '.join(KNOB_TYPES)}")
    if bool in allowed:
        flags = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
        if value.lower() not in flags:
            raise InputError(f"knob {key} is yes or no (1/0, true/false), got {value!r}")
        return key, flags[value.lower()]
    try:
        return key, int(value)
    except ValueError:
        raise InputError(f"knob {key} is an integer, got {value!r}") from None


def check_option_types(*, window, pv_split, tuning) -> None:
    """The types the options must have, for a path that converts them before the checks see them (torch.compile's
    op arguments: int(3.7) would pass as 3): InputError for a window or split that is not ints, or a knob of
    another type than KernelSpec's field."""
    for name, values in (("window", window), ("pv_split", pv_split)):
        if values is not None and not all(type(x) is int for x in values):
            raise InputError(f"{name} must be a sequence of ints, got {values!r}")
    for knob, value in tuning.items():
        allowed = KNOB_TYPES.get(knob)
        if allowed is not None and type(value) not in allowed:
            raise InputError(f"{knob} must be {' or '.join(a.__name__ for a in allowed)}, got {value!r}")


def _require_torch(what: str) -> None:
    """One clear error, before anything else, where torch (or a torch new enough for the custom op) is missing."""
    if _torch_op is None:
        raise ModuleNotFoundError(f"{what} needs torch: {_TORCH_MISSING}; {TORCH_HINT}", name="torch")


_TORCH_MISSING = ""
try:  # torch for the calls, and torch.ops.flashgen.attention registered (the generator itself never needs torch)
    import torch

    from . import torch_op as _torch_op
    from .launcher import Launcher, remember
except (ImportError, AttributeError) as _e:  # AttributeError: a torch before 2.4, without torch.library.custom_op
    _TORCH_MISSING = str(_e) if isinstance(_e, ImportError) else f"this torch is too old ({_e})"
    torch = _torch_op = Launcher = remember = None
