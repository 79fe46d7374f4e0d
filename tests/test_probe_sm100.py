"""The Blackwell probe family (codegen/families/probe_sm100): generated from the sm_100a/sm_103a derivations,
compiled for both architectures with the intended SASS, and run only where a Blackwell GPU is present."""

from __future__ import annotations

import pytest

from codegen import families, sass
from codegen.build import build
from codegen.probe import CAPABILITY, probe_spec
from codegen.spec import KernelSpec, SpecError
from layouts.tcgen05 import InstrDescriptor

HEAD_DIMS = (64, 96, 128, 192, 256)


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("head_dim, dtype", [(d, "bf16" if d % 64 else "f16") for d in HEAD_DIMS] + [(128, "bf16")])
def test_probe_compiles_to_tcgen05_with_every_number_derived(arch, head_dim, dtype):
    spec = probe_spec(KernelSpec(seq_len=1024, heads=8, head_dim=head_dim, dtype=dtype, arch=arch))
    built = build(spec, family="probe_sm100")
    plan, source = built.plan, built.rendered.source
    bn = plan.spec.block_n
    ops = sass.opcode_counts(sass.disassemble(built.compiled.cubin))
    # One MMA per 16-wide k slice: QK^T over the head dim, PV over the keys.
    assert ops["UTCHMMA"] == head_dim // 16 + bn // 16
    assert ops["LDTM"] == bn // 32 + head_dim // 32 and ops["STTM"] >= 1 and ops["UTMALDG"] == 3
    assert ops["HGMMA"] == 0 and ops["HMMA"] == 0
    assert built.compiled.spill_stores.get(built.rendered.kernel_name, 0) == 0
    for desc in plan.q.descriptors() + plan.k.descriptors() + plan.v.descriptors():
        assert f"0x{desc:016x}ull" in source
    assert f"kQkIdesc = 0x{InstrDescriptor(m=128, n=bn, ab_type=dtype).encode():08x}u" in source
    pv = InstrDescriptor(m=128, n=head_dim, ab_type=dtype, b_major=plan.v.mma_major)
    assert f"kPvIdesc = 0x{pv.encode():08x}u" in source and plan.v.mma_major == "MN"
    assert plan.v.tensor_map.kind == "key_group_atoms"  # the seed's 5-D V map


def test_blackwell_specs_resolve_with_the_forward_family():
    assert families.family_for(KernelSpec(seq_len=1024, heads=64, head_dim=128, arch="sm_103a")).name == "fwd_sm100"
    assert families.resolve(KernelSpec(seq_len=1024, heads=64, head_dim=128, arch="sm_100a")).block_n == 128
    with pytest.raises(SpecError, match="no forward kernel for sm_80|not supported"):
        KernelSpec(seq_len=1024, heads=64, head_dim=128, arch="sm_80")


@pytest.mark.gpu
def test_probe_on_blackwell_silicon():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    capability = torch.cuda.get_device_capability()
    arch = {v: k for k, v in CAPABILITY.items()}.get(capability)
    if arch not in ("sm_100a", "sm_103a"):
        pytest.skip(f"the Blackwell probe needs a B200 (10.0) or B300 (10.3); this GPU is {capability[0]}.{capability[1]}")
    from codegen.probe import run_probe

    for head_dim in (64, 128):
        report = run_probe(KernelSpec(seq_len=1024, heads=8, head_dim=head_dim, dtype="bf16", arch=arch))
        assert report.ok, report.summary()
