"""Attention sinks in the Hopper forward kernel (KernelSpec.sinks), on the CPU: the spec, the ABI, NVRTC and the
SASS, the command line, the Blackwell refusal and the export bundle. tests/test_gpu_sinks.py runs them."""

from __future__ import annotations

import re

import pytest

import gen
from codegen import families, sass
from codegen.build import build
from codegen.cli import regenerate_command
from codegen.export import export_bundle
from codegen.families import resolve
from codegen.render import render
from codegen.spec import KernelSpec, SpecError

# Every path that finishes a tile's rows: one CTA per tile and persistent (with and without storing O under the
# next tile's QK), varlen, every head dim, masks, grouped-query heads, softcap, short tails and the widest key
# blocks (where the consumers' registers are tightest).
SINK_SPECS = [
    KernelSpec(seq_len=1000, heads=16, head_dim=128, causal=True, sinks=True),
    KernelSpec(seq_len=1024, heads=8, head_dim=128, sinks=True),
    KernelSpec(seq_len=1024, heads=8, head_dim=128, tile_overlap=True, sinks=True),
    KernelSpec(seq_len=4096, heads=8, head_dim=128, block_n=192, sinks=True),
    KernelSpec(seq_len=4096, heads=8, head_dim=64, block_n=208, dtype="bf16", sinks=True),
    KernelSpec(seq_len=4096, heads=16, head_dim=128, varlen=True, causal=True, kv_heads=4, dtype="bf16", sinks=True),
    KernelSpec(seq_len=1024, heads=8, head_dim=64, varlen=True, persistent=False, window=(64, 32), sinks=True),
    KernelSpec(seq_len=300, heads=16, head_dim=96, seq_len_k=1000, kv_heads=4, causal=True, sinks=True),
    KernelSpec(seq_len=777, heads=8, head_dim=192, window=(128, -1), causal=True, softcap=50.0, dtype="bf16",
               sinks=True),
    KernelSpec(seq_len=2000, heads=8, head_dim=256, window=(256, 64), softcap=30.0, sinks=True),
    KernelSpec(seq_len=1000, heads=16, head_dim=64, persistent=True, window=(256, -1), softcap=20.0, kv_heads=4,
               sinks=True),
]


def test_spec_names_differ_with_and_without_sinks():
    for spec in SINK_SPECS:
        with_sinks, without = resolve(spec), resolve(spec.replace(sinks=False))
        assert with_sinks.name != without.name and "_sinks" in with_sinks.name and "_sinks" not in without.name
        assert with_sinks.replace(sinks=False) == without  # the mode changes nothing else the plan decides
    with pytest.raises(SpecError, match="sinks must be True or False"):
        KernelSpec(seq_len=128, heads=1, head_dim=128, sinks=1)


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(varlen=True), dict(varlen=True, causal=True),
                                     dict(persistent=False)], ids=str)
def test_the_sinks_parameter_is_in_the_abi_only_with_the_mode(options):
    without = families.make_plan(KernelSpec(seq_len=1000, heads=16, head_dim=128, **options))
    plan = families.make_plan(KernelSpec(seq_len=1000, heads=16, head_dim=128, sinks=True, **options))
    names, plain = list(plan.abi.names), list(without.abi.names)
    assert "sinks" not in plain and names.index("sinks") == names.index("lse_out") + 1
    assert [n for n in names if n != "sinks"] == plain
    source = render(plan).source
    signature = source.split(plan.spec.name + "(", 1)[1].split(") {", 1)[0]
    assert [d.strip() for d in signature.split(",\n")] == [p.declaration for p in plan.abi.params]
    assert "const float* __restrict__ sinks" in signature
    assert "constexpr bool kSinks = true;" in source and "constexpr bool kSinks = false;" in render(without).source
    manifest = build(plan.spec).manifest()
    assert [a["name"] for a in manifest["arguments"]] == names and manifest["spec"]["sinks"] is True


