"""`gen.py bench --matrix decode` off the GPU: the matrix's cases and their skips, the KV bandwidth and ratio
arithmetic, the JSON rows and files, the tables, the command line, and one case run end to end on CPU tensors
(real torch SDPA, a stand-in torch.cuda and a stand-in attention_with_kvcache)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types

import pytest

from bench import decode, gpu_run
from bench.cases import BenchUsageError
from bench.cli import bench_main
from bench.config import DECODE_IMPLS, DECODE_MATRIX, parse_config
from bench.decode import (ROW_KEYS, DecodeCase, DecodeRow, copy_bandwidth_gbs, decode_cases, decode_json,
                          decode_table, finalize_decode, kv_gbs, save_decode, skipped_rows, summary_line)
from bench.report import RUN_KEYS
from codegen import check
from tests.cpu_stand_ins import CpuTorch

B32 = DecodeCase(32, 1, 8192)


# ---------------------------------------------------------------------------------------------- the matrix


def test_matrix_is_the_issues_cases():
    cases = decode_cases()
    assert len(cases) == 20 and len(set(cases)) == 20
    assert all(c.dtype == "bf16" for c in cases)
    grid = [c for c in cases if (c.q_len, c.heads, c.kv_heads, c.dim, c.page_size) == (1, 32, 8, 128, 0)]
    assert {(c.batch, c.cache_len) for c in grid} == {(b, s) for b in (1, 8, 32, 128) for s in (2048, 8192, 32768)}
    assert len(grid) == 12
    assert DecodeCase(32, 4, 8192) in cases and DecodeCase(32, 8, 8192) in cases
    assert DecodeCase(32, 1, 8192, heads=64, kv_heads=8) in cases
    assert DecodeCase(32, 1, 8192, dim=64) in cases and DecodeCase(32, 1, 8192, dim=256) in cases
    paged = [c for c in cases if c.page_size]
    assert [(c.batch, c.cache_len, c.page_size) for c in paged] == [(32, 8192, 16), (32, 8192, 128), (32, 8192, 4)]


def test_every_case_fits_the_h200():
    for case in decode_cases():
        assert case.planned_skip() is None, case
    assert DecodeCase(32, 1, 8192, page_size=16).memory_bytes > DecodeCase(32, 1, 8192).memory_bytes  # its copy
    biggest = DecodeCase(128, 1, 32768)
    assert biggest.kv_bytes == 16 * 2**30 and biggest.input_sets == 1
    assert max(c.memory_bytes for c in decode_cases()) == biggest.memory_bytes < 24 * 2**30
    assert biggest.planned_skip(memory_bytes=16 * 2**30).startswith("does not fit: needs 2")


SKIP = "does not fit: needs 200.0 GiB, 139.0 GiB free"


def test_skipped_rows_cover_every_implementation():
    rows = skipped_rows(B32, SKIP)
    assert [r.impl for r in rows] == list(DECODE_IMPLS) == ["flashgen", "cudnn", "flash", "efficient"]
    assert all(r.skipped == SKIP and r.ms is None and not r.ok for r in rows)
    paged = skipped_rows(DecodeCase(32, 1, 8192, page_size=16), SKIP)  # cuDNN's own paged read as well
    assert [r.impl for r in paged] == list(DECODE_IMPLS) + ["cudnn_paged"] == list(decode.decode_impls(paged[0].case))


def test_small_caches_rotate_input_sets_past_l2():
    tiny = DecodeCase(1, 1, 2048)
    assert tiny.kv_bytes == 2048 * 8 * 128 * 2 * 2 == 8 * 2**20
    assert tiny.input_sets == decode.MAX_DECODE_SETS == 16
    assert DecodeCase(1, 1, 8192).input_sets == 7  # 32 MiB + q, o: ceil(200 MiB / that)
    assert DecodeCase(8, 1, 8192).input_sets == 1 and B32.input_sets == 1
    assert B32.check_seqs == 2 and tiny.check_seqs == 1


def test_labels_name_every_dimension():
    assert B32.label == "B=32 S_q=1 S_k=8192 H=32/8 D=128 bf16"
    assert DecodeCase(32, 1, 8192, page_size=128).label.endswith(" page128")
    with pytest.raises(BenchUsageError, match="multiple"):
        DecodeCase(1, 1, 64, heads=12, kv_heads=8)


# ---------------------------------------------------------------------------------------------- arithmetic


def test_kv_bandwidth_and_copy_bandwidth():
    assert B32.kv_bytes == 32 * 8192 * 8 * 128 * 2 * 2 == 2**30
    assert kv_gbs(B32, 0.5) == pytest.approx(2**30 / 0.5e-3 / 1e9)  # 2147.5 GB/s
    assert kv_gbs(B32, None) is None and kv_gbs(B32, 0.0) is None and kv_gbs(B32, math.inf) is None
    assert copy_bandwidth_gbs(2 * 2**30, 1.0) == pytest.approx(2 * 2 * 2**30 / 1e-3 / 1e9)  # read + write
    assert DecodeCase(32, 1, 8192, dim=256).kv_bytes == 2 * B32.kv_bytes
    assert DecodeCase(32, 1, 8192, heads=64).kv_bytes == B32.kv_bytes  # query heads read no more K/V


def _measured(case=B32):
    return [DecodeRow("cudnn", case, ms=0.5, call_ms=0.6, rel_err=2e-3),
            DecodeRow("flash", case, ms=1.0, rel_err=3e-3),
            DecodeRow("efficient", case, skipped="views: No viable backend"),
            DecodeRow("flashgen", case, ms=0.4, call_ms=0.5, rel_err=2e-3, num_splits=4)]


def test_ratios_to_cudnn_and_share_of_copy_bandwidth():
    rows = finalize_decode(_measured(), copy_gbs=4000.0)
    by = {r.impl: r for r in rows}
    assert by["flashgen"].ratio_to_cudnn == pytest.approx(0.5 / 0.4)
    assert by["flashgen"].call_vs_cudnn == pytest.approx(0.6 / 0.5)
    assert by["flash"].ratio_to_cudnn == pytest.approx(0.5) and by["flash"].call_vs_cudnn is None
    assert by["cudnn"].ratio_to_cudnn == 1.0
    assert by["efficient"].ratio_to_cudnn is None and by["efficient"].kv_gbs is None
    assert by["flashgen"].kv_gbs == pytest.approx(2**30 / 0.4e-3 / 1e9)
    assert by["flashgen"].kv_pct_of_copy == pytest.approx(100 * by["flashgen"].kv_gbs / 4000.0)
    assert all(r.copy_gbs == 4000.0 for r in rows)
    # a case without a cuDNN time has no ratios
    alone = finalize_decode([DecodeRow("cudnn", B32, error="boom"), DecodeRow("flashgen", B32, ms=0.4)], 4000.0)
    assert all(r.ratio_to_cudnn is None for r in alone)


# ---------------------------------------------------------------------------------------------- rows and files


META = {"gpu": "NVIDIA H200", "driver_version": "580.1", "torch": "2.9.0", "cudnn": 91000, "triton": None,
        "date_utc": "2026-12-01 12:00:00 UTC", "date_utc_stamp": "20261201T120000Z", "flashgen_commit": "abc",
        "flashgen_tree": "def", "flashgen_source_sha256": "0" * 64, "command": "gen.py bench --matrix decode"}


def _result_rows():
    paged = DecodeCase(32, 1, 8192, page_size=16)
    rows = _measured() + _measured(DecodeCase(1, 1, 2048))
    # a NaN output: a time, but an error and rel_err inf (written as null)
    rows[-1] = DecodeRow("flashgen", DecodeCase(1, 1, 2048), ms=0.01, rel_err=math.inf, error="output holds NaN or inf")
    return finalize_decode(rows + skipped_rows(paged, SKIP), copy_gbs=4000.0)


def test_json_rows_carry_the_issue_keys_and_the_run_metadata():
    rows = decode_json(META, _result_rows())
    required = {"impl", "B", "S_q", "S_k", "H", "H_kv", "D", "dtype", "page_size", "ms", "call_ms", "kv_gbs",
                "copy_gbs", "ratio_to_cudnn", "rel_err", "num_splits", "notes", "skipped", "error"}
    assert required <= set(ROW_KEYS)
    for row in rows:
        assert list(row) == list(ROW_KEYS) + list(RUN_KEYS)
        assert row["gpu"] == "NVIDIA H200" and row["flashgen_commit"] == "abc" and row["command"] == META["command"]
    first = rows[3]
    assert (first["impl"], first["B"], first["S_q"], first["S_k"], first["H"], first["H_kv"], first["D"],
            first["dtype"], first["page_size"], first["num_splits"]) == ("flashgen", 32, 1, 8192, 32, 8, 128, "bf16",
                                                                         0, 4)
    assert first["ratio_to_cudnn"] == pytest.approx(1.25) and first["rel_err_seqs"] == 2
    assert rows[7]["rel_err"] is None and rows[7]["kv_gbs"] is None and rows[7]["ratio_to_cudnn"] is None
    assert rows[7]["ms"] == 0.01 and rows[7]["error"] == "output holds NaN or inf"
    assert rows[-1]["skipped"] == SKIP and rows[-1]["page_size"] == 16 and rows[-1]["ms"] is None
    json.dumps(rows, allow_nan=False)


def test_save_writes_stamped_and_h200_latest_decode_files(tmp_path):
    paths = save_decode(META, _result_rows(), tmp_path)
    assert [p.name for p in paths] == ["nvidia-h200-20261201T120000Z-decode.json",
                                       "nvidia-h200-20261201T120000Z-decode.md",
                                       "h200-latest-decode.json", "h200-latest-decode.md"]
    assert paths[0].read_text() == paths[2].read_text() and paths[1].read_text() == paths[3].read_text()
    assert len(json.loads(paths[0].read_text())) == len(_result_rows())
    md = paths[1].read_text()
    assert "# flashgen bench (decode)" in md and "- gpu: NVIDIA H200" in md and SKIP in md
    assert "geomean flashgen vs cuDNN" in md and "## B=32 S_q=1 S_k=8192 H=32/8 D=128 bf16" in md
    other = save_decode({**META, "gpu": "NVIDIA H100 80GB HBM3"}, _result_rows(), tmp_path / "h100")
    assert [p.name for p in other] == ["nvidia-h100-80gb-hbm3-20261201T120000Z-decode.json",
                                       "nvidia-h100-80gb-hbm3-20261201T120000Z-decode.md"]
    assert not (tmp_path / "h200-latest.json").exists()  # the forward matrix's latest files are not touched


def test_table_and_summary_line():
    rows = _result_rows()
    table = decode_table(rows)
    assert table[0] == ["case", "cuDNN ms", "cuDNN KV GB/s", "% copy", "flashgen ms", "flashgen vs cuDNN",
                        "call vs cuDNN", "flash vs cuDNN", "efficient vs cuDNN", "vs cuDNN paged", "splits"]
    b32 = table[1]
    assert b32[0] == B32.label and b32[1] == "0.5000" and b32[2] == f"{2**30 / 0.5e-3 / 1e9:.0f}"
    assert b32[3] == f"{100 * 2**30 / 0.5e-3 / 1e9 / 4000:.0f}%"
    assert b32[4:] == ["0.4000", "1.250x", "1.200x", "0.500x", "skipped", "-", "4"]
    assert table[2][4] == "0.0100" and table[2][5] == "error"  # flashgen's NaN output: no ratio
    assert table[3][1] == f"skipped: {SKIP}"
    line = summary_line(rows)
    assert line.startswith("geomean flashgen vs cuDNN: 1.250x over 1/2 cases")
    assert "copy bandwidth 4000 GB/s" in line and "paged read" not in line


PAGE16 = DecodeCase(32, 1, 8192, page_size=16)


def test_paged_rows_compare_with_cudnns_paged_read_too():
    rows = finalize_decode(_measured(PAGE16) + [DecodeRow("cudnn_paged", PAGE16, ms=0.55, rel_err=2e-3)], 4000.0)
    by = {r.impl: r for r in rows}
    assert by["flashgen"].ratio_to_cudnn_paged == pytest.approx(0.55 / 0.4)
    assert by["cudnn_paged"].ratio_to_cudnn == pytest.approx(0.5 / 0.55)  # what paging costs cuDNN
    assert by["cudnn"].ratio_to_cudnn_paged == pytest.approx(0.55 / 0.5)
    assert decode_json(META, rows)[3]["ratio_to_cudnn_paged"] == pytest.approx(1.375)
    table = decode_table(rows)
    assert table[1][9] == "1.375x" and table[1][5] == "1.250x"
    assert summary_line(rows).endswith("; flashgen vs cuDNN's paged read: page 16 1.375x")
    # without cuDNN's paged read (no frontend), the cell says why and the dense rows have none
    skipped = finalize_decode(_measured(PAGE16) + [DecodeRow("cudnn_paged", PAGE16, skipped="no frontend")], 4000.0)
    assert decode_table(skipped)[1][9] == "skipped" and decode_table(_measured())[1][9] == "-"
    assert summary_line(skipped).endswith("; cuDNN's paged read: no frontend")  # said, not silently left out
    assert all(r.ratio_to_cudnn_paged is None for r in finalize_decode(_measured(), 4000.0))


# ---------------------------------------------------------------------------------------------- command line


def test_matrix_decode_parses_to_the_decode_mode():
    config = parse_config(["--matrix", "decode", "--iters", "50", "--no-save"])
    assert config.mode == DECODE_MATRIX == "decode" and config.matrix == "decode"
    assert config.peers == DECODE_IMPLS and config.cases == () and config.iters == 50 and config.out is None
    assert config.command == "gen.py bench --matrix decode --iters 50 --no-save"
    assert parse_config(["--matrix", "decode"]).out is not None
    # the forward modes keep their defaults
    assert parse_config(["--shape", "1,1024,64,128"]).cases[0].dtype == "f16"
    assert parse_config(["--matrix"]).matrix == "default"


@pytest.mark.parametrize("extra, flag", [(["--shape", "1,1024,64,128"], "--shape"), (["--varlen", "100,200"], "--varlen"),
                                         (["--dtype", "bf16"], "--dtype"), (["--causal"], "--causal"),
                                         (["--peers", "cudnn"], "--peers"), (["--all-peers"], "--all-peers"),
                                         (["--split", "64,64"], "--split"), (["--heads", "8"], "--heads")])
def test_matrix_decode_refuses_the_options_it_does_not_take(extra, flag):
    with pytest.raises(BenchUsageError, match=f"drop {flag}"):
        parse_config(["--matrix", "decode", *extra])


def test_bench_main_reports_decode_usage_errors_in_one_line(capsys):
    assert bench_main(["--matrix", "decode", "--shape", "1,1024,64,128"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --matrix decode runs its own cases") and err.count("\n") == 1


def test_bench_main_without_a_gpu_says_so(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main(["--matrix", "decode", "--no-save"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- one case on CPU


def test_one_case_runs_end_to_end_on_cpu_tensors(monkeypatch):
    """The GPU path with CPU stand-ins: SDPA's MATH backend stands in for cuDNN (the CPU has no cuDNN), the
    efficient backend refuses CPU tensors (a skipped row with its reasons, not a crash), flash takes them, and
    a CPU attention_with_kvcache (kvcache_reference in bf16) registers a launcher with 3 splits."""
    torch = pytest.importorskip("torch")
    import codegen.decode as cdecode

    launchers: dict = {}

    def fake_kvcache(q, k_cache, v_cache, cache_seqlens, *, causal=True, out=None, **_):
        launchers.setdefault("the case's call", types.SimpleNamespace(splits=3))
        o = check.kvcache_reference(q, k_cache, v_cache, cache_seqlens.tolist(), causal=causal, same_dtype=True)[0]
        return out.copy_(o) if out is not None else o

    monkeypatch.setattr(cdecode, "_LAUNCHERS", launchers)
    monkeypatch.setattr(cdecode, "attention_with_kvcache", fake_kvcache)
    monkeypatch.setattr(gpu_run, "cuda_fault", lambda torch: None)
    monkeypatch.setattr(decode, "make_decode_inputs", functools.partial(decode.make_decode_inputs, device="cpu"))
    monkeypatch.setitem(decode.SDPA_BACKENDS, "cudnn", "MATH")
    case = DecodeCase(3, 2, 64, heads=4, kv_heads=2, dim=16)
    config = parse_config(["--matrix", "decode", "--iters", "10", "--warmup", "1", "--no-save"])
    placed = []  # decode times each call right after its kernel, even under a config built for apart call rounds
    together = gpu_run.measure_together
    monkeypatch.setattr(gpu_run, "measure_together",
                        lambda torch, entries, case, inputs, config, **k: (placed.append(config.call_rounds),
                                                                            together(torch, entries, case, inputs,
                                                                                     config, **k))[1])
    lines = []
    rows, fault = decode.bench_decode_case(CpuTorch(torch), case, dataclasses.replace(config, call_rounds="apart"),
                                           lines.append)
    assert fault is None and placed == ["shared"]
    by = {r.impl: r for r in rows}
    assert list(by) == ["cudnn", "flash", "efficient", "flashgen"]
    assert by["efficient"].skipped.startswith("views, contiguous, repeated: ")  # one reason for all three forms
    for impl in ("cudnn", "flash", "flashgen"):
        r = by[impl]
        assert r.ok and r.iters == 10 and r.rel_err < 2e-2, (impl, r)
        assert "first 2 of 3 sequences" in r.notes
    assert by["flashgen"].num_splits == 3 and by["flashgen"].call_ms is not None and by["flashgen"].call_error is None
    assert "re-encodes" not in by["flashgen"].notes  # 16 input sets fit the launcher's 256 maps per cache
    assert by["cudnn"].call_ms is not None and by["flash"].call_ms is None
    assert by["cudnn"].notes.endswith(decode.SDPA_FORM_NOTES["views"])
    final = {r.impl: r for r in finalize_decode(rows, copy_gbs=1000.0)}
    assert final["flashgen"].ratio_to_cudnn == pytest.approx(by["cudnn"].ms / by["flashgen"].ms)
    assert any(line.strip().startswith("flashgen") and "splits 3" in line for line in lines)


@pytest.mark.parametrize("frontend", [True, False])
def test_a_paged_case_times_cudnns_paged_read_of_flashgens_pool(monkeypatch, frontend):
    """A paged case on CPU tensors: flashgen (a stand-in gathering its pages) and cuDNN's paged read (the stand-in
    frontend of tests.cpu_stand_ins) read one shared paged copy, each checked against the dense reference; without
    the frontend, cuDNN's paged row is skipped with the reason and the others still run."""
    torch = pytest.importorskip("torch")
    import sys

    import codegen.decode as cdecode
    from tests.cpu_stand_ins import FakeCudnnGraph, fake_cudnn

    pools = set()
    monkeypatch.setattr(FakeCudnnGraph, "made", [])

    def fake_kvcache(q, k_cache, v_cache, cache_seqlens, *, causal=True, out=None, page_table=None, **_):
        pools.add(k_cache.data_ptr())
        k, v = (c[page_table.long()].flatten(1, 2) for c in (k_cache, v_cache))  # (B, S, H_kv, D) in key order
        o = check.kvcache_reference(q, k, v, cache_seqlens.tolist(), causal=causal, same_dtype=True)[0]
        return out.copy_(o) if out is not None else o

    monkeypatch.setitem(sys.modules, "cudnn", fake_cudnn() if frontend else None)
    monkeypatch.setattr(cdecode, "_LAUNCHERS", {})
    monkeypatch.setattr(cdecode, "attention_with_kvcache", fake_kvcache)
    monkeypatch.setattr(gpu_run, "cuda_fault", lambda torch: None)
    monkeypatch.setattr(decode, "make_decode_inputs", functools.partial(decode.make_decode_inputs, device="cpu"))
    monkeypatch.setitem(decode.SDPA_BACKENDS, "cudnn", "MATH")
    case = DecodeCase(3, 1, 64, heads=4, kv_heads=2, dim=16, page_size=8)
    config = parse_config(["--matrix", "decode", "--iters", "4", "--warmup", "1", "--no-save"])
    rows, fault = decode.bench_decode_case(CpuTorch(torch), case, config, lambda line: None)
    by = {r.impl: r for r in finalize_decode(rows, copy_gbs=1000.0)}
    assert fault is None and set(by) == {"cudnn", "flash", "efficient", "cudnn_paged", "flashgen"}
    assert by["flashgen"].ok and by["flashgen"].rel_err < 2e-2
    assert len(pools) == case.input_sets  # one paged copy a set, whoever reads it
    if frontend:
        assert by["cudnn_paged"].ok and by["cudnn_paged"].rel_err < 2e-2 and by["cudnn_paged"].call_ms is None
        assert {g.last_pack[g.sdpa_kwargs["k"]].data_ptr() for g in FakeCudnnGraph.made} == pools  # the same pools
        assert by["flashgen"].ratio_to_cudnn_paged == pytest.approx(by["cudnn_paged"].ms / by["flashgen"].ms)
    else:
        assert "frontend does not import" in by["cudnn_paged"].skipped
        assert by["flashgen"].ratio_to_cudnn_paged is None


