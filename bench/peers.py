"""The implementations timed beside flashgen: Peer, the torch SDPA backends, cuDNN (padded and ragged), flex,
unfused, FlashAttention-2 varlen, FlashAttention-4 (when it imports) and flashgen's own calls, the PEERS and
VARLEN_PEER_IMPLS tables, and which of them (with which PV splits) run on a case."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import math
import pathlib
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .cases import Case
from .config import VARLEN_ONLY_PEERS, VARLEN_PEERS, BenchConfig
from .inputs import Inputs, unpad
from .report import split_impl

# Candidate PV splits; a shape gets those that add up to its block_n (codegen.policy decides block_n).
CANDIDATE_SPLITS = ((96, 32), (64, 64), (32, 32), (64,))

MATH_MAX_SCORES = 2**28  # B*H*S*S above this: the math backend's S x S float scores take minutes and GBs
UNFUSED_MAX_SCORES = 2**33  # unfused keeps scores and probabilities (2 bytes each) alive at once


def splits_for(block_n: int, requested: Iterable[tuple[int, ...]] = ()) -> tuple[tuple[int, ...], ...]:
    """The PV splits to time for a kernel with this block_n: the requested ones, else every valid candidate,
    else the plan's default split for it (block_n 176 has no candidate)."""
    from codegen.policy import default_pv_split

    return (tuple(requested) or tuple(s for s in CANDIDATE_SPLITS if sum(s) == block_n)
            or (tuple(default_pv_split(block_n)),))


def _bhsd(qkv):
    return tuple(t.transpose(1, 2) for t in qkv)


def gqa_kwargs(case: Case) -> dict:
    """enable_gqa=True for a grouped-query case (SDPA and flex_attention, torch >= 2.5); nothing otherwise, so
    the equal-heads calls stay exactly what they were (and still run on an older torch)."""
    return {"enable_gqa": True} if case.gqa else {}


def sdpa_kwargs(case: Case) -> dict:
    """The keyword arguments of every scaled_dot_product_attention call the bench times. A causal case with
    S_k != S_q has is_causal=False: SDPA aligns is_causal to the top left, the bench to the bottom right, so its
    calls take bottom_right_bias as attn_mask instead (_sdpa_calls)."""
    return {"is_causal": case.causal and not case.chunked, **gqa_kwargs(case)}


def bottom_right_keep(torch, case: Case, device):
    """Boolean (S_q, S_k): query i sees key j where j <= i + S_k - S_q (causal aligned to the bottom right, as
    codegen.check.reference, flashgen and FlashAttention align it)."""
    return torch.ones(case.seq, case.seq_k, dtype=torch.bool, device=device).tril(case.seq_k - case.seq)


def bottom_right_bias(torch, case: Case, dtype, device):
    """(S_q, S_k) additive mask in q's dtype: 0 on the keys bottom_right_keep keeps, -inf on the others."""
    keep = bottom_right_keep(torch, case, device)
    return torch.zeros(case.seq, case.seq_k, dtype=dtype, device=device).masked_fill_(~keep, float("-inf"))


def _sdpa_calls(torch, inputs: Inputs, case: Case):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kwargs = sdpa_kwargs(case)
    if case.causal and case.chunked:  # made once, outside the timed calls
        q0 = inputs.sets[0][0]
        kwargs["attn_mask"] = bottom_right_bias(torch, case, q0.dtype, q0.device)

    def call(qkv):
        q, k, v = _bhsd(qkv)
        return lambda: sdpa(q, k, v, **kwargs).transpose(1, 2)

    return [call(s) for s in inputs.sets]


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _flex_calls(torch, inputs: Inputs, case: Case):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compile per shape: entries from earlier shapes must not count toward dynamo's recompile limit.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    device = inputs.sets[0][0].device
    mask_mod = _causal_mask_mod
    if case.chunked:
        offset = case.seq_k - case.seq

        def mask_mod(b, h, q_idx, kv_idx):  # bottom-right: query i sees keys up to i + S_k - S_q
            return q_idx + offset >= kv_idx

    mask = (create_block_mask(mask_mod, B=None, H=None, Q_LEN=case.seq, KV_LEN=case.seq_k, device=device)
            if case.causal else None)
    kwargs = gqa_kwargs(case)

    def call(qkv):
        q, k, v = _bhsd(qkv)
        return lambda: compiled(q, k, v, block_mask=mask, **kwargs).transpose(1, 2)

    return [call(s) for s in inputs.sets]


