"""The wide backward family (bwd_sm90_wide, D=256) on the CPU: the spec routes to it, its reads compose to the
products the kernel computes (every operand byte read through the descriptor model, windows moved as the kernel
moves them), its stores land where the tiles' formulas say, its kernels compile without spills, its CLI (the GPU
results are tests/test_gpu_backward.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gen
from codegen import families
from codegen.build import build
from codegen.families.bwd_sm90 import BackwardSpec, post_name, pre_name, resolve
from codegen.families.bwd_sm90_wide import context
from codegen.families.bwd_sm90_wide.plan import WidePlan, window_step
from codegen.spec import SpecError
from layouts import LayoutError, derive_operand
from layouts.cexpr import compile_c_expr
from layouts.operands import read_tile
from tests.test_backward import _fragment_c, _place, _read


def wide_plan(**kw) -> WidePlan:
    base = dict(seq_len=1000, seq_len_k=1000, heads=8, kv_heads=2, head_dim=256)
    return WidePlan(resolve(BackwardSpec(**{**base, **kw})))


def _moved(windows, w):
    """Window w of a Windows as the kernel reads it: window 0's read at a start `w * step` bytes further."""
    return windows.first, w * windows.step


def test_head_dims_192_and_256_are_the_wide_familys():
    shape = wide_plan(head_dim=192)
    assert (shape.consumers, shape.block_n, shape.keys_per_consumer, shape.head_rows, shape.head_tiles,
            shape.dq_chunks, shape.threads, shape.consumer_regs) == (3, 96, 32, 64, 1, 1, 512, 160)
    assert shape.smem.total <= 227 * 1024 and shape.smem.kv_bytes == 96 * 192 * 2
    spec = resolve(BackwardSpec(seq_len=1000, seq_len_k=1000, heads=8, kv_heads=2, head_dim=256))
    assert spec.family == "bwd_sm90_wide" and families.family_for(spec).name == "bwd_sm90_wide"
    assert BackwardSpec(seq_len=1, seq_len_k=1, heads=1, kv_heads=1, head_dim=128).family == "bwd_sm90"
    plan = families.make_plan(spec)
    assert isinstance(plan, WidePlan) and plan.block_m == 64 and plan.block_n == 80
    assert (plan.consumers, plan.keys_per_consumer, plan.head_rows, plan.head_tiles, plan.dq_chunks) == (2, 40, 128, 2, 2)
    assert plan.threads == 384 and plan.consumer_regs == 240
    assert plan.n_blocks == -(-1000 // 80) and plan.smem.total <= 227 * 1024
    # dO has one slot of its own beside the two-slot ring of Q.
    assert plan.smem.v_offset - plan.smem.k_offset == plan.smem.kv_bytes == 80 * 256 * 2
    assert [b.name for b in plan.abi.barriers.barriers] == ["KvFull", "DoFull", "DoEmpty", "QFull", "QEmpty"]


@pytest.mark.parametrize("kw, match", [(dict(deterministic=True), "deterministic=True needs dQ added as one tile"),
                                       (dict(stages=3), "shared memory"), (dict(head_dim=160), "head_dim 160")])
def test_what_the_wide_family_refuses_says_why(kw, match):
    with pytest.raises(SpecError, match=match):
        wide_plan(**kw)


def test_window_step_proves_each_moved_window_and_refuses_uneven_ones():
    k = derive_operand("k", arch="sm_90a", head_dim=256, block_rows=80, dtype="bf16")
    even = window_step([read_tile(k, row_name="n", k_name="k", rows=40, row0=r) for r in (0, 40)])
    assert even.step == 40 * 128
    with pytest.raises(LayoutError, match="not window 0 moved"):
        window_step([read_tile(k, row_name="n", k_name="k", rows=8, row0=r) for r in (0, 8, 24)])


@pytest.mark.parametrize("head_dim", [256, 192])
def test_the_products_compose_from_the_reads_the_kernel_makes(head_dim):
    """S, dV^T (dK^T) and dQ as the template issues them (k slices of the verified reads, windows moved by their
    step), every operand byte read through the descriptor model, equal the products of the tiles' contents."""
    plan = wide_plan(head_dim=head_dim)
    d, n, keys = head_dim, plan.block_n, plan.keys_per_consumer
    rng = np.random.default_rng(0)
    q = rng.integers(-3, 4, size=(64, d))         # queries x head dim (dO alike)
    k = rng.integers(-3, 4, size=(n, d))          # keys x head dim (V alike)
    p = rng.integers(-3, 4, size=(64, n))         # P (dS alike): queries x keys
    smem = np.zeros(1 << 18, dtype=np.uint8)
    q_base, k_base, pd_base = 0, 65536, 131072
    _place(smem, plan.q, q_base, q)
    _place(smem, plan.k, k_base, k)
    _place(smem, plan.pd, pd_base, p.T)           # the tile holds P^T: keys x queries
    for c in range(plan.consumers):               # S of consumer c: its keys
        read, moved = _moved(plan.kv_as_b, c)
        s = sum(_read(smem, plan.q_as_a, q_base, kk, 64) @ _read(smem, read, k_base + moved, kk, keys).T
                for kk in range(len(plan.q_as_a.slices)))
        assert np.array_equal(s, q @ k[keys * c:keys * c + keys].T), f"S of consumer {c}"
    for w in range(d // 64):                      # dV^T's m64 tile w = c * head_tiles + j: head-dim rows [64w, +64)
        read, moved = _moved(plan.q_as_a_mn, w)
        dvt = sum(_read(smem, read, q_base + moved, kk, 64) @ _read(smem, plan.pd_as_b, pd_base, kk, n).T
                  for kk in range(len(plan.pd_as_b.slices)))
        assert np.array_equal(dvt, q[:, 64 * w:64 * w + 64].T @ p), f"dV^T tile {w}"
    for w in range(d // 64):                      # dQ chunk w = c * dq_chunks + h: head-dim columns [64w, +64)
        read, moved = _moved(plan.k_as_b_mn, w)
        dq = sum(_read(smem, plan.ds_as_a, pd_base, kk, 64) @ _read(smem, read, k_base + moved, kk, 64).T
                 for kk in range(len(plan.ds_as_a.slices)))
        assert np.array_equal(dq, p @ k[:, 64 * w:64 * w + 64]), f"dQ chunk {w}"


@pytest.mark.parametrize("head_dim", [256, 192])
def test_p_and_ds_stores_cover_the_tile_from_their_bases(head_dim):
    """Consumer c's S value i goes to (key c * keys + col, query row) at its base plus immediate, as the kernel
    computes the bases; over every consumer each element of the keys x queries tile is stored once."""
    plan = wide_plan(head_dim=head_dim)
    ctx = context(plan)
    acc_row, acc_col = _fragment_c(ctx)
    offset = compile_c_expr(ctx["pd_offset_c"], ("n", "k"))
    keys = plan.keys_per_consumer
    seen = np.zeros(plan.block_n * 64 * 2, dtype=int)
    assert len(ctx["pd_stores"]) == keys // 2 == {256: 20, 192: 16}[head_dim]
    for c in range(plan.consumers):
        for i, store in enumerate(ctx["pd_stores"]):
            b = ctx["pd_store_bases"][store["base"]]
            at_base = np.asarray(offset({"n": keys * c + acc_col(b), "k": acc_row(b)}))
            want = np.asarray(offset({"n": keys * c + acc_col(i), "k": acc_row(i)}))
            assert np.array_equal(at_base + store["imm"], want)
            np.add.at(seen, want, 1)
    assert np.array_equal(seen[::2], np.ones(plan.block_n * 64, dtype=int)) and not seen[1::2].any()


@pytest.mark.parametrize("head_dim", [256, 192])
def test_dk_and_dv_leave_through_the_stage_tile_as_whole_runs(head_dim):
    """The epilogue's 16-bit stores of dK^T (value v = j * keys / 2 + i of consumer c at (key, head-dim row)) cover
    the keys x head dim stage tile once, and copy_rows' 16-byte runs (8 columns from a multiple of 8) are contiguous
    there."""
    plan = wide_plan(head_dim=head_dim)
    ctx = context(plan)
    acc_row, acc_col = _fragment_c(ctx)
    offset = compile_c_expr(ctx["dkv_offset_c"], ("m", "n"))
    n, per_tile, tiles = plan.block_n, plan.block_n // 2, plan.head_tiles
    seen = np.zeros(n * head_dim * 2, dtype=int)
    assert len(ctx["dkv_stores"]) == tiles * per_tile
    for c in range(plan.consumers):
        for v, store in enumerate(ctx["dkv_stores"]):
            j, i = divmod(v, per_tile)
            bj, bi = divmod(ctx["dkv_store_bases"][store["base"]], per_tile)
            at_base = np.asarray(offset({"m": acc_col(bi), "n": (tiles * c + bj) * 64 + acc_row(bi)}))
            want = np.asarray(offset({"m": acc_col(i), "n": (tiles * c + j) * 64 + acc_row(i)}))
            assert np.array_equal(at_base + store["imm"], want)
            np.add.at(seen, want, 1)
    assert np.array_equal(seen[::2], np.ones(n * head_dim, dtype=int))
    run = ctx["dkv_run"]
    keys, cols = (g.ravel() for g in np.meshgrid(np.arange(n), np.arange(head_dim), indexing="ij"))
    start = np.asarray(offset({"m": keys, "n": cols - cols % run}))
    assert run == 8 and np.array_equal(np.asarray(offset({"m": keys, "n": cols})), start + 2 * (cols % run))
    assert np.all(start % 16 == 0)


SPECS = [dict(), dict(causal=True), dict(dtype="f16", seq_len=1, seq_len_k=1),
         dict(softcap=20.0, window=(256, -1), causal=True, seq_len=700, seq_len_k=900), dict(kv_heads=1, causal=True),
         dict(head_dim=192), dict(head_dim=192, softcap=20.0, window=(256, -1), causal=True, seq_len=700, seq_len_k=900)]


@pytest.mark.parametrize("kw", SPECS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_wide_kernels_compile_without_spills(kw):
    built = build(wide_plan(**kw).spec)
    spec, c = built.spec, built.compiled
    assert built.family.name == "bwd_sm90_wide"
    for name in (spec.name, pre_name(spec), post_name(spec)):
        assert name in c.registers, f"{name} is not in the module"
        assert c.spill_stores.get(name, 0) == 0 and c.spill_loads.get(name, 0) == 0, name
    # The main kernel scales dQ (its atomics carry it), so _post must not.
    assert "constexpr bool kStageUnderSt = true;" in built.rendered.source


def test_cli_emits_the_wide_backward(tmp_path, capsys):
    assert gen.main(["--shape", "1000,16,256", "--backward", "--out", str(tmp_path)]) == 0
    name = "flashgen_bwd_sm_90a_s1000_sk1000_h16_kvh16_d256_m64_f16_full_st2"
    assert (tmp_path / f"{name}.cu").is_file() and (tmp_path / f"{name}.json").is_file()
    out = capsys.readouterr().out
    assert "0 bytes stored" in out
