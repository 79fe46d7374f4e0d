"""The decode family on the CPU: its plan's numbers, its compiles, the API's refusals and the reference itself."""

from __future__ import annotations

import dataclasses

import pytest

from codegen.build import build
from codegen.families.decode_sm90 import DecodeSpec, Plan, resolve
from codegen.spec import SpecError


def plan_of(**kw) -> Plan:
    return Plan(resolve(DecodeSpec(**kw)))


def test_small_tiles_take_two_key_groups_and_an_even_ring():
    p = plan_of(heads=32, kv_heads=8, head_dim=128)
    assert (p.row_groups, p.key_groups, p.block_m, p.tiles_m, p.threads) == (1, 2, 64, 1, 384)
    assert p.spec.stages % 2 == 0 and p.spec.block_n == 128
    assert p.abi.barriers.barriers[2].arrivals == 4  # one key group's warps release a slot


def test_wide_tiles_take_two_row_groups_and_chunked_prefill_more_tiles():
    p = plan_of(heads=64, kv_heads=8, head_dim=128, q_len=16)  # 128 rows
    assert (p.row_groups, p.key_groups, p.block_m, p.tiles_m) == (2, 1, 128, 1)
    assert p.abi.barriers.barriers[2].arrivals == 8  # both row groups read every slot
    assert plan_of(heads=16, kv_heads=4, head_dim=96, q_len=40).tiles_m == 2  # 160 rows


def test_an_odd_ring_with_key_groups_is_refused():
    with pytest.raises(SpecError, match="multiple of 2"):
        resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=128, block_n=64, stages=3))


@pytest.mark.parametrize("bad, match", [(dict(kv_heads=5), "multiple of kv_heads"), (dict(head_dim=80), "head_dim"),
                                        (dict(page_size=4), "pages of"), (dict(q_len=0), "q_len"),
                                        (dict(arch="sm_100a"), "sm_90a")])
def test_bad_specs_say_why(bad, match):
    with pytest.raises(SpecError, match=match):
        DecodeSpec(**{**dict(heads=32, kv_heads=8, head_dim=128), **bad})


@pytest.mark.parametrize("kw", [dict(heads=32, kv_heads=8, head_dim=128), dict(heads=64, kv_heads=8, head_dim=128, q_len=16),
                                dict(heads=8, kv_heads=1, head_dim=256, q_len=3, dtype="f16"),
                                dict(heads=32, kv_heads=8, head_dim=64, window=(100, -1), softcap=30.0)])
def test_kernels_compile_without_spills(kw):
    built = build(DecodeSpec(**kw), family="decode_sm90")
    for name in (built.rendered.kernel_name, built.rendered.kernel_name + "_append"):
        assert name in built.compiled.registers, name
        assert built.compiled.spill_stores.get(name, 0) == 0 and built.compiled.spill_loads.get(name, 0) == 0
    manifest = built.manifest()
    assert manifest["family"] == "decode_sm90" and set(manifest["tensor_maps"]) == {"k", "v"}
    assert manifest["grid"]["x"] == "splits"


def test_paged_tiles_are_gathered_by_verified_loads():
    import layouts
    from layouts.paged import SubLoad, paged_tile

    k = layouts.derive_operand("k", arch="sm_90a", head_dim=128, block_rows=128, dtype="bf16")
    small = paged_tile(k, 16)  # 8 pages x 2 atom column blocks, each 16 x 64
    assert len(small.loads) == 16 and small.box == (64, 16, 1, 1, 1)
    assert small.loads[:3] == (SubLoad(0, 0, 0), SubLoad(0, 1, 16384), SubLoad(16, 0, 2048))
    assert paged_tile(k, 256).loads == (SubLoad(0, 0, 0),) and paged_tile(k, 256).box == k.tensor_map.box
    # A load placed one page off is caught by the TMA model.
    wrong = dataclasses.replace(small, loads=(SubLoad(0, 0, 2048),) + small.loads[1:])
    assert wrong.verify()
    p = plan_of(heads=32, kv_heads=8, head_dim=128, page_size=16)
    assert p.k_pages.loads == small.loads and p.v_pages is not None


def test_splits_fill_one_wave_where_tiles_are_few():
    from codegen.decode import choose_splits

    assert choose_splits(8, 16, 132) == 8      # B=1, 2k keys: 2 blocks a split
    assert choose_splits(8, 256, 132) == 16    # one wave
    assert choose_splits(64, 16, 132) == 1     # B=8, 2k: the merge does not pay
    assert choose_splits(64, 256, 132) == 2
    assert choose_splits(256, 64, 132) == 1


torch = pytest.importorskip("torch")


def cpu_inputs(**over):
    q = torch.zeros(2, 1, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 256, 2, 64, dtype=torch.bfloat16)
    args = dict(q=q, k_cache=k, v_cache=k.clone(), cache_seqlens=torch.tensor([3, 4], dtype=torch.int32))
    args.update(over)
    return args


@pytest.mark.parametrize("over, match", [
    (dict(cache_seqlens=torch.tensor([3, 4], dtype=torch.int64)), "int32"),
    (dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), "one length per sequence"),
    (dict(q=torch.zeros(2, 1, 7, 64, dtype=torch.bfloat16)), "multiple"),
    (dict(v_cache=torch.zeros(2, 255, 2, 64, dtype=torch.bfloat16)), "one shape"),
    (dict(q=torch.zeros(2, 1, 8, 64, dtype=torch.float16)), "dtype"),
    (dict(k_new=torch.zeros(2, 1, 2, 64, dtype=torch.bfloat16)), "together"),
    (dict(page_table=torch.zeros(2, 4, dtype=torch.int64)), "int32"),
    (dict(page_table=torch.zeros(3, 4, dtype=torch.int32)), "a row of pages per sequence"),
    (dict(page_table=torch.zeros(2, 4, dtype=torch.int32)), "CUDA device"),
    (dict(sinks=torch.zeros(7)), "sinks"),
    (dict(num_splits=-1), "num_splits"),
    ({}, "CUDA device"),
])
def test_bad_calls_are_refused_before_any_launch(over, match):
    from codegen.api import InputError
    from codegen.decode import attention_with_kvcache

    args = cpu_inputs(**over)
    with pytest.raises(InputError, match=match):
        attention_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_seqlens"),
                               **args)


def test_the_reference_is_attention_over_each_sequences_keys():
    from codegen import check

    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, 32)
    k, v = torch.randn(2, 50, 2, 32), torch.randn(2, 50, 2, 32)
    o, lse = check.kvcache_reference(q, k, v, [50, 20], causal=True)
    for b, n in enumerate((50, 20)):
        ref, ref_lse = check.reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True)
        assert torch.allclose(o[b:b + 1], ref) and torch.allclose(lse[b:b + 1], ref_lse)
    # A sink of -inf is no sink; a sink takes its share of the weight.
    o2, _ = check.kvcache_reference(q, k, v, [50, 20], sinks=torch.full((4,), float("-inf")))
    o3, lse3 = check.kvcache_reference(q, k, v, [50, 20], sinks=torch.full((4,), 5.0))
    plain, plain_lse = check.kvcache_reference(q, k, v, [50, 20])
    assert torch.allclose(o2, plain)
    assert torch.allclose(lse3, torch.logaddexp(plain_lse, torch.tensor(5.0, dtype=torch.float64)))
    assert o3.norm() < plain.norm()
