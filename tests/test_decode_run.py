"""`flashgen --shape S_MAX,H,D --kv-heads N --decode S_Q [--page-size P] --run` on the CPU: one-line errors
without torch or a GPU (nothing written), the wiring from the command line to codegen.decode_run, and the
inputs and the verdict it builds (ragged lengths, NaN past them, shuffled pages), on CPU tensors. The run itself
is tests/test_gpu_decode.py's."""

from __future__ import annotations

import sys

import pytest

import gen
from codegen import decode_run
from codegen.families.decode_sm90 import DecodeSpec, resolve

DECODE = ["--shape", "1000,32,128", "--kv-heads", "8", "--decode", "2", "--dtype", "bf16"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_decode_run_without_torch_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert gen.main(DECODE + ["--page-size", "4", "--out", str(tmp_path / "out"), "--run"]) == 2
    line = one_error_line(capsys)
    assert "--run needs torch" in line and "flashgen[torch]" in line
    assert not (tmp_path / "out").exists()


def test_decode_run_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gen.main(DECODE + ["--out", str(tmp_path / "out"), "--run"]) == 2
    assert "--run needs a CUDA GPU" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [(["--shape", "0,32,128"], "at least one row"),
                                           (["--batch", "0"], "--batch must be at least 1"),
                                           (["--page-size", "3"], "page_size 3"),
                                           (["--shape", "1000,16,96", "--kv-heads", "4", "--page-size", "1",
                                             "--no-gather"], "128-byte aligned"),
                                           (["--gather"], "it needs a page_size")])
def test_bad_decode_runs_are_one_line(args, message, tmp_path, capsys):
    assert gen.main(DECODE + args + ["--out", str(tmp_path / "out"), "--run"]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


class Recorded(list):
    """The calls of a fake codegen.decode_run.run_decode, which returns (or raises) `result`."""

    result: object = (0, ["  run        fake: PASS"])

    def __call__(self, torch, spec, batch, capacity):
        self.append((torch, spec, batch, capacity))
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


@pytest.fixture
def fake_gpu(monkeypatch):
    """--run with torch's GPU check passed and codegen.decode_run.run_decode recorded."""
    from codegen import cli

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cli, "_require_torch_gpu", lambda what: torch)
    calls = Recorded()
    monkeypatch.setattr(decode_run, "run_decode", calls)
    return calls


@pytest.mark.parametrize("extra, page", [([], 0), (["--page-size", "4"], 4), (["--page-size", "1", "--causal"], 1),
                                         (["--page-size", "8"], 8), (["--page-size", "16"], 16)])
def test_decode_run_builds_then_runs_the_spec_it_emitted(extra, page, fake_gpu, tmp_path, capsys):
    assert gen.main(DECODE + extra + ["--batch", "3", "--out", str(tmp_path), "--run"]) == 0
    out = capsys.readouterr().out
    assert "generating flashgen_decode_" in out and "  run        fake: PASS" in out
    ((torch, spec, batch, capacity),) = fake_gpu
    # Pages of up to 8 rows are gathered by default (plan.gather_by_default).
    want = resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=128, q_len=2, dtype="bf16", page_size=page,
                              causal="--causal" in extra, gather=0 < page <= 8))
    assert (torch.__name__, spec, batch, capacity) == ("torch", want, 3, 1000)
    assert (tmp_path / f"{spec.name}.cu").is_file()


