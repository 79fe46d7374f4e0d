"""Disassemble cubins to SASS (no GPU needed) and count opcodes.

    sass = disassemble(result.cubin)
    opcode_counts(sass)["HGMMA"]      # wgmma on sm_90a
    opcode_counts(sass)["UTMALDG"]    # TMA loads

nvdisasm comes from the ``nvidia-cuda-nvdisasm`` wheel (found through ``cuda.pathfinder`` or in the
installed ``nvidia`` packages), ``$FLASHGEN_NVDISASM``, ``$CUDA_HOME/bin``, or ``PATH``.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cuda_env import ToolchainMissingError, _candidate_roots

__all__ = ["nvdisasm_path", "disassemble", "opcode_counts", "instructions", "work_before_full_waits",
           "work_after_vote_branches"]

PIP_HINT_NVDISASM = "pip install 'nvidia-cuda-nvdisasm>=13.2,<14'"


def _wheel_candidates() -> list[Path]:
    out = []
    try:
        import nvidia  # type: ignore  # namespace package of the NVIDIA wheels
    except ImportError:
        return out
    for base in getattr(nvidia, "__path__", []):
        base = Path(base)
        out += sorted(base.glob("cu*/bin/nvdisasm"), reverse=True)
        out += sorted(base.glob("cuda_nvdisasm/bin/nvdisasm"))
    return out


@functools.lru_cache(maxsize=None)
def nvdisasm_path() -> str:
    """Absolute path of an nvdisasm executable; ToolchainMissingError (with the pip command) if none."""
    tried = []
    env = os.environ.get("FLASHGEN_NVDISASM")
    if env:
        tried.append(env)
        if os.access(env, os.X_OK):
            return env
    try:
        import cuda.pathfinder as pf  # type: ignore

        fn = getattr(pf, "find_nvidia_binary_utility", None)
        if fn is not None:
            p = fn("nvdisasm")
            tried.append(f"cuda.pathfinder -> {p}")
            if p:
                return str(p)
    except Exception:
        pass
    for p in _wheel_candidates():
        tried.append(str(p))
        if os.access(p, os.X_OK):
            return str(p)
    for root in _candidate_roots():
        p = root / "bin" / "nvdisasm"
        tried.append(str(p))
        if os.access(p, os.X_OK):
            return str(p)
    p = shutil.which("nvdisasm")
    tried.append("PATH")
    if p:
        return p
    raise ToolchainMissingError(
        f"nvdisasm not found (needed to read SASS). Install it with: {PIP_HINT_NVDISASM}. "
        f"Looked in: {'; '.join(tried)}"
    )


def disassemble(cubin: bytes, *, timeout: float = 120.0) -> str:
    """SASS text of every function in ``cubin`` (``nvdisasm --print-code``)."""
    if not isinstance(cubin, (bytes, bytearray)) or not cubin:
        raise ValueError("disassemble() needs the non-empty bytes of a cubin")
    exe = nvdisasm_path()
    with tempfile.TemporaryDirectory(prefix="flashgen-sass-") as d:
        f = Path(d) / "kernel.cubin"
        f.write_bytes(bytes(cubin))
        proc = subprocess.run([exe, "--print-code", str(f)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm ({exe}) failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
    return proc.stdout


# "/*0060*/   @!P0 HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ, !UPT, gsb0 ;"
_INSN_RE = re.compile(
    r"^\s*/\*[0-9a-fA-F]+\*/\s*\{?\s*(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)"
)


def instructions(sass: str) -> list[str]:
    """Each instruction's full opcode with its modifiers, e.g. 'HGMMA.64x8x16.F16', in order."""
    out = []
    for line in sass.splitlines():
        m = _INSN_RE.match(line)
        if m:
            out.append(m.group(1) + m.group(2))
    return out


def opcode_counts(sass: str, *, modifiers: bool = False) -> collections.Counter:
    """Counter of SASS opcodes: base names ('HGMMA', 'UTMALDG', 'SYNCS', ...) by default, or full
    opcodes with modifiers ('SYNCS.ARRIVE.TRANS64.A1T0') when ``modifiers=True``."""
    c: collections.Counter = collections.Counter()
    for op in instructions(sass):
        c[op if modifiers else op.split(".", 1)[0]] += 1
    return c


# "WARPGROUP.DEPBAR.LE gsb0, 0x2 ;": wait until at most 2 wgmma groups are in flight.
_WGMMA_WAIT_RE = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0\s*,\s*(0x[0-9a-fA-F]+)")


def work_before_full_waits(sass: str, opcode: str = "MUFU.EX2") -> list[int]:
    """For each wait for every wgmma (``DEPBAR.LE gsb0, 0x0``) that follows a partial one (``0x1`` or more, in the
    text's order), how many ``opcode`` instructions lie between the two. In the forward's main loop that is the
    softmax's exponentials issued while PV(j-1) is still in flight: the overlap ptxas may or may not keep."""
    counts, between = [], None
    for line in sass.splitlines():
        m = _INSN_RE.match(line)
        if not m:
            continue
        wait = _WGMMA_WAIT_RE.search(line)
        if wait:
            if int(wait.group(1), 16) > 0:
                between = 0
            elif between is not None:
                counts.append(between)
                between = None
        elif between is not None and (m.group(1) + m.group(2)).startswith(opcode):
            between += 1
    return counts


# "VOTE.ANY P0, P0 ;": a warp vote into a predicate; "@!P0 BRA `(.L_x_12) ;": a branch on one.
_VOTE_RE = re.compile(r"\bVOTE\.ANY\s+(P[0-6])\s*,")
_BRANCH_RE = re.compile(r"@!?(P[0-6])\s+BRA\b")


def work_after_vote_branches(sass: str, opcode: str = "F2FP") -> list[int]:
    """For each warp vote (``VOTE.ANY Pn``), how many ``opcode`` instructions lie after the first branch on its
    predicate and before the next ``BAR.SYNC`` (the next step's turn), in the text's order. In the forward's main
    loop that is work left behind the rescale vote's branch, which ptxas does not interleave with what came before."""
    counts, vote_pred, after = [], None, None
    for line in sass.splitlines():
        m = _INSN_RE.match(line)
        if not m:
            continue
        op = m.group(1) + m.group(2)
        if after is not None and (op.startswith("BAR.SYNC") or op.startswith("VOTE")):
            counts.append(after)
            after = None
        vote = _VOTE_RE.search(line)
        if vote:
            vote_pred = vote.group(1)
            continue
        branch = _BRANCH_RE.search(line)
        if vote_pred and branch and branch.group(1) == vote_pred:
            vote_pred, after = None, 0
        elif after is not None and op.startswith(opcode):
            after += 1
    if after is not None:
        counts.append(after)
    return counts
