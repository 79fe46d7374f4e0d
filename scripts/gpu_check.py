#!/usr/bin/env python3
"""One call on the GPU machine: GPU tests, the probe, the exported example, the pipeline trace, the benchmark;
a table last.

    python3 scripts/gpu_check.py [--skip-tests] [--skip-bench] [--matrices default,coverage,varlen]
                                              [--trace 1,1024,64,128:f16] [--clocks 1,1024,64,128:f16]
                                              [--ncu 1,1024,64,128:f16]

Everything lands in $OUT (or ./gpu-check-out) as two files, because the device tool returns only a few:
summary.txt (the table printed last) and logs.tgz (pytest, probe, export and bench logs, and each matrix's
result files under results/<matrix>/, ready to copy into bench/results). The device machine has the image's
own python3 with torch; nothing is installed. Commit first and run it as
`FLASHGEN_COMMIT=<git log -1 --format=%H:%T> python3 scripts/gpu_check.py ...`: the copy's .git is stale, and
the results record that commit as clean only when its tree is the files' tree (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench.config import CALL_ROUNDS, DECODE_MATRIX, DEFAULT_ITERS, MIN_ROUNDS  # noqa: E402
from bench.report import COMMIT_ENV, ROOT, git_commit, load_rows, working_tree  # noqa: E402
# ncu sections for --ncu: how busy the tensor pipe is, and why warps stall when it is not.
# cuDNN's SDPA call spends a few microseconds of host time: on rows this long its call and its kernel time alike,
# unless the call slots ran at another clock than the kernel slots (bench/LOG.md "h5 measured": 7-12% apart).
CALL_CHECK_MIN_MS = 0.3
CALL_OVER_KERNEL_MAX = 1.03
NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "WarpStateStats", "SchedulerStats")
# The sections give no per-reason breakdown without PC sampling; these metrics do (cycles a warp spends stalled
# for each reason, per issued instruction).
NCU_STALL_METRICS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
# Matrices that choose their own peers (gen.py bench refuses --peers for decode): --bench-peers is for the others.
OWN_PEERS = ("default", "decode", "fa4", "backward")


def matrix_peers(matrix: str, bench_peers: str) -> list[str]:
    """The --peers arguments of one matrix's run."""
    return [] if matrix in OWN_PEERS else ["--peers", bench_peers]