def test_a_failed_or_refused_decode_run_exits_non_zero(fake_gpu, tmp_path, capsys):
    from codegen.api import InputError
    from codegen.driver import DriverError

    fake_gpu.result = (1, ["  run        fake: FAIL", "  rel err 1 > 2 x 0"])
    assert gen.main(DECODE + ["--out", str(tmp_path), "--run"]) == 1
    assert "FAIL" in capsys.readouterr().out
    fake_gpu.result = InputError("the decode kernel is generated for sm_90a (H100/H200) only so far,\nnot sm_80")
    assert gen.main(DECODE + ["--out", str(tmp_path), "--run"]) == 2
    assert "sm_90a (H100/H200) only so far, not sm_80" in one_error_line(capsys)
    fake_gpu.result = DriverError("cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert gen.main(DECODE + ["--out", str(tmp_path), "--run"]) == 1
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in one_error_line(capsys)
    torch = pytest.importorskip("torch")
    fake_gpu.result = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
    assert gen.main(DECODE + ["--out", str(tmp_path), "--run"]) == 1
    assert "out of memory" in one_error_line(capsys)


# ---------------------------------------------------------------------------------------------------------------
# The inputs and the verdict, on the CPU

torch = pytest.importorskip("torch")


def inputs_for(page, batch=5, capacity=37, seed=0, **kw):
    spec = resolve(DecodeSpec(**{**dict(heads=8, kv_heads=2, head_dim=64, q_len=2, page_size=page), **kw}))
    return spec, decode_run.decode_inputs(torch, spec, batch, capacity, "cpu",
                                          generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("page", [0, 1, 4, 16, 64])
def test_inputs_are_ragged_caches_nan_past_each_length(page):
    spec, inp = inputs_for(page)
    assert inp.lengths[0] == 37 and all(0 <= n <= 37 for n in inp.lengths) and len(set(inp.lengths)) > 1
    assert inp.seqlens.dtype == torch.int32 and inp.seqlens.tolist() == inp.lengths
    assert tuple(inp.q.shape) == (5, 2, 8, 64) and inp.q.dtype == torch.bfloat16
    for b, n in enumerate(inp.lengths):
        assert torch.isnan(inp.k[b, n:]).all() and torch.isfinite(inp.k[b, :n]).all()
        assert torch.isnan(inp.v[b, n:]).all() and torch.isfinite(inp.v[b, :n]).all()
    if not page:
        assert inp.page_table is None and inp.k_cache is inp.k
        return
    per = -(-37 // page)  # 37 rows: the last page part-filled
    assert inp.page_table.dtype == torch.int32 and tuple(inp.page_table.shape) == (5, per)
    assert tuple(inp.k_cache.shape) == (5 * per + 1, page, 2, 64) == tuple(inp.v_cache.shape)
    used = inp.page_table.flatten().tolist()
    assert len(set(used)) == len(used) and set(used) < set(range(5 * per + 1))
    spare = (set(range(5 * per + 1)) - set(used)).pop()
    assert torch.isnan(inp.k_cache[spare]).all() and torch.isnan(inp.v_cache[spare]).all()
    if page < 37:
        assert used != sorted(used)  # shuffled
    for cache, dense in ((inp.k_cache, inp.k), (inp.v_cache, inp.v)):  # one table for K and V
        seen = decode_run.dense_from_pages(cache, inp.page_table)
        assert torch.equal(seen[:, :37].view(torch.int16), dense.view(torch.int16))  # NaN rows included
        assert torch.isnan(seen[:, 37:]).all()


def test_the_verdict_is_the_accuracy_rule():
    from codegen import check

    spec, inp = inputs_for(4)
    ref, ref_lse = check.kvcache_reference(inp.q, inp.k, inp.v, inp.lengths, causal=spec.causal)
    good = decode_run.decode_verdict(torch, spec, inp, ref.to(inp.q.dtype), ref_lse.float())
    assert good.ok and good.rel_err <= 2 * good.yardstick and good.lse_err < 1e-5
    row = ref.clone()
    row[1, 0, 3] *= 1.03  # one wrong row of 80: the global error passes, the worst row's does not
    assert "worst row" in decode_run.decode_verdict(torch, spec, inp, row.to(inp.q.dtype), ref_lse.float()).failure
    nan = ref.clone()
    nan[2, 1, 0, 5] = float("nan")
    assert not decode_run.decode_verdict(torch, spec, inp, nan.to(inp.q.dtype), ref_lse.float()).ok
    lse = ref_lse.clone()
    lse[0, 0, 0] += 0.01
    assert "lse off by" in decode_run.decode_verdict(torch, spec, inp, ref.to(inp.q.dtype), lse.float()).lse_failure


def test_bandwidth_counts_the_rows_the_queries_see():
    spec = resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=128, q_len=2))
    assert decode_run.keys_read(spec, [1000, 0, 17]) == 1017
    assert decode_run.kv_gbs(spec, [1000], 0.001) == pytest.approx(2 * 1000 * 8 * 128 * 2 / 1e-6 / 1e9)  # GB/s
    window = resolve(DecodeSpec(heads=32, kv_heads=8, head_dim=128, q_len=2, window=(100, -1)))
    assert decode_run.keys_read(window, [1000, 50]) == 102 + 50  # positions 998, 999 see keys 898..999


def test_gather_is_refused_outside_decode(tmp_path, capsys):
    assert gen.main(["--shape", "1024,32,128", "--gather", "--out", str(tmp_path / "out")]) == 2
    assert "--page-size, --gather, --ctas-per-sm and --head-pack are for the decode kernel" in one_error_line(capsys)
    assert gen.main(["--shape", "1024,32,64", "--head-pack", "2", "--out", str(tmp_path / "out")]) == 2
    assert "are for the decode kernel: add --decode" in one_error_line(capsys)
    assert gen.main(["--shape", "1024,32,64", "--backward", "--head-pack", "2", "--out", str(tmp_path / "out")]) == 2
    assert "--head-pack does not apply to the backward kernels" in one_error_line(capsys)
    assert gen.main(["--shape", "1024,32,64", "--kv-heads", "8", "--decode", "1", "--head-pack", "2", "--page-size",
                     "4", "--gather", "--out", str(tmp_path / "out")]) == 2
    assert "loads the heads' rows by TMA boxes, not gathered" in one_error_line(capsys)
    assert gen.main(["--shape", "1024,32,128", "--ctas-per-sm", "2", "--out", str(tmp_path / "out")]) == 2
    assert "are for the decode kernel: add --decode" in one_error_line(capsys)
    assert gen.main(["--shape", "1024,32,128", "--backward", "--gather", "--out", str(tmp_path / "out")]) == 2
    assert "--gather does not apply to the backward kernels" in one_error_line(capsys)
    assert gen.main(["--shape", "1024,32,128", "--backward", "--ctas-per-sm", "2", "--out", str(tmp_path / "out")]) == 2
    assert "--ctas-per-sm does not apply to the backward kernels" in one_error_line(capsys)
    assert gen.main(["--shape", "8192,32,256", "--kv-heads", "8", "--decode", "1", "--ctas-per-sm", "2",
                     "--out", str(tmp_path / "out")]) == 2
    assert "two CTAs per SM fit head dims 64, 96, 128, not 256" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_the_cli_names_the_decode_kernels_register_split(tmp_path, capsys):
    assert gen.main(["--shape", "8192,32,128", "--kv-heads", "8", "--decode", "1", "--ctas-per-sm", "2",
                     "--out", str(tmp_path)]) == 0
    assert "setmaxnreg moves consumers to 216, the producer to 40" in capsys.readouterr().out
    assert gen.main(["--shape", "8192,32,128", "--kv-heads", "8", "--decode", "1", "--out", str(tmp_path)]) == 0
    assert "setmaxnreg moves consumers to 240, the producer to 24" in capsys.readouterr().out


def test_the_cli_emits_a_two_head_decode_kernel_that_names_its_regeneration(tmp_path, capsys):
    assert gen.main(["--shape", "8192,32,64", "--kv-heads", "8", "--decode", "1", "--head-pack", "2",
                     "--out", str(tmp_path)]) == 0
    (source,) = tmp_path.glob("*_hp2.cu")
    text = source.read_text()
    assert "--ctas-per-sm" not in text.splitlines()[1] and "--head-pack 2" in text.splitlines()[1]
    assert "constexpr int kHeadPack = 2, kHeadRows = 4, kTileRows = 128;" in text
