"""`gen.py bench --matrix backward` off the GPU: the matrix's cases, the FLOP and ratio arithmetic, how the backward
and forward + backward entries of measure_together become one row, the JSON rows and files, the tables, the command
line, and one case run end to end on CPU tensors (real torch SDPA and autograd, a stand-in torch.cuda and stand-in
codegen.attention / codegen.backward.attention_backward computed in float64)."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import types

import pytest

from bench import backward, gpu_run
from bench.backward import (FWD_BWD, ROW_KEYS, BackwardRow, backward_cases, backward_flops, backward_json,
                            backward_table, finalize_backward, fwd_bwd_flops, merge_rows, save_backward, skipped_rows,
                            summary_line)
from bench.cases import BenchUsageError, Case
from bench.cli import bench_main
from bench.config import BACKWARD_IMPLS, BACKWARD_MATRIX, parse_config
from bench.report import ROOT, RUN_KEYS, Row
from tests.cpu_stand_ins import CpuTorch

BIG = Case(4, 4096, 32, 128, "bf16")
GQA = Case(1, 8192, 32, 128, "bf16", True, kv_heads=8)


# ---------------------------------------------------------------------------------------------- the matrix


def test_matrix_is_the_issues_cases():
    shapes = [(c.batch, c.seq, c.heads, c.dim, c.kv_heads, c.dtype, c.causal) for c in backward_cases()]
    assert shapes == [
        (4, 4096, 32, 128, 32, "bf16", False), (4, 4096, 32, 128, 32, "bf16", True),
        (1, 16384, 16, 128, 16, "bf16", False), (1, 16384, 16, 128, 16, "bf16", True),
        (16, 1024, 32, 64, 32, "bf16", False), (2, 4096, 16, 256, 16, "bf16", False),
        (1, 8192, 32, 128, 8, "bf16", True),
        (4, 4096, 32, 128, 32, "f16", False),
    ]
    assert not any(c.varlen or c.chunked for c in backward_cases())
    assert BACKWARD_IMPLS == ("flashgen", "cudnn", "flash")


def test_backward_flops_follow_the_forward_convention():
    assert backward_flops(BIG) == 10 * 4 * 32 * 4096 * 4096 * 128 == 2.5 * BIG.flops
    causal = Case(4, 4096, 32, 128, "bf16", True)
    assert backward_flops(causal) == backward_flops(BIG) / 2
    assert fwd_bwd_flops(BIG) == 3.5 * BIG.flops
    assert backward_flops(GQA) == backward_flops(Case(1, 8192, 32, 128, "bf16", True))  # K/V heads: same work
    row = BackwardRow("flashgen", BIG, ms=2.0, fwd_bwd_ms=3.0)
    assert row.tflops == pytest.approx(backward_flops(BIG) / 2e-3 / 1e12)
    assert row.fwd_bwd_tflops == pytest.approx(fwd_bwd_flops(BIG) / 3e-3 / 1e12)
    assert BackwardRow("flash", BIG, skipped="refused").tflops is None


# ---------------------------------------------------------------------------------------------- rows


def _measured(case=BIG):
    """measure_together's rows for one case: each implementation's backward entry and its FWD_BWD entry."""
    return [Row("cudnn", case, ms=2.0, rel_err=4e-3, call_ms=2.1, call_rel_err=4e-3, iters=50),
            Row("cudnn" + FWD_BWD, case, ms=3.0, rel_err=4e-3, iters=50),
            Row("flash", case, skipped="No available kernel (head dim 256)"),
            Row("flash" + FWD_BWD, case, skipped="No available kernel (head dim 256)"),
            Row("flashgen", case, ms=1.6, rel_err=3e-3, call_ms=1.7, call_rel_err=3e-3, iters=60),
            Row("flashgen" + FWD_BWD, case, ms=2.5, rel_err=9e-3, iters=40)]


ERRORS = {"cudnn": (4e-3, 5e-3, 3e-3), "flashgen": (3e-3, 3.5e-3, 2e-3), "flashgen" + FWD_BWD: (9e-3,) * 3}


def test_merge_makes_one_row_per_implementation():
    rows = merge_rows(BIG, _measured(), ERRORS)
    assert [r.impl for r in rows] == ["cudnn", "flash", "flashgen"]
    cudnn, flash, ours = rows
    assert (cudnn.ms, cudnn.call_ms, cudnn.fwd_bwd_ms, cudnn.iters) == (2.0, 2.1, 3.0, 50)
    assert (cudnn.rel_err_dq, cudnn.rel_err_dk, cudnn.rel_err_dv, cudnn.rel_err) == (4e-3, 5e-3, 3e-3, 5e-3)
    assert cudnn.fwd_bwd_ok and cudnn.notes == backward.NOTES["cudnn"]
    assert flash.skipped.startswith("No available kernel") and flash.fwd_bwd_error is None and flash.notes is None
    assert (ours.ms, ours.call_ms, ours.fwd_bwd_ms, ours.rel_err) == (1.6, 1.7, 2.5, 3.5e-3)
    # its forward + backward is 3x the backward's error off: a time, but not one that counts
    assert ours.fwd_bwd_error == "wrong gradients: rel err 9.00e-03, the backward's 3.00e-03" and not ours.fwd_bwd_ok
    # without per-gradient errors (the first call failed), the combined one stands; without an FWD_BWD entry, so says
    alone = merge_rows(BIG, [Row("flashgen", BIG, ms=1.0, rel_err=2e-3)], {})
    assert alone[0].rel_err == 2e-3 and alone[0].rel_err_dq is None and alone[0].fwd_bwd_error == "not run"


def test_ratios_to_cudnn_for_the_backward_the_call_and_forward_plus_backward():
    rows = finalize_backward(merge_rows(BIG, _measured(), ERRORS))
    by = {r.impl: r for r in rows}
    assert by["flashgen"].ratio_to_cudnn == pytest.approx(2.0 / 1.6)
    assert by["flashgen"].call_vs_cudnn == pytest.approx(2.1 / 1.7)
    assert by["flashgen"].fwd_bwd_vs_cudnn is None  # its forward + backward is wrong
    assert by["cudnn"].ratio_to_cudnn == by["cudnn"].fwd_bwd_vs_cudnn == 1.0
    assert by["flash"].ratio_to_cudnn is None and by["flash"].fwd_bwd_vs_cudnn is None
    fixed = [r if r.impl != "flashgen" + FWD_BWD else Row(r.impl, BIG, ms=2.5, rel_err=3e-3) for r in _measured()]
    by = {r.impl: r for r in finalize_backward(merge_rows(BIG, fixed, ERRORS))}
    assert by["flashgen"].fwd_bwd_vs_cudnn == pytest.approx(3.0 / 2.5)
    lonely = finalize_backward([BackwardRow("cudnn", BIG, error="boom"), BackwardRow("flashgen", BIG, ms=1.0)])
    assert all(r.ratio_to_cudnn is None for r in lonely)


def test_skipped_rows_cover_every_implementation():
    rows = skipped_rows(GQA, "CUDA context lost", error=True)
    assert [r.impl for r in rows] == list(BACKWARD_IMPLS)
    assert all(r.error == "CUDA context lost" and not r.ok for r in rows)
    assert [r.impl for r in skipped_rows(GQA, "x", ("flashgen", "cudnn"))] == ["flashgen", "cudnn"]


# ---------------------------------------------------------------------------------------------- rows and files


META = {"gpu": "NVIDIA H200", "driver_version": "580.159.04", "torch": "2.11.0", "cudnn": 91900, "triton": "3.6.0",
        "date_utc": "2026-12-02 12:00:00 UTC", "date_utc_stamp": "20261202T120000Z", "flashgen_commit": "abc",
        "flashgen_tree": "def", "flashgen_source_sha256": "0" * 64, "command": "gen.py bench --matrix backward"}


def _result_rows():
    rows = merge_rows(BIG, _measured(), ERRORS) + merge_rows(GQA, _measured(GQA), {})
    rows[-1] = BackwardRow("flashgen", GQA, ms=0.5, rel_err=math.inf, error="output holds NaN or inf")
    return finalize_backward(rows)


def test_json_rows_carry_the_forward_keys_and_the_run_metadata():
    rows = backward_json(META, _result_rows())
    forward = {"impl", "B", "S", "S_k", "H", "H_kv", "D", "causal", "dtype", "ms", "tflops", "snr_db", "rel_err",
               "ratio_to_cudnn", "call_ms", "call_vs_cudnn", "call_rel_err", "call_error", "iters", "error", "skipped"}
    assert forward <= set(ROW_KEYS)
    assert {"fwd_bwd_ms", "fwd_bwd_tflops", "fwd_bwd_vs_cudnn", "rel_err_dq", "rel_err_dk", "rel_err_dv",
            "fwd_bwd_error", "flops", "notes"} <= set(ROW_KEYS)
    for row in rows:
        assert list(row) == list(ROW_KEYS) + list(RUN_KEYS)
        assert row["gpu"] == "NVIDIA H200" and row["flashgen_commit"] == "abc" and row["command"] == META["command"]
    ours = rows[2]
    assert (ours["impl"], ours["B"], ours["S"], ours["S_k"], ours["H"], ours["H_kv"], ours["D"], ours["causal"],
            ours["dtype"]) == ("flashgen", 4, 4096, 4096, 32, 32, 128, False, "bf16")
    assert ours["ratio_to_cudnn"] == pytest.approx(1.25) and ours["rel_err_batches"] == 1
    assert ours["snr_db"] == pytest.approx(-20 * math.log10(3.5e-3)) and ours["flops"] == backward_flops(BIG)
    assert ours["tflops"] == pytest.approx(backward_flops(BIG) / 1.6e-3 / 1e12)
    nan = rows[-1]
    assert nan["ms"] == 0.5 and nan["rel_err"] is None and nan["snr_db"] is None and nan["ratio_to_cudnn"] is None
    assert rows[1]["skipped"].startswith("No available kernel") and rows[1]["ms"] is None
    json.dumps(rows, allow_nan=False)


def test_save_writes_stamped_and_h200_latest_backward_files(tmp_path):
    paths = save_backward(META, _result_rows(), tmp_path)
    assert [p.name for p in paths] == ["nvidia-h200-20261202T120000Z-backward.json",
                                       "nvidia-h200-20261202T120000Z-backward.md",
                                       "h200-latest-backward.json", "h200-latest-backward.md"]
    assert paths[0].read_text() == paths[2].read_text() and paths[1].read_text() == paths[3].read_text()
    assert len(json.loads(paths[0].read_text())) == len(_result_rows())
    md = paths[1].read_text()
    assert "# flashgen bench (backward)" in md and "- gpu: NVIDIA H200" in md and "- cudnn: 91900" in md
    assert "geomean flashgen vs cuDNN, backward" in md and f"## {BIG.label}" in md and f"## {GQA.label}" in md
    assert "No available kernel (head dim 256)" in md
    other = save_backward({**META, "gpu": "NVIDIA H100 80GB HBM3"}, _result_rows(), tmp_path / "h100")
    assert [p.name for p in other] == ["nvidia-h100-80gb-hbm3-20261202T120000Z-backward.json",
                                       "nvidia-h100-80gb-hbm3-20261202T120000Z-backward.md"]
    assert not (tmp_path / "h200-latest.json").exists()  # the forward matrix's latest files are not touched


def test_table_and_summary_line():
    rows = _result_rows()
    table = backward_table(rows)
    assert table[0] == list(backward.TABLE_HEADER)
    big = table[1]
    assert big[:5] == [BIG.label, "2.000", f"{backward_flops(BIG) / 2e-3 / 1e12:.0f}", "1.600",
                       f"{backward_flops(BIG) / 1.6e-3 / 1e12:.0f}"]
    assert big[5:] == ["1.250x", f"{2.1 / 1.7:.3f}x", "-", "skipped", "skipped", "3.50e-03", "5.00e-03"]
    assert table[2][3] == "0.500" and table[2][5] == "error"  # NaN gradients: a time, no ratio
    line = summary_line(rows)
    assert line.startswith("geomean flashgen vs cuDNN, backward: 1.250x over 1/2 cases")
    assert f"(call: {2.1 / 1.7:.3f}x over 1/2" in line and "flash: - over 0/2" in line


# ---------------------------------------------------------------------------------------------- command line


def test_matrix_backward_parses_to_the_backward_mode():
    config = parse_config(["--matrix", "backward", "--iters", "30", "--no-save"])
    assert config.mode == BACKWARD_MATRIX == "backward" and config.matrix == "backward"
    assert config.peers == BACKWARD_IMPLS and config.cases == () and config.iters == 30 and config.out is None
    assert config.command == "gen.py bench --matrix backward --iters 30 --no-save"
    assert parse_config(["--matrix", "backward", "--peers", "flash,flashgen"]).peers == BACKWARD_IMPLS
    assert parse_config(["--matrix", "backward", "--peers", "flashgen"]).peers == ("flashgen", "cudnn")
    assert parse_config(["--matrix", "backward"]).out is not None


def test_matrix_backward_refuses_other_implementations_and_options():
    with pytest.raises(BenchUsageError, match=r"unknown implementation\(s\) \['flex'\] .* choose from flashgen, cudnn"):
        parse_config(["--matrix", "backward", "--peers", "flashgen,flex"])
    for extra, flag in ((["--shape", "1,1024,64,128"], "--shape"), (["--dtype", "bf16"], "--dtype"),
                        (["--causal"], "--causal"), (["--all-peers"], "--all-peers"), (["--split", "64,64"], "--split"),
                        (["--varlen", "100,200"], "--varlen")):
        with pytest.raises(BenchUsageError, match=f"--matrix backward runs its own cases .*drop {flag}"):
            parse_config(["--matrix", "backward", *extra])
    with pytest.raises(BenchUsageError, match="drop --peers"):  # decode still takes none
        parse_config(["--matrix", "decode", "--peers", "cudnn"])


def test_bench_main_reports_backward_usage_errors_in_one_line(capsys):
    assert bench_main(["--matrix", "backward", "--causal"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --matrix backward runs its own cases") and err.count("\n") == 1


def test_bench_main_without_a_gpu_says_so(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main(["--matrix", "backward", "--no-save"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_nothing_imports_torch_until_the_matrix_runs():
    code = ("import sys; import bench.backward, bench.cli; from bench.config import parse_config; "
            "parse_config(['--matrix', 'backward']); assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _script(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_the_backward_matrix_with_its_own_peers():
    assert _script("gpu_check").matrix_peers("backward", "flashgen,cudnn,flash,flex") == []


# ---------------------------------------------------------------------------------------------- one case on CPU


def _stand_in_flashgen(monkeypatch, check):
    """codegen.attention attached to autograd and codegen.backward.attention_backward, both float64 references
    rounded to the inputs' dtype; returns the list each attention_backward call appends to."""
    import codegen.api

    calls = []

    def attention(q, k, v, *, causal=False, return_lse=False, **_):
        o, lse = check.reference(q.double(), k.double(), v.double(), causal=causal)
        return (o.to(q.dtype), lse.float()) if return_lse else o.to(q.dtype)

    def attention_backward(q, k, v, o, lse, do, *, causal=False, **_):
        calls.append((o.shape, lse.shape))
        return tuple(g.to(q.dtype) for g in check.reference_backward(q, k, v, do, causal=causal))

    monkeypatch.setattr(codegen.api, "attention", attention)
    monkeypatch.setitem(sys.modules, "codegen.backward", types.SimpleNamespace(attention_backward=attention_backward))
    return calls


