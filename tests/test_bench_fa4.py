"""FlashAttention-4 as a `gen.py bench` peer, off the GPU (issue 22): the `fa4` matrix's cases, the command line,
the rows when flash_attn.cute does not import, and the peer's calls through a stand-in flash_attn.cute on CPU
tensors (layout, causal bottom-right, grouped-query K/V heads). Chunked-prefill cases (S_k != S_q) too."""

from __future__ import annotations

import importlib
import json
import math
import pathlib
import sys
import types

import pytest

from bench import peers, report
from bench.cases import MATRICES, Case, OWN_LATEST, kernel_spec
from bench.config import ALL_PEERS, MATRIX_DEFAULT_PEERS, MATRIX_PEERS, build_parser, parse_config
from bench.gpu_run import measure
from bench.inputs import Inputs, input_set_count
from bench.peers import (PEERS, Unavailable, _fa4_calls, _sdpa_calls, _unfused_calls, bottom_right_keep, fa4_function,
    fa4_kwargs, peer_names, peers_for, sdpa_kwargs)
from bench.report import BenchResult, Row, finalize

torch = pytest.importorskip("torch")

from codegen import check  # noqa: E402  (needs torch)

FA4_MATRIX = [  # (B, S_q, S_k, H, H_kv, D, dtype, causal)
    (1, 1024, 1024, 64, 64, 128, "f16", False),
    (4, 4096, 4096, 32, 32, 128, "bf16", False),
    (4, 4096, 4096, 32, 32, 128, "bf16", True),
    (1, 16384, 16384, 16, 16, 128, "bf16", False),
    (1, 16384, 16384, 16, 16, 128, "bf16", True),
    (16, 1024, 1024, 32, 32, 64, "bf16", False),
    (2, 4096, 4096, 16, 16, 256, "bf16", False),
    (1, 8192, 8192, 32, 8, 128, "bf16", True),
    (4, 2048, 2048, 24, 24, 96, "bf16", False),
    (2, 4096, 4096, 16, 16, 192, "bf16", False),
    (8, 512, 512, 32, 32, 128, "bf16", False),
    (32, 256, 256, 32, 32, 128, "bf16", False),
    (1, 512, 8192, 32, 8, 128, "bf16", True),
    (4, 1024, 8192, 32, 8, 128, "bf16", True),
]


def _shape(c: Case):
    return (c.batch, c.seq, c.seq_k, c.heads, c.kv_heads, c.dim, c.dtype, c.causal)


# ---------------------------------------------------------------------------------------------- cases, command line


def test_the_fa4_matrix_holds_the_issues_shapes():
    cases = MATRICES["fa4"]
    assert [_shape(c) for c in cases] == FA4_MATRIX
    assert not any(c.varlen for c in cases) and len(set(cases)) == len(cases)
    chunked = [c for c in cases if c.chunked]
    assert [c.label for c in chunked] == ["(1,512,32,128) S_k 8192 kv8 bf16 causal",
                                          "(4,1024,32,128) S_k 8192 kv8 bf16 causal"]
    assert "fa4" in OWN_LATEST and "default" not in OWN_LATEST


def test_matrix_fa4_defaults_to_flashgen_fa4_and_cudnn():
    config = parse_config(["--matrix", "fa4"])
    assert config.mode == "matrix" and config.matrix == "fa4" and config.cases == MATRICES["fa4"]
    assert config.peers == ("flashgen", "cudnn", "fa4") == MATRIX_DEFAULT_PEERS["fa4"]
    assert parse_config(["--matrix", "fa4", "--peers", "flashgen,fa4,cudnn"]).peers == config.peers
    assert parse_config(["--matrix", "fa4", "--all-peers"]).peers == ALL_PEERS
    assert parse_config(["--matrix", "default"]).peers == MATRIX_PEERS  # the other matrices keep theirs
    assert "fa4" not in MATRIX_PEERS and "fa4" in ALL_PEERS


def test_peers_flashgen_fa4_cudnn_parses_and_fa4_runs_on_dense_cases_only():
    config = parse_config(["--shape", "1,1024,32,128:8", "--causal", "--peers", "flashgen,fa4,cudnn"])
    assert config.peers == ("flashgen", "cudnn", "fa4")
    assert parse_config(["--shape", "1,1024,32,128", "--peers", "fa4"]).peers == ("cudnn", "fa4")
    order = [(p.name, split) for p, split in peers_for(config.cases[0], config, block_n=64)]
    assert order == [("cudnn", None), ("fa4", None), ("flashgen[32+32]", (32, 32)), ("flashgen[64]", (64,))]
    ragged = MATRICES["varlen"][0]
    assert "fa4" not in peer_names(ragged, ALL_PEERS)
    assert "fa4" in build_parser().format_help()
    assert "--matrix fa4" in build_parser().description