def test_refusals_share_a_reason_per_form():
    assert decode._joined_reasons([("views", "no GQA"), ("contiguous", "no GQA"), ("repeated", "needs 9 GiB")]) == (
        "views, contiguous: no GQA; repeated: needs 9 GiB")


def test_a_copy_that_does_not_fit_is_a_reason_not_a_crash(monkeypatch):
    torch = pytest.importorskip("torch")
    case = DecodeCase(1, 1, 64, heads=4, kv_heads=2, dim=16)
    inputs = decode.make_decode_inputs(torch, case, device="cpu")
    from bench.peers import Unavailable

    with pytest.raises(Unavailable, match="contiguous copies need"):
        decode._sdpa_tensors(CpuTorch(torch, free=2**20), inputs.sets, case, "contiguous")
    views = decode._sdpa_tensors(CpuTorch(torch, free=2**20), inputs.sets, case, "views")
    assert views[0][1].shape == (1, 2, 64, 16) and views[0][1].data_ptr() == inputs.sets[0][1].data_ptr()
    repeated = decode._sdpa_tensors(CpuTorch(torch), inputs.sets, case, "repeated")
    assert repeated[0][1].shape == (1, 4, 64, 16) and repeated[0][1].is_contiguous()
    assert inputs.ref.shape == (1, 1, 4, 16) and inputs.ref.dtype == torch.float64


