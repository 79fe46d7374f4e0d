"""The basis-vector probe for sm_90a (codegen/probe.py runs it): the forward kernel's TMA loads and wgmma
reads of one Q tile and one K/V block, with S and O written straight from the accumulators and P given instead
of computed. Same layouts and the same MMA forms as the forward family; its own small kernel and ABI."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from codegen import policy
from codegen.abi import Barrier, BarrierMap, Grid, KernelABI

from .. import Family
from .. import fwd_sm90
from ..common import PROBE_PARAMS
from ..fwd_sm90.plan import Plan, resolve as fwd_resolve

_PARAMS = tuple(p for p in fwd_sm90.fwd_abi.ALL_PARAMS if p.name.startswith("tmap_")) + PROBE_PARAMS


@dataclass(frozen=True)
class ProbePlan(Plan):
    """The forward plan of a one-block spec (its shared-memory map holds the probe's tiles and barriers), with
    the probe's parameters and barriers."""

    @cached_property
    def abi(self) -> KernelABI:
        barriers = (Barrier("QFull", 1, 1, "both Q halves have landed"), Barrier("KFull", 1, 1, "K has landed"),
                    Barrier("VFull", 1, 1, "V has landed"))
        return KernelABI(_PARAMS, BarrierMap(barriers), Grid(persistent=False, heads=1))  # z: one CTA per injection


def probe_resolve(spec):
    """One whole K/V block, one stage, no masks: the load and MMA path alone."""
    s = fwd_resolve(spec)
    return s.replace(persistent=False, tile_overlap=None, stages=2, causal=False, window=(-1, -1), softcap=0.0,
                     varlen=False, trace=False)


def context(plan: ProbePlan) -> dict:
    ctx = fwd_sm90.context(plan)
    ctx["kernel_name"] = plan.spec.name + "_probe"
    ctx["tma_tiles"] = fwd_sm90.tma_tiles(plan, {"q": ("load",), "k": ("load",), "v": ("load",)})
    # The head dim's own QK form (the plan's rule without a short tail).
    ctx["modes"] = [("QkOverwrites", plan.spec.head_dim >= policy.QK_OVERWRITES_MIN_HEAD_DIM)]
    return ctx


FAMILY = Family(name="probe_sm90", template="probe_sm90/kernel.cu.j2", resolve=probe_resolve,
                make_plan=ProbePlan, context=context, kernel_name=lambda spec: spec.name + "_probe")
