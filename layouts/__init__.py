"""flashgen's layout algebra: derive every shared-memory layout, MMA descriptor and TMA tensor map,
and verify each against an independent model of the hardware before a kernel uses it.

Modules, one job each:

* ``linear``   -- ``LinearLayout``: GF(2)-affine maps stored as basis images
* ``stacked``  -- ``StackedLayout``: a linear block repeated at a byte stride (head dims of 3 swizzle atoms)
* ``swizzle``  -- the 32/64/128-byte swizzles, in address bits, that build the tiles
* ``hw_swizzle`` -- the same swizzles written again from the PTX ISA's tables, for the hardware models
  only: a model sharing ``swizzle`` with the tiles it checks would agree with a wrong swizzle
* ``tma``      -- cuTensorMapEncodeTiled limits and a model of where a TMA box lands in shared memory
  (swizzled by ``hw_swizzle``)
* ``mma``      -- wgmma / tcgen05 shared-memory descriptors and a model of which byte an MMA reads
  (swizzled by ``hw_swizzle``)
* ``cexpr``    -- safe parser/evaluator for C integer expressions
* ``derive``   -- closed-form formulas (sympy and C) read off a layout
* ``verify``   -- basis-vector and exhaustive comparison of two maps, seed-style reports
* ``operands`` -- ``derive_operand``: the Q/K/V/O tiles the kernels stage, derived and verified
* ``seed``     -- the B300 story's V layout, its two wrong formulas and its wrong 4-D box
* ``tcgen05``  -- Blackwell facts as data: the tcgen05.mma instruction descriptor, the TMEM column plan, the TMEM load map
* ``cli``      -- ``gen.py layout`` and ``gen.py verify``
"""

from .errors import LayoutError
from .linear import LinearLayout
from .stacked import StackedLayout
from .operands import OperandDerivation, TensorMapRecipe, derive_operand
from .swizzle import Swizzle
from .tma import L2_PROMOTION_BYTES, TensorMapParams

__all__ = [
    "L2_PROMOTION_BYTES",
    "LayoutError",
    "LinearLayout",
    "OperandDerivation",
    "StackedLayout",
    "Swizzle",
    "TensorMapParams",
    "TensorMapRecipe",
    "derive_operand",
]