@pytest.mark.parametrize("spec", SINK_SPECS, ids=lambda s: resolve(s).name)
def test_kernels_with_sinks_compile_without_spills(spec):
    built = build(resolve(spec))
    name = built.rendered.kernel_name
    assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0
    ops = sass.opcode_counts(sass.disassemble(built.compiled.cubin))
    assert ops["HGMMA"] > 0 and ops["HMMA"] == 0
    assert ops["LDL"] == 0 and ops["STL"] == 0, "local memory in the kernel"
    plain = sass.opcode_counts(sass.disassemble(build(resolve(spec.replace(sinks=False))).compiled.cubin))
    assert ops["LDG"] == plain["LDG"] + 1, "the head's sink is one global load per tile"


def test_gen_cli_emits_the_kernel_with_sinks(tmp_path, capsys):
    assert gen.main(["--shape", "1000,8,128", "--causal", "--sinks", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "spills     0 bytes" in out
    (source,) = tmp_path.glob("*_sinks*.cu")
    text = source.read_text()
    assert "constexpr bool kSinks = true;" in text and "const float* __restrict__ sinks" in text
    spec = resolve(KernelSpec(seq_len=1000, heads=8, head_dim=128, causal=True, sinks=True))
    assert source.name == f"{spec.name}.cu"
    assert regenerate_command(spec).startswith("flashgen --shape 1000,8,128") and "--sinks" in regenerate_command(spec)
    assert f"//   {regenerate_command(spec)}" in text


@pytest.mark.parametrize("argv, message", [
    (["--shape", "1024,8,128", "--arch", "sm_100a", "--sinks"], "attention sinks are not in the Blackwell"),
    (["--shape", "1024,8,128", "--arch", "sm_103a", "--sinks"], "attention sinks are not in the Blackwell"),
    (["--shape", "1024,8,128", "--kv-heads", "8", "--decode", "1", "--sinks"], "--sinks does not apply to the decode"),
])
def test_gen_cli_refuses_sinks_where_they_are_not(argv, message, tmp_path, capsys):
    assert gen.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_blackwell_refuses_sinks_with_a_reason():
    for arch in ("sm_100a", "sm_103a"):
        with pytest.raises(SpecError, match="sm_90a"):
            resolve(KernelSpec(seq_len=1024, heads=8, head_dim=128, arch=arch, sinks=True))
        resolve(KernelSpec(seq_len=1024, heads=8, head_dim=128, arch=arch))  # without them it resolves


def test_the_custom_op_takes_sinks():
    pytest.importorskip("torch")
    from codegen import torch_op

    schema = str(torch_op.attention_op._opoverload._schema)
    assert "Tensor? sinks" in schema


@pytest.mark.parametrize("spec", [resolve(KernelSpec(seq_len=300, heads=16, head_dim=128, seq_len_k=1000, kv_heads=4,
                                                     causal=True, dtype="bf16", sinks=True)),
                                  resolve(KernelSpec(seq_len=2048, heads=16, head_dim=128, varlen=True, causal=True,
                                                     kv_heads=4, sinks=True))], ids=lambda s: s.name)
def test_export_launcher_takes_the_sinks(spec, tmp_path):
    bundle = export_bundle(spec, tmp_path)
    plan = bundle.built.plan
    header = (tmp_path / f"{spec.name}.h").read_text()
    launcher = (tmp_path / f"{spec.name}_launch.cu").read_text()
    example = (tmp_path / "example.cu").read_text()
    declared = header.split(f"cudaError_t {spec.name}_launch(", 1)[1].split(");", 1)[0]
    assert "float* lse, const float* sinks," in " ".join(declared.split())
    assert "!sinks ||" in launcher  # a null sinks array is refused before the launch
    assert ", ".join(p.launcher for p in plan.abi.params) + ");" in launcher
    assert re.search(r"lse, sinks, (d_cu_q|batch)", example) and "if (sinks) {" in example
    plain = export_bundle(resolve(spec.replace(sinks=False)), tmp_path / "plain")
    assert "sinks" not in (plain.directory / f"{plain.built.spec.name}.h").read_text()
