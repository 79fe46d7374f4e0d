"""The basis-vector probe: check the layout models in layouts/ against the real TMA loads and wgmma reads.

For each operand the kernel stages by TMA and feeds to wgmma (Q and K for S = Q K^T, V for O = P V), every
basis vector of the operand's tile coordinates gets one launch's worth of input (a batch entry): that operand
is zero but for a single 1, the other operands are random small integers (exact in f16/bf16 and f32). The
probe kernel is the attention kernel's own load and MMA path rendered in probe mode: it writes S and O
straight from the accumulators, with P given instead of computed. Where the 1 lands in S or O names the
element the hardware really read; it must be the element that was injected.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import KernelSpec


@dataclass(frozen=True)
class ProbeMismatch:
    operand: str
    injected: dict
    read_as: dict | None  # None: the 1 did not come out anywhere (or came out more than once)

    def __str__(self) -> str:
        inj = ", ".join(f"{k}={v}" for k, v in self.injected.items())
        if self.read_as is None:
            return f"{self.operand}: inject ({inj}): the unit element did not appear exactly once"
        got = ", ".join(f"{k}={v}" for k, v in self.read_as.items())
        return f"{self.operand}: inject ({inj}): hardware read ({got})"


@dataclass(frozen=True)
class ProbeReport:
    spec: KernelSpec
    checked: dict  # operand -> number of basis vectors injected
    mismatches: tuple[ProbeMismatch, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        if self.ok:
            return f"probe: {len(self.checked)} operand layouts match the hardware"
        return "\n".join(["probe: MISMATCH"] + [f"  {m}" for m in self.mismatches])


def _basis(extent: int) -> list[int]:
    """0 and every power of two below the extent, which reaches every swizzle atom of the head dim: at D=96
    (32-column atoms) 32 and 64 start atoms 1 and 2, at D=192 (64-column atoms) 64 and 128 do."""
    return [0] + [1 << b for b in range((extent - 1).bit_length())]


def probe_injections(spec: KernelSpec) -> list[tuple[str, dict]]:
    """(operand, tile coordinates) of every unit element the probe injects, for a resolved spec: the origin and
    every basis vector of each operand tile staged by TMA and read by wgmma."""
    def star(op, first, second, extents):
        return [(op, {first: a, second: b}) for a in _basis(extents[0]) for b in _basis(extents[1]) if a == 0 or b == 0]

    rows_q, bn, d = spec.block_m, spec.block_n, spec.head_dim
    return star("q", "m", "k", (rows_q, d)) + star("k", "n", "k", (bn, d)) + star("v", "k", "n", (bn, d))


# The compute capability each architecture's probe needs (its cubin runs on that GPU only).
CAPABILITY = {"sm_90a": (9, 0), "sm_100a": (10, 0), "sm_103a": (10, 3)}


def probe_spec(spec: KernelSpec) -> KernelSpec:
    """The one-block spec whose probe checks `spec`'s tiles: one Q tile and one K/V block of its block_n."""
    from . import families

    s = families.resolve(spec)
    seq = max(s.block_m, s.block_n)
    return s.replace(seq_len=seq, seq_len_k=seq, kv_heads=s.heads)


