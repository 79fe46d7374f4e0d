"""`gen.py bench --compile`: cold (render + NVRTC into an empty cache) and warm (disk-cache hit) build times of
each case's kernel, against their targets, with the report's table and files."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .cases import kernel_spec
from .config import BenchConfig
from .report import ROOT, host_meta, render_markdown, slug

COLD_TARGET_S = 1.5
WARM_TARGET_S = 0.050


@dataclass(frozen=True)
class BuildTiming:
    total_s: float
    render_s: float  # plan + layout derivations + Jinja
    compile_s: float  # NVRTC, or the disk-cache read on a hit
    cached: bool

    @property
    def other_s(self) -> float:
        return max(0.0, self.total_s - self.render_s - self.compile_s)


@dataclass(frozen=True)
class CompileTiming:
    kernel: str
    cold: BuildTiming
    warm: BuildTiming
    template_load_s: float  # Jinja's parse of the template, paid once per process (inside cold)

    @property
    def cold_ok(self) -> bool:
        return self.cold.total_s < COLD_TARGET_S

    @property
    def warm_ok(self) -> bool:
        return self.warm.total_s < WARM_TARGET_S and self.warm.cached

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "cold": _timing_json(self.cold), "warm": _timing_json(self.warm),
                "template_load_s": self.template_load_s, "cold_target_s": COLD_TARGET_S,
                "warm_target_s": WARM_TARGET_S, "cold_ok": self.cold_ok, "warm_ok": self.warm_ok}


def _timing_json(t: BuildTiming) -> dict:
    return {"total_s": t.total_s, "render_s": t.render_s, "compile_s": t.compile_s, "other_s": t.other_s,
            "cached": t.cached}


def _timed_build(spec) -> BuildTiming:
    from codegen.build import build

    t0 = time.perf_counter()
    built = build(spec)
    total = time.perf_counter() - t0
    return BuildTiming(total, built.render_seconds, built.compiled.compile_seconds, built.compiled.cached)


@contextlib.contextmanager
def fresh_cache_dir():
    """FLASHGEN_CACHE_DIR pointed at an empty temporary folder for the duration; restored after."""
    old = os.environ.get("FLASHGEN_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="flashgen-bench-cache-") as tmp:
        os.environ["FLASHGEN_CACHE_DIR"] = tmp
        try:
            yield Path(tmp)
        finally:
            if old is None:
                os.environ.pop("FLASHGEN_CACHE_DIR", None)
            else:
                os.environ["FLASHGEN_CACHE_DIR"] = old


def time_compile(spec) -> CompileTiming:
    """Cold: derive + render + NVRTC into an empty cache, with the in-memory derivation and template caches
    emptied first. Warm: the same spec built again (a new plan and render over cached derivations, the cubin
    read back from disk)."""
    from codegen import families, render
    from codegen.families.fwd_sm90 import plan

    with fresh_cache_dir():
        plan.clear_caches()
        render.environment.cache_clear()
        t0 = time.perf_counter()
        render.environment().get_template(families.family_for(spec).template)
        template_load = time.perf_counter() - t0
        render.environment.cache_clear()
        cold = _timed_build(spec)
        warm = _timed_build(spec)
    return CompileTiming(spec.name, cold, warm, template_load)


def import_seconds() -> float | None:
    """Seconds a fresh interpreter takes to import the generator (sympy, jinja2, cuda.bindings): part of a
    first compile in a new process, though not of `build` itself."""
    code = "import time; t = time.perf_counter(); import codegen.build; print(time.perf_counter() - t)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        return float(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def compile_specs(config: BenchConfig) -> list:
    from codegen.families import resolve

    specs = []
    for case in config.cases:
        base = kernel_spec(case)
        for split in config.splits or ((),):
            specs.append(resolve(base.replace(pv_split=split)))
    return specs


def compile_table(timings: Sequence[CompileTiming]) -> list[list[str]]:
    def ms(x):
        return f"{x * 1e3:.1f}"

    table = [["kernel", "cold ms", "render", "NVRTC", "other", "warm ms", "render", "cache read", "other",
              "targets"]]
    for t in timings:
        verdict = (f"cold {'ok' if t.cold_ok else 'MISS'} (<{COLD_TARGET_S:g} s), "
                   f"warm {'ok' if t.warm_ok else 'MISS'} (<{WARM_TARGET_S * 1e3:g} ms)")
        if not t.warm.cached:
            verdict += ", warm build missed the cache"
        table.append([t.kernel, ms(t.cold.total_s), ms(t.cold.render_s), ms(t.cold.compile_s), ms(t.cold.other_s),
                      ms(t.warm.total_s), ms(t.warm.render_s), ms(t.warm.compile_s), ms(t.warm.other_s), verdict])
    return table


def run_compile(config: BenchConfig) -> tuple[dict, list[CompileTiming]]:
    now = _dt.datetime.now(_dt.timezone.utc)
    meta = {**host_meta(config.command, now), "import_s": import_seconds()}
    return meta, [time_compile(spec) for spec in compile_specs(config)]


def compile_markdown(meta: dict, timings: Sequence[CompileTiming]) -> str:
    lines = ["# flashgen bench (compile)", ""] + [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", render_markdown(compile_table(timings))]
    return "\n".join(lines) + "\n"


def save_compile(meta: dict, timings: Sequence[CompileTiming], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"compile-{slug(platform.node() or 'host')}-{meta['date_utc_stamp']}"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps({"meta": meta, "kernels": [t.to_json() for t in timings]}, indent=2) + "\n")
    paths[1].write_text(compile_markdown(meta, timings))
    return paths