def test_existing_cases_are_unchanged_by_the_key_length():
    for name in ("default", "quick", "coverage", "varlen"):
        for c in MATRICES[name]:
            assert c.seq_k == c.seq and not c.chunked and " S_k " not in c.label
            assert c == Case(c.batch, c.seq, c.heads, c.dim, c.dtype, c.causal, c.kv_heads, lens=c.lens)
    assert Case(1, 512, 32, 128, seq_k=512) == Case(1, 512, 32, 128)
    with pytest.raises(Exception, match="at least 1"):
        Case(1, 512, 32, 128, seq_k=0)


def test_chunked_prefill_flops_bytes_and_spec():
    c = MATRICES["fa4"][-2]  # (1, 512) over 8192 keys, 32/8 heads, causal
    pairs = 512 * 8192 - 512 * 512 / 2  # rows see 7681..8192 keys: the rectangle less half of the 512 square
    assert c.flops == 4.0 * 1 * 32 * pairs * 128 and c.padding_efficiency == 1.0
    assert sum(min(8192, i + 8192 - 512 + 1) for i in range(512)) == pytest.approx(pairs, rel=2e-3)
    full = Case(1, 512, 32, 128, "bf16", False, 8, seq_k=8192)
    assert full.flops == 4.0 * 32 * 512 * 8192 * 128 and full.scores == 32 * 512 * 8192
    assert c.set_bytes == 2 * (512 * 32 * 128 * 2) + 2 * (8192 * 8 * 128 * 2)
    square = Case(1, 8192, 32, 128, "bf16", True, 8)
    assert square.flops == 4.0 * 32 * 8192 * 8192 * 128 / 2  # S_k = S_q: halved, as before
    spec = kernel_spec(c)
    assert (spec.seq_len, spec.seq_len_k, spec.kv_heads, spec.causal) == (512, 8192, 8, True)
    assert kernel_spec(square).seq_len_k in (0, 8192)


# ---------------------------------------------------------------------------------------------- fa4 unavailable


class _NoCuda:
    """Enough of torch for gpu_run.measure up to a peer's make (which raises before any call)."""

    cuda = types.SimpleNamespace(synchronize=lambda: None)


def test_fa4_is_not_importable_here_and_its_rows_are_skipped_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # `import flash_attn.cute` raises ImportError
    with pytest.raises(Unavailable) as err:
        fa4_function()
    reason = str(err.value)
    assert reason.startswith("FlashAttention-4 (flash_attn.cute) does not import: ModuleNotFoundError: import of "
                             "flash_attn.cute halted") and "\n" not in reason
    config = parse_config(["--matrix", "fa4"])
    for case in MATRICES["fa4"]:
        row = measure(_NoCuda(), PEERS["fa4"], None, case, Inputs(sets=(), ref=None), config)
        assert row.impl == "fa4" and row.skipped == reason and row.error is None and row.ms is None and not row.ok


def test_fa4_really_absent_here_is_skipped_not_a_crash():
    try:
        importlib.import_module("flash_attn.cute")
    except Exception:
        pass
    else:
        pytest.skip("flash_attn.cute imports on this machine")
    row = measure(_NoCuda(), PEERS["fa4"], None, MATRICES["fa4"][0], Inputs(sets=(), ref=None),
                  parse_config(["--matrix", "fa4"]))
    assert row.skipped and row.skipped.startswith("FlashAttention-4 (flash_attn.cute) does not import: ")
    assert "\n" not in row.skipped and not row.error


def test_fa4_unpacked_but_off_the_path_says_how_to_put_it_on(monkeypatch, tmp_path):
    # Session 62 lost an A/B to `PYTHONPATH=. python3 scripts/ab.py` after `. scripts/fa4-site.sh finish`.
    import bench.peers

    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    monkeypatch.setattr(bench.peers, "FA4_SITE", tmp_path / ".fa4site")
    with pytest.raises(Unavailable) as bare:
        fa4_function()
    (tmp_path / ".fa4site" / "flash_attn").mkdir(parents=True)
    with pytest.raises(Unavailable) as unpacked:
        fa4_function()
    assert str(unpacked.value).startswith(str(bare.value) + f" ({tmp_path / '.fa4site'} holds it, off sys.path: ")
    assert "fa4-site.sh finish" in str(unpacked.value) and "fa4-site" not in str(bare.value)


