#!/usr/bin/env python3
"""flashgen command line, from a checkout: the same CLI as the installed `flashgen` script (codegen/cli.py),
with this folder as the checkout that `gen.py bench` and `gen.py canonical` use.

  python gen.py --shape 1024,64,128      emit, compile and describe one kernel (python gen.py --help)
  python gen.py layout | verify | probe | bench | canonical ...
"""

from __future__ import annotations

import pathlib
import sys

from codegen import cli

ROOT = pathlib.Path(__file__).resolve().parent
GENERATED = ROOT / "generated"
CANONICAL = cli.CANONICAL


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, checkout=ROOT)


if __name__ == "__main__":
    sys.exit(main())