def check_device(arch: str, device_index: int = 0) -> None:
    """Raise a clear error unless the GPU can run `arch`'s cubin."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"the {arch} probe needs a GPU; torch sees none")
    have = torch.cuda.get_device_capability(device_index)
    if have != CAPABILITY[arch]:
        raise RuntimeError(f"the {arch} probe needs compute capability {CAPABILITY[arch][0]}.{CAPABILITY[arch][1]}; "
                           f"device {device_index} ({torch.cuda.get_device_name(device_index)}) is {have[0]}.{have[1]}")


def run_probe(spec: KernelSpec, device_index: int = 0, seed: int = 0) -> ProbeReport:
    import torch

    from . import driver, families
    from .build import build
    from .check import torch_dtype

    s = families.resolve(spec)
    check_device(s.arch, device_index)
    rows_q, bn, d = s.block_m, s.block_n, s.head_dim
    seq = max(rows_q, bn)
    built = build(probe_spec(spec), family=families.PROBE_BY_ARCH[s.arch])
    plan = built.plan
    kernel = driver.load(built.compiled.cubin, built.rendered.kernel_name, plan.smem.total, device_index)

    injections = probe_injections(s)
    batch = len(injections)
    dtype = torch_dtype(s.dtype)
    dev = torch.device("cuda", device_index)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand_ints(*shape):
        return torch.randint(-2, 3, shape, generator=gen).to(torch.float64)

    q = rand_ints(batch, seq, 1, d)
    k = rand_ints(batch, seq, 1, d)
    v = rand_ints(batch, seq, 1, d)
    p = rand_ints(batch, rows_q, bn)
    for b, (operand, at) in enumerate(injections):
        tensor = {"q": q, "k": k, "v": v}[operand]
        tensor[b].zero_()
        row = at.get("m", at.get("n")) if operand != "v" else at["k"]
        col = at["k"] if operand != "v" else at["n"]
        tensor[b, row, 0, col] = 1.0

    tq, tk, tv = (t.to(dev, dtype) for t in (q, k, v))
    to = torch.empty_like(tq)
    s_out = torch.full((batch, rows_q, bn), float("nan"), device=dev)
    o_out = torch.full((batch, rows_q, d), float("nan"), device=dev)
    p_in = p.to(dev, torch.float32)
    values = {"p_in": p_in.data_ptr(), "s_out": s_out.data_ptr(), "o_out": o_out.data_ptr()}
    for name, t in (("q", tq), ("k", tk), ("v", tv), ("o", to)):
        params = getattr(plan, name).tensor_map.instantiate(
            batch=batch, seq_len=seq, heads=1, stride_b=t.stride(0), stride_s=t.stride(1), stride_h=d)
        values[f"tmap_{name}"] = driver.encode_tensor_map(params, t.data_ptr())
    stream = torch.cuda.current_stream(dev).cuda_stream
    grid = plan.abi.grid.dims(tiles_m=1, batch=batch)  # one CTA per injection
    driver.launch(kernel, grid, plan.threads, stream, plan.abi.pack(values))
    torch.cuda.synchronize(dev)
    s_hw, o_hw = s_out.double().cpu(), o_out.double().cpu()

    mismatches = []
    checked: dict[str, int] = {}
    for b, (operand, at) in enumerate(injections):
        checked[operand] = checked.get(operand, 0) + 1
        read = _locate(operand, b, s_hw, o_hw, q, k, v, p, rows_q, bn)
        if read != at:
            mismatches.append(ProbeMismatch(operand, at, read))
    return ProbeReport(plan.spec, checked, tuple(mismatches))


def _locate(operand, b, s_hw, o_hw, q, k, v, p, rows_q, bn):
    """Which element of `operand` did the hardware treat as the injected 1? None if unidentifiable.

    With a unit at (row', col') as the hardware reads it, one line of the output equals one column of the
    other operand:  Q(m', k'): S[m', :] = K[:, k'];  K(n', k'): S[:, n'] = Q[:, k'];  V(k', n'): O[:, n'] = P[:, k'].
    """
    import torch

    if operand == "q":
        lines, other = s_hw[b], k[b, :bn, 0, :]
    elif operand == "k":
        lines, other = s_hw[b].T, q[b, :rows_q, 0, :]
    else:
        lines, other = o_hw[b].T, p[b]
    if not torch.isfinite(lines).all():
        return None
    hit = [i for i in range(lines.shape[0]) if lines[i].abs().sum() > 0]
    if len(hit) != 1:
        return None
    match = [j for j in range(other.shape[1]) if torch.equal(other[:, j], lines[hit[0]])]
    if len(match) != 1:
        return None
    if operand == "q":
        return {"m": hit[0], "k": match[0]}
    if operand == "k":
        return {"n": hit[0], "k": match[0]}
    return {"k": match[0], "n": hit[0]}
