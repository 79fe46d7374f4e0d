"""bench/done_when.py and `scripts/targets.py --matrix decode|fa4`: the decode and FA4 issues' criteria, read from
result rows (no GPU)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from bench import done_when

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _script():
    """scripts/targets.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("targets_script", ROOT / "scripts" / "targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode_rows(ratio_b8=1.05, ratio_slow=1.25, paged_ms=1.02, pct_slow=30.0, gpu="NVIDIA H200"):
    """A three-case decode matrix: a B=1 row where cuDNN is slow, a B=8 dense row and its pages of 16, at the
    given flashgen ratios (cuDNN at 1.0 ms, flashgen at 1 / ratio ms; the paged row at paged_ms x the dense one's)."""
    cases = [dict(B=1, page_size=0, ratio=ratio_slow, pct=pct_slow),
             dict(B=8, page_size=0, ratio=ratio_b8, pct=95.0),
             dict(B=8, page_size=16, ratio=ratio_b8 / paged_ms, pct=95.0)]
    rows = []
    for c in cases:
        key = dict(B=c["B"], S_q=1, S_k=8192, H=32, H_kv=8, D=128, dtype="bf16", page_size=c["page_size"], gpu=gpu)
        rows.append(dict(key, impl="cudnn", ms=1.0, ratio_to_cudnn=1.0, kv_pct_of_copy=c["pct"]))
        rows.append(dict(key, impl="flashgen", ms=1.0 / c["ratio"], ratio_to_cudnn=c["ratio"]))
    return rows


def held(run):
    return {c.name.split(":")[0].split(" ")[0]: c.held for c in run.criteria}


def test_a_decode_run_that_meets_every_criterion_but_the_geomean():
    run = done_when.decode_run(decode_rows())
    assert [c.held for c in run.criteria] == [True, True, True, True, False]
    assert run.geomean == pytest.approx((1.25 * 1.05 * 1.05 / 1.02) ** (1 / 3))
    assert all(not c.failing for c in run.criteria)


def test_each_decode_criterion_fails_on_its_own_row():
    b8 = done_when.decode_run(decode_rows(ratio_b8=0.99))
    assert [c.held for c in b8.criteria][:3] == [False, True, False]
    assert b8.criteria[0].failing == ("B=8 S_q=1 S_k=8192 H=32/8 D=128 bf16", "B=8 S_q=1 S_k=8192 H=32/8 D=128 bf16 page16")
    slow = done_when.decode_run(decode_rows(ratio_slow=1.15))
    assert [c.held for c in slow.criteria][:3] == [True, False, True]
    assert slow.criteria[1].failing == ("B=1 S_q=1 S_k=8192 H=32/8 D=128 bf16",)
    assert done_when.decode_run(decode_rows(ratio_slow=1.15, pct_slow=70.0)).criteria[1].held  # cuDNN not slow there
    paged = done_when.decode_run(decode_rows(paged_ms=1.06))
    assert not paged.criteria[3].held and paged.criteria[3].failing == ("B=8 S_q=1 S_k=8192 H=32/8 D=128 bf16 page16",)
    assert done_when.decode_run(decode_rows(ratio_b8=1.3, ratio_slow=1.3)).criteria[4].held


def test_a_row_without_a_ratio_fails_the_row_criteria_and_the_geomean():
    """A passing run whose paged flashgen row errored (a fault, a refusal) no longer passes: the run is judged on the
    rows the matrix asked for. A row every implementation skipped (too big for the GPU) is left out."""
    good = decode_rows(ratio_b8=1.3, ratio_slow=1.3)
    assert all(c.held for c in done_when.decode_run(good).criteria)
    broken = [dict(r, ms=None, ratio_to_cudnn=None, error="CUDA error: an illegal memory access")
              if r["impl"] == "flashgen" and r["page_size"] else r for r in good]
    run = done_when.decode_run(broken)
    assert [c.held for c in run.criteria] == [False, True, False, False, False]
    assert run.criteria[2].failing == ("B=8 S_q=1 S_k=8192 H=32/8 D=128 bf16 page16 (no ratio, or its output off)",)
    missing = [r for r in good if not (r["impl"] == "cudnn" and r["page_size"])]  # cuDNN's side never ran
    assert not done_when.decode_run(missing).criteria[4].held
    too_big = [dict(r, ms=None, ratio_to_cudnn=None, skipped="does not fit") if r["page_size"] else r for r in good]
    assert all(c.held for c in done_when.decode_run(too_big).criteria)


def test_a_fast_row_with_a_wrong_output_is_no_row():
    rows = [dict(r, rel_err=2.3e-3 if r["impl"] == "cudnn" else 2.2e-3) for r in decode_rows(ratio_b8=1.3, ratio_slow=1.3)]
    assert all(c.held for c in done_when.decode_run(rows).criteria)
    rows[1] = dict(rows[1], rel_err=3e-2)  # the B=1 row's flashgen output: 13x cuDNN's error
    run = done_when.decode_run(rows)
    assert not run.criteria[2].held and not run.criteria[4].held
    assert run.criteria[2].failing == ("B=1 S_q=1 S_k=8192 H=32/8 D=128 bf16 (no ratio, or its output off)",)


def test_paged_rows_compare_by_their_ratios_in_their_own_cases():
    # The paged case's cuDNN ran 10% slower than the dense case's (a clock move between the cases): flashgen's
    # paged time is 8% over its dense one, yet its ratio to cuDNN is within 5% of the dense row's.
    rows = decode_rows(ratio_b8=1.3, ratio_slow=1.3)
    for r in rows:
        if r["page_size"]:
            r["ms"] = 1.1 if r["impl"] == "cudnn" else 1.08 / 1.3
            r["ratio_to_cudnn"] = 1.0 if r["impl"] == "cudnn" else 1.1 / (1.08 / 1.3)
    assert done_when.decode_run(rows).criteria[3].held


def test_paged_rows_show_their_ratio_to_cudnns_paged_read_beside_the_criteria():
    rows = decode_rows()
    rows[-1]["ratio_to_cudnn_paged"] = 1.02  # flashgen's paged row against cuDNN's own paged read
    run = done_when.decode_run(rows)
    label = "B=8 S_q=1 S_k=8192 H=32/8 D=128 bf16 page16 vs cuDNN paged"
    assert run.references == {label: 1.02}
    assert [c.held for c in run.criteria] == [c.held for c in done_when.decode_run(decode_rows()).criteria]
    table = done_when.runs_table([run])
    assert table[len(run.ratios) + 2] == [label, "1.020x", "1.020x (1.020-1.020)"]  # after the geomean


def fa4_rows(ratios, gpu="NVIDIA H200"):
    rows = []
    for i, r in enumerate(ratios):
        key = dict(B=1, S=1024 * (i + 1), S_k=1024 * (i + 1), H=16, H_kv=16, D=128, dtype="bf16", causal=i % 2 == 1,
                   gpu=gpu)
        rows += [dict(key, impl="fa4", ms=1.0), dict(key, impl="flashgen", ms=1.0 / r), dict(key, impl="cudnn", ms=1.2)]
    return rows


def test_an_fa4_run_compares_flashgen_with_fa4_row_by_row():
    run = done_when.fa4_run(fa4_rows([1.10, 1.02, 1.04]))
    assert run.ratios == pytest.approx({"(1,1024,16,128) bf16": 1.10, "(1,2048,16,128) bf16 causal": 1.02,
                                        "(1,3072,16,128) bf16": 1.04})
    assert [c.held for c in run.criteria] == [True, True]
    low = done_when.fa4_run(fa4_rows([1.10, 0.99, 1.10]))
    assert [c.held for c in low.criteria] == [False, True] and low.criteria[0].failing == ("(1,2048,16,128) bf16 causal",)
    assert [c.held for c in done_when.fa4_run(fa4_rows([1.0, 1.0])).criteria] == [True, False]
    rows = fa4_rows([1.10, 1.10])
    rows[1] = dict(rows[1], ms=None, error="SpillError")  # flashgen's first row failed: no longer left out
    run = done_when.fa4_run(rows)
    assert [c.held for c in run.criteria] == [False, False] and run.criteria[0].failing == ("(1,1024,16,128) bf16 (no ratio, or its output off)",)


def write(path, rows):
    path.write_text(json.dumps(rows))
    return path


def test_runs_load_oldest_first_from_one_gpu_and_tabulate(tmp_path):
    write(tmp_path / "nvidia-h200-20261205T120000Z-decode.json", decode_rows(ratio_b8=0.99))
    write(tmp_path / "nvidia-h200-20261204T120000Z-decode.json", decode_rows())
    write(tmp_path / "h200-latest-decode.json", decode_rows())  # a copy of one run: left out
    write(tmp_path / "nvidia-h200-20261204T120000Z-fa4.json", fa4_rows([1.1]))  # another matrix: left out
    runs = done_when.load_runs("decode", [tmp_path])
    assert [r.source for r in runs] == ["20261204T120000Z", "20261205T120000Z"]
    files = [tmp_path / "nvidia-h200-20261205T120000Z-decode.json", tmp_path / "nvidia-h200-20261204T120000Z-decode.json"]
    assert [r.source for r in done_when.load_runs("decode", files)] == ["20261204T120000Z", "20261205T120000Z"]
    table = done_when.runs_table(runs)
    assert table[0] == ["row", "20261204T120000Z", "20261205T120000Z", "median (range)"]
    assert table[2] == ["B=8 S_q=1 S_k=8192 H=32/8 D=128 bf16", "1.050x", "0.990x", "1.020x (0.990-1.050)"]
    assert table[-5] == ["S_q=1, B>=8 rows >= 1.0x", "met", "no", "1 of 2 runs"]
    assert not runs[0].references and table[-6][0] == "geomean"  # no cuDNN paged read in these runs
    assert "S_q=1, B>=8 rows >= 1.0x: 1 of 2 (last run: B=8 S_q=1" in done_when.verdict(runs)
    dirty = [dict(r, flashgen_commit="81622372e88182e24d00fa597a63cf055c811c8b+dirty",
                  flashgen_tree="20e38f10a84a35e00c6582db73f46287d4f3317c") for r in decode_rows()]
    write(tmp_path / "nvidia-h200-20261206T120000Z-decode.json", dirty)  # the tree it measured, and that it was dirty
    assert done_when.load_runs("decode", [tmp_path])[-1].source == "20261206T120000Z 20e38f1+dirty"
    write(tmp_path / "nvidia-h100-80gb-hbm3-20261203T120000Z-decode.json", decode_rows(gpu="NVIDIA H100 80GB HBM3"))
    with pytest.raises(ValueError, match="come from 2 GPUs"):
        done_when.load_runs("decode", [tmp_path])


def test_the_script_prints_the_table_and_refuses_what_it_cannot_read(tmp_path, capsys):
    script = _script()
    good = write(tmp_path / "nvidia-h200-20261205T120000Z-fa4.json", fa4_rows([1.1, 0.98]))
    assert script.main(["--matrix", "fa4", str(good)]) == 0
    out = capsys.readouterr().out
    assert "(1,2048,16,128) bf16 causal" in out and "every row >= 1.0x FA4: 0 of 1" in out
    bad = tmp_path / "nvidia-h200-20261205T130000Z-fa4.json"
    bad.write_text("{}")
    assert script.main(["--matrix", "fa4", str(bad)]) == 2
    assert "is not a benchmark result file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--matrix", "fa4", str(tmp_path / "missing.json")])