@pytest.fixture
def cpu_case(monkeypatch):
    """bench_backward_case on CPU tensors: SDPA's MATH backend stands in for cuDNN (the CPU has none)."""
    torch = pytest.importorskip("torch")
    from codegen import check

    calls = _stand_in_flashgen(monkeypatch, check)
    monkeypatch.setattr(gpu_run, "cuda_fault", lambda torch: None)
    monkeypatch.setattr(backward, "make_backward_inputs", functools.partial(backward.make_backward_inputs,
                                                                            device="cpu"))
    monkeypatch.setitem(backward.SDPA_BACKENDS, "cudnn", "MATH")

    def run(case, argv=()):
        config = parse_config(["--matrix", "backward", "--iters", "10", "--warmup", "1", "--no-save", *argv])
        lines = []
        rows, fault = backward.bench_backward_case(CpuTorch(torch), case, config, lines.append)
        assert fault is None
        return {r.impl: r for r in rows}, lines

    return run, calls


def test_one_case_runs_end_to_end_on_cpu_tensors(cpu_case):
    run, calls = cpu_case
    case = Case(3, 64, 4, 16, "bf16", True, kv_heads=2)
    by, lines = run(case)
    assert list(by) == ["cudnn", "flash", "flashgen"]
    for impl, r in by.items():
        assert r.ok and r.fwd_bwd_ok and r.iters == 10, (impl, r)
        assert r.fwd_bwd_ms is not None and r.notes == backward.NOTES[impl]
        assert max(r.rel_err_dq, r.rel_err_dk, r.rel_err_dv) == r.rel_err < 3e-2, (impl, r)
    assert by["flashgen"].rel_err < 1e-2  # float64 rounded once: better than a bf16 backward
    assert by["flashgen"].call_ms is not None and by["flashgen"].call_error is None
    assert by["cudnn"].call_ms is not None and by["flash"].call_ms is None
    assert calls and calls[0] == ((3, 64, 4, 16), (3, 4, 64))  # the kernel row is attention_backward on a saved o, lse
    final = {r.impl: r for r in finalize_backward(list(by.values()))}
    assert final["flashgen"].ratio_to_cudnn == pytest.approx(by["cudnn"].ms / by["flashgen"].ms)
    assert any(line.strip().startswith("flashgen") and "fwd+bwd" in line for line in lines)