def test_gpu_check_runs_the_decode_matrix_with_its_own_peers():
    """gen.py bench refuses --peers with --matrix decode, so scripts/gpu_check.py passes none there."""
    import importlib.util

    from bench.report import ROOT

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.matrix_peers("decode", "flashgen,cudnn") == [] == gpu_check.matrix_peers("fa4", "x")
    assert gpu_check.matrix_peers("coverage", "flashgen,cudnn") == ["--peers", "flashgen,cudnn"]
    with pytest.raises(BenchUsageError, match="drop --peers"):  # what the old call met: the matrix never ran
        parse_config(["--matrix", "decode", "--peers", "flashgen,cudnn"])


@pytest.mark.parametrize("span", [0, 1, 3, 4])
def test_a_paged_copy_holds_every_page_where_its_table_says(span):
    torch = pytest.importorskip("torch")
    k = torch.randn(3, 16, 2, 8)
    pages, table = decode.paged_copy(torch, k, 4, span=span)
    assert pages.shape == (12, 4, 2, 8) and table.shape == (3, 4) and table.dtype == torch.int32
    assert torch.equal(pages[table.flatten().long()].reshape(k.shape), k)
    entries = table.flatten().tolist()
    assert sorted(entries) == list(range(12))
    assert (entries == list(range(12))) is (span == 1)  # in key order only when asked
    if span:  # each run of `span` keys' pages stays within its own run of the pool
        assert all(e // span == i // span for i, e in enumerate(entries))


def test_a_paged_copy_refuses_a_span_that_does_not_divide_the_pool():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="divide"):
        decode.paged_copy(torch, torch.randn(3, 16, 2, 8), 4, span=5)
