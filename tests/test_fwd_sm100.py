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
# Varlen: seq_len / seq_len_k are the longest sequences' buckets (codegen.api._length_bucket).
VARLEN_CASES = [dict(seq_len=2048, heads=16, head_dim=128, dtype="f16", causal=True, kv_heads=4, varlen=True),
                dict(seq_len=1024, heads=8, head_dim=64, dtype="bf16", window=(100, 37), softcap=30.0, varlen=True),
                dict(seq_len=256, heads=8, head_dim=96, dtype="f16", seq_len_k=1024, kv_heads=2, causal=True,
                     window=(64, 5), varlen=True),
                dict(seq_len=512, heads=4, head_dim=256, dtype="bf16", kv_heads=1, varlen=True),
                dict(seq_len=4096, heads=4, head_dim=192, dtype="bf16", varlen=True)]


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("case", CASES + VARLEN_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
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
    assert f"kVarlen = {'true' if s.varlen else 'false'};" in source
    names = plan.abi.names
    if s.varlen:  # the Hopper family's varlen parameters, tiles_m of the longest sequence, no batch stride
        assert {"cu_seqlens_q", "cu_seqlens_k", "tiles_m", "o_row_bytes", "o_head_bytes"} <= set(names)
        assert "o_batch_bytes" not in names
        # The offsets are read (LDG) on top of what the fixed-length kernel loads.
        fixed = build(KernelSpec(arch=arch, **{**case, "varlen": False}))
        assert ops["LDG"] > sass.opcode_counts(sass.disassemble(fixed.compiled.cubin))["LDG"]
    else:
        assert "cu_seqlens_q" not in names and "tiles_m" not in names and "o_batch_bytes" in names


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
    (dict(persistent=False), "one CTA per tile"), (dict(trace=True), "trace"),
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

    def without(*args):
        progs = real(*args)
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


# --- variable-length batches -----------------------------------------------------------------------------------

# Ragged batches: empty query sequences (every tile skipped), sequences without keys (tiles of 0 blocks), first
# keys off the 8-key groups (key_shift), one-row sequences, the longest setting tiles_m.
RAGGED = [[(1000, 1000), (0, 37), (130, 5), (1, 0), (257, 300), (77, 1)],
          [(300, 511), (5, 1), (2048, 2000), (0, 0), (129, 131)],
          [(128, 128), (1, 1), (640, 100), (3, 700)]]


def _offsets(lengths):
    cu_q, cu_k = [0], [0]
    for q, k in lengths:
        cu_q.append(cu_q[-1] + q)
        cu_k.append(cu_k[-1] + k)
    return cu_q, cu_k


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(window=(100, 0)), dict(window=(16, 37), block_n=64),
                                     dict(causal=True, window=(40, 0), kv_heads=1)], ids=str)
@pytest.mark.parametrize("lengths", RAGGED, ids=lambda l: f"{len(l)}seqs")
def test_the_protocol_holds_over_ragged_varlen_tiles(options, lengths):
    """Each CTA's real varlen tile list (Plan.walk, as Tiles::take walks it): skipped tiles (None) of short
    sequences between tiles of varying key counts, 0 among them; every role skips the same ones."""
    cu_q, cu_k = _offsets(lengths)
    spec = families.resolve(KernelSpec(**{"seq_len": 2048, "seq_len_k": 2048, "heads": 2, "head_dim": 64,
                                          "arch": "sm_100a", "varlen": True, **options}))
    plan = families.make_plan(spec)
    walks = plan.walk(cu_q, cu_k, ctas=3)
    tiles = [t for w in walks for t in w]
    assert len(tiles) == plan.tiles_m(max(q for q, _ in lengths)) * spec.heads * len(lengths)
    assert any(t is None for t in tiles) and len({t[4] for t in tiles if t}) >= 2
    for cta, walk in enumerate(walks):
        protocol.check(spec.stages, [None if t is None else t[4] for t in walk], chunks=len(spec.pv_split),
                       schedules=15, seed=cta)


@pytest.mark.parametrize("role", ("producer", "mma", "softmax0", "softmax3"))
def test_a_role_that_does_not_skip_a_tile_is_caught(role):
    """A tile past its sequence's end walked by one role (as a tile without keys) and skipped by the others
    desynchronizes the Q and ring phases: the check must fail."""
    protocol.check(2, [2, None, 3, None, 0, 1], schedules=50, seed=1)
    with pytest.raises(protocol.ProtocolError):
        for tiles in ([2, None, 3], [None, 1, 2], [1, None, 0, 2]):
            protocol.check(2, tiles, schedules=50, seed=1, unskipped={role})


def test_varlen_tiles_follow_each_sequence():
    """kv_range per sequence: bottom-right aligned to its own lengths, counted from its first key's group."""
    spec = families.resolve(KernelSpec(seq_len=1024, heads=1, head_dim=128, arch="sm_103a", varlen=True, causal=True))
    plan = families.make_plan(spec)
    cu_q, cu_k = _offsets([(100, 300), (300, 100), (0, 5), (129, 129)])
    (walk,) = plan.walk(cu_q, cu_k)
    assert plan.tiles_m(300) == 3 and len(walk) == 3 * 4
    by_seq = [walk[3 * b:3 * b + 3] for b in range(4)]  # each sequence's tiles, the last first
    assert by_seq[0] == [None, None, (0, 0, 0, 0, 3)]  # 100 queries: one tile, keys 0..299 (diagonal +200)
    # Sequence 1 starts at key 300 (shift 4), diagonal -200: rows 0..199 see no key; its keys are tile keys 4..103.
    assert by_seq[1] == [(2, 0, 1, 0, 1), (1, 0, 1, 0, 1), (0, 0, 1, 0, 0)]
    assert by_seq[2] == [None, None, None]  # no queries
    # Sequence 3 starts at key 405 (shift 5): its 129 keys are tile keys 5..133, two blocks for both tiles.
    assert by_seq[3] == [None, (1, 0, 3, 0, 2), (0, 0, 3, 0, 2)]


