"""The Blackwell forward family (codegen/families/fwd_sm100): compiled for sm_100a and sm_103a with the intended
SASS and every number derived, its barrier protocol checked on the CPU, its options refused with a reason.
No Blackwell GPU runs it here."""

from __future__ import annotations

import functools
import re

import pytest

import codegen.protocol
from codegen import families, sass
from codegen.build import build
from codegen.families.fwd_sm100 import protocol
from codegen.spec import KernelSpec, SpecError
from layouts.tcgen05 import InstrDescriptor

CASES = [dict(seq_len=1024, heads=8, head_dim=128, dtype="bf16"),
         dict(seq_len=1000, heads=8, head_dim=64, dtype="f16", causal=True),
         dict(seq_len=300, heads=8, head_dim=96, dtype="f16", seq_len_k=1024, kv_heads=2, causal=True),
         dict(seq_len=2048, heads=4, head_dim=192, dtype="bf16"),
         dict(seq_len=512, heads=4, head_dim=256, dtype="bf16", kv_heads=1),
         # Sliding windows (a left bound skips the key blocks before a tile's band) and the soft cap.
         dict(seq_len=1024, heads=8, head_dim=128, dtype="bf16", window=(256, 0)),
         dict(seq_len=1000, heads=8, head_dim=64, dtype="f16", window=(100, 37), softcap=30.0),
         dict(seq_len=300, heads=8, head_dim=96, dtype="f16", seq_len_k=1024, kv_heads=2, causal=True, window=(64, 5)),
         dict(seq_len=2048, heads=4, head_dim=192, dtype="bf16", softcap=50.0),
         dict(seq_len=512, heads=4, head_dim=256, dtype="bf16", window=(-1, 16), softcap=20.0)]


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_compiles_to_tcgen05_without_spills(arch, case):
    built = build(KernelSpec(arch=arch, **case))
    assert built.family.name == "fwd_sm100"
    plan, source, name = built.plan, built.rendered.source, built.rendered.kernel_name
    text = sass.disassemble(built.compiled.cubin)
    ops, mufu = sass.opcode_counts(text), sass.opcode_counts(text, modifiers=True)
    assert ops["UTCHMMA"] > 0 and ops["LDTM"] > 0 and ops["STTM"] > 0 and ops["UTMALDG"] >= 3
    assert ops["HGMMA"] == 0 and ops["HMMA"] == 0 and ops["LDL"] == 0 and ops["STL"] == 0
    assert built.compiled.spill_stores.get(name, 0) == 0
    for desc in plan.q.descriptors() + plan.k.descriptors() + plan.v.descriptors():
        assert f"0x{desc:016x}ull" in source
    s = plan.spec
    assert f"kQkIdesc = 0x{InstrDescriptor(m=128, n=s.block_n, ab_type=s.dtype).encode():08x}u" in source
    assert f"kPvIdesc = 0x{InstrDescriptor(m=128, n=s.head_dim, ab_type=s.dtype, b_major='MN').encode():08x}u" in source
    assert plan.smem.total <= 227 * 1024 and "NOT YET RUN ON A GPU" in source
    left, right = s.window[0], 0 if s.causal else s.window[1]
    assert f"kWindowLeft = {left}, kWindowRight = {right};" in source
    assert f"kSoftcap = {float(s.softcap)!r}f;" in source
    # The cap is tanh.approx on every score of the exponential pass (MUFU.TANH), and absent without one.
    assert (mufu["MUFU.TANH"] >= 32) == bool(s.softcap) and mufu["MUFU.EX2"] >= 32
    manifest = built.manifest()
    assert manifest["family"] == "fwd_sm100" and list(manifest["tensor_maps"]) == ["q", "k", "v"]


def _tmem_load_groups(ptx: str) -> list[tuple[int, int]]:
    """Per tcgen05.wait::ld of the PTX (in text order): the tcgen05.ld issued since the previous wait, and the
    ex2 between the last of them and this wait (exponentials computed while the load is in flight)."""
    groups = []
    for segment in ptx.split("tcgen05.wait::ld")[:-1]:
        loads = segment.count("tcgen05.ld.")
        if loads:
            groups.append((loads, segment[segment.rfind("tcgen05.ld."):].count("ex2.approx")))
    return groups


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("head_dim, block_n, budget, together", [(128, 128, None, 4), (64, 224, None, 7),
                                                                   (128, 128, 64, 2), (96, 96, 32, 1)])
