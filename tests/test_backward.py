"""The backward family on the CPU: its spec's refusals, its tiles' verified reads, its kernels compiled without
spills, its CLI, and attention_backward's input checks (the GPU results are tests/test_gpu_backward.py)."""

from __future__ import annotations

import numpy as np
import pytest

import pathlib

import gen
from codegen.build import build
from codegen.render import render
from codegen.families.bwd_sm90 import BackwardSpec, Plan, context, post_name, pre_name, resolve
from codegen.spec import SpecError
from layouts import LayoutError, derive_operand, fragments
from layouts.cexpr import compile_c_expr
from layouts.operands import read_tile


ROOT = pathlib.Path(__file__).resolve().parent.parent


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


def test_query_blocks_are_128_at_d64_and_64_above():
    for d, block_m, by in ((64, 128, "rows"), (96, 64, None), (128, 64, "columns")):
        plan = plan_of(head_dim=d)
        assert plan.block_m == block_m and f"_d{d}_m{block_m}_" in plan.spec.name
        assert (plan.dq_split.by if plan.dq_split else None) == by
        assert plan.smem.row_bytes == block_m * d * 2 and plan.smem.stats_bytes == block_m * 4
        assert plan.padded_rows == -(-1000 // block_m) * block_m
    rows = plan_of(head_dim=64).dq_split
    assert (rows.row0, rows.col0, rows.cols) == ((0, 64), (0, 0), 64)
    # Consumer c's A is the 64-query window at column 64c of a dS^T tile (64 keys x 128 queries, two 128-byte atoms).
    assert rows.a[1].descriptor_objects()[0].start_address - rows.a[0].descriptor_objects()[0].start_address == 64 * 128
    # 64-query blocks at D=64 still build (columns of 32): the layout the 128-query blocks replaced.
    forced = plan_of(head_dim=64, block_m=64)
    assert forced.block_m == 64 and forced.dq_split.by == "columns" and forced.dq_split.cols == 32


def test_soft_capped_kernels_keep_64_query_blocks_at_d64():
    assert plan_of(head_dim=64, softcap=30.0).block_m == 64 and plan_of(head_dim=64).block_m == 128


@pytest.mark.parametrize("kw, match", [(dict(head_dim=128, block_m=128), "at most 64"),
                                       (dict(head_dim=64, block_m=128, softcap=30.0), "and a soft cap"),
                                       (dict(head_dim=64, block_m=96), "block_m must be 64 or 128")])
def test_query_blocks_that_do_not_fit_are_refused(kw, match):
    with pytest.raises(SpecError, match=match):
        plan_of(**kw)


def test_half_the_head_dim_is_a_verified_read_only_on_a_swizzle_atom():
    assert plan_of(head_dim=128).dq_split is not None and plan_of(head_dim=64).dq_split is not None
    plan = plan_of(head_dim=96)
    assert plan.dq_split is None and [(c.first, c.cols) for c in plan.dq_chunks] == [(0, 64), (64, 32)]


def _fragment_c(ctx):
    """The accumulator's row and column as the templates render them, evaluable over arrays."""
    row = compile_c_expr(ctx["acc"].row_c, ("warp", "lane", "i"))
    col = compile_c_expr(ctx["acc"].col_c, ("lane", "i"))
    lane, warp = (g.ravel() for g in np.meshgrid(np.arange(32), np.arange(4), indexing="ij"))
    return (lambda i: np.asarray(row({"warp": warp, "lane": lane, "i": np.full(lane.shape, i)})),
            lambda i: np.asarray(col({"lane": lane, "i": np.full(lane.shape, i)})))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dq_staged_by_the_consumers_is_where_post_reads_it(head_dim):
    """Split mode, emulated from the rendered texts and constants: consumer c stores its value pairs at base +
    immediate (c * kDqRowStep, c * kDqColStep, kDqBaseValue, kDqStoreBase, kDqStoreImm, dq_col), every element of the fp32 tile
    exactly once, and _post finds (row, 2c) at row * D + dq_col(row, 2c) with (row, 2c + 1) right after it.
    D=128 splits 64-query blocks by columns, D=64 128-query blocks by rows."""
    d = head_dim
    plan = plan_of(head_dim=d)
    ctx = context(plan)
    split = ctx["dq_split"]
    assert split["by"] == {64: "rows", 128: "columns"}[d]
    acc_row, acc_col = _fragment_c(ctx)
    dq_col = compile_c_expr(ctx["dq_col_c"], ("row", "col"))
    tile = np.full(plan.block_m * d, -1)
    assert len(ctx["dq_stores"]) == split["cols"] // 4
    for row0, col0 in zip(split["row0"], split["col0"]):
        for j, store in enumerate(ctx["dq_stores"]):
            b = ctx["dq_store_bases"][store["base"]]
            row = row0 + acc_row(b)
            address = 4 * (row * d + dq_col({"row": row, "col": col0 + acc_col(b)})) + store["imm"]
            assert np.all(address % 8 == 0)  # st.shared.v2.f32
            for h in range(2):
                slot = address // 4 + h
                assert np.all(tile[slot] == -1), "an element stored twice"
                tile[slot] = (row0 + acc_row(2 * j + h)) * d + col0 + acc_col(2 * j + h)
    assert np.all(tile >= 0)
    rows, pairs = (g.ravel() for g in np.meshgrid(np.arange(plan.block_m), np.arange(d // 2), indexing="ij"))
    first = rows * d + dq_col({"row": rows, "col": 2 * pairs})
    assert np.array_equal(tile[first], rows * d + 2 * pairs)
    assert np.array_equal(tile[first + 1], rows * d + 2 * pairs + 1)


def _place(smem, tile, base, values):
    """values (coords of the tile, in its coords' order) as 16-bit integers at the tile's formula offsets."""
    names = tuple(tile.coords)
    grid = np.meshgrid(*(np.arange(tile.coords[n]) for n in names), indexing="ij")
    offset = base + np.asarray(compile_c_expr(tile.formula_c, names)(dict(zip(names, grid))), dtype=np.int64)
    bits = values.astype(np.int16).view(np.uint16)
    smem[offset], smem[offset + 1] = (bits & 0xFF).astype(np.uint8), (bits >> 8).astype(np.uint8)


def _read(smem, read, base, kk, rows):
    """(rows x 16) slice kk of a TileRead at shared address `base`, as wgmma reads it (layouts.mma's model)."""
    import dataclasses

    from layouts.mma import mma_read_byte

    desc = read.descriptor_objects()[kk]
    desc = dataclasses.replace(desc, start_address=desc.start_address + base)
    r, k = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    at = mma_read_byte(desc, major=read.major, elem_bytes=2, row=r, k=k)
    return (smem[at].astype(np.uint16) | (smem[at + 1].astype(np.uint16) << 8)).view(np.int16).astype(np.int64)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dq_split_reads_compose_to_ds_times_k(head_dim):
    """The split dQ loop as the template runs it (kk over both consumers' dS^T tiles: A slice kk % L of tile kk / L,
    B slice kk of K), with every operand byte read through the descriptor model, gives each consumer its part of
    dS K: rows [row0, row0 + 64) x columns [col0, col0 + cols) of the block's dQ."""
    plan = plan_of(head_dim=head_dim)
    split, d, bm = plan.dq_split, head_dim, plan.block_m
    rng = np.random.default_rng(0)
    k = rng.integers(-3, 4, size=(128, d))          # keys x head dim
    ds = rng.integers(-3, 4, size=(bm, 128))        # queries x keys
    smem = np.zeros(1 << 18, dtype=np.uint8)
    k_base, ds_base = 0, 65536
    _place(smem, plan.k, k_base, k)
    for tile in range(2):  # consumer tile's dS^T: its 64 keys x the block's queries
        _place(smem, plan.ds, ds_base + tile * plan.smem.ds_bytes, ds[:, 64 * tile:64 * tile + 64].T)
    slices = len(split.a[0].slices)
    for c in range(2):
        dq = np.zeros((64, split.cols), dtype=np.int64)
        for kk in range(2 * slices):
            a = _read(smem, split.a[c], ds_base + (kk // slices) * plan.smem.ds_bytes, kk % slices, 64)
            b = _read(smem, split.b[c], k_base, kk, split.cols)
            dq += a @ b.T
        want = ds[split.row0[c]:split.row0[c] + 64] @ k[:, split.col0[c]:split.col0[c] + split.cols]
        assert np.array_equal(dq, want), f"consumer {c}"


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_ds_stores_from_bases_land_where_the_tile_formula_says(head_dim):
    ctx = context(plan_of(head_dim=head_dim))
    acc_row, acc_col = _fragment_c(ctx)
    ds_offset = compile_c_expr(ctx["ds_offset_c"], ("n", "k"))
    # The 128-byte swizzle XORs all three chunk bits of a 64-query atom: 8 bases for the 16 or 32 stores.
    assert len(ctx["ds_store_bases"]) == 8 and len(ctx["ds_stores"]) == ctx["block_m"] // 4
    for j, store in enumerate(ctx["ds_stores"]):
        b = ctx["ds_store_bases"][store["base"]]
        at_base = ds_offset({"n": acc_row(b), "k": acc_col(b)})
        assert np.array_equal(at_base + store["imm"], ds_offset({"n": acc_row(2 * j), "k": acc_col(2 * j)}))


def test_accumulator_coordinates_are_a_thread_part_plus_a_register_part():
    for n in (64, 96, 128, 256):
        fragments.check_separable(n)


@pytest.mark.parametrize("kw, match", [
    (dict(head_dim=160), "head_dim 160"),
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
         dict(head_dim=64, block_m=64, causal=True),
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


def test_banded_grids_launch_the_long_ctas_first_in_sections_that_fit_the_l2():
    causal = plan_of(causal=True, seq_len=8192, seq_len_k=8192, heads=32, kv_heads=8)  # 64 x 8 = 512 CTAs
    assert causal.section(batch=1, sms=132) == 8  # a few waves: every pair
    # 2048 CTAs: sections of pairs whose Q, dO (4 heads x 8192 x 128 x 2 x 2 B) and dQ accumulators (x 4 B) fit
    # half the L2 twice over: 32 MiB a pair, so one.
    assert causal.pair_bytes == 4 * 128 * (2 * 8192 * 2 + 4 * 8192) and causal.section(batch=4, sms=132) == 1
    assert plan_of(causal=True, seq_len=4096, seq_len_k=4096, heads=32, kv_heads=32).section(batch=4, sms=132) == 4
    assert plan_of(seq_len=8192, seq_len_k=8192).section(batch=1, sms=132) == 1  # no band: all CTAs alike


@pytest.mark.parametrize("pairs_per_batch, batch, section, tail", [
    (32, 4, 1, (0, 1)), (32, 4, 4, (0, 1)), (32, 4, 128, (0, 1)), (3, 5, 4, (0, 1)), (2, 3, 6, (0, 1)),
    (32, 4, 1, (4, 3)), (3, 5, 4, (7, 2)), (2, 3, 6, (30, 5))])
def test_the_launch_order_visits_each_cta_once_key_blocks_ascending(pairs_per_batch, batch, section, tail):
    """this_cta's map and cta_positions (schedule.j2), computed as the kernel does: every (key block, pair) once, or
    as pieces that take each of its query-block positions once, a pair's key blocks in ascending order (deterministic
    mode waits on them so), each section's key blocks slowest."""
    n_blocks, positions = 5, 7  # the query blocks every key block sees
    pairs = pairs_per_batch * batch
    tail_units, tail_pieces = tail
    whole = n_blocks * pairs - tail_units
    seen, taken, last = set(), {}, {}
    for cta in range(whole + tail_units * tail_pieces):
        split = cta - whole
        piece = 0 if split < 0 else split % tail_pieces
        pieces = 1 if split < 0 else tail_pieces
        idx = cta if split < 0 else whole + split // tail_pieces
        first = idx // (section * n_blocks) * section
        size = min(section, pairs - first)
        r = idx - first * n_blocks
        pair, n_block = first + r % size, r // size
        head_kv, b = pair % pairs_per_batch, pair // pairs_per_batch
        unit = (n_block, head_kv, b)
        assert 0 <= n_block < n_blocks and b < batch and (idx - whole < 0) == (split < 0)
        if piece == 0:
            assert unit not in seen
            seen.add(unit)
            assert last.get(pair, -1) == n_block - 1
            last[pair] = n_block
        t0, t1 = positions * piece // pieces, positions * (piece + 1) // pieces  # piece_blocks' lo, hi
        taken.setdefault(unit, []).extend(range(t0, t1))
    assert len(seen) == n_blocks * pairs
    assert all(sorted(ts) == list(range(positions)) for ts in taken.values())
    source = (ROOT / "templates" / "bwd_sm90" / "schedule.j2").read_text()
    for line in ("const int pairs = kv_heads * p.batch, whole = n_blocks * pairs - p.tail_units;",
                 "const int split = kSplitsTail ? cta_index - whole : -1, piece = split < 0 ? 0 : split % p.tail_pieces;",
                 "const int idx = split < 0 ? cta_index : whole + split / p.tail_pieces;",
                 "const int first = idx / (p.section * n_blocks) * p.section;",
                 "const int size = min(p.section, pairs - first), r = idx - first * n_blocks;",
                 "const int pair = first + r % size;",
                 "const int batch = pair / kv_heads;", "Cta cta{r / size, pair % kv_heads, batch, kFixedLengths, 0, 0, batch,",
                 "piece, split < 0 ? 1 : p.tail_pieces, idx - whole, 0, 0};",
                 "const int lo = count * cta.piece / cta.pieces, hi = count * (cta.piece + 1) / cta.pieces;"):
        assert line in source, "the test's copy of this_cta no longer matches the template's"


def test_a_few_ctas_past_whole_waves_run_as_pieces_of_their_query_blocks():
    # (4,4096,32,128): 4096 CTAs = 31 waves of 132 and 4; the 4 run as 32 pieces of 2 of their 64 query blocks.
    full = plan_of(seq_len=4096, seq_len_k=4096, heads=32, kv_heads=32)
    assert full.tail_split(batch=4, sms=132) == (4, 32) and full.grid(4, (4, 32)) == (4096 - 4 + 4 * 32, 1, 1)
    assert full.tail_workspace(4) == (4 * 2 * 128 * 128, 4 * 8)
    # D=96: 1000 queries are 16 blocks of 64, so pieces of at least TAIL_MIN_BLOCKS_PER_PIECE are 8 at most.
    assert plan_of(seq_len=1000, seq_len_k=1000, heads=17, kv_heads=17, head_dim=96).tail_split(1, 132) == (4, 8)
    # D=64 keeps whole units (TAIL_SPLIT_MIN_HEAD_DIM).
    assert plan_of(seq_len=1024, seq_len_k=1024, heads=32, kv_heads=32, head_dim=64).tail_split(16, 132) == (0, 1)
    # Nothing to split: whole waves, a last wave too full for pieces, one wave or less.
    assert full.tail_split(batch=33, sms=132) == (0, 1)  # 33 x 1024 = 256 waves exactly
    assert plan_of(seq_len=16384, seq_len_k=16384, heads=16, kv_heads=16).tail_split(1, 132) == (0, 1)  # 68 left
    assert full.tail_split(batch=1, sms=2048) == (0, 1)
    # Under a band the CTAs differ (the sections order them); deterministic sums stay in key-block order.
    for kw in (dict(causal=True), dict(window=(256, 0)), dict(deterministic=True), dict(kv_heads=8)):
        plan = plan_of(seq_len=4096, seq_len_k=4096, heads=32, **{"kv_heads": 32, **kw})
        assert plan.tail_split(batch=4, sms=132) == (0, 1), kw


def test_cli_emits_the_backward_kernels(tmp_path, capsys):
    assert gen.main(["--shape", "1000,16,128", "--kv-heads", "4", "--causal", "--backward", "--out", str(tmp_path)]) == 0
    name = "flashgen_bwd_sm_90a_s1000_sk1000_h16_kvh4_d128_m64_f16_causal_st2"
    assert (tmp_path / f"{name}.cu").is_file() and (tmp_path / f"{name}.json").is_file()
    assert "0 bytes stored" in capsys.readouterr().out


@pytest.mark.parametrize("args, match", [
    (["--shape", "1000,16,96", "--backward", "--deterministic"], "deterministic=True needs dQ added as one tile"),
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

    def traced(dim, fullgraph, **options):
        q = torch.randn(1, 128, 2, dim, dtype=torch.bfloat16, requires_grad=True)
        torch._dynamo.reset()
        return torch.compile(lambda q, k, v: attention(q, k, v, causal=True, **options), fullgraph=fullgraph,
                             backend="eager")(q, q, q)

    with pytest.raises(NotImplementedError, match="flashgen::attention"):
        traced(128, True)
    with pytest.raises(InputError, match="backward: deterministic=True needs dQ added as one tile"):
        traced(96, False, deterministic=True)

    def traced_varlen(dim, fullgraph, **options):  # a packed batch of two sequences, 100 and 28 rows
        q = torch.randn(128, 2, dim, dtype=torch.bfloat16, requires_grad=True)
        cu = torch.tensor([0, 100, 128], dtype=torch.int32)
        torch._dynamo.reset()
        return torch.compile(lambda q, k, v: attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True,
                                                       **options), fullgraph=fullgraph, backend="eager")(q, q, q)

    with pytest.raises(NotImplementedError, match="flashgen::attention"):  # no graph break: the op is reached
        traced_varlen(128, True, max_seqlen_q=100, max_seqlen_k=100)
    # What the op cannot carry runs eagerly behind a graph break (here on the CPU: refused for its device); with
    # fullgraph=True dynamo refuses the break and says why.
    with pytest.raises(InputError, match="CUDA device"):
        traced_varlen(128, False, max_seqlen_q=100)
    with pytest.raises(Exception, match="a varlen batch without both max lengths .* runs eagerly"):
        traced_varlen(128, True, max_seqlen_q=100)
    with pytest.raises(InputError, match="CUDA device"):
        traced(128, False, multicast=True)
    with pytest.raises(Exception, match="with check=True .* runs eagerly"):  # the offsets read: not in the graph
        traced_varlen(128, True, max_seqlen_q=100, max_seqlen_k=100, check=True)
    with pytest.raises(InputError, match="backward: head_dim 192: the backward of variable-length"):
        traced_varlen(192, False, max_seqlen_q=100, max_seqlen_k=100)


@pytest.mark.parametrize("head_dim,lanes,rows_per_block", [(64, 8, 16), (96, 4, 32), (128, 16, 8)])
def test_row_kernels_give_each_row_an_aligned_lane_group_of_16_byte_vectors(head_dim, lanes, rows_per_block):
    """_pre and _post as rows.j2 maps threads: CTA x warp x lane group -> row r, lanes of a group take vectors
    c = lane, lane + kLanes, ...; every padded row of every (sequence, head) is some group's, once, and every
    16-byte vector of it some lane's, once."""
    plan = plan_of(head_dim=head_dim, seq_len=1000, heads=3, kv_heads=3)
    ctx = context(plan)
    assert (ctx["row_lanes"], plan.rows_per_row_block, ctx["row_vector"]) == (lanes, rows_per_block, 8)
    batch = 2
    (ctas, _, _), warps = plan.row_grid(batch), ctx["row_warps"]
    cta, warp, tid = (g.ravel() for g in np.meshgrid(np.arange(ctas), np.arange(warps), np.arange(32), indexing="ij"))
    r = (cta * warps + warp) * (32 // lanes) + tid // lanes
    total = batch * plan.spec.heads * plan.padded_rows
    assert ctas * plan.rows_per_row_block == total  # no CTA half past the end: whole warps shuffle
    seen = np.zeros((total, head_dim // 8), dtype=int)
    for step in range(head_dim // 8 // lanes):
        np.add.at(seen, (r, tid % lanes + step * lanes), 1)
    assert np.all(seen == 1)


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_post_reads_each_vector_of_the_accumulator_as_one_contiguous_run(head_dim):
    """_post loads columns [8c, 8c + 8) of a dQ accumulator row as two float4 from dq_col(row, 8c): the swizzle
    must keep them together and in order, 32-byte aligned."""
    ctx = context(plan_of(head_dim=head_dim))
    dq_col = compile_c_expr(ctx["dq_col_c"], ("row", "col"))
    vec = ctx["row_vector"]
    assert ctx["dq_chunk_cols"] % vec == 0
    rows, cols = (g.ravel() for g in np.meshgrid(np.arange(64), np.arange(head_dim), indexing="ij"))
    at = np.asarray(dq_col({"row": rows, "col": cols}))
    start = np.asarray(dq_col({"row": rows, "col": cols - cols % vec}))
    assert np.array_equal(at, start + cols % vec)
    assert np.all(start % vec == 0)


@pytest.mark.parametrize("kw,under", [(dict(head_dim=128), True), (dict(head_dim=128, causal=True), True),
                                      (dict(head_dim=128, softcap=30.0), False), (dict(head_dim=64), False),
                                      (dict(head_dim=96), False)])
def test_dq_is_staged_under_the_next_st_where_it_compiles_cleanly(kw, under):
    """Plan.stage_under_st (LOG b9): D=128's columns split without a soft cap stages dQ under the next block's S^T and
    scales it there, so _post must not scale it again; elsewhere dQ is staged at once and _post scales."""
    plan = plan_of(**kw)
    ctx = context(plan)
    assert plan.stage_under_st is under and ctx["stage_under_st"] is under
    source = render(plan).source
    assert f"constexpr bool kStageUnderSt = {'true' if under else 'false'};" in source
    assert "const float f = cfg::kStageUnderSt ? 1.f : scale;" in source


def test_variable_length_batches_have_their_own_kernels():
    spec = resolve(BackwardSpec(seq_len=1024, seq_len_k=2048, heads=8, kv_heads=2, head_dim=96, causal=True, varlen=True))
    assert spec.name.endswith("_varlen") and "--varlen" in context(Plan(spec))["regenerate"]
    plan = Plan(spec)
    assert not plan.splits_tail and plan.tail_split(batch=33, sms=132) == (0, 1)  # CTAs of unequal sequences
    assert build(spec, use_cache=False).compiled.spill_stores[spec.name] == 0
    # Written for bwd_sm90's head dims; the wide family takes fixed lengths only.
    with pytest.raises(SpecError, match="variable-length batches is written for head dims \\(64, 96, 128\\)"):
        BackwardSpec(seq_len=1024, seq_len_k=1024, heads=8, kv_heads=8, head_dim=256, varlen=True)
    # A soft cap under a band bounded on both sides spilled at D=128 (VARLEN_BANDED_SOFTCAP_MAX_HEAD_DIM).
    for kw in (dict(causal=True, window=(96, -1)), dict(window=(96, 96))):
        with pytest.raises(SpecError, match="soft cap and a band bounded on both sides"):
            BackwardSpec(seq_len=1024, seq_len_k=1024, heads=8, kv_heads=8, head_dim=128, softcap=20.0, varlen=True, **kw)
        BackwardSpec(seq_len=1024, seq_len_k=1024, heads=8, kv_heads=8, head_dim=96, softcap=20.0, varlen=True, **kw)
    BackwardSpec(seq_len=1024, seq_len_k=1024, heads=8, kv_heads=8, head_dim=128, softcap=20.0, varlen=True,
                 window=(96, -1))  # one-sided: compiles without spills


def test_cli_emits_the_varlen_backward(tmp_path):
    assert gen.main(["--shape", "2048,8,128", "--kv-heads", "2", "--causal", "--backward", "--varlen",
                     "--out", str(tmp_path)]) == 0
    (source,) = tmp_path.glob("*_varlen.cu")
    assert "constexpr bool kVarlen = true;" in source.read_text()


def test_an_expanded_output_gradient_is_copied_before_its_tensor_map():
    """dO of (o.sum(1) * w).sum().backward() has a stride of 0 over S, which no tensor map takes: a dense copy."""
    torch = pytest.importorskip("torch")
    from codegen.backward import _check_like

    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    expanded = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16).expand(2, 8, 4, 64)
    assert expanded.stride(1) == 0
    dense = _check_like("do", expanded, q, "bshd")
    assert dense.is_contiguous() and torch.equal(dense, expanded)
    kept = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    assert _check_like("do", kept, q, "bshd") is kept  # already readable in place: no copy
