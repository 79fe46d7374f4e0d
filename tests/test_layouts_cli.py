import json

from layouts import seed
from layouts.cli import all_specs, layout_main, verify_main

SEED_ARGS = ["--operand", "v", "--arch", "sm_103a", "--head-dim", "128", "--block-n", "128", "--dtype", "f16"]


def test_layout_prints_the_seed_case(capsys):
    assert layout_main(SEED_ARGS) == 0
    out = capsys.readouterr().out
    assert "formula (bytes): (n & 7) * 2 + ((k & 7) ^ ((n >> 3) & 7)) * 16 + (k & 7) * 128 + (n >> 6) * 1024 + (k >> 3) * 2048" in out
    assert "formula (elements, seed fields): n_lo + (k_in ^ n_vec) * 8 + k_in * 64 + n_atom * 512 + k_group * 1024" in out
    assert "LBO 1024 B, SBO 2048 B" in out
    assert "dims {64, 8, 2, H, B*S/8}" in out and "box {64, 8, 2, 1, 16}" in out
    assert "0 mismatches" in out


def test_layout_json_keys(capsys):
    assert layout_main(SEED_ARGS + ["--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert {"formula_c", "coords", "tensor_map", "descriptor"} <= set(obj)
    assert obj["coords"] == {"k": 128, "n": 128}
    assert obj["tensor_map"]["box"] == [64, 8, 2, 1, 16]
    assert obj["descriptor"]["lbo"] == 1024 and len(obj["descriptor"]["encoded"]) == 8
    assert obj["verification"]["mismatches"] == []


def test_check_formula_exit_codes(capsys):
    good = seed.seed_v().formula_c
    assert layout_main(SEED_ARGS + ["--check-formula", good]) == 0
    assert "matches" in capsys.readouterr().out
    assert layout_main(SEED_ARGS + ["--check-formula", seed.WRONG_N_VEC_C]) == 1
    out = capsys.readouterr().out
    assert "inject (k=1, n=0): expected byte 144, model reads byte 128 (n off by 8)" in out


def test_check_formula_rejects_unsafe_text(capsys):
    assert layout_main(SEED_ARGS + ["--check-formula", "__import__('os').system('true')"]) == 2
    assert "not allowed" in capsys.readouterr().err


def test_bad_arguments_exit_2(capsys):
    assert layout_main(["--operand", "v", "--arch", "sm_80", "--head-dim", "128", "--block-n", "128",
                        "--dtype", "f16"]) == 2
    assert layout_main(SEED_ARGS[:7] + ["100", "--dtype", "f16"]) == 2
    assert "multiple of 8" in capsys.readouterr().err


def test_hopper_q_uses_block_m(capsys):
    args = ["--operand", "q", "--arch", "sm_90a", "--head-dim", "64", "--block-n", "128", "--dtype", "bf16", "--json"]
    assert layout_main(args) == 0
    assert json.loads(capsys.readouterr().out)["coords"] == {"m": 64, "k": 64}


def test_verify_all(capsys):
    assert verify_main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"{len(list(all_specs()))} layouts verified, 0 mismatches"


def test_layout_prints_a_three_atom_tile(capsys):
    args = ["--operand", "v", "--arch", "sm_90a", "--head-dim", "96", "--block-n", "128", "--dtype", "f16"]
    assert layout_main(args) == 0
    out = capsys.readouterr().out
    assert "formula (bytes): (n & 7) * 2 + (((k >> 1) & 3) ^ ((n >> 3) & 3)) * 16 + k * 64 + (n >> 5) * 8192" in out
    assert "LBO 8192 B, SBO 512 B, swizzle 64B (code 2)" in out
    assert "dims {32, S, 3, H, B}" in out and "box {32, 128, 3, 1, 1} (24576 B), swizzle 64B" in out
    assert "0 mismatches" in out


def test_verify_covers_every_head_dim():
    from layouts.operands import HEAD_DIMS

    assert {spec[3] for spec in all_specs()} == set(HEAD_DIMS) == {64, 96, 128, 192, 256}
    from codegen.spec import SUPPORTED_BLOCK_N

    assert {spec[4] for spec in all_specs() if spec[0] == "k"} == set(SUPPORTED_BLOCK_N) == set(range(64, 257, 16))
    assert len(list(all_specs())) == 900  # q, o: 2 heights; k, v: 13 (64..256 by 16)
