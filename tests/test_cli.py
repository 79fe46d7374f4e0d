"""The command line a new user meets (issue 23), on the CPU: one-line errors with nothing half-written, negative
option values, --export's refusal to overwrite, subcommands that parse first, the default output folder, the
packaging (torch extra, the `flashgen` script, LICENSE, the test cache), the README, and the small ones (formula
errors, the shared-memory advice, subcommand typos, --arch, the kernel header)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import gen
from codegen import cli
from codegen.cache import default_cache_dir
from codegen.families import make_plan, resolve
from codegen.files import OutputError, write_all
from codegen.render import render
from codegen.spec import KernelSpec
from layouts.mma import SmemDescriptor

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--shape", "256,2,64"]  # a quick kernel to compile
LAYOUT = ["layout", "--operand", "v", "--arch", "sm_90a", "--head-dim", "128", "--block-n", "128", "--dtype", "f16"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def run_cli(args, env=None, cwd=None, timeout=300, preexec_fn=None):
    return subprocess.run([sys.executable, str(REPO / "gen.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd, preexec_fn=preexec_fn)


# ---------------------------------------------------------------------------------------------------------------
# 1. One clear line on stderr, a non-zero exit, nothing half-written


@pytest.mark.parametrize("args, message", [
    (["--shape", "1024,16,128", "--kv-heads", "0"], "--kv-heads must be at least 1, got 0"),
    (["--shape", "1024,16,128", "--seq-k", "0"], "--seq-k must be at least 1, got 0"),
    (["--shape", "1024,16,128", "--kv-heads", "4", "--decode", "0"], "new tokens per sequence (>= 1), got 0"),
    (["--shape", "1024,16,128", "--kv-heads", "4", "--decode", "1", "--backward"], "different kernels"),
    (["--shape", "1024,16,128", "--kv-heads", "4", "--decode", "1", "--deterministic"], "--deterministic does not"),
    (["--shape", "0,16,128", "--kv-heads", "4", "--decode", "1"], "at least one row, got S_MAX 0"),
    (["--shape", "256,2,64", "--run", "--batch", "0"], "--batch must be at least 1, got 0"),
    (["--shape", "256,2,64", "--kv-heads", "2", "--decode", "1", "--run", "--batch", "0"], "--batch must be at least 1"),
])
def test_an_explicit_value_out_of_range_is_an_error_not_the_default(args, message, tmp_path, capsys):
    """A zero that used to mean "the default" (--decode 0 emitted the forward kernel) is refused, before any file."""
    assert gen.main([*args, "--out", str(tmp_path)]) == 2
    assert message in one_error_line(capsys)
    assert not list(tmp_path.iterdir())


def test_export_onto_a_file_fails_in_one_line_before_writing(tmp_path, capsys):
    target = tmp_path / "afile"
    target.write_text("mine\n")
    out = tmp_path / "out"
    assert gen.main(SMALL + ["--out", str(out), "--export", str(target)]) == 2
    assert "exists and is not a folder" in one_error_line(capsys)
    assert not out.exists() and target.read_text() == "mine\n"


def test_out_that_cannot_be_made_fails_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    assert gen.main(SMALL + ["--out", str(blocker / "sub")]) == 2
    assert "is not a folder" in one_error_line(capsys)
    if Path("/proc/self").is_dir():  # the issue's own example: a folder that cannot be made
        assert gen.main(SMALL + ["--out", "/proc/forbidden"]) == 2
        assert "/proc/forbidden" in one_error_line(capsys)


def test_write_all_writes_everything_or_nothing(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(OutputError, match="afile"):
        write_all({tmp_path / "new" / "deep" / "a.txt": "1", tmp_path / "afile" / "b.txt": "2"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no folder, no temporary file left
    written = write_all({tmp_path / "new" / "a.txt": "1", tmp_path / "new" / "b.bin": b"\x00"})
    assert [p.name for p in written] == ["a.txt", "b.bin"] and (tmp_path / "new" / "a.txt").read_text() == "1"
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["a.txt", "b.bin"]


def test_probe_without_a_gpu_is_one_line(monkeypatch, capsys):
    from codegen import cuda_env

    monkeypatch.setattr(cuda_env, "driver_status", lambda: (False, "no CUDA driver: cuInit could not run "
                                                                   "(DynamicLibNotFoundError: no libcuda)"))
    assert gen.main(["probe"]) == 2
    assert "probe runs on an NVIDIA GPU: no CUDA driver" in one_error_line(capsys)


def test_probe_with_a_bad_shape_is_one_line(capsys):
    assert gen.main(["probe", "--shape", "abc"]) == 2
    assert "--shape expects S,H,D" in one_error_line(capsys)


def test_check_formula_of_2000_terms_answers(capsys):
    rc = gen.main(LAYOUT + ["--check-formula", "+".join(["n"] * 2000)])
    assert rc == 1 and "does not match" in capsys.readouterr().out


def test_check_formula_with_a_huge_shift_is_one_line():
    # In a child with its address space capped, so that a regression fails fast with MemoryError instead of
    # exhausting the machine (1 << 99999999999 is a 12.5 GB integer).
    def cap():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    result = run_cli(LAYOUT + ["--check-formula", "1 << 99999999999"], timeout=120, preexec_fn=cap)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "error: shift count 99999999999 is over 63 (a 64-bit value)"


def test_run_without_torch_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert gen.main(SMALL + ["--out", str(tmp_path / "out"), "--run"]) == 2
    line = one_error_line(capsys)
    assert "--run needs torch" in line and "flashgen[torch]" in line
    assert not (tmp_path / "out").exists()


def test_attention_without_torch_says_what_to_install():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import codegen\n"
            "try:\n    codegen.attention(None, None, None)\n"
            "except ModuleNotFoundError as e:\n    print(e.name, '|', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    name, _, message = result.stdout.strip().partition(" | ")
    assert name == "torch" and "codegen.attention() needs torch" in message and "flashgen[torch]" in message
    assert "\n" not in message


def test_the_calls_the_readme_names_are_the_packages():
    import codegen

    readme = _readme()
    for name in ("attention", "prepare", "attention_with_kvcache", "attention_backward", "scaled_dot_product_attention"):
        assert f"codegen.{name}(" in readme or f"import {name}" in readme or f"`{name}(" in readme, name
        assert callable(getattr(codegen, name)), name
    from codegen.backward import attention_backward

    assert codegen.attention_backward is attention_backward


# ---------------------------------------------------------------------------------------------------------------
# 2. Negative values: --window -1,0


def test_window_takes_a_negative_left_bound(tmp_path, capsys):
    assert gen.main(SMALL + ["--window", "-1,0", "--out", str(tmp_path)]) == 0
    (manifest,) = tmp_path.glob("*.json")
    assert json.loads(manifest.read_text())["spec"]["window"] == [-1, 0]
    assert cli.join_signed_values(["--window", "-1,0", "--causal"]) == ["--window=-1,0", "--causal"]
    assert cli.join_signed_values(["--window", "--causal"]) == ["--window", "--causal"]


def test_help_shows_a_negative_window(capsys):
    assert gen.main(["--help"]) == 0
    assert "--window -1,0" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------------------------------------------------------
# 3. --export never overwrites silently


def test_export_refuses_a_folder_that_is_not_its_bundle(tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text("# mine\n")
    (project / "example.cu").write_text("// mine\n")
    assert gen.main(SMALL + ["--out", str(tmp_path / "out"), "--export", str(project)]) == 2
    assert "not empty" in one_error_line(capsys)
    assert (project / "CMakeLists.txt").read_text() == "# mine\n" and (project / "example.cu").read_text() == "// mine\n"
    assert not (tmp_path / "out").exists()
    assert gen.main(SMALL + ["--out", str(tmp_path / "out"), "--export", str(project), "--force"]) == 0
    assert (project / "CMakeLists.txt").read_text() != "# mine\n"


def test_export_writes_over_its_own_bundle_and_into_empty_folders(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert gen.main(SMALL + ["--out", str(tmp_path / "out"), "--export", str(bundle)]) == 0
    assert gen.main(SMALL + ["--out", str(tmp_path / "out"), "--export", str(bundle)]) == 0  # the same kernel again
    other = ["--shape", "256,2,64", "--causal", "--out", str(tmp_path / "out"), "--export", str(bundle)]
    assert gen.main(other) == 2  # another kernel's bundle is not this one's
    assert "not empty" in one_error_line(capsys)


def test_export_refuses_an_empty_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert gen.main(SMALL + ["--out", str(tmp_path / "out"), "--export", ""]) == 2
    assert "--export needs a folder name" in one_error_line(capsys)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# 4. Subcommands parse first; generated/ is only for `canonical`


def _generated_state():
    return {p.name: p.stat().st_mtime_ns for p in gen.GENERATED.iterdir()}


@pytest.mark.parametrize("args,code", [(["canonical", "--help"], 0), (["canonical", "--bogus"], 2),
                                       (["probe", "--help"], 0), (["verify", "--bogus"], 2),
                                       (["layout", "--help"], 0)])
def test_subcommands_parse_their_arguments_first(args, code, capsys):
    before = _generated_state()
    assert gen.main(args) == code
    captured = capsys.readouterr()
    assert ("usage:" in captured.out) if code == 0 else ("unrecognized arguments: --bogus" in captured.err)
    assert _generated_state() == before, "generated/ was rewritten"


def test_a_new_shape_goes_to_the_cache_not_to_generated(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    before = _generated_state()
    assert gen.main(SMALL) == 0
    assert [p.suffix for p in sorted((tmp_path / "cache" / "kernels").iterdir())] == [".cu", ".json"]
    assert str(tmp_path / "cache" / "kernels") in capsys.readouterr().out
    assert _generated_state() == before


def test_bench_and_canonical_outside_a_checkout_say_so(capsys):
    for command in (["bench", "--matrix"], ["canonical"]):
        assert cli.main(command, checkout=None) == 2
        line = one_error_line(capsys)
        assert "runs from a checkout" in line and f"python gen.py {command[0]}" in line


def test_the_checkout_is_found_from_the_package():
    assert cli.find_checkout() == REPO


# ---------------------------------------------------------------------------------------------------------------
# 5. Packaging


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_torch_extra_script_and_license_are_declared():
    project = _pyproject()["project"]
    assert project["optional-dependencies"]["torch"] == ["torch>=2.4,<3"]
    assert "torch==2.13.0" in project["optional-dependencies"]["test"]  # CI's exact CPU pin
    assert project["scripts"] == {"flashgen": "codegen.cli:main"}
    assert project["license"] == {"text": "MIT"}
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
    assert "version" in project["dynamic"] and _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "codegen.__version__"}


def test_the_installed_flashgen_script_is_the_same_cli(tmp_path):
    script = Path(sys.executable).parent / "flashgen"
    if not script.exists():
        pytest.skip(f"no flashgen script beside {sys.executable} (reinstall: pip install -e .)")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0 and "usage: flashgen" in result.stdout
    result = subprocess.run([str(script), "prbe"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "did you mean 'probe'" in result.stderr


def test_the_suite_never_writes_into_the_users_cache():
    assert default_cache_dir() != Path.home() / ".cache" / "flashgen"
    explicit = os.environ.get("FLASHGEN_TEST_CACHE_DIR")
    assert explicit is None or default_cache_dir() == Path(explicit).expanduser()


# ---------------------------------------------------------------------------------------------------------------
# 6. The README


def _readme() -> str:
    return (REPO / "README.md").read_text()


def _sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", text, re.S)


def test_readme_points_only_inside_the_repository():
    text = _readme()
    assert "../" not in text and "shared/DESIGN" not in text
    for path in re.findall(r"`((?:bench|scripts|codegen|layouts|templates|tests|generated)/[\w./-]*)`", text):
        assert (REPO / path.rstrip("/")).exists() or "<" in path, path
    assert (REPO / "DESIGN.md").is_file() and "../shared" not in (REPO / "DESIGN.md").read_text()


def test_readme_order_requirements_speed_limitations_then_usage():
    text = _readme()
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    order = [h.split(" ", 1)[1] for h in heads]
    assert order[0] == "Requirements" and order[1] == "Quick start"
    assert order.index("Speed") < order.index("Limitations") < order.index("Command line")
    assert order.index("Command line") < order.index("Performance work and the GPU check")
    for word in ("Python 3.10", "driver", "torch 2.4", "Without a GPU"):
        assert word in text.split("## Quick start")[0], word
    speed = text.split("## Speed")[1].split("\n## ")[0]
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", speed), "the speed tables say when they were measured"
    recorded = re.search(r"^- command: (gen\.py bench [^\n]*?)(?: --out \S+)?$",
                         (REPO / "bench" / "results" / "h200-latest.md").read_text(), re.M)
    assert recorded and f"`{recorded.group(1)}`" in speed, "the speed section quotes the command its table records"
    assert "bench/results/h200-latest.md" in speed and "FlashAttention-4" in speed
    # every paragraph of the performance section is short now (the old one was 30 lines)
    perf = text.split("## Performance work and the GPU check")[1].split("\n## ")[0]
    assert max(len(p.splitlines()) for p in perf.split("\n\n")) <= 12


def test_readme_speed_numbers_are_the_latest_tables():
    latest = (REPO / "bench" / "results" / "h200-latest.md").read_text()
    speed = _readme().split("## Speed")[1].split("\n## ")[0]
    for shape in ("(1,1024,64,128) f16", "(4,4096,32,128) bf16", "(1,16384,16,128) bf16"):
        row = re.search(rf"\| {re.escape(shape)} non-causal \|[^\n]*?([0-9.]+x) \([0-9+]+\) \| ([0-9.]+x) \|", latest)
        assert row, shape
        kernel, call = row.groups()
        assert re.search(rf"\| {re.escape(shape)} \| {kernel} \| {call} \|", speed), (shape, kernel, call)
    geomean = re.search(r"\| geomean \|  \|  \| ([0-9.]+x) \(8/8\) \| ([0-9.]+x) \(8/8\) \|", latest).groups()
    assert f"| default matrix, geomean of 8 | {geomean[0]} | {geomean[1]} |" in speed
    decode = (REPO / "bench" / "results" / "h200-latest-decode.md").read_text()
    mean = re.search(r"geomean[^\n]*?([0-9.]+x) over (\d+)/\d+ cases \(call vs cuDNN's call: ([0-9.]+x)", decode)
    assert mean, "the decode result file's geomean line"
    assert f"| decode matrix, geomean of {mean.group(2)} | | | {mean.group(1)} | {mean.group(3)} |" in speed


def test_readme_test_command_shows_skip_reasons_and_is_what_ci_runs():
    quick = _sh_blocks(_readme().split("## Quick start")[1].split("\n## ")[0])
    assert len(quick) == 2
    test_command = quick[1].split("&&")[-1].strip()
    assert test_command == "python -m pytest -q -rs"
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(test_command)}$", ci, re.M), "CI must run the README's test command"
    assert "FLASHGEN_TEST_CACHE_DIR" in ci


def test_readme_needs_no_pythonpath_and_the_scripts_run_from_anywhere(tmp_path):
    assert not re.search(r"PYTHONPATH=\S+ +(python|ncu)", _readme())  # no command needs it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The ones that import bench/ or scripts/.
    for name in ("ab", "clocks", "gpu_check", "profile_one", "slot_probe", "targets", "trace"):
        result = subprocess.run([sys.executable, str(REPO / "scripts" / f"{name}.py"), "--help"], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (name, result.stderr[-2000:])
    for path in (REPO / "scripts").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"PYTHONPATH=\S+ +(python|ncu)", text), path.name
        if re.search(r"^(from|import) (bench|codegen|layouts|scripts)\b", text, re.M):
            assert "sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))" in text, path.name


# ---------------------------------------------------------------------------------------------------------------
# 7. The small ones


@pytest.mark.parametrize("formula,named", [("n ** 2", "the operator '**'"), ("k < 2", "the comparison '<'"),
                                           ("f(k)", "a function call"), ("k.real", "the attribute access '.real'")])
def test_check_formula_errors_name_the_operator(formula, named, capsys):
    assert gen.main(LAYOUT + ["--check-formula", formula]) == 2
    line = one_error_line(capsys)
    assert named in line and not re.search(r"\b(BinOp|Compare|Call|Attribute)\b", line)


def test_shared_memory_advice_at_the_fewest_stages(capsys):
    assert gen.main(["--shape", "1024,8,256", "--block-n", "96"]) == 2  # 2 stages already do not fit
    line = one_error_line(capsys)
    assert "shared memory" in line and "fewer stages" not in line and "smaller block_n" in line
    assert gen.main(["--shape", "1024,8,256", "--block-n", "64", "--stages", "3"]) == 2
    assert "use fewer stages or a smaller block_n" in one_error_line(capsys)


def test_a_subcommand_typo_lists_the_subcommands(capsys):
    assert gen.main(["prbe"]) == 2
    line = one_error_line(capsys)
    assert "did you mean 'probe'" in line
    assert all(name in line for name in ("layout", "verify", "probe", "bench", "canonical"))


def test_arch_has_help_and_choices(capsys):
    assert gen.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--arch {sm_90a," in out and "GPU architecture to compile for" in out
    assert gen.main(SMALL + ["--arch", "sm_80"]) == 2
    assert "invalid choice: 'sm_80'" in capsys.readouterr().err


CASES = [
    dict(seq_len=1024, heads=64, head_dim=128),
    dict(seq_len=777, heads=8, head_dim=96, dtype="bf16", causal=True, kv_heads=2, seq_len_k=1500),
    dict(seq_len=512, heads=4, head_dim=64, window=(-1, 32), softcap=30.0),
    dict(seq_len=4096, heads=8, head_dim=128, varlen=True, causal=True),
    dict(seq_len=1024, heads=8, head_dim=256, dtype="bf16"),
]


@pytest.mark.parametrize("fields", CASES, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_kernel_header_gives_the_exact_command_and_the_version(fields):
    import codegen

    spec = resolve(KernelSpec(**fields))
    lines = render(make_plan(spec)).source.splitlines()
    assert lines[0] == f"// Auto-generated by flashgen {codegen.__version__} from templates/fwd_sm90/. Do not edit; " \
                       "regenerate with"
    command = lines[1].removeprefix("//   ")
    argv = shlex.split(command)
    assert argv[0] == "flashgen"
    args = cli._generate_parser().parse_args(cli.join_signed_values(argv[1:]))
    assert cli._spec_from(args) == spec  # the command emits this very kernel


def test_the_header_command_regenerates_the_file(tmp_path, capsys):
    spec = resolve(KernelSpec(seq_len=256, heads=2, head_dim=64, window=(-1, 16)))
    source = render(make_plan(spec)).source
    argv = shlex.split(source.splitlines()[1].removeprefix("//   "))
    assert "--window" in argv and argv[argv.index("--window") + 1] == "-1,16"  # the form the help shows
    assert cli.main(argv[1:] + ["--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{spec.name}.cu").read_text() == source


def test_a_spec_beyond_the_command_line_gets_the_python_call():
    spec = resolve(KernelSpec(seq_len=1024, heads=8, head_dim=128, pingpong=False))
    line = render(make_plan(spec)).source.splitlines()[1]
    assert line.startswith('//   python -c "from codegen.build import build;') and "pingpong=False" in line
    code = shlex.split(line.removeprefix("//   "))[2]
    namespace: dict = {}
    exec(code.replace("print(", "result = ("), namespace)  # noqa: S102 - our own header
    assert namespace["result"] == render(make_plan(spec)).source


def test_descriptor_constants_carry_their_decoded_fields():
    spec = resolve(KernelSpec(seq_len=1024, heads=64, head_dim=128))
    source = render(make_plan(spec)).source
    for op in "QKV":
        (line,) = [x for x in source.splitlines() if x.startswith(f"__device__ constexpr u64 k{op}Desc[")]
        values = [int(v, 16) for v in re.findall(r"0x([0-9a-f]{16})ull", line)]
        decoded = [SmemDescriptor.decode("wgmma", v) for v in values]
        comment = line.split("//", 1)[1]
        assert f"k slices start at {', '.join(str(d.start_address) for d in decoded)} B" in comment
        first = decoded[0]
        assert (f"LBO {first.lbo} B, SBO {first.sbo} B, swizzle {first.swizzle.name}, base offset "
                f"{first.base_offset}") in comment


@pytest.mark.parametrize("args, message", [
    (["--shape", "1024,8,128", "--multicast", "--varlen"], "not varlen"),
    (["--shape", "1024,8,128", "--multicast", "--window", "64,0"], "no left window"),
    (["--shape", "1024,8,128", "--multicast", "--backward"], "--multicast"),
    (["--shape", "1024,8,128", "--kv-heads", "8", "--decode", "1", "--multicast"], "--multicast"),
])
def test_multicast_refusals_are_one_line(args, message, capsys):
    assert gen.main(args) == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize("mask, persistent", [(["--causal"], False), ([], True)])
def test_multicast_kernel_from_the_command_line(tmp_path, mask, persistent):
    """Causal pairs are one tile per CTA; alike tiles pair persistently (the policy's persistence)."""
    assert gen.main(["--shape", "1024,8,128", *mask, "--multicast", "--out", str(tmp_path)]) == 0
    (manifest,) = tmp_path.glob("*.json")
    described = json.loads(manifest.read_text())
    assert described["spec"]["multicast"] is True and described["kernel"].endswith("_mc")
    assert described["spec"]["persistent"] is persistent
    # The kernel's header names the command that emits it again, the flag included.
    (source,) = tmp_path.glob("*.cu")
    assert source.read_text().splitlines()[1].endswith(" --multicast")