def test_any_error_on_import_is_a_one_line_skip(monkeypatch):
    real = importlib.import_module

    def broken(name, *args):
        if name == "flash_attn.cute":
            raise OSError("libcuda.so.1: cannot open shared object file:\n  No such file or directory")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    row = measure(_NoCuda(), PEERS["fa4"], None, MATRICES["fa4"][0], Inputs(sets=(), ref=None),
                  parse_config(["--matrix", "fa4"]))
    assert row.skipped == ("FlashAttention-4 (flash_attn.cute) does not import: OSError: libcuda.so.1: cannot open "
                           "shared object file: No such file or directory")


# ---------------------------------------------------------------------------------------------- fa4 through a stand-in


class _FakeFA4:
    """A stand-in flash_attn.cute: flash_attn_func as interface.py declares it (q, k, v, softmax_scale=None,
    causal=False, ...), computed with torch on CPU, returning (out, lse) with lse None; it records its calls."""

    def __init__(self):
        self.calls = []
        self.module = types.ModuleType("flash_attn.cute")
        self.module.flash_attn_func = self.flash_attn_func

    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False, window_size=(None, None),
                        learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                        return_lse=False, **rest):
        assert not rest, rest
        (b, s_q, h, d), (_, s_k, h_kv, _) = q.shape, k.shape
        assert k.shape == v.shape and h % h_kv == 0  # GQA: k and v keep their heads, as FA4 takes them
        self.calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "causal": causal,
                           "softmax_scale": softmax_scale, "pack_gqa": pack_gqa})
        scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
        qh, kh, vh = (t.transpose(1, 2).double() for t in (q, k, v))
        kh, vh = (t.repeat_interleave(h // h_kv, dim=1) for t in (kh, vh))
        scores = qh @ kh.transpose(-1, -2) * scale
        if causal:  # bottom-right, as flash_attn/cute/mask.py: col_limit_right = row + 1 + S_k - S_q
            keep = torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
            scores = scores.masked_fill(~keep, float("-inf"))
        out = (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2).to(q.dtype).contiguous()
        return out, None


@pytest.fixture
def fake_fa4(monkeypatch):
    fake = _FakeFA4()
    parent = types.ModuleType("flash_attn")
    parent.cute = fake.module
    monkeypatch.setitem(sys.modules, "flash_attn", parent)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", fake.module)
    return fake


def _cpu_inputs(case: Case, sets: int = 2) -> Inputs:
    torch.manual_seed(0)
    made = tuple(tuple(torch.randn(shape, dtype=torch.float32) for shape in
                       ((case.batch, case.seq, case.heads, case.dim),) + ((case.batch, case.seq_k, case.kv_heads,
                                                                            case.dim),) * 2)
                 for _ in range(sets))
    return Inputs(made, check.reference(*made[0], causal=case.causal)[0])


CPU_CASES = [
    Case(2, 16, 4, 32),  # equal heads, non-causal
    Case(2, 24, 4, 32, causal=True),
    Case(1, 32, 8, 16, causal=True, kv_heads=2),  # grouped query
    Case(1, 8, 8, 16, causal=True, kv_heads=2, seq_k=40),  # chunked prefill: bottom-right
    Case(2, 8, 4, 16, kv_heads=1, seq_k=24),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.label)
def test_fa4_calls_give_the_harness_layout_and_pass_causal_and_gqa(fake_fa4, case):
    inputs = _cpu_inputs(case)
    calls = _fa4_calls(torch, inputs, case)
    assert len(calls) == len(inputs.sets)  # one per input set, as every peer
    outs = [call() for call in calls]
    for out, (q, _, _) in zip(outs, inputs.sets):  # (B, S, H, D) in q's dtype, as the harness compares
        assert tuple(out.shape) == (case.batch, case.seq, case.heads, case.dim) and out.dtype == q.dtype
    assert check.rel_err(PEERS["fa4"].output(outs[0], inputs), inputs.ref) < 1e-6  # the first set's reference
    assert fa4_kwargs(case) == {"causal": case.causal}
    assert [c["causal"] for c in fake_fa4.calls] == [case.causal] * len(calls)
    # k and v reach FA4 with their own K/V heads (no repeat, no kwarg), q with H: FA4 groups them itself.
    assert all(c["q"] == (case.batch, case.seq, case.heads, case.dim) and
               c["k"] == (case.batch, case.seq_k, case.kv_heads, case.dim) for c in fake_fa4.calls)
    assert all(c["softmax_scale"] is None and c["pack_gqa"] is None for c in fake_fa4.calls)


def test_fa4_nopack_turns_only_the_grouped_query_packing_off(fake_fa4):
    case = CPU_CASES[2]  # grouped query: FA4 packs by default
    inputs = _cpu_inputs(case)
    outs = [call() for call in PEERS["fa4_nopack"].make(torch, inputs, case)]
    assert [c["pack_gqa"] for c in fake_fa4.calls] == [False] * len(outs)
    assert all(c["causal"] == case.causal for c in fake_fa4.calls)
    assert check.rel_err(PEERS["fa4_nopack"].output(outs[0], inputs), inputs.ref) < 1e-6


def test_fa4_through_measure_with_a_fake_gpu(fake_fa4):
    clock = [0.0]

    class Event:
        def __init__(self, enable_timing):
            self.t = 0.0

        def record(self):
            clock[0] += 0.5
            self.t = clock[0]

        def elapsed_time(self, other):
            return other.t - self.t

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None,
                                                                  _sleep=lambda cycles: None))
    case = CPU_CASES[2]
    config = parse_config(["--shape", "1,32,8,16:2", "--causal", "--iters", "5", "--warmup", "1", "--peers", "fa4"])
    row = measure(fake_torch, PEERS["fa4"], None, case, _cpu_inputs(case), config)
    assert row.ok and row.impl == "fa4" and row.rel_err < 1e-6 and row.ms == pytest.approx(0.5), row
    assert row.call_ms is None  # a peer: only its kernel is timed
    (saved,) = [r for r in finalize([row, Row("cudnn", case, ms=1.0, rel_err=1e-3)]) if r.impl == "fa4"]
    assert saved.ratio_to_cudnn == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------- chunked prefill