def _unfused_calls(torch, inputs: Inputs, case: Case):
    scale = 1.0 / math.sqrt(case.dim)
    device = inputs.sets[0][0].device
    masked = ~bottom_right_keep(torch, case, device) if case.causal else None  # triu(1) when S_k = S_q

    def run(q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        if masked is not None:
            scores.masked_fill_(masked, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)

    def call(qkv):
        q, k, v = _bhsd(qkv)
        # Under GQA, K/V heads are repeated here, once per input set and outside the timed calls: the row times
        # the attention arithmetic itself. (A model that repeats per call, as repeat_kv does, pays one K/V copy
        # more.) Query head h reads K/V head h // group, as in codegen.check.reference and SDPA's enable_gqa.
        if case.gqa:
            k, v = (t.repeat_interleave(case.group, dim=1) for t in (k, v))
        return lambda: run(q, k, v)

    return [call(s) for s in inputs.sets]


def flashgen_kwargs(case: Case, split: tuple[int, ...] | None, inputs: Inputs) -> dict:
    """The keyword arguments of flashgen's calls on a case, the same for prepare() and attention(): causal, the PV
    split the row times and, for a varlen case, cu_seqlens_q/k and max_seqlen_q/k (q lengths = k lengths). Nothing
    the case does not set (scale, window, softcap, the other tuning knobs stay at their defaults)."""
    kwargs: dict = {"causal": case.causal, "pv_split": split}
    if case.varlen:
        cu = inputs.cu_seqlens
        kwargs.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=case.seq, max_seqlen_k=case.seq)
    return kwargs


def _flashgen_calls(split: tuple[int, ...]):
    """The kernel: prepare(q, k, v, ...) once per input set, outside the timing; each call launches only."""

    def make(torch, inputs: Inputs, case: Case):
        from codegen.api import prepare

        kwargs = flashgen_kwargs(case, split, inputs)
        prepared = [prepare(q, k, v, **kwargs) for q, k, v in inputs.sets]
        return [p.__call__ for p in prepared]

    return make


def _flashgen_attention_calls(split: tuple[int, ...]):
    """What users call: codegen.attention(q, k, v, ...) with the same arguments as the prepared kernel (dense and
    varlen alike; a varlen case gives both max lengths, so its offsets are not read). Every call runs the cached
    launcher's checks, allocates o and launches: its host time is part of call_ms."""

    def make(torch, inputs: Inputs, case: Case):
        import codegen

        attention = codegen.attention  # resolved once, as `from codegen import attention` does
        kwargs = flashgen_kwargs(case, split, inputs)

        def call(qkv):
            q, k, v = qkv
            return lambda: attention(q, k, v, **kwargs)

        return [call(s) for s in inputs.sets]

    return make


class Unavailable(RuntimeError):
    """An implementation this torch (or this flashgen) does not have: its row is skipped, with the reason."""


def _flashgen_varlen_calls(split: tuple[int, ...]):
    """flashgen's varlen API: prepare(q, k, v, cu_seqlens_q=..., cu_seqlens_k=..., max_seqlen_q=..., ...)
    (flashgen_kwargs of a varlen case; _flashgen_calls itself takes both forms)."""
    return _flashgen_calls(split)