def test_a_backend_that_refuses_is_a_skipped_row_with_its_reason(cpu_case, monkeypatch):
    run, _ = cpu_case
    monkeypatch.setitem(backward.SDPA_BACKENDS, "flash", "EFFICIENT_ATTENTION")  # no CPU kernel: SDPA refuses
    by, _ = run(Case(2, 32, 2, 16, "bf16"), ["--peers", "flash"])
    assert list(by) == ["cudnn", "flash"]
    assert by["flash"].skipped.startswith("No viable backend") and by["flash"].ms is None
    assert by["flash"].fwd_bwd_error is None and by["cudnn"].ok and by["cudnn"].call_ms is None  # no flashgen call


def _bwd_ab():
    return _script("bwd_ab")


def test_bwd_ab_reads_cases_and_trees_and_refuses_bad_ones(tmp_path):
    ab = _bwd_ab()
    assert ab.parse_case("4,4096,32,128") == (4, 4096, 32, 128, False)
    assert ab.parse_case("1,16384,16,128,c") == (1, 16384, 16, 128, True)
    for bad in ("4,4096,32", "4,4096,32,128,x"):
        with pytest.raises(SystemExit, match="expected B,S,H,D"):
            ab.parse_case(bad)
    with pytest.raises(SystemExit, match="a tree with codegen/ and bench/"):
        ab.parse_tree(f"x={tmp_path}")
    assert ab.parse_tree(f"base={ROOT}") == ("base", ROOT)