def test_bottom_right_mask():
    keep = bottom_right_keep(torch, Case(1, 2, 1, 8, seq_k=5), "cpu")
    assert keep.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    square = bottom_right_keep(torch, Case(1, 4, 1, 8), "cpu")
    assert torch.equal(~square, torch.ones(4, 4, dtype=torch.bool).triu(1))  # unfused's old triu(1)


def test_sdpa_peers_take_a_bottom_right_mask_on_chunked_causal_cases():
    chunked, square = Case(1, 8, 8, 16, causal=True, kv_heads=2, seq_k=40), Case(1, 8, 8, 16, causal=True)
    assert sdpa_kwargs(chunked) == {"is_causal": False, "enable_gqa": True}
    assert sdpa_kwargs(square) == {"is_causal": True}  # the square calls stay what they were
    for case in (chunked, CPU_CASES[4], CPU_CASES[1]):
        inputs = _cpu_inputs(case, sets=1)
        for make in (_sdpa_calls, _unfused_calls):
            (call,) = make(torch, inputs, case)
            out = call()
            assert tuple(out.shape) == (case.batch, case.seq, case.heads, case.dim)
            assert check.rel_err(out, inputs.ref) < 1e-5, (make.__name__, case.label)


def test_chunked_rows_are_skipped_while_the_inputs_lack_the_key_length(fake_fa4):
    case = MATRICES["fa4"][-2]
    config = parse_config(["--matrix", "fa4"])
    entries = peers_for(case, config, block_n=128)
    assert [p.name for p, _ in entries] == ["cudnn", "fa4", "flashgen[96+32]", "flashgen[64+64]"]
    small = Case(1, 8, 8, 16, causal=True, kv_heads=2, seq_k=40)
    square_k = torch.zeros(1, 8, 2, 16)  # what an inputs.py without S_k makes: k with S_q keys
    stale = Inputs(((torch.zeros(1, 8, 8, 16), square_k, square_k),), ref=None)
    fa4 = next(p for p, _ in peers_for(small, parse_config(["--shape", "1,8,8,16:2", "--peers", "fa4"]), None)
               if p.name == "fa4")
    with pytest.raises(Unavailable, match="the inputs hold 8 keys, the case S_k = 40"):
        fa4.make(torch, stale, small)
    assert len(fa4.make(torch, _cpu_inputs(small), small)) == 2  # with S_k keys it runs
    # square cases are left as they are
    square = MATRICES["fa4"][1]
    assert [p for p, _ in peers_for(square, config, block_n=None)] == [PEERS["cudnn"], PEERS["fa4"]]


# ---------------------------------------------------------------------------------------------- result files