def _cudnn_padded_calls(torch, inputs: Inputs, case: Case):
    """The varlen yardstick: cuDNN SDPA on the zero-padded (B, S, H, D) batch, what a user without varlen runs.
    Causal needs no mask (q and k lengths are equal, so no token's causal keys reach its sequence's padding);
    non-causal takes the additive key-padding mask, without which every token would also attend to the
    padding's zero keys. Output (B, S, H, D); its padding rows are garbage and dropped by _unpadded."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kwargs = sdpa_kwargs(case)
    if inputs.key_mask is not None:
        kwargs["attn_mask"] = inputs.key_mask

    def call(qkv):
        q, k, v = _bhsd(qkv)
        return lambda: sdpa(q, k, v, **kwargs).transpose(1, 2)

    return [call(s) for s in inputs.padded]


def _unpadded(out, inputs: Inputs):
    return unpad(out, inputs.valid)


def _same(out, inputs: Inputs):
    return out


def aten_op(torch, name: str, needs: Sequence[str] = ()):
    """torch.ops.aten.<name>.default, if this torch has it with the arguments `needs`; else Unavailable."""
    try:
        op = getattr(torch.ops.aten, name).default
        args = {a.name for a in op._schema.arguments}
    except (AttributeError, RuntimeError) as e:
        raise Unavailable(f"torch {torch.__version__} has no aten::{name} ({type(e).__name__})") from None
    missing = [n for n in needs if n not in args]
    if missing:
        raise Unavailable(f"torch {torch.__version__}'s aten::{name} takes no {', '.join(missing)}")
    return op


def _ragged_kwargs(inputs: Inputs, case: Case) -> dict:
    cu = inputs.cu_seqlens
    return {"cum_seq_q": cu, "cum_seq_k": cu, "max_q": case.seq, "max_k": case.seq, "dropout_p": 0.0,
            "is_causal": case.causal, "return_debug_mask": False}


def _cudnn_varlen_calls(torch, inputs: Inputs, case: Case):
    """cuDNN's ragged (THD) kernel: aten::_cudnn_attention_forward with cum_seq_q/k, the call SDPA makes on
    nested (jagged) tensors under the CUDNN_ATTENTION backend, here with cu_seqlens made once (no nested-tensor
    bookkeeping in the timed call). Output packed (T, H, D)."""
    kwargs = {"attn_bias": None, "compute_log_sumexp": False, **_ragged_kwargs(inputs, case)}
    op = aten_op(torch, "_cudnn_attention_forward", ("query", "key", "value", *kwargs))
    if not torch.backends.cudnn.is_available():
        raise Unavailable(f"torch {torch.__version__} has no cuDNN")

    def call(qkv):
        q, k, v = qkv
        return lambda: op(query=q, key=k, value=v, **kwargs)[0]

    return [call(s) for s in inputs.sets]


def _flash_varlen_calls(torch, inputs: Inputs, case: Case):
    """FlashAttention-2's varlen kernel as torch ships it: aten::_flash_attention_forward with cum_seq_q/k, which
    torch.nn.attention.varlen.varlen_attn calls (its Python signature changed between releases; the op's did
    not). K/V heads may divide H (the kernel reads them grouped). Output packed (T, H, D)."""
    kwargs = _ragged_kwargs(inputs, case)
    op = aten_op(torch, "_flash_attention_forward", ("query", "key", "value", *kwargs))

    def call(qkv):
        q, k, v = qkv
        return lambda: op(query=q, key=k, value=v, **kwargs)[0]

    return [call(s) for s in inputs.sets]


def _flex_varlen_calls(torch, inputs: Inputs, case: Case):
    """flex_attention on the packed batch as one sequence of T tokens, with a document mask (a token sees
    only its own sequence's keys, and under causal only the earlier ones): blocks across sequences are
    skipped. Output packed (T, H, D)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    docs, causal, total = inputs.doc_ids, case.causal, case.total_tokens

    def same_sequence(b, h, q_idx, kv_idx):
        same = docs[q_idx] == docs[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same

    mask = create_block_mask(same_sequence, B=None, H=None, Q_LEN=total, KV_LEN=total, device=docs.device)
    kwargs = gqa_kwargs(case)

    def call(qkv):
        q, k, v = (t.transpose(0, 1)[None] for t in qkv)  # (1, H, T, D)
        return lambda: compiled(q, k, v, block_mask=mask, **kwargs)[0].transpose(0, 1)

    return [call(s) for s in inputs.sets]


# FlashAttention-4 (package flash-attn-4, CuTe DSL; import flash_attn.cute). Its public forward, as read in
# Dao-AILab/flash-attention flash_attn/cute/interface.py (the stored public source, commit 004b1a2e41bf):
#   flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
#                   softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, mask_mod=None, ...,
#                   return_lse=False)
# returns FlashAttnFunc.apply(...), i.e. the tuple (out, lse): out (B, S_q, H, D) in q's dtype, lse None unless
# return_lse or an input requires grad. q is (B, S_q, H, D), k and v (B, S_k, H_kv, D): _flash_attn_fwd asserts
# num_head % num_head_kv == 0 and reads grouped K/V heads natively (qhead_per_kvhead = H / H_kv; pack_gqa=None
# picks packing itself), so GQA needs no kwarg and no repeat. softmax_scale None is 1/sqrt(D), the bench's scale.
# causal=True sets window_size_right = 0, and flash_attn/cute/mask.py aligns it to the bottom right:
# col_limit_right = row + 1 + seqlen_k - seqlen_q (causal_row_offset), as codegen.check.reference does.
FA4_MODULE = "flash_attn.cute"
# Where `scripts/fa4-site.sh finish` unpacks FA4 on the GPU machine (the checkout's .fa4site, git-ignored).
FA4_SITE = pathlib.Path(__file__).resolve().parent.parent / ".fa4site"


def fa4_function():
    """flash_attn.cute.flash_attn_func; Unavailable with the error, on one line, when it does not import (not
    installed, or any error on import: missing CUDA libraries, a cutlass-dsl mismatch)."""
    try:
        return importlib.import_module(FA4_MODULE).flash_attn_func
    except Exception as e:  # whatever the import raises is the row's reason, never the end of the run
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        if isinstance(e, ModuleNotFoundError) and (FA4_SITE / "flash_attn").is_dir():
            reason += (f" ({FA4_SITE} holds it, off sys.path: `. scripts/fa4-site.sh finish` exports the PYTHONPATH "
                       "that finds it, and a command's own PYTHONPATH=... replaces that one)")
        raise Unavailable(f"FlashAttention-4 ({FA4_MODULE}) does not import: {reason}") from None


def fa4_kwargs(case: Case) -> dict:
    """The keyword arguments of the timed flash_attn_func call: causal only (bottom-right where S_k != S_q). Grouped
    query is k and v's own head count; the scale is FA4's default, 1/sqrt(D)."""
    return {"causal": case.causal}


def _fa4_out(result):
    """out of flash_attn_func's (out, lse); a bare tensor as it is, should a version return only out."""
    return result[0] if isinstance(result, (tuple, list)) else result


def _fa4_calls(torch, inputs: Inputs, case: Case, **options):
    """FlashAttention-4's forward on the (B, S, H, D) sets as they are (k, v with H_kv heads). Its first call
    compiles (cute.compile, cached by the package per configuration); the timed calls launch. Output (B, S, H, D).
    `options` go to flash_attn_func as they are (fa4_nopack: pack_gqa=False)."""
    attention = fa4_function()
    kwargs = {**fa4_kwargs(case), **options}

    def call(qkv):
        q, k, v = qkv
        return lambda: _fa4_out(attention(q, k, v, **kwargs))

    return [call(s) for s in inputs.sets]


def _sdpa_backend(name: str):
    def context(torch):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, name)])

    return context


