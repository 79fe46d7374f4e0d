"""The backward pass: `attention_backward` runs the bwd_sm90 kernels (codegen/families/bwd_sm90) on the forward's
o and logsumexp, and `AttentionFunction` makes `codegen.attention()` differentiable through them.

One call launches three kernels on the current stream: `_pre` (delta = rowsum(dO * O), the log2 logsumexp, the
fp32 dQ accumulator zeroed), the main kernel (dK, dV, and dQ added into the accumulator) and `_post` (dQ in the
input dtype). Every input is checked before the first launch; the workspaces come from torch's allocator.
"""

from __future__ import annotations

import functools
import math

from layouts import LayoutError
from layouts.dtypes import BY_TORCH_NAME

from . import api
from .api import InputError, _check_inputs, _current_stream, _device_arch, _sm_count, _strides_bshd
from .families.bwd_sm90 import BackwardSpec, post_name, pre_name, resolve
from .families.bwd_sm90.plan import ROW_THREADS
from .families.fwd_sm90.abi import LOG2E
from .spec import SpecError

MAX_LAUNCHERS = 64
_LAUNCHERS: dict = {}


def backward_spec(shape, dtype, *, causal, window, softcap, arch: str, deterministic: bool = False,
                  varlen: bool = False) -> BackwardSpec:
    """The resolved spec of a call's backward kernels, or the InputError that says why there is none. A varlen
    call's spec is specialized on its longest sequences rounded up (Shape.spec_seq_q), as the forward's is."""
    if arch != "sm_90a":
        raise InputError(f"the backward kernels are generated for sm_90a (H100/H200) only so far, not {arch}")
    try:
        return resolve(BackwardSpec(seq_len=shape.spec_seq_q, seq_len_k=shape.spec_seq_k, heads=shape.heads,
                                    kv_heads=shape.kv_heads, head_dim=shape.dim,
                                    dtype=BY_TORCH_NAME[str(dtype).split(".")[-1]].name, causal=bool(causal),
                                    window=tuple(window) if window else (-1, -1), softcap=float(softcap),
                                    deterministic=bool(deterministic), varlen=bool(varlen)))
    except (SpecError, TypeError) as e:
        raise InputError(f"backward: {e}") from None


@functools.lru_cache(maxsize=32)
def _loaded(spec: BackwardSpec, device_index: int):
    from . import build, driver

    built = build.build(spec)
    kernel = driver.load(built.compiled.cubin, built.rendered.kernel_name, built.plan.smem.total, device_index)
    return built, kernel, driver.sibling(kernel, pre_name(spec)), driver.sibling(kernel, post_name(spec))


def _strided(name: str, t, layout: str) -> dict:
    """A tensor's address and byte strides as the ABI's strided_tensor parameters; a packed varlen (total, H, D)
    tensor has no batch stride (the kernels add each sequence's first row)."""
    e = t.element_size()
    sb, ss, sh = (0, t.stride(0), t.stride(1)) if t.dim() == 3 else _strides_bshd(t, layout)
    return {f"{name}_gmem": t.data_ptr(), f"{name}_batch_bytes": sb * e, f"{name}_row_bytes": ss * e,
            f"{name}_head_bytes": sh * e}


def _check_like(name: str, t, q, layout: str):
    """o and dO: q's shape, dtype and device; dO of any strides is made TMA-readable (a copy where needed)."""
    import torch

    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype or t.device != q.device:
        raise InputError(f"{name} must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device {q.device}")
    # A copy where a TMA map cannot read it in place: a strided last dim, a misaligned start or stride, or a stride
    # of 0 (an expanded gradient, e.g. of a sum over a dimension: a tensor map takes no zero stride).
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any(
            t.shape[a] > 1 and (t.stride(a) == 0 or (t.stride(a) * t.element_size()) % 16) for a in range(t.dim() - 1)):
        t = t.contiguous()
    return t