def _fa4_result(gpu: str = "NVIDIA H200") -> BenchResult:
    meta = {"gpu": gpu, "date_utc_stamp": "20261201T120000Z", "matrix": "fa4", "command": "gen.py bench --matrix fa4"}
    chunked = MATRICES["fa4"][-2]
    rows = [Row("cudnn", c, ms=1.0, rel_err=1e-3) for c in (MATRICES["fa4"][0], chunked)]
    rows += [Row("fa4", MATRICES["fa4"][0], skipped="FlashAttention-4 (flash_attn.cute) does not import: x")]
    return BenchResult(meta, tuple(finalize(rows)), "matrix")


@pytest.mark.skipif(not hasattr(report, "OWN_LATEST"),
                    reason="bench/report.py save_results does not read cases.OWN_LATEST yet (issue 22)")
def test_the_fa4_matrix_writes_its_own_latest_files(tmp_path):
    names = sorted(p.name for p in report.save_results(_fa4_result(), tmp_path))
    assert names == ["h200-latest-fa4.json", "h200-latest-fa4.md", "nvidia-h200-20261201T120000Z-fa4.json",
                     "nvidia-h200-20261201T120000Z-fa4.md"]
    assert not (tmp_path / "h200-latest.json").exists()  # the default matrix's latest files are not touched


@pytest.mark.skipif("S_k" not in Row("x", Case(1, 2, 1, 8)).to_json(),
                    reason="bench/report.py Row.to_json writes no S_k yet (issue 22)")
def test_rows_carry_s_k_and_h_kv_and_read_back():
    rows = _fa4_result().to_json()
    chunked = next(r for r in rows if r["S"] == 512)
    assert (chunked["S_k"], chunked["H"], chunked["H_kv"]) == (8192, 32, 8)
    assert all(r["S_k"] == r["S"] for r in rows if r is not chunked)
    assert {r["impl"] for r in rows} == {"cudnn", "fa4"}
    back = [Row.from_json(json.loads(json.dumps(r))) for r in rows]
    assert [r.case for r in back] == [r.case for r in _fa4_result().rows]


def test_input_sets_count_the_longer_keys():
    c = MATRICES["fa4"][-2]
    assert input_set_count(c) == -(-200 * 2**20 // c.set_bytes)


def test_fa4_site_splits_here_and_joins_there_over_two_calls(tmp_path):
    """scripts/fa4-site.sh: `split` halves the tarball (FA4_FIRST_BYTES in the first), `stage` keeps the first half
    on the machine, `finish` (sourced) joins both, unpacks them with the wheels, and exports PYTHONPATH; a finish on a
    machine where nothing was staged says so instead of unpacking half a tarball."""
    import random
    import shutil
    import subprocess
    import tarfile

    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(pathlib.Path(__file__).resolve().parent.parent / "scripts" / "fa4-site.sh", root / "scripts")
    payload = tmp_path / "payload"
    (payload / "nvidia_cutlass_dsl" / "dsl_packages").mkdir(parents=True)
    body = random.Random(0).randbytes(2**16)  # random: xz keeps it over FA4_FIRST_BYTES
    (payload / "nvidia_cutlass_dsl" / "dsl_packages" / "blob.bin").write_bytes(body)
    (root / ".fa4x").mkdir()
    with tarfile.open(root / ".fa4x" / "cu13.tar.xz", "w:xz") as tar:
        tar.add(payload, arcname=".")
    (root / ".fa4wheels" / "quack").mkdir(parents=True)  # what stage's pip install leaves
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text("#!/bin/sh\nexit 0\n")  # stage's pip: the wheels are stood in for above
    (fake_bin / "python3").chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "FA4_FIRST_BYTES": "1000"}

    def sh(script: str):
        return subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True)

    assert sh("bash scripts/fa4-site.sh split").returncode == 0
    first, second = (root / ".fa4xa" / "p").read_bytes(), (root / ".fa4xb" / "p").read_bytes()
    assert len(first) == 1000 and first + second == (root / ".fa4x" / "cu13.tar.xz").read_bytes()
    refused = sh(". scripts/fa4-site.sh finish")
    assert refused.returncode == 1 and "nothing staged" in refused.stderr
    assert sh("bash scripts/fa4-site.sh stage").returncode == 0
    done = sh('. scripts/fa4-site.sh finish && echo "PYTHONPATH=$PYTHONPATH"')
    assert done.returncode == 0, done.stderr
    site = root / ".fa4site"
    assert f"PYTHONPATH={site}:{site}/nvidia_cutlass_dsl/dsl_packages:{root}" in done.stdout
    assert (site / "nvidia_cutlass_dsl" / "dsl_packages" / "blob.bin").read_bytes() == body
    assert (site / "quack").is_dir() and not (site / "partA").exists()