def test_softmax_s_loads_overlap_as_the_seeds_v50(monkeypatch, arch, head_dim, block_n, budget, together):
    """The row-max pass issues the S loads of a whole row (or the plan's register budget) before one wait; the
    exponential pass computes chunk c with chunk c + 1's load in flight. Either way, no spills."""
    from codegen.families import fwd_sm100

    if budget:
        monkeypatch.setattr(fwd_sm100, "MAX_PASS_COLUMNS", budget)
    built = build(KernelSpec(seq_len=1024, heads=8, head_dim=head_dim, block_n=block_n, arch=arch))
    assert built.plan.max_pass_chunks == together and f"kMaxPassChunks = {together};" in built.rendered.source
    name = built.rendered.kernel_name
    assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0
    groups = _tmem_load_groups(built.compiled.ptx)
    assert max(loads for loads, _ in groups) == together
    # The double-buffered load: a whole chunk's exponentials (32 keys) between a load and its wait.
    assert any(loads == 1 and ex2 >= fwd_sm100.TMEM_CHUNK for loads, ex2 in groups)


@pytest.mark.parametrize("options, message", [
    (dict(varlen=True), "varlen"), (dict(persistent=False), "one CTA per tile"),
    (dict(seq_len_k=300), "groups of 8"), (dict(block_n=80), "32-column chunks")])
def test_unsupported_options_are_refused(options, message):
    with pytest.raises(SpecError, match=message):
        families.resolve(KernelSpec(seq_len=1024, heads=8, head_dim=128, arch="sm_103a", **options))


@pytest.fixture
def tma_loads_land_in_any_order(monkeypatch):
    """protocol.check under asynchronous completions for the TMA thread's arrivals (Q, K and V loads), landing in
    any order after their issue (codegen/protocol.py). The MMA thread's tcgen05.commit arrivals stay immediate:
    taken as asynchronous they pass every wait, but the last blocks' KEmpty/VEmpty (and a keyless CTA's QEmpty)
    commits are waited for by nothing, which the check refuses, and _apply_use takes an MMA as done at its issue."""
    monkeypatch.setattr(protocol, "run", functools.partial(codegen.protocol.run,
                                                           async_completions=lambda role, step: role == "producer"))


@pytest.mark.parametrize("stages", (2, 3, 4, 5, 6))
@pytest.mark.parametrize("model", ("async", "immediate"))
def test_the_barrier_protocol_cannot_deadlock_alias_or_overrun(request, stages, model):
    if model == "async":
        request.getfixturevalue("tma_loads_land_in_any_order")
    for chunks in (1, 2):
        for n_kv in range(0, 3 * stages + 1):
            protocol.check(stages, n_kv, chunks=chunks, schedules=40, seed=n_kv)
        # A persistent CTA's tiles, some without keys (a causal tile above the diagonal), across the ring.
        for tiles in ([1, 0, 3], [0, 0, 2, 0], [stages, 1, 2 * stages + 1], [3, 3, 3, 3]):
            protocol.check(stages, tiles, chunks=chunks, schedules=20, seed=len(tiles))


@pytest.mark.parametrize("options", [dict(window=(100, 0)), dict(window=(0, 0), block_n=64),
                                     dict(seq_len=2048, seq_len_k=1024, causal=True, window=(40, 0))], ids=str)
@pytest.mark.usefixtures("tma_loads_land_in_any_order")
def test_the_protocol_holds_over_windowed_tiles(options):
    """Under a window a tile's key blocks start later (kv_first > 0) and some tiles have none; the protocol counts
    blocks across the CTA's tiles (G), not by key position, so each CTA's real list of block counts is checked."""
    spec = families.resolve(KernelSpec(**{"seq_len": 1024, "heads": 2, "head_dim": 64, "arch": "sm_103a", **options}))
    plan = families.make_plan(spec)
    tiles_m, ctas = plan.m_blocks, 3
    ranges = [plan.kv_range(tiles_m - 1 - idx % tiles_m) for idx in range(tiles_m * spec.heads)]  # Tiles::take
    assert any(first > 0 for first, count in ranges if count)
    if spec.keys < spec.seq_len:
        assert any(count == 0 for _, count in ranges)
    for cta in range(ctas):
        protocol.check(spec.stages, [count for _, count in ranges[cta::ctas]], chunks=len(spec.pv_split),
                       schedules=20, seed=cta)