def test_bwd_ab_stops_with_the_workers_error_when_a_worker_fails(tmp_path, capsys):
    # The worker of a tree whose packages cannot import fails before timing anything; the table is not printed.
    for package in ("codegen", "bench"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("raise ImportError('broken tree')\n")
    assert _bwd_ab().main(["--tree", f"bad={tmp_path}", "--case", "1,128,1,64", "--rounds", "1"]) == 1
    err = capsys.readouterr().err
    assert "round 0 bad: worker failed" in err and "broken tree" in err


def test_bwd_ab_names_the_backwards_kernels_by_their_role():
    ab = _bwd_ab()
    name = "flashgen_bwd_sm_90a_s1000_sk1000_h8_kvh2_d128_bf16_full_st2"
    assert [ab._role(name + suffix) for suffix in ("_pre", "", "_post")] == ["pre", "main", "post"]


def test_bwd_ab_worker_measures_as_the_backward_matrix_does(cpu_case, capsys):
    """The worker's line for a case comes from bench_backward_case (here on CPU tensors with stand-ins): flashgen's
    and cuDNN's kernel and call times and their errors against float64."""
    import torch

    _bwd_ab().worker(["2,32,2,16,c"], 10, torch=CpuTorch(torch))
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert line["case"] == "2,32,2,16,c" and line["ms"] > 0 and line["cudnn_ms"] > 0
    assert line["call_ms"] > 0 and line["cudnn_call_ms"] > 0
    assert line["err"] < 1e-2 and line["cudnn_err"] < 3e-2


def test_bwd_ab_worker_stops_on_a_flashgen_row_without_a_time(cpu_case, monkeypatch):
    import torch

    def broken(*args, **kwargs):
        raise RuntimeError("kernel fault")

    monkeypatch.setitem(sys.modules, "codegen.backward", types.SimpleNamespace(attention_backward=broken))
    with pytest.raises(SystemExit, match="kernel fault"):
        _bwd_ab().worker(["2,32,2,16"], 10, torch=CpuTorch(torch))


def _bwd_sweep():
    return _script("bwd_sweep")


def test_bwd_sweep_grid_and_its_verdicts():
    sweep = _bwd_sweep()
    assert len(sweep.grid([64, 96, 128], quick=False)) == 3 * 3 * 2 * 2 * 5 * 2 + 3
    assert len(sweep.grid([128], quick=True)) == 3 * 2 * 2 + 1
    # deterministic D=96 is refused by the family (atomics), which is not a failure
    spec, status, detail = sweep.compile_one((96, "full", 0.0, True, (1000, 1000), 1, "bf16"))
    assert status == "refused" and "deterministic" in detail
    assert sweep.compile_one((64, "causal", 0.0, False, (17, 17), 1, "bf16"))[1] == "ok"


def test_bwd_sweep_exits_1_when_a_spec_fails(monkeypatch, capsys):
    sweep = _bwd_sweep()
    monkeypatch.setattr(sweep, "compile_one", lambda spec: (spec, "failed" if spec[0] == 96 else "ok", "SpillError: x"))
    assert sweep.main(["--head-dims", "64,96", "--quick", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAILED D=96" in out and "13 clean, 0 refused by the family (not failures), 13 failed" in out
    monkeypatch.setattr(sweep, "compile_one", lambda spec: (spec, "ok", ""))
    assert sweep.main(["--head-dims", "64", "--quick", "--jobs", "1"]) == 0
