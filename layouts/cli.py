"""``gen.py layout`` and ``gen.py verify``: print a derivation, check a formula, verify them all.

``codegen.cli`` (the ``flashgen`` script and ``gen.py``) owns the top-level parser and hands the remaining
arguments to ``layout_main`` or ``verify_main``; both return the process exit code (0 success, 1 mismatch,
2 bad arguments or a rejected layout).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

from .derive import to_c
from .errors import LayoutError
from .operands import ARCHES, DTYPE_BYTES, HEAD_DIMS, OPERANDS, OperandDerivation, derive_operand
from .seed import element_formula

# Tile rows the generator stages: q/o are one consumer warpgroup's rows (64 on Hopper; up to 128 for
# tcgen05), k/v are block_n keys (any multiple of 16 in 64..256).
KEY_BLOCK_ROWS = tuple(range(64, 257, 16))
VERIFY_BLOCK_ROWS = {"q": (64, 128), "o": (64, 128), "k": KEY_BLOCK_ROWS, "v": KEY_BLOCK_ROWS}
DEFAULT_BLOCK_M = {"sm_90a": 64, "sm_100a": 128, "sm_103a": 128}


def _layout_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gen.py layout", description="Derive and verify one staged tile layout.")
    p.add_argument("--operand", required=True, choices=OPERANDS)
    p.add_argument("--arch", required=True, choices=ARCHES)
    p.add_argument("--head-dim", required=True, type=int)
    p.add_argument("--block-n", required=True, type=int, help="keys per K/V tile")
    p.add_argument("--block-m", type=int, help="rows of the Q/O tile (default: 64 on sm_90a, 128 on Blackwell)")
    p.add_argument("--dtype", required=True, choices=sorted(DTYPE_BYTES))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check-formula", metavar="EXPR", help="C byte-offset formula to check against the derivation")
    return p


def _braces(values) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def derivation_json(d: OperandDerivation) -> dict:
    descs = d.descriptors()
    return {
        "operand": d.operand, "arch": d.arch, "dtype": d.dtype, "elem_bytes": d.elem_bytes,
        "coords": dict(d.coords), "formula_c": d.formula_c, "formula_sympy": str(d.formula),
        "smem_bytes": d.smem_bytes, "smem_align": d.smem_align, "swizzle": d.swizzle.name,
        "mma": {"major": d.mma_major, "transpose": d.mma_transpose, "rows": d.mma_rows, "k": d.mma_k},
        "descriptor": {**d.descriptor_fields(), "encoded": [f"{x:#018x}" for x in descs]},
        "tensor_map": d.tensor_map.describe(),
        "verification": {"mismatches": [str(m) for m in d.verify()]},
    }


def _print_text(d: OperandDerivation) -> None:
    coords = ", ".join(f"{k}={v}" for k, v in d.coords.items())
    print(f"layout {d.operand} on {d.arch}: head_dim {d.head_dim}, {d.block_rows} rows, {d.dtype} ({d.elem_bytes} B)")
    print(f"coords: {coords}")
    print(f"formula (bytes): {d.formula_c}")
    if d.operand == "v" and d.tensor_map.kind == "key_group_atoms" and d.tensor_map.atom_cols == 64:  # the seed's fields
        print(f"formula (elements, seed fields): {to_c(element_formula(d))}")
    print(f"shared memory: {d.smem_bytes} B, align {d.smem_align} B, swizzle {d.swizzle.name}")
    fields = d.descriptor_fields()
    if fields:
        extra = f", LBO mode {fields['lbo_mode']}" if "lbo_mode" in fields else ""
        print(f"descriptor ({fields['kind']}, {d.mma_major}-major, transpose {d.mma_transpose}, "
              f"footprint {d.mma_rows} x {d.mma_k}): start 0, LBO {fields['lbo']} B, SBO {fields['sbo']} B, "
              f"swizzle {fields['swizzle']} (code {fields['swizzle_code']}), base offset {fields['base_offset']}{extra}")
        for start, value in zip(fields["slice_start_bytes"], d.descriptors()):
            print(f"  k-slice at byte {start}: {value:#018x}")
    else:
        print("descriptor: none (written by threads, stored by TMA)")
    tm = d.tensor_map.describe()
    print(f"tensor map: rank {tm['rank']}, dims {_braces(tm['dims'])}, strides {_braces(tm['strides_bytes'])} B, "
          f"box {_braces(tm['box'])} ({tm['box_bytes']} B), swizzle {tm['swizzle']}")
    mismatches = d.verify()
    slices = len(d.descriptors())
    print(f"verification: formula, {slices} descriptor k-slices, TMA box: {len(mismatches)} mismatches")


def layout_main(argv: list[str]) -> int:
    try:
        args = _layout_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    rows = args.block_n if args.operand in ("k", "v") else (args.block_m or DEFAULT_BLOCK_M[args.arch])
    try:
        d = derive_operand(args.operand, arch=args.arch, head_dim=args.head_dim, block_rows=rows, dtype=args.dtype)
        if args.check_formula is not None:
            mismatches = d.check_formula(args.check_formula)
        else:
            mismatches = None
    except LayoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if mismatches is not None:
        if args.json:
            print(json.dumps({"formula": args.check_formula, "match": not mismatches,
                              "mismatches": [str(m) for m in mismatches]}))
        elif mismatches:
            basis = [m for m in mismatches if m.basis]
            print(f"formula does not match the derivation ({len(basis)} basis vectors differ):")
            for m in basis or mismatches:
                print(f"  {m}")
        else:
            print(f"formula matches the derivation on all {d.layout.in_size} elements")
        return 1 if mismatches else 0
    if args.json:
        print(json.dumps(derivation_json(d)))
    else:
        _print_text(d)
    return 0


def all_specs():
    """Every (operand, arch, dtype, head_dim, block_rows) the generator derives."""
    for operand, arch, dtype, head_dim in itertools.product(OPERANDS, ARCHES, sorted(DTYPE_BYTES), HEAD_DIMS):
        for rows in VERIFY_BLOCK_ROWS[operand]:
            yield operand, arch, dtype, head_dim, rows


def verify_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gen.py verify", description="Verify every layout derivation.")
    parser.add_argument("-v", "--verbose", action="store_true", help="print one line per layout")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    count = failures = 0
    for operand, arch, dtype, head_dim, rows in all_specs():
        count += 1
        name = f"{operand} {arch} {dtype} D={head_dim} rows={rows}"
        try:
            d = derive_operand(operand, arch=arch, head_dim=head_dim, block_rows=rows, dtype=dtype)
        except LayoutError as exc:
            failures += 1
            print(f"FAIL {name}: {exc}")
            continue
        if args.verbose:
            print(f"ok   {name}: {d.formula_c}")
    print(f"{count} layouts verified, {failures} mismatches")
    return 1 if failures else 0
