"""The CPU model of a Blackwell tile (codegen/simulate.py): the derived layouts carry attention to within the
same-dtype error, with and without windows and the soft cap, and each injected fault (the seed's wrong V formula,
P one slice off in TMEM, the seed's 4-D V box, a window bound off by one) fails (CPU only)."""

from __future__ import annotations

import pytest

from codegen.simulate import FAULTS, simulate, simulate_main, simulate_varlen
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
    window = (64, 0) if fault == "window_off_by_one" else (-1, -1)  # a left bound to be off by one
    # The varlen fault needs a sequence whose first key is off the 8-key groups.
    varlen = dict(lengths=[(100, 203), (300, 301)], sequence=1) if fault == "varlen_key_shift" else {}
    result = simulate(KernelSpec(seq_len=1024, heads=1, head_dim=128, dtype="f16", arch="sm_103a", window=window),
                      fault=fault, **varlen)
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


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("keys, head_dim, dtype, options", [
    (1024, 128, "f16", dict(window=(256, 0))),
    # Left bound 16 at the last tile: its first block (keys 768..895) is empty for rows 912 on.
    (1024, 128, "bf16", dict(window=(16, 0))),
    (1000, 64, "f16", dict(window=(100, 37), softcap=30.0)),
    (520, 96, "bf16", dict(causal=True, softcap=5.0)),
    (512, 256, "bf16", dict(window=(-1, 8), softcap=20.0)),
    (304, 192, "f16", dict(window=(0, 0))),
])
def test_windows_and_softcap_carry_attention(arch, keys, head_dim, dtype, options):
    spec = KernelSpec(seq_len=keys, heads=1, head_dim=head_dim, dtype=dtype, arch=arch, **options)
    result = simulate(spec)
    assert result.ok, result.summary()


def test_a_left_window_starts_the_tile_at_a_later_block_with_empty_rows():
    """The shape of the case above: the last tile's key blocks start past 0, and some of its rows see no key of
    that first block (their running max stays -inf through it)."""
    from codegen.families import fwd_sm100

    plan = fwd_sm100.Plan(fwd_sm100.resolve(KernelSpec(seq_len=1024, heads=1, head_dim=128, arch="sm_103a",
                                                       window=(16, 0))))
    first, count = plan.kv_range(plan.m_blocks - 1)
    assert (first, count) == (6, 2)
    last_row = plan.m_blocks * 128 - 1
    assert last_row - 16 > (first + 1) * plan.spec.block_n - 1  # the last row's band misses block `first`
    assert simulate(plan.spec).ok and simulate(plan.spec, tile=0).ok


@pytest.mark.parametrize("options", [dict(window=(16, 0)), dict(window=(100, 3), softcap=30.0)], ids=str)
def test_a_window_bound_off_by_one_fails(options):
    spec = KernelSpec(seq_len=1024, heads=1, head_dim=128, dtype="f16", arch="sm_103a", **options)
    result = simulate(spec, fault="window_off_by_one")
    assert not result.ok and result.summary().endswith("FAIL"), result.summary()


def test_the_reference_band_is_the_hopper_tests_band():
    torch = pytest.importorskip("torch")
    from codegen.check import band_mask
    from codegen.simulate import band_keep

    for sq, sk, causal, window in ((300, 1024, True, (64, 5)), (1024, 300, False, (16, 0)), (128, 128, False, (-1, 3)),
                                   (200, 200, True, (-1, -1))):
        right = 0 if causal else window[1]
        expected = band_mask(sq, sk, causal=causal, window=window, device="cpu")
        expected = torch.ones(sq, sk, dtype=torch.bool) if expected is None else expected
        assert (band_keep(sq, sk, (window[0], right)) == expected.numpy()).all()


def test_the_cli_takes_window_and_softcap(capsys):
    assert simulate_main(["--shape", "512,1,64", "--arch", "sm_100a", "--window", "-1,0", "--softcap", "30"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("PASS") and "window=(-1, 0) softcap=30" in out
    assert simulate_main(["--shape", "512,1,64", "--window", "32,0", "--fault", "window_off_by_one"]) == 1
    assert capsys.readouterr().out.strip().endswith("FAIL")
    assert simulate_main(["--shape", "512,1,64", "--window", "32"]) == 2
    assert "--window expects LEFT,RIGHT" in capsys.readouterr().err


# Ragged batches, packed as the API packs them: empty query sequences, sequences without keys, first keys off the
# 8-key groups, S_q > S_k (rows that see no key), and tiles whose loads run into the neighbouring sequences.
RAGGED = [[(100, 300), (0, 37), (260, 261), (1, 0), (130, 5), (77, 5)],
          [(300, 511), (5, 1), (200, 200)],
          [(129, 1000), (384, 100), (1, 3), (7, 9)]]


@pytest.mark.parametrize("arch", ("sm_100a", "sm_103a"))
@pytest.mark.parametrize("head_dim, dtype, options", [
    (64, "bf16", dict(causal=True)), (128, "f16", dict()), (96, "f16", dict(window=(64, 0), softcap=20.0)),
    (128, "bf16", dict(window=(16, 37))), (256, "bf16", dict(causal=True, window=(100, 0)))])
@pytest.mark.parametrize("lengths", RAGGED, ids=lambda l: f"{len(l)}seqs")
def test_varlen_tiles_carry_attention(arch, head_dim, dtype, options, lengths):
    spec = KernelSpec(seq_len=128, heads=1, head_dim=head_dim, dtype=dtype, arch=arch, **options)
    results = simulate_varlen(spec, lengths)
    assert len(results) == sum(-(-q // 128) for q, _ in lengths)  # every tile inside a sequence, none past it
    assert all(r.spec.varlen for r in results)
    for r in results:
        assert r.ok, r.summary()


def test_varlen_without_the_key_shift_fails():
    """The band left unshifted by a sequence's first key mod 8 reads the previous sequence's keys: FAIL, but only
    for sequences that start off the key groups."""
    lengths = [(100, 300), (260, 261), (130, 7)]  # keys from 0, 300 (shift 4) and 561 (shift 1)
    spec = KernelSpec(seq_len=128, heads=1, head_dim=64, dtype="bf16", arch="sm_103a")
    ok = {r.sequence[0]: r.ok for r in simulate_varlen(spec, lengths, fault="varlen_key_shift")}
    assert ok == {0: True, 1: False, 2: False}


def test_varlen_refusals():
    spec = KernelSpec(seq_len=128, heads=1, head_dim=64, arch="sm_103a")
    with pytest.raises(ValueError, match="groups of 8"):
        simulate(spec, lengths=[(10, 10), (10, 11)])
    with pytest.raises(ValueError, match="needs a varlen batch"):
        simulate(spec, fault="varlen_key_shift")


def test_the_cli_takes_varlen(capsys):
    assert simulate_main(["--shape", "128,1,64", "--arch", "sm_100a", "--varlen", "300:511,5:1,200", "--causal"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 + 1 + 2 + 1 and out[-1].endswith("PASS") and "varlen: 6 tiles of 3 sequences" in out[-1]
    assert simulate_main(["--shape", "128,1,64", "--varlen", "300:511,5:1,200", "--fault", "varlen_key_shift"]) == 1
    assert capsys.readouterr().out.strip().endswith("FAIL")
    assert simulate_main(["--shape", "128,1,64", "--varlen", "3:x"]) == 2
    assert "--varlen expects" in capsys.readouterr().err
