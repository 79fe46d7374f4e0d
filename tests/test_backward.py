"""The backward family on the CPU: its spec's refusals, its tiles' verified reads, its kernels compiled without
spills, its CLI, and attention_backward's input checks (the GPU results are tests/test_gpu_backward.py)."""

from __future__ import annotations

import pytest

import gen
from codegen.build import build
from codegen.families.bwd_sm90 import BackwardSpec, Plan, post_name, pre_name, resolve
from codegen.spec import SpecError
from layouts import LayoutError, derive_operand, fragments
from layouts.operands import read_tile


def plan_of(**kw) -> Plan:
    base = dict(seq_len=1000, seq_len_k=1000, heads=8, kv_heads=2, head_dim=128)
    return Plan(resolve(BackwardSpec(**{**base, **kw})))


def test_a_tiles_64_row_windows_read_as_their_own_rows():
    k = derive_operand("k", arch="sm_90a", head_dim=128, block_rows=128, dtype="bf16")
    first, second = (read_tile(k, row_name="n", k_name="k", rows=64, row0=r) for r in (0, 64))
    assert first.major == second.major == "K" and first.transpose == 0
    # The window 64 rows down starts 64 rows of 128 bytes further, every other field the same.
    for a, b in zip(first.descriptor_objects(), second.descriptor_objects()):
        assert b.start_address - a.start_address == 64 * 128
        assert (a.lbo, a.sbo, a.swizzle) == (b.lbo, b.sbo, b.swizzle)
    mn = read_tile(k, row_name="k", k_name="n", rows=64, row0=64)
    assert mn.major == "MN" and mn.transpose == 1 and len(mn.slices) == 8
    assert mn.descriptor_objects()[0].start_address == 128 * 128  # the second 64-column block of the tile


def test_a_read_off_the_tiles_rows_fails_verification():
    k = derive_operand("k", arch="sm_90a", head_dim=128, block_rows=128, dtype="bf16")
    with pytest.raises(LayoutError, match="fails verification"):
        read_tile(k, row_name="n", k_name="k", rows=64, row0=60)  # mid core matrix: no descriptor says this
    with pytest.raises(LayoutError, match="outside the tile"):
        read_tile(k, row_name="n", k_name="k", rows=64, row0=96)
    with pytest.raises(LayoutError, match="names its coordinates"):
        read_tile(k, row_name="m", k_name="k", rows=64)
    with pytest.raises(LayoutError, match="slices"):
        read_tile(k, row_name="k", k_name="n", rows=64, k_first=8)


def test_half_the_head_dim_is_a_verified_read_only_on_a_swizzle_atom():
    assert plan_of(head_dim=128).dq_split is not None and plan_of(head_dim=64).dq_split is not None
    plan = plan_of(head_dim=96)
    assert plan.dq_split is None and [(c.first, c.cols) for c in plan.dq_chunks] == [(0, 64), (64, 32)]


def test_accumulator_coordinates_are_a_thread_part_plus_a_register_part():
    for n in (64, 96, 128, 256):
        fragments.check_separable(n)


@pytest.mark.parametrize("kw, match", [
    (dict(head_dim=192), "head_dim 192"),
    (dict(head_dim=96, deterministic=True), "deterministic=True needs dQ added as one tile"),
    (dict(heads=6, kv_heads=4), "multiple of kv_heads"),
    (dict(dtype="f32"), "dtype"),
    (dict(stages=5), "stages"),
    (dict(window=(-2, 0)), "window"),
])
def test_bad_specs_say_why(kw, match):
    with pytest.raises(SpecError, match=match):
        plan_of(**kw)


SPECS = [dict(), dict(causal=True), dict(head_dim=64, dtype="f16", seq_len=17, seq_len_k=4096),
         dict(head_dim=96, causal=True, window=(100, -1)), dict(softcap=30.0, causal=True, window=(64, 0)),
         dict(deterministic=True, causal=True), dict(seq_len=512, seq_len_k=128, causal=True, kv_heads=1)]