def test_cli_emits_and_compiles_the_blackwell_varlen_kernel(tmp_path, capsys):
    import gen

    out, bundle = tmp_path / "out", tmp_path / "bundle"
    assert gen.main(["--shape", "2048,16,128", "--arch", "sm_103a", "--varlen", "--causal", "--kv-heads", "4",
                     "--out", str(out), "--export", str(bundle)]) == 0
    (cu,) = out.glob("*.cu")
    text = cu.read_text()
    assert "_varlen" in cu.stem and "kVarlen = true;" in text and "NOT YET RUN ON A GPU" in text
    assert "spills     0 bytes stored, 0 bytes loaded" in capsys.readouterr().out
    launch = next(bundle.glob("*_launch.cu")).read_text()
    assert "cu_seqlens_q, cu_seqlens_k, static_cast<unsigned char*>(o), o_row_bytes, o_head_bytes, lse, tiles_m" in launch


# --- the API's argument path on a Blackwell spec, without a GPU ------------------------------------------------


@pytest.fixture
def blackwell_prepare(monkeypatch):
    """codegen.api.prepare as it runs on a B200, down to the packed arguments: the spec resolved for sm_100a,
    the kernel built (NVRTC) but not loaded, tensor maps encoded as placeholders, 148 SMs."""
    torch = pytest.importorskip("torch")
    from codegen import api, driver

    maps = []
    monkeypatch.setattr(api, "resolve", lambda spec: families.resolve(spec.replace(arch="sm_100a")))
    monkeypatch.setattr(api, "_check_device", lambda t: None)
    monkeypatch.setattr(api, "_loaded", lambda key: (build(key.spec), None))
    monkeypatch.setattr(api, "_sm_count", lambda index: 148)
    monkeypatch.setattr(driver, "encode_tensor_map", lambda params, address: maps.append(params) or bytes(128))

    def call(*args, **kwargs):
        prepared = api.prepare(*args, **kwargs)
        values = dict(zip(prepared.built.plan.abi.names, (h.value if hasattr(h, "value") else bytes(h)
                                                         for h in prepared.args.holders)))
        return prepared, values, maps

    return torch, call


def test_prepare_fills_the_blackwell_varlen_arguments(blackwell_prepare):
    torch, call = blackwell_prepare
    lengths = [(300, 511), (0, 5), (1000, 1000), (129, 4)]
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in _offsets(lengths))
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(total_q, 8, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(total_k, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    prepared, values, maps = call(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    s = prepared.spec
    assert prepared.built.family.name == "fwd_sm100" and s.varlen and (s.seq_len, s.keys) == (1024, 1024)
    assert values["cu_seqlens_q"] == cu_q.data_ptr() and values["cu_seqlens_k"] == cu_k.data_ptr()
    assert values["o_gmem"] == prepared.o.data_ptr() and values["lse_out"] == prepared.lse.data_ptr()
    assert values["o_row_bytes"] == 8 * 128 * 2 and values["o_head_bytes"] == 128 * 2
    assert values["tiles_m"] == 8 and values["batches"] == 4  # ceil(1000 / 128) tiles of the longest sequence
    assert prepared.grid == (min(8 * 8 * 4, 148), 1, 1)
    assert prepared.o.shape == q.shape and prepared.lse.shape == (8, total_q)
    # The tensor maps see each packed tensor as one batch entry of every sequence's rows.
    assert [m.dims[-1] for m in maps] == [1, 1, total_k // 8]  # V: the key groups of all sequences
    assert maps[0].dims[1] == total_q and maps[1].dims[1] == total_k


def test_prepare_fills_the_blackwell_fixed_length_arguments(blackwell_prepare):
    """The same path for a fixed-length batch: O's three strides, no offsets; the grid takes the SM count."""
    torch, call = blackwell_prepare
    q = torch.randn(2, 1000, 8, 64, dtype=torch.float16)
    k, v = (torch.randn(2, 1000, 8, 64, dtype=torch.float16) for _ in range(2))
    prepared, values, _ = call(q, k, v, causal=True)
    assert not prepared.spec.varlen and "cu_seqlens_q" not in values
    assert (values["o_batch_bytes"], values["o_row_bytes"], values["o_head_bytes"]) == (1000 * 8 * 64 * 2, 8 * 64 * 2,
                                                                                         64 * 2)
    assert values["batches"] == 2 and prepared.grid == (8 * 8 * 2, 1, 1) and prepared.lse.shape == (2, 8, 1000)


def test_a_blackwell_varlen_batch_off_the_key_groups_is_refused(blackwell_prepare):
    """The V map walks keys in groups of 8, so the packed keys must be a multiple of 8 (sequences may start and
    end anywhere): refused with that reason before anything is launched."""
    from codegen.api import InputError

    torch, call = blackwell_prepare
    cu = torch.tensor([0, 100, 301], dtype=torch.int32)
    t = torch.randn(301, 2, 64, dtype=torch.float16)
    with pytest.raises(InputError, match="groups of 8"):
        call(t, t, t, cu_seqlens_q=cu, cu_seqlens_k=cu)
