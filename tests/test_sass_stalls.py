"""scripts/sass_stalls.py on a small hand-made ncu source page (CPU only)."""

from __future__ import annotations

import gzip
import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "sass_stalls.py"
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
          "stall_long_sb", "stall_wait (Not Issued)"]
ROWS = [
    ["0x10", "FMNMX R9, R13, R8, !PT", "30", "100", "30", "0", "30"],
    ["0x20", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12], R2", "10", "50", "0", "10", "0"],
    ["0x30", "MOV R1, R2", "0", "50", "0", "0", "0"],
    ["0x40", "@!P0  BRA 0x20", "40", "50", "0", "40", "0"],
    ["0x50", "HGMMA.64x128x16.F32 R112, R180, gdesc[UR12].tnspB, R112", "20", "100", "20", "0", "20"],
]


@pytest.fixture(scope="module")
def sass_stalls():
    spec = importlib.util.spec_from_file_location("sass_stalls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(tmp_path, rows=ROWS) -> str:
    text = '"Kernel Name","k",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [HEADER] + rows) + "\n"
    path = tmp_path / "page.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return str(path)


def test_shares_by_opcode_and_mbarrier(sass_stalls, tmp_path, capsys):
    assert sass_stalls.main([_page(tmp_path)]) == 0
    out = capsys.readouterr().out
    # 100 samples: the wait's TRYWAIT and its retry branch (10 + 40) are one mbarrier wait, by operand and count.
    assert "100 samples over 5 SASS instructions" in out
    assert "50.0%  mbarrier wait   long_sb=50.0%" in out
    assert "30.0%  FMNMX           wait=30.0%" in out
    assert "20.0%  HGMMA" in out
    assert "50.0%  mbarrier [UR12] ex=50" in out


def test_a_page_without_samples_is_refused(sass_stalls, tmp_path):
    empty = [r[:2] + ["0"] + r[3:] for r in ROWS]
    with pytest.raises(SystemExit, match="no warp-stall samples"):
        sass_stalls.main([_page(tmp_path, empty)])