@pytest.mark.parametrize("kw", SPECS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_kernels_compile_without_spills(kw):
    built = build(plan_of(**kw).spec)
    spec, c = built.spec, built.compiled
    for name in (spec.name, pre_name(spec), post_name(spec)):
        assert name in c.registers, f"{name} is not in the module"
        assert c.spill_stores.get(name, 0) == 0 and c.spill_loads.get(name, 0) == 0, name
    assert built.plan.smem.total <= 227 * 1024


def test_the_manifest_describes_the_main_kernel_from_its_abi():
    manifest = build(plan_of().spec).manifest()
    assert manifest["family"] == "bwd_sm90"
    assert [a["name"] for a in manifest["arguments"]][:4] == ["tmap_q", "tmap_k", "tmap_v", "tmap_do"]
    assert manifest["grid"] == {"x": "key blocks x K/V heads x batch = 8 x 2 x batch", "y": "1", "z": "1"}
    # The row kernels around it, each with its own arguments, in launch order.
    pre, post = manifest["other_kernels"]
    assert pre["kernel"].endswith("_pre") and post["kernel"].endswith("_post")
    assert [a["name"] for a in pre["arguments"]][:2] == ["o_gmem", "o_batch_bytes"]
    assert [a["name"] for a in post["arguments"]][0] == "dq_accum" and pre["block"] == [128, 1, 1]


def test_banded_grids_of_a_few_waves_launch_the_long_ctas_first():
    causal = plan_of(causal=True, seq_len=8192, seq_len_k=8192, heads=32, kv_heads=8)  # 64 x 8 = 512 CTAs
    assert causal.longest_first(batch=1, sms=132) and not causal.longest_first(batch=4, sms=132)
    assert not plan_of(seq_len=8192, seq_len_k=8192).longest_first(batch=1, sms=132)  # no band: all CTAs alike


def test_cli_emits_the_backward_kernels(tmp_path, capsys):
    assert gen.main(["--shape", "1000,16,128", "--kv-heads", "4", "--causal", "--backward", "--out", str(tmp_path)]) == 0
    name = "flashgen_bwd_sm_90a_s1000_sk1000_h16_kvh4_d128_f16_causal_st2"
    assert (tmp_path / f"{name}.cu").is_file() and (tmp_path / f"{name}.json").is_file()
    assert "0 bytes stored" in capsys.readouterr().out


@pytest.mark.parametrize("args, match", [
    (["--shape", "1000,16,192", "--backward"], "head_dim 192"),
    (["--shape", "1000,16,128", "--backward", "--run"], "--run is not written for the backward"),
    (["--shape", "1000,16,128", "--deterministic"], "add --backward"),
    (["--shape", "1000,16,128", "--backward", "--sinks"], "sinks need nothing"),
])
def test_cli_refusals_are_one_line(args, match, capsys):
    assert gen.main(args) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_attention_backward_checks_its_inputs_before_any_launch():
    torch = pytest.importorskip("torch")
    from codegen.api import InputError
    from codegen.backward import attention_backward

    q = torch.randn(1, 128, 4, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 128)
    with pytest.raises(InputError, match="o must be a tensor of q's shape"):
        attention_backward(q, q, q, q[:, :64], lse, q)
    with pytest.raises(InputError, match="lse must be the forward's float32 logsumexp"):
        attention_backward(q, q, q, q, lse[:, :2], q)
    with pytest.raises(InputError, match="CUDA device"):
        attention_backward(q, q, q, q, lse, q)


def test_torch_compile_traces_training_and_raises_the_backwards_refusals():
    # On the CPU, tracing reaches the ops (then there is no CPU kernel); a head dim the backward refuses is refused
    # while tracing, before anything would run.
    torch = pytest.importorskip("torch")
    from codegen import attention
    from codegen.api import InputError

    def traced(dim, fullgraph):
        q = torch.randn(1, 128, 2, dim, dtype=torch.bfloat16, requires_grad=True)
        torch._dynamo.reset()
        return torch.compile(lambda q, k, v: attention(q, k, v, causal=True), fullgraph=fullgraph, backend="eager")(q, q, q)

    with pytest.raises(NotImplementedError, match="flashgen::attention"):
        traced(128, True)
    with pytest.raises(InputError, match="backward: head_dim 192"):
        traced(192, False)