@pytest.mark.parametrize("drop, message", [
    (("producer", "KEmpty"), "K slot .* loaded with block .* before QK"),
    (("mma", "KFull"), "QK .* ran before K block .* was loaded"),
    (("mma", "VFull"), "PV .* ran before V block .* was loaded"),
    (("softmax0", "PvDone"), "rescaled|O of tile .* read before|older phase"),
    (("mma", "PFull"), "of P before every softmax warp wrote it"),
    (("producer", "QEmpty"), "Q of tile .* loaded before the QKs of tile"),
])
@pytest.mark.parametrize("model", ("immediate", "async"))
def test_a_missing_wait_is_caught(request, monkeypatch, drop, message, model):
    """(The MMA thread's PvDone wait before reusing an S buffer is kept although the model cannot miss it: it
    treats one thread's tcgen05.mma as completing in issue order, which the kernel does not rely on.)

    Under asynchronous TMA completions the same drops are caught, some by another rule: _apply_use takes a load's
    data as there at its issue, so an MMA that no longer waits for VFull reads "loaded" V, and what is caught is
    the load's completion that nothing waits for."""
    if model == "async":
        request.getfixturevalue("tma_loads_land_in_any_order")
        message += "|is still in flight when every role has finished .*: nothing waits for it"
    role, barrier = drop
    real = protocol.programs

    def without(stages, n_kv, chunks=2):
        progs = real(stages, n_kv, chunks)
        progs[role] = [s for s in progs[role] if not (s.kind == "wait" and s.barrier.startswith(barrier))]
        return progs

    monkeypatch.setattr(protocol, "programs", without)
    with pytest.raises(protocol.ProtocolError, match=message):
        for tiles in ([n] for n in range(1, 9)):
            protocol.check(2, tiles, schedules=100, seed=1)
        protocol.check(2, [2, 3, 1], schedules=100, seed=1)


def test_the_protocol_waits_on_what_the_kernel_waits_on():
    """Each device function of the rendered kernel waits on exactly the barriers its role waits on here."""
    source = build(KernelSpec(seq_len=1024, heads=8, head_dim=128, arch="sm_103a")).rendered.source
    functions = dict(re.findall(r"static __device__ __forceinline__ void (\w+)\((.*?)\n}\n", source, flags=re.S))

    def waited(*names):
        found = (m for n in names for m in re.findall(r"mbar_wait\(bar\(bars, kBar(\w+?)\s*[+)]", functions[n]))
        return {re.sub(r"\d+$", "", m) for m in found}  # SFull0 + b, PFull00 + ...: the barrier's family

    def protocol_waits(role):  # over a few tiles, one without keys, so every wait of every role occurs
        return {s.barrier.split("[")[0] for s in protocol.programs(3, [2, 0, 5])[role] if s.kind == "wait"}

    assert waited("producer") == protocol_waits("producer")
    assert waited("mma_issuer", "issue_pv") == protocol_waits("mma")
    assert waited("softmax_tile", "softmax") == protocol_waits("softmax0")


def test_the_cli_emits_compiles_and_exports_the_blackwell_kernel(tmp_path, capsys):
    import gen

    for arch in ("sm_100a", "sm_103a"):
        out, bundle = tmp_path / arch, tmp_path / f"{arch}-bundle"
        assert gen.main(["--shape", "1024,64,128", "--arch", arch, "--out", str(out), "--export", str(bundle)]) == 0
        (cu,) = out.glob("*.cu")
        assert "NOT YET RUN ON A GPU" in cu.read_text() and "setmaxnreg" not in capsys.readouterr().out
        assert (bundle / "example.cu").exists() and (bundle / f"{cu.stem}_launch.cu").exists()