def timing_args(rounds: int) -> list[str]:
    """gen.py bench's --rounds and --iters for `rounds` rounds at the default run's calls a round."""
    if rounds == MIN_ROUNDS:
        return []
    return ["--rounds", str(rounds), "--iters", str(DEFAULT_ITERS * rounds // MIN_ROUNDS)]


def call_rounds_args(matrix: str, call_rounds: str) -> list[str]:
    """gen.py bench's --call-rounds for one matrix: said only where it differs from the bench's default, and never to
    the decode matrix (its calls are its kernels' slots; gen.py bench refuses the option there)."""
    if call_rounds == CALL_ROUNDS[0] or matrix == DECODE_MATRIX:
        return []
    return ["--call-rounds", call_rounds]


def bench_timeout(seconds: int, rounds: int) -> int:
    """A matrix run's time limit, grown with its rounds."""
    return seconds * max(1, -(-rounds // MIN_ROUNDS))


PROBE_SHAPES = [("1024,64,128", "f16"), ("1024,64,128", "bf16"), ("1024,16,64", "f16"), ("1024,16,256", "bf16"),
                ("1024,16,96", "f16"), ("1024,16,192", "bf16")]


def run(cmd: list[str], log: pathlib.Path, timeout: int) -> tuple[int, str, float]:
    t0 = time.time()
    # The checkout first; a caller's PYTHONPATH (e.g. FA4's --target install, bench/wip/README.md) stays behind it.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    print(f"$ {shlex.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        rc, text = proc.returncode, proc.stdout
    except OSError as e:  # the tool is missing (ncu or nvcc off the PATH)
        rc, text = 127, f"[could not start {cmd[0]}: {e}]\n"
    except subprocess.TimeoutExpired as e:
        rc, text = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        text += f"\n[timed out after {timeout} s]\n"
    log.write_text(text)
    return rc, text, time.time() - t0


def default_repeats(runs: int, results: pathlib.Path, out: pathlib.Path, rounds: int = MIN_ROUNDS,
                    call_rounds: str = CALL_ROUNDS[0]) -> tuple[str, str, str, float]:
    """Runs 2..runs of the default matrix (flashgen and cuDNN only) beside the first, then issue 4's targets over
    all of them: one run's ratios move by a few percent, and the bf16 target sits inside that spread."""
    t0, failed = time.time(), []
    for i in range(2, runs + 1):
        rc, _, _ = run([sys.executable, "gen.py", "bench", "--matrix", "default", "--peers", "flashgen,cudnn",
                        *timing_args(rounds), *call_rounds_args("default", call_rounds), "--out", str(results)],
                       out / f"bench-default-{i}.log",
                       timeout=bench_timeout(240, rounds))
        if rc != 0:
            failed.append(i)
    rc, text, _ = run([sys.executable, "scripts/targets.py", str(results)], out / "targets.log", timeout=60)
    print(text, flush=True)
    last = text.strip().splitlines()[-1] if text.strip() else "(no output)"
    status = "OK" if rc == 0 and not failed else f"FAIL rc={rc}" + (f", runs {failed} failed" if failed else "")
    return ("targets", status, last, time.time() - t0)


def round_spread_step(results: pathlib.Path, out: pathlib.Path) -> tuple[str, str, str, float]:
    """scripts/round_spread.py on the fa4 run just made: each case's rounds and flashgen / FA4 round by round, in
    round-spread-fa4.log (bench/LOG.md h3: the same commit's rows moved 2-8% between runs)."""
    runs = sorted(results.glob("nvidia-*-fa4.json"))
    if not runs:
        return ("round spread", "FAIL", f"no fa4 result file in {results}", 0.0)
    rc, text, secs = run([sys.executable, "scripts/round_spread.py", str(runs[-1]), "--peer", "fa4"],
                         out / "round-spread-fa4.log", timeout=60)
    print(text, flush=True)
    last = text.strip().splitlines()[-1] if text.strip() else "(no output)"
    return ("round spread", "OK" if rc == 0 else f"FAIL rc={rc}", last, secs)


def call_slot_step(results: pathlib.Path, pattern: str) -> tuple[str, str, str, float]:
    """Whether the newest run's call slots saw the kernel slots' clock: cuDNN's call ms over its kernel ms, median over
    the rows of at least CALL_CHECK_MIN_MS (WARN past CALL_OVER_KERNEL_MAX: the call columns are then biased)."""
    runs = sorted(results.glob(pattern))
    ratios = sorted(r.call_ms / r.ms for r in (load_rows(runs[-1]) if runs else [])
                    if r.impl == "cudnn" and r.ok and r.call_ms and r.ms >= CALL_CHECK_MIN_MS)
    if not ratios:
        return ("call slots", "FAIL", f"no cuDNN row of {CALL_CHECK_MIN_MS} ms or more with its call in {results}", 0.0)
    median = statistics.median(ratios)
    status = "OK" if median <= CALL_OVER_KERNEL_MAX else "WARN"
    detail = (f"cuDNN call / its kernel {median:.3f} (median of {len(ratios)} rows, {ratios[0]:.3f}-{ratios[-1]:.3f})"
              + ("" if status == "OK" else ": the call slots ran at another clock, the call columns are biased"))
    return ("call slots", status, detail, 0.0)


def clock_step(item: str, out: pathlib.Path) -> tuple[str, str, str, float]:
    """scripts/clocks.py at one shape: whether the clock is power-capped, and energy per call (a kernel's time
    under the cap follows its energy, not its cycles)."""
    shape, _, dtype = item.partition(":")
    tag = f"{shape.replace(',', 'x')}-{dtype or 'bf16'}"
    rc, text, secs = run([sys.executable, "scripts/clocks.py", "--shape", shape, "--dtype", dtype or "bf16",
                          "--seconds", "1.5", "--json", str(out / f"clocks-{tag}.json")], out / f"clocks-{tag}.log",
                         timeout=180)
    print(text, flush=True)
    detail = "(no rows)"
    path = out / f"clocks-{tag}.json"
    if rc == 0 and path.exists():
        rows = [r for r in json.loads(path.read_text())["rows"] if "sm_mhz" in r]
        last = {r["impl"]: r for r in rows}  # the last round's row of each
        detail = "; ".join(f"{name} {r['sm_mhz']:.0f} MHz {r['watts']:.0f} W {r['energy_mj']:.1f} mJ/call"
                           f" ({', '.join(r['reasons']) or 'no limit'})" for name, r in last.items())
    return (f"clocks {shape}", "OK" if rc == 0 else f"FAIL rc={rc}", detail, secs)


# GPU memory per pytest worker: tests/test_gpu.py's largest cases hold up to ~17 GiB at once (float64 references of
# 3 GiB among them); eight workers on an 80 GB H100 ran out of memory in 7 of 439 tests (session 38), on an H200 none.
WORKER_GIB, MAX_WORKERS = 16, 8


def default_workers() -> int:
    """pytest-xdist workers the GPU's memory holds (MAX_WORKERS where nvidia-smi cannot say)."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=30).stdout
        return max(1, min(MAX_WORKERS, int(text.split()[0]) // 1024 // WORKER_GIB))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return MAX_WORKERS


def out_of_memory_failures(junit_xml: pathlib.Path) -> tuple[list[str], int]:
    """From pytest's --junitxml report: the ids of the tests that failed for GPU memory (torch.OutOfMemoryError),
    and how many failed or erred in all. (pytest -q's summary lines cut the error's name to the terminal's width.)"""
    import xml.etree.ElementTree as ET

    oom, bad = [], 0
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        for problem in [*case.findall("failure"), *case.findall("error")]:
            bad += 1
            if "OutOfMemoryError" in (problem.get("message") or ""):
                parts = (case.get("classname") or "").split(".")
                # classname "tests.test_gpu" (or "tests.test_gpu.TestX"): the longest prefix that is a file
                cut = next((i for i in range(len(parts), 0, -1)
                            if (ROOT / ("/".join(parts[:i]) + ".py")).is_file()), len(parts))
                oom.append("::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], case.get("name") or ""]))
    return oom, bad


def _pytest_tail(text: str) -> str:
    tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)|error", line)]
    return tail[-1] if tail else ""


def gpu_tests(targets: list[str], workers: int, out: pathlib.Path) -> tuple[str, str, str, float]:
    """The GPU tests in `workers` processes; tests that failed only for GPU memory the other workers held run
    again one at a time (the 80 GB card's headroom depends on which large cases meet), and the line says so.
    Any other failure, or one of those failing alone, fails the step."""
    junit = out / "pytest.xml"
    rc, text, secs = run([sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-p", "no:cacheprovider",
                          f"--junitxml={junit}", *targets], out / "pytest.log", timeout=420)
    print("\n".join(text.splitlines()[-25:]), flush=True)
    status, detail = "PASS" if rc == 0 else f"FAIL rc={rc}", _pytest_tail(text)
    oom, bad = out_of_memory_failures(junit) if rc == 1 and junit.is_file() else ([], 0)
    if oom and len(oom) == bad:
        rc2, text2, secs2 = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *oom],
                                out / "pytest-alone.log", timeout=300)
        print("\n".join(text2.splitlines()[-10:]), flush=True)
        status = "PASS" if rc2 == 0 else f"FAIL rc={rc2}"
        detail += f"; the {len(oom)} out of GPU memory under {workers} workers, alone: {_pytest_tail(text2)}"
        secs += secs2
    return ("GPU tests", status, detail, secs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--tests", default="tests/test_gpu.py", help="pytest target(s)")
    parser.add_argument("--matrices", default="default,coverage,varlen",
                        help="benchmark matrices to run, comma-separated (gen.py bench --matrix NAME each)")
    parser.add_argument("--bench-peers", default="flashgen,cudnn,flash,flex,cudnn_varlen,flash_varlen",
                        help="--peers for the coverage and varlen matrices; default, decode and fa4 choose their own "
                             "(this default keeps flex off varlen rows, "
                             "whose dense document masks take minutes at 64k tokens)")
    parser.add_argument("--default-runs", type=int, default=3,
                        help="runs of the default matrix (the first with every peer, the others flashgen and cuDNN "
                             "only); the summary ends with issue 4's targets over them (scripts/targets.py)")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                        help=f"each matrix's timing rounds (gen.py bench --rounds; default {MIN_ROUNDS}), with "
                             f"--iters raised alike ({DEFAULT_ITERS // MIN_ROUNDS} a round) so a slot keeps its "
                             "calls: more rounds steady a row's median against the clock moving between slots")
    parser.add_argument("--call-rounds", choices=CALL_ROUNDS, default=CALL_ROUNDS[0],
                        help="gen.py bench --call-rounds for every matrix but decode: 'apart' times the user calls "
                             "in rounds of their own after the kernels' that replay them, 'shared' each right "
                             f"after its kernel (default {CALL_ROUNDS[0]})")
    parser.add_argument("--workers", type=int, default=None,
                        help="pytest-xdist workers (compiles run in parallel; default: one per WORKER_GIB of the GPU's "
                             f"memory, at most {MAX_WORKERS})")
    parser.add_argument("--trace", action="append", default=None, metavar="B,S,H,D:DTYPE",
                        help="shapes for scripts/trace.py's cycles per pipeline phase (default: the seed's); "
                             "--trace none skips it")
    parser.add_argument("--clocks", default="1,1024,64,128:f16", metavar="B,S,H,D:DTYPE",
                        help="shape for scripts/clocks.py (SM clock, power and energy per call of cuDNN and "
                             "flashgen under sustained load; default: the seed's); 'none' skips it")
    parser.add_argument("--ncu", action="append", default=[], metavar="B,S,H,D:DTYPE",
                        help="profile the default kernel of this shape with ncu (clocks left alone); repeatable")
    args = parser.parse_args()
    declared = os.environ.get(COMMIT_ENV)
    if declared is not None and not re.fullmatch(r"[0-9a-f]{40}:[0-9a-f]{40}", declared):
        # bench.report.git_commit ignores anything else and the results would name the copy's stale .git.
        parser.error(f"{COMMIT_ENV}={declared!r}: expected `git log -1 --format=%H:%T` (two full 40-digit hashes)")
    final = pathlib.Path(os.environ.get("OUT", ROOT / "gpu-check-out"))
    final.mkdir(parents=True, exist_ok=True)
    out = pathlib.Path(tempfile.mkdtemp(prefix="gpu-check-"))  # logs gather here, then go into logs.tgz
    summary = []
    tree = working_tree()  # before any step writes a file
    source = f"commit {git_commit(tree)}, tree {tree}"
    if declared is not None and declared.partition(":")[2] != tree:
        # Said at once and in the summary: such results cannot be committed as that commit's.
        why = ("the files' tree is " + tree) if tree else f"{ROOT} is not its checkout's top level (run from there)"
        summary.append(("commit label", "WARN", f"{COMMIT_ENV} declares tree {declared.partition(':')[2][:12]}, "
                        f"but {why}: results are labeled {git_commit(tree)}", 0.0))
        print(f"WARNING: {summary[-1][2]}", flush=True)

    if not args.skip_tests:
        summary.append(gpu_tests(args.tests.split(), args.workers or default_workers(), out))

    if not args.skip_probe:
        lines, ok, t0 = [], True, time.time()
        for shape, dtype in PROBE_SHAPES:
            rc, text, _ = run([sys.executable, "gen.py", "probe", "--shape", shape, "--dtype", dtype],
                              out / f"probe-{shape.replace(',', 'x')}-{dtype}.log", timeout=120)
            ok &= rc == 0
            last = next((line for line in reversed(text.splitlines()) if line.startswith("probe")), "(no summary)")
            lines.append(f"D={shape.split(',')[2]} {dtype}: {last}")
        (out / "probe.log").write_text("\n".join(lines) + "\n")
        for f in out.glob("probe-*.log"):
            f.unlink()
        summary.append(("layout probe", "PASS" if ok else "FAIL", "; ".join(lines), time.time() - t0))
        print("\n".join(lines), flush=True)

    if not args.skip_export:
        # The seed's bundle (batch 2), a multicast one (persistent pairs: a cluster launch sized by the occupancy
        # query), a varlen bundle (causal, grouped-query, 4 packed sequences), and a decode bundle (paged, 4 new
        # tokens appended, 3 sequences in 3 splits), and one gathering 4-row pages by cp.async.
        for label, spec_args, run_arg in (("export example", ["--shape", "1024,64,128"], "2"),
                                          ("export multicast", ["--shape", "2048,16,128", "--multicast", "--dtype",
                                                                "bf16"], "2"),
                                          ("export varlen", ["--shape", "2048,16,128", "--varlen", "--causal",
                                                             "--kv-heads", "4", "--dtype", "bf16"], "4"),
                                          ("export decode", ["--shape", "1280,32,128", "--kv-heads", "8", "--decode",
                                                             "4", "--page-size", "16", "--causal", "--dtype",
                                                             "bf16"], "3"),
                                          ("export gathered", ["--shape", "1280,32,128", "--kv-heads", "8", "--decode",
                                                               "2", "--page-size", "4", "--gather", "--dtype", "bf16"],
                                           "3")):
            t0 = time.time()
            tag = label.replace(" ", "-")
            bundle_dir = pathlib.Path("/tmp/flashgen-bundle") / tag
            shutil.rmtree(bundle_dir, ignore_errors=True)
            rc, text, _ = run([sys.executable, "gen.py", *spec_args, "--export", str(bundle_dir),
                               "--out", str(bundle_dir / "generated")], out / f"{tag}.log", timeout=120)
            build_cmd = next((line.strip() for line in text.splitlines() if line.strip().startswith("nvcc ")), None)
            detail = "export failed"
            if rc == 0 and build_cmd:
                rc, text2, _ = run(shlex.split(build_cmd), out / f"{tag}-build.log", timeout=300)
                detail = "nvcc build failed"
                if rc == 0:
                    rc, text3, _ = run([str(bundle_dir / "example"), run_arg], out / f"{tag}-run.log", timeout=120)
                    detail = text3.strip().splitlines()[-1] if text3.strip() else "(no output)"
            summary.append((label, "PASS" if rc == 0 else f"FAIL rc={rc}", detail, time.time() - t0))
            print(detail, flush=True)

    for item in args.trace if args.trace is not None else ["1,1024,64,128:f16"]:
        if item == "none":
            continue
        shape, _, dtype = item.partition(":")
        tag = f"{shape.replace(',', 'x')}-{dtype or 'bf16'}"
        rc, text, secs = run([sys.executable, "scripts/trace.py", "--shape", shape, "--dtype", dtype or "bf16",
                              "--json", str(out / f"trace-{tag}.json")], out / f"trace-{tag}.log", timeout=180)
        first_table = text.split("\neach warp", 1)[0]  # CTA 0's consumers; the per-warp table comes after
        cells = {line[:28].strip(): line[28:].split() for line in first_table.splitlines() if len(line) > 28}
        step = cells.get("whole step", ["?"])[0]
        softmax = cells.get("softmax(t)", ["?"])[0]
        summary.append((f"trace {shape}", "OK" if rc == 0 else f"FAIL rc={rc}",
                        f"cycles per key-block step {step}, of which softmax {softmax} (CTA 0, consumer 0)", secs))
        print("\n".join(text.splitlines()[-28:]), flush=True)

    for item in args.ncu:
        shape, _, dtype = item.partition(":")
        cmd = ["ncu", "--clock-control", "none", "--launch-skip", "1", "--launch-count", "1", "-k", "regex:flashgen"]
        for section in NCU_SECTIONS:
            cmd += ["--section", section]
        cmd += ["--metrics", NCU_STALL_METRICS]
        cmd += [sys.executable, "scripts/profile_one.py", "--shape", shape, "--dtype", dtype or "bf16"]
        rc, text, secs = run(cmd, out / f"ncu-{shape.replace(',', 'x')}-{dtype or 'bf16'}.log", timeout=180)
        busy = [line.split()[-1] for line in text.splitlines() if line.strip().startswith("Compute (SM) Throughput")]
        summary.append((f"ncu {shape}", "OK" if rc == 0 and busy else f"FAIL rc={rc}",
                        f"compute (SM) throughput {busy[0] if busy else '?'}%", secs))

    if args.clocks != "none":
        summary.append(clock_step(args.clocks, out))

    # Host time per call (issue 18's method: 2,000 back-to-back calls on a tiny shape).
    rc, text, secs = run([sys.executable, "scripts/host_time.py", "--json"], out / "host-time.log", timeout=180)
    try:
        us = json.loads(text.strip().splitlines()[-1])["us_per_call"]
        detail = ", ".join(f"{name} {value:.1f} us" for name, value in us.items())
    except (ValueError, KeyError, IndexError):
        detail = "(no result)"
    summary.append(("host time", "OK" if rc == 0 else f"FAIL rc={rc}", detail, secs))

    if not args.skip_bench:
        for matrix in filter(None, args.matrices.split(",")):
            results = out / "results" / matrix
            peers = matrix_peers(matrix, args.bench_peers)
            rc, text, secs = run([sys.executable, "gen.py", "bench", "--matrix", matrix, *peers,
                                  *timing_args(args.rounds), *call_rounds_args(matrix, args.call_rounds),
                                  "--out", str(results)],
                                 out / f"bench-{matrix}.log", timeout=bench_timeout(480, args.rounds))
            geomean = next((line.split(None, 1)[1][:100] for line in reversed(text.splitlines())
                            if line.startswith("geomean")), "(no geomean)")
            summary.append((f"bench {matrix}", "OK" if rc == 0 else f"FAIL rc={rc}", f"geomean {geomean}", secs))
            print("\n".join(text.splitlines()[-14:]), flush=True)
            if matrix in ("default", "fa4") and rc == 0:
                pattern = "nvidia-*-fa4.json" if matrix == "fa4" else "nvidia-*Z.json"  # the default's have no suffix
                summary.append(call_slot_step(results, pattern))
            if matrix == "default" and rc == 0:
                summary.append(default_repeats(args.default_runs, results, out, args.rounds, args.call_rounds))
            if matrix == "fa4" and rc == 0:
                summary.append(round_spread_step(results, out))

    lines = ["== gpu_check summary ==", source] + [f"{name:14s} {status:12s} {secs:6.1f}s  {detail[:150]}"
                                          for name, status, detail, secs in summary]
    print("\n" + "\n".join(lines))
    (final / "summary.txt").write_text("\n".join(lines) + "\n")
    with tarfile.open(final / "logs.tgz", "w:gz") as tar:
        tar.add(out, arcname="gpu-check")
    shutil.rmtree(out, ignore_errors=True)
    return 0 if all(s[1] in ("PASS", "OK") for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