def _no_context(torch):
    return contextlib.nullcontext()


def _no_recompile(torch):
    """After the first (compiling) call, a recompilation is an error, so a storm cannot hide in the timing."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return set_stance("fail_on_recompile") if set_stance else contextlib.nullcontext()


@dataclass(frozen=True)
class Peer:
    name: str
    make: Callable  # (torch, inputs, case) -> [zero-argument call returning o as (B, S, H, D)], one per input set
    context: Callable = _no_context  # (torch) -> context around every call
    steady: Callable = _no_context  # (torch) -> context after the first call (which may compile)
    skip: Callable[[Case], str | None] = lambda case: None
    output: Callable = _same  # (o, inputs) -> o comparable with inputs.ref (the padded yardstick drops its padding)
    # What users call, timed apart from `make` with its host time visible (call_ms): (torch, inputs, case) ->
    # [zero-argument call], like make. flashgen: codegen.attention(...) beside the prepared kernel; the cuDNN
    # yardstick: its own SDPA call (the same as make), timed only when another entry times a call.
    call: Callable | None = None
    yardstick: bool = False


def _math_skip(case: Case) -> str | None:
    return f"B*H*S*S = {case.scores} > 2^28" if case.scores > MATH_MAX_SCORES else None


def _unfused_skip(case: Case) -> str | None:
    return f"B*H*S*S = {case.scores} > 2^33" if case.scores > UNFUSED_MAX_SCORES else None


PEERS = {
    "cudnn": Peer("cudnn", _sdpa_calls, _sdpa_backend("CUDNN_ATTENTION"), call=_sdpa_calls, yardstick=True),
    "sdpa": Peer("sdpa", _sdpa_calls),
    "flash": Peer("flash", _sdpa_calls, _sdpa_backend("FLASH_ATTENTION")),
    "mem_efficient": Peer("mem_efficient", _sdpa_calls, _sdpa_backend("EFFICIENT_ATTENTION")),
    "math": Peer("math", _sdpa_calls, _sdpa_backend("MATH"), skip=_math_skip),
    "flex": Peer("flex", _flex_calls, steady=_no_recompile),
    "unfused": Peer("unfused", _unfused_calls, skip=_unfused_skip),
    "fa4": Peer("fa4", _fa4_calls),
    # FA4 with its grouped-query packing off (it packs whenever H > H_kv on sm90): what packing is worth to it,
    # before flashgen's forward packs too (bench/LOG.md, "What FA4's sm90 forward does differently").
    "fa4_nopack": Peer("fa4_nopack", functools.partial(_fa4_calls, pack_gqa=False)),
}

# The same names on a varlen case: "cudnn" is then the padded yardstick.
VARLEN_PEER_IMPLS = {
    "cudnn": Peer("cudnn", _cudnn_padded_calls, _sdpa_backend("CUDNN_ATTENTION"), output=_unpadded,
                  call=_cudnn_padded_calls, yardstick=True),
    "flex": Peer("flex", _flex_varlen_calls, steady=_no_recompile),
    "cudnn_varlen": Peer("cudnn_varlen", _cudnn_varlen_calls),
    "flash_varlen": Peer("flash_varlen", _flash_varlen_calls),
}


def peer_names(case: Case, names: Iterable[str]) -> list[str]:
    """The chosen implementations that have a form for this case (dense or varlen)."""
    if case.varlen:
        return [n for n in names if n in VARLEN_PEERS]
    return [n for n in names if n not in VARLEN_ONLY_PEERS]


def peers_for(case: Case, config: BenchConfig, block_n: int | None) -> list[tuple[Peer, tuple[int, ...] | None]]:
    """The implementations to run on one case, torch's first: if one of ours faults the CUDA context, the
    peers' rows are already measured."""
    table = VARLEN_PEER_IMPLS if case.varlen else PEERS
    names = peer_names(case, config.peers)
    out = [(table[name], None) for name in names if name != "flashgen"]
    if "flashgen" in names and block_n is not None:
        out += [(flashgen_peer(s), s) for s in splits_for(block_n, config.splits)]
    if case.chunked:
        out = [(dataclasses.replace(p, make=_keys_checked(p.make), call=p.call and _keys_checked(p.call)), s)
               for p, s in out]
    return out


def _keys_checked(make: Callable) -> Callable:
    """make, refusing inputs whose k does not hold the case's S_k keys: where bench/inputs.py's make_inputs builds
    k and v with S_q keys, a chunked-prefill row is skipped with that reason instead of timing (and checking
    against a reference of) the square problem."""

    def checked(torch, inputs: Inputs, case: Case):
        keys = inputs.sets[0][1].shape[-3]
        if keys != case.seq_k:
            raise Unavailable(f"the inputs hold {keys} keys, the case S_k = {case.seq_k} (bench/inputs.py "
                              "make_inputs must build k and v with case.seq_k keys)")
        return make(torch, inputs, case)

    return checked


def flashgen_peer(split: tuple[int, ...]) -> Peer:
    """flashgen with one PV split, dense or varlen: the kernel through prepare() (ms) and the call through
    attention() (call_ms), with the same arguments."""
    return Peer(split_impl(split), _flashgen_calls(split), call=_flashgen_attention_calls(split))