class BackwardLauncher:
    """The loaded kernels of one call signature, their grids and the tensor-map parameters of q, k, v, dO."""

    def __init__(self, spec: BackwardSpec, shape, layout: str, scale: float, q, k, v, do, device, varlen: bool = False):
        from .launcher import TensorMapCache

        self.built, self.kernel, self.pre, self.post = _loaded(spec, device.index or 0)
        self.plan, self.shape, self.layout, self.scale, self.device = self.built.plan, shape, layout, scale, device
        self.maps = {}
        for op, t, seq, heads in (("q", q, shape.seq_q, shape.heads), ("k", k, shape.seq_k, shape.kv_heads),
                                  ("v", v, shape.seq_k, shape.kv_heads), ("do", do, shape.seq_q, shape.heads)):
            sb, ss, sh = api.map_strides(t, layout, varlen)
            try:
                params = getattr(self.plan, op).tensor_map.instantiate(batch=1 if varlen else shape.batch, seq_len=seq,
                                                                       heads=heads, stride_b=sb, stride_s=ss,
                                                                       stride_h=sh)
            except LayoutError as e:
                raise InputError(f"{op}: {e}") from None
            self.maps[op] = TensorMapCache(params, 8)
        sms = _sm_count(device.index or 0)
        self.section = self.plan.section(shape.batch, sms)
        self.tail = self.plan.tail_split(shape.batch, sms)
        self.grid = self.plan.grid(shape.batch, self.tail)
        if self.grid[0] >= 2**31:
            raise InputError(f"{self.grid[0]} CTAs: over the grid's limit; split the batch")

    def __call__(self, q, k, v, o, lse, do, cu_seqlens_q=None, cu_seqlens_k=None):
        import torch

        from .launcher import launch_now

        plan, shape = self.plan, self.shape
        rows = plan.padded_rows
        f32 = dict(dtype=torch.float32, device=q.device)
        lse_log2 = torch.empty((shape.batch, shape.heads, rows), **f32)
        delta = torch.empty((shape.batch, shape.heads, rows), **f32)
        dq_accum = torch.empty((shape.batch, shape.heads, rows, shape.dim), **f32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        stream = _current_stream(q.device)
        turns = (torch.empty((shape.batch, shape.heads, plan.m_blocks), dtype=torch.int32, device=q.device)
                 if plan.spec.deterministic else None)
        cu = dict(cu_seqlens_q=0 if cu_seqlens_q is None else cu_seqlens_q.data_ptr())
        work = dict(cu, lse_log2=lse_log2.data_ptr(), delta=delta.data_ptr(), dq_accum=dq_accum.data_ptr(),
                    dq_turns=0 if turns is None else turns.data_ptr())
        # A split tail's fp32 dK/dV sums and counts, zeroed together (int 0 and float 0.0 are the same bits).
        tail_units, tail_pieces = self.tail
        floats, counts = plan.tail_workspace(tail_units)
        tail = torch.zeros(floats + counts, **f32) if tail_units else None
        pre = dict(work, **_strided("o", o, self.layout), **_strided("do", do, self.layout), lse=lse.data_ptr(),
                   batch=shape.batch)
        main = dict(work, **{f"tmap_{op}": self.maps[op].get(t.data_ptr())
                             for op, t in (("q", q), ("k", k), ("v", v), ("do", do))},
                    **_strided("dk", dk, self.layout), **_strided("dv", dv, self.layout),
                    scale_log2=float(self.scale * LOG2E), scale=float(self.scale), batch=shape.batch,
                    cu_seqlens_k=0 if cu_seqlens_k is None else cu_seqlens_k.data_ptr(),
                    section=self.section, tail_units=tail_units, tail_pieces=tail_pieces,
                    dkv_tail=0 if tail is None else tail.data_ptr(),
                    tail_count=0 if tail is None else tail.data_ptr() + 4 * floats)
        post = dict(cu, dq_accum=dq_accum.data_ptr(), **_strided("dq", dq, self.layout), scale=float(self.scale),
                    batch=shape.batch)
        row_grid = plan.row_grid(shape.batch)
        launch_now(self.pre, row_grid, ROW_THREADS, stream, plan.pre_abi.pack(pre))
        launch_now(self.kernel, self.grid, plan.threads, stream, plan.abi.pack(main))
        launch_now(self.post, row_grid, ROW_THREADS, stream, plan.post_abi.pack(post))
        return dq, dk, dv


def attention_backward(q, k, v, o, lse, do, *, causal: bool = False, scale: float | None = None,
                       window: tuple[int, int] | None = None, softcap: float = 0.0, layout: str = "bshd",
                       deterministic: bool = False, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q: int | None = None, max_seqlen_k: int | None = None):
    """dq, dk, dv of o = attention(q, k, v, ...) for the gradient `do` of o, given o and its logsumexp `lse`
    ((B, H, S_q) float32, natural log, as attention(..., return_lse=True) returns it). The options must be
    those of the forward call. Under grouped-query attention dk and dv are summed over each K/V head's query
    heads. The gradients have q's, k's and v's shapes and strides where those are dense. A variable-length batch
    (D 64, 96, 128) passes the forward's packed tensors, cu_seqlens and max lengths, and its (H, total_q) lse; as in
    attention(), its offsets are read (a synchronization) and checked only where a max length is missing."""
    import torch

    api._require_torch("codegen.attention_backward()")
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        q, k, v = q.detach(), k.detach(), v.detach()
    varlen = any(x is not None for x in (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    with torch.no_grad():
        if varlen:
            shape = api._check_varlen_inputs(q, k, v, layout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             read_offsets=api.reads_offsets(False, max_seqlen_q, max_seqlen_k))
            lse_shape = (shape.heads, shape.seq_q)
        else:
            shape = _check_inputs(q, k, v, layout)
            lse_shape = (shape.batch, shape.heads, shape.seq_q)
        o = _check_like("o", o, q, layout)
        do = _check_like("do", do, q, layout)
        if (not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or lse.device != q.device
                or tuple(lse.shape) != lse_shape):
            raise InputError(f"lse must be the forward's float32 logsumexp of shape {lse_shape} on {q.device}")
        lse = lse.contiguous()
        if scale is None:
            scale = 1.0 / math.sqrt(shape.dim)
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise InputError(f"scale must be a positive finite number, got {scale!r}")
        api._check_device(q)
        key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), do.stride(), q.dtype, q.device, bool(causal),
               float(scale), layout, None if window is None else tuple(window), float(softcap), bool(deterministic),
               shape.batch, shape.spec_seq_q, shape.spec_seq_k, varlen)
        launcher = _LAUNCHERS.get(key)
        if launcher is None:
            spec = backward_spec(shape, q.dtype, causal=causal, window=window, softcap=softcap,
                                 arch=_device_arch(q.device), deterministic=deterministic, varlen=varlen)
            launcher = BackwardLauncher(spec, shape, layout, float(scale), q, k, v, do, q.device, varlen)
            api.remember(_LAUNCHERS, key, launcher, MAX_LAUNCHERS)
        return launcher(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k)


def _function():
    import torch

    class AttentionFunction(torch.autograd.Function):
        """o, lse = attention(q, k, v, ...) with o differentiable through the backward kernels (lse is not)."""

        @staticmethod
        def forward(ctx, q, k, v, options):
            o, lse = api._call(q, k, v, options["causal"], options["scale"], options["layout"], options["window"],
                               options["softcap"], options["pv_split"], options["tuning"], return_lse=True,
                               sinks=options["sinks"], varlen=options["varlen"])
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.options = options
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(ctx, do, _dlse):
            q, k, v, o, lse = ctx.saved_tensors
            opt = ctx.options
            dq, dk, dv = attention_backward(q, k, v, o, lse, do, causal=opt["causal"], scale=opt["scale"],
                                            window=opt["window"], softcap=opt["softcap"], layout=opt["layout"],
                                            deterministic=opt["deterministic"],
                                            **dict(zip(api.VARLEN_ARGS, opt["varlen"] or ())))
            return dq, dk, dv, None

    return AttentionFunction


@functools.lru_cache(maxsize=1)
def attention_function():
    return _function()


def check_differentiable(q, k, *, layout, causal, window, softcap, sinks, deterministic, refusal_of=None) -> None:
    """The backward's refusals from shapes and dtypes alone. torch.compile passes `refusal_of` wrapped as a
    constant result (codegen.torch_op), so they are raised while tracing without tracing the layouts' numpy."""
    if sinks is not None and getattr(sinks, "requires_grad", False):
        raise InputError("the gradient of sinks is not computed yet: pass sinks.detach() (q, k and v still get theirs)")
    if layout not in api.LAYOUTS or q.dim() != 4 or k.dim() != 4:
        return  # the forward's own checks say what is wrong
    (seq_q, heads, dim), (seq_k, kv_heads) = ((q.shape[1], q.shape[2], q.shape[3]), (k.shape[1], k.shape[2])) \
        if layout == "bshd" else ((q.shape[2], q.shape[1], q.shape[3]), (k.shape[2], k.shape[1]))
    dims = (seq_q, seq_k, heads, kv_heads, dim)
    if not all(isinstance(x, int) for x in dims):
        return  # dynamic shapes under torch.compile: the backward op refuses when it runs
    refusal = (refusal_of or backward_refusal)(
        int(seq_q), int(seq_k), int(heads), int(kv_heads), int(dim), str(q.dtype), bool(causal),
        None if window is None else tuple(int(w) for w in window), float(softcap), bool(deterministic),
        q.device.type, q.device.index or 0)
    if refusal:
        raise InputError(refusal)


def backward_refusal(seq_q, seq_k, heads, kv_heads, dim, dtype, causal, window, softcap, deterministic, device_type,
                     device_index, varlen: bool = False) -> str:
    """The InputError message of a backward spec that cannot be made, or '': plain values in and out."""
    import torch

    arch = _device_arch(torch.device(device_type, device_index)) if device_type == "cuda" else "sm_90a"
    try:
        backward_spec(api.Shape(1, seq_q, seq_k, heads, kv_heads, dim), dtype, causal=causal, window=window,
                      softcap=softcap, arch=arch, deterministic=deterministic, varlen=varlen)
    except InputError as e:
        return str(e)
    return ""


def differentiable_attention(q, k, v, *, causal, scale, layout, window, softcap, pv_split, sinks, tuning,
                             deterministic=False, varlen=None, check=False):
    """attention() where q, k or v requires grad: every check of the backward spec first (an unsupported case is an
    InputError before the forward runs), then the forward through AttentionFunction.

    Sinks need nothing of the backward kernels: the forward's logsumexp includes them, so P = exp(s - lse) is
    already each key's share, and delta = rowsum(dO * O) is still sum_j P_ij dP_ij (a sink has no value). Their own
    gradient is not computed: sinks that require grad are refused by the forward's checks.

    `varlen`: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a variable-length batch, else None. Its
    offsets are read and checked here (a synchronization) only with `check` or where a max length is missing; the
    forward and the backward then take the max lengths as given and never read them."""
    if varlen is None:
        _check_inputs(q.detach(), k.detach(), v.detach(), layout)
    else:
        shape = api._check_varlen_inputs(q.detach(), k.detach(), v.detach(), layout, *varlen,
                                         read_offsets=api.reads_offsets(check, varlen[2], varlen[3]))
        varlen = (varlen[0], varlen[1], shape.max_seq_q, shape.max_seq_k)
    # Fixed lengths: every refusal of the spec; varlen (3-D tensors): the sinks' only, the spec's below.
    check_differentiable(q, k, layout=layout, causal=causal, window=window, softcap=softcap, sinks=sinks,
                         deterministic=deterministic)
    if varlen is not None:
        refusal = backward_refusal(shape.spec_seq_q, shape.spec_seq_k, shape.heads, shape.kv_heads, shape.dim,
                                   str(q.dtype), bool(causal), None if window is None else tuple(window),
                                   float(softcap), bool(deterministic), q.device.type, q.device.index or 0,
                                   varlen=True)
        if refusal:
            raise InputError(refusal)
    options = dict(causal=causal, scale=scale, layout=layout, window=window, softcap=softcap, pv_split=pv_split,
                   sinks=sinks, tuning=tuning, deterministic=deterministic, varlen=varlen)
    return attention_function().apply(q, k, v, options)
