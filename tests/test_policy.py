"""codegen.policy: the measured defaults as one table, checked against the expected choices and against the
evidence it names (CPU only). When the table replaced codegen/plan.py's functions it was checked equal to them
over a grid of every head dim x lengths x masks x modes (bench/LOG.md, "Policy evidence")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from codegen import policy
from codegen.spec import SUPPORTED_HEAD_DIMS, KernelSpec

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LOG = ROOT / "bench" / "LOG.md"




def test_explicit_defaults():
    """The measured values themselves (tests/test_codegen.py asserts the same through resolve), so the test keeps
    meaning something once codegen.plan reads them from codegen.policy."""
    def spec(keys, head_dim, **kw):
        return KernelSpec(seq_len=keys, heads=16, head_dim=head_dim, **kw)

    bn = policy.default_block_n
    assert bn(spec(1024, 128)) == 176 and bn(spec(4096, 128)) == 176 and bn(spec(512, 128)) == 128
    assert bn(spec(4096, 128, causal=True)) == 128 and bn(spec(4096, 128, varlen=True)) == 128
    assert bn(spec(4096, 128, window=(256, -1))) == 128
    assert bn(spec(1024, 64)) == 192 and bn(spec(512, 64)) == 128 and bn(spec(4096, 64, causal=True)) == 128
    assert bn(spec(4096, 256)) == 80 and bn(spec(1024, 256)) == 80 and bn(spec(1023, 256)) == 64
    assert bn(spec(4096, 256, causal=True)) == 64
    assert bn(spec(4096, 96)) == 128 and bn(spec(4096, 192)) == 112
    assert bn(spec(512, 128, seq_len_k=1024)) == 176  # the keys decide
    assert policy.default_pv_split(176) == (144, 32) and policy.default_pv_split(128) == (96, 32)
    assert policy.default_pv_split(192) == (160, 32) and policy.default_pv_split(80) == (48, 32)
    assert policy.default_pv_split(64) == (32, 32)

    pingpong = policy.pingpong_by_default  # turns everywhere (v39 measured D=256 without them: more energy a call)
    assert pingpong(spec(4096, 256)) and pingpong(spec(2048, 256, causal=True)) and pingpong(spec(8192, 256))
    assert pingpong(spec(4096, 128)) and pingpong(spec(4096, 192)) and pingpong(spec(1024, 64))

    persistent = lambda s: policy.persistent_by_default(s.replace(block_n=policy.default_block_n(s)))  # noqa: E731
    assert persistent(spec(1024, 128)) and persistent(spec(1024, 64)) and persistent(spec(4096, 96))
    assert persistent(spec(4096, 128, causal=True)) and not persistent(spec(4097, 128, causal=True))  # v53
    assert not persistent(spec(4096, 96, causal=True)) and not persistent(spec(3073, 64, causal=True))
    assert persistent(spec(1024, 128, causal=True)) and persistent(spec(512, 64, causal=True))
    assert persistent(spec(2048, 128, causal=True)) and persistent(spec(3072, 96, causal=True))
    assert not persistent(spec(512, 128, causal=True, seq_len_k=8192))  # the keys decide: long tiles stay per-tile
    assert persistent(spec(4096, 128, varlen=True)) and persistent(spec(4096, 128, varlen=True, causal=True))
    assert not persistent(spec(4096, 128, window=(128, 0))) and persistent(spec(4096, 128, window=(256, -1)))
    assert not persistent(spec(4096, 256)) and not persistent(spec(4096, 192))
    assert not policy.persistent_by_default(spec(4096, 128, block_n=64))
    assert not policy.persistent_by_default(spec(4096, 128))  # block_n still 0: resolve asks once it is set

    def overlap(keys, head_dim, **kw):
        return policy.tile_overlap_by_default(spec(keys, head_dim, persistent=True, **kw))

    assert not overlap(2048, 128) and overlap(2049, 128) and not overlap(1024, 128) and overlap(4096, 128)
    assert overlap(16384, 128) and overlap(1024, 64) and overlap(512, 64) and overlap(1024, 96)
    assert overlap(1024, 128, causal=True) and overlap(1024, 128, window=(256, -1))
    assert policy.tile_overlap_by_default(spec(1024, 128, persistent=False))
    assert policy.alike_tiles(spec(1024, 128, persistent=True))
    assert not policy.alike_tiles(spec(1024, 128)) and not policy.alike_tiles(spec(1024, 128, persistent=False))
    assert not policy.alike_tiles(spec(1024, 128, persistent=True, varlen=True))

    assert (policy.MAX_STAGES, policy.PERSISTENT_MAX_STAGES) == (4, 3)
    assert policy.QK_OVERWRITES_MIN_HEAD_DIM == 128
    assert (policy.SHORT_TAIL_MAX_BLOCK_N, policy.PREFETCH_Q_MAX_KEYS) == (192, 1024)
    assert (policy.PLAIN_BOUNDARY_MIN_HEAD_DIM, policy.PLAIN_BOUNDARY_MAX_KEYS) == (128, 2048)
    assert policy.DEFAULT_BLOCK_N == {64: 128, 96: 128, 128: 128, 192: 112, 256: 64}
    assert policy.WIDE_BLOCK_N == {64: (192, 1024), 128: (176, 1024), 256: (80, 1024)}


def test_every_knob_has_a_fallback_for_every_spec():
    """Each knob's rows cover its whole domain: the last row of a knob is `otherwise`, or (block_n) the head
    dims are covered one by one."""
    for knob in policy.KNOBS:
        if knob == "block_n":
            for head_dim in SUPPORTED_HEAD_DIMS:
                policy.choice(knob, KernelSpec(seq_len=128, heads=1, head_dim=head_dim, causal=True))
        else:
            assert policy.rows(knob)[-1].where == (), knob


def test_evidence_exists():
    log = LOG.read_text()
    versions = set(re.findall(r"^## (v\d+[a-z]?)\b", log, flags=re.M))
    for row in policy.POLICY:
        assert row.versions, row
        for name in row.results:
            assert "/" not in name and (RESULTS / name).is_file(), f"{row.knob}={row.value}: no bench/results/{name}"
        for version in row.versions:
            assert version in versions, f"{row.knob}={row.value}: no section {version} in bench/LOG.md"
        assert row.reason and "\n" not in row.reason and len(row.reason) <= 120, row
    assert "## Policy evidence (moved from codegen/plan.py)" in log


def test_table_markdown_lists_every_row():
    text = policy.table_markdown()
    lines = text.splitlines()
    assert lines[0].startswith("| knob | value | domain | evidence |") and len(lines) == 2 + len(policy.POLICY)
    for row, line in zip(policy.POLICY, lines[2:]):
        assert line.count("|") - line.count("\\|") == 6
        assert line.startswith(f"| {row.knob} | ") and row.domain in line
        assert all(f"`{name}`" in line for name in row.results)
    assert "head_dim == 128 and dense and keys >= 1024" in text and "(block_n - 32, 32)" in text
    assert policy.describe() == text


def test_policy_imports_only_the_spec():
    tree = ast.parse((ROOT / "codegen" / "policy.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
    local = {m for m in imported if m.startswith(".") or m.startswith("codegen")}
    assert local <= {".spec", "codegen.spec"}, local
    assert not {m for m in imported if m.split(".")[0] in ("torch", "layouts", "sympy", "jinja2")}
