"""Kernel families on one ABI (CPU only): templates stay small, each family's contract has one source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from codegen import families
from codegen.abi import KernelABI
from codegen.build import build
from codegen.families.fwd_sm90 import abi as fwd_abi
from codegen.render import render
from codegen.spec import KernelSpec

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TEMPLATES = sorted(p for d in ("common", "fwd_sm90", "probe_sm90", "fwd_sm100", "probe_sm100") for p in (ROOT / "templates" / d).glob("*.j2"))
MAX_IFS, MAX_LINES = 12, 450


@pytest.mark.parametrize("path", KERNEL_TEMPLATES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kernel_templates_stay_small(path):
    text = path.read_text()
    ifs = len(re.findall(r"\{%-?\s*if\b", text))
    assert ifs <= MAX_IFS, f"{path.name}: {ifs} {{% if (modes belong in cfg:: constexpr and if constexpr)"
    assert len(text.splitlines()) <= MAX_LINES


def test_every_family_is_registered_with_its_template():
    for name in ("fwd_sm90", "probe_sm90", "fwd_sm100", "probe_sm100", "decode_sm90", "bwd_sm90"):
        family = families.get(name)
        assert (ROOT / "templates" / family.template).is_file()
    with pytest.raises(KeyError, match="no kernel family"):
        families.get("bwd_sm100")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
            names.update(f"{node.module}.{a.name}" for a in node.names if node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_plan_imports_no_instrumentation():
    imports = _imports(ROOT / "codegen" / "families" / "fwd_sm90" / "plan.py")
    assert not any("trace" in name for name in imports), imports


def test_the_benchmark_is_not_in_the_library():
    assert not (ROOT / "codegen" / "bench").exists()


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(varlen=True), dict(varlen=True, causal=True),
                                     dict(persistent=False)], ids=str)
def test_signature_params_and_barriers_come_from_the_abi(options):
    spec = families.resolve(KernelSpec(seq_len=1000, heads=16, head_dim=128, **options))
    plan = families.make_plan(spec)
    source = render(plan).source
    abi = plan.abi
    assert isinstance(abi, KernelABI)
    signature = source.split(spec.name + "(", 1)[1].split(") {", 1)[0]
    assert [d.strip() for d in signature.split(",\n")] == [p.declaration for p in abi.params]
    # Every barrier of the map is an enumerator at its slot; the others (another mode's) are absent.
    for name, first in abi.barriers.first.items():
        assert f"kBar{name} = {first}," in source
    for name in set(fwd_abi.BARRIER_NAMES) - set(abi.barriers.first):
        assert f"kBar{name} = 0xffffffffu," in source
    assert plan.smem.barriers == abi.barriers.count
    # No mbarrier address arithmetic or descriptor encoding typed in the kernel: bar() and desc_at() do it.
    after_bar = source.split("static __device__ __forceinline__ u32 bar(", 1)[1].split("\n", 1)[1]
    assert "return bars + 8 * index;" in source and not re.search(r"bars \+ \d", after_bar)
    assert f"(tile >> {plan.desc_address_shift})" in source and ">> 4)" not in source.replace("(tile >> 4)", "")


def test_pack_refuses_arguments_that_do_not_match_the_abi():
    plan = families.make_plan(KernelSpec(seq_len=5000, heads=16, head_dim=128, causal=True))  # per-tile
    values = {p.name: 0 for p in plan.abi.params}
    values.update({f"tmap_{op}": bytes(128) for op in "qkvo"}, scale_log2=1.0)
    assert len(plan.abi.ordered(values)) == len(plan.abi.params)
    with pytest.raises(ValueError, match="missing \\['lse_out'\\]"):
        plan.abi.ordered({k: v for k, v in values.items() if k != "lse_out"})
    with pytest.raises(ValueError, match="unexpected \\['tile_counter'\\]"):
        plan.abi.ordered({**values, "tile_counter": 0})


def test_descriptor_address_shift_is_derived():
    plan = families.make_plan(KernelSpec(seq_len=1024, heads=8, head_dim=96))
    assert plan.desc_address_shift == 4  # matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4


def test_row_reduction_lanes_come_from_the_fragment():
    from layouts import fragments

    assert fragments.wgmma_accumulator_c().row_lane_masks == (1, 2)
    assert fragments.wgmma_accumulator_c().col_lane_masks == (4, 8, 16)  # the lanes of one column's rows
    source = render(families.make_plan(KernelSpec(seq_len=1024, heads=8, head_dim=64))).source
    assert "kRowLaneMasks[2] = {1, 2};" in source and "__shfl_xor_sync(0xffffffffu, new_max[h], 1)" not in source


def test_probe_family_has_its_own_kernel_and_abi():
    from codegen.probe import probe_spec

    built = build(probe_spec(KernelSpec(seq_len=1024, heads=4, head_dim=64)), family="probe_sm90")
    assert built.rendered.kernel_name.endswith("_probe")
    assert [p.name for p in built.plan.abi.params][-3:] == ["p_in", "s_out", "o_out"]
    assert "Auto-generated by flashgen from templates/probe_sm90/" in built.rendered.source
