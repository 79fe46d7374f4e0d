"""The CPU model of a Blackwell tile (codegen/simulate.py): the derived layouts carry attention to within the
same-dtype error, and each injected fault (the seed's wrong V formula, P one slice off in TMEM, the seed's 4-D
V box) fails (CPU only)."""

from __future__ import annotations

import pytest

from codegen.simulate import FAULTS, simulate, simulate_main
from codegen.spec import KernelSpec, SpecError


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("keys, head_dim, dtype", [(1024, 128, "f16"), (304, 64, "bf16"), (1000, 256, "bf16"),
                                                   (520, 96, "f16"), (256, 192, "bf16"), (128, 128, "bf16")])
def test_the_derived_path_carries_attention(arch, keys, head_dim, dtype):
    result = simulate(KernelSpec(seq_len=keys, heads=1, head_dim=head_dim, dtype=dtype, arch=arch))
    assert result.ok, result.summary()
    assert result.summary().endswith("PASS")


@pytest.mark.parametrize("fault", FAULTS)
def test_every_injected_fault_fails(fault):
    result = simulate(KernelSpec(seq_len=1024, heads=1, head_dim=128, dtype="f16", arch="sm_103a"), fault=fault)
    assert not result.ok and result.summary().endswith("FAIL"), result.summary()


def test_the_cli_ends_in_pass_or_fail(capsys):
    assert simulate_main(["--shape", "512,1,128", "--arch", "sm_103a"]) == 0
    assert capsys.readouterr().out.strip().endswith("PASS")
    assert simulate_main(["--shape", "512,1,128", "--arch", "sm_103a", "--inject-seed-bug"]) == 1
    assert capsys.readouterr().out.strip().endswith("FAIL")
    assert simulate_main(["--shape", "300,1,128"]) == 2
    assert "groups of 8" in capsys.readouterr().err


def test_key_lengths_off_the_8_key_groups_are_refused():
    with pytest.raises(SpecError, match="groups of 8"):
        simulate(KernelSpec(seq_len=300, heads=1, head_dim=64, arch="sm_100a"))


def test_gen_py_simulate_is_a_subcommand():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    ok = subprocess.run([sys.executable, "gen.py", "simulate", "--shape", "256,1,64", "--arch", "sm_100a"], cwd=root,
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("PASS"), ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "gen.py", "simulate", "--shape", "256,1,64", "--inject-seed-bug"], cwd=root,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout.strip().endswith("FAIL"), bad.stdout + bad.stderr
