"""Kernel families: one kind of kernel each, on one pattern.

A family is the spec fields it uses, its plan (every number its kernel needs, layouts derived and verified),
its ABI (codegen/abi.py: parameters, mbarriers, declared once in the plan), its templates
(templates/<family>/, sharing templates/common/) and its tests. The forward sm_90a kernel is `fwd_sm90`; the
basis-vector probe, a different kernel on the same layouts, is `probe_sm90`; Blackwell has `fwd_sm100` and
`probe_sm100`; decode over a KV cache is `decode_sm90`; the backward is `bwd_sm90`, with `bwd_sm90_wide` for the
head dims whose dK and dV it keeps transposed (one BackwardSpec; its `family` picks).

Adding a family (decode, backward):

1. `codegen/families/<name>/plan.py`: a `resolve(spec)` that fills the spec's defaults (from
   `codegen.policy` rows of its own, with their evidence) and a `Plan` with `spec`, `abi` (a
   `codegen.abi.KernelABI`), `threads`, `smem.total` and `grid(...)`; layouts only through `layouts/`.
2. `codegen/families/<name>/__init__.py`: `FAMILY = Family(...)` with the template's name and a
   `context(plan)` that turns the plan into template values; instrumentation such as `codegen.trace`
   enters here, never in the plan.
3. `templates/<name>/kernel.cu.j2` (and partials): the signature, `Params`, barrier enum and init come from
   `templates/common/abi.j2`; modes are `constexpr bool` in `cfg::` and `if constexpr`, Jinja only for what
   changes the text (types, unrolled counts, derived formulas); at most 12 `{% if` and 450 lines a file
   (tests/test_families.py holds every template to it).
4. Register it in FAMILIES below; `codegen.build.build(spec, family=...)` then renders, compiles and
   describes it (manifest, export) from its ABI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Family:
    name: str
    template: str                    # the kernel template, by name under templates/
    resolve: Callable[[Any], Any]    # spec -> spec with every default filled
    make_plan: Callable[[Any], Any]  # resolved spec -> plan
    context: Callable[[Any], dict]   # plan -> template values
    kernel_name: Callable[[Any], str]


def _registry() -> dict[str, Family]:
    from . import bwd_sm90, bwd_sm90_wide, decode_sm90, fwd_sm90, fwd_sm100, probe_sm90, probe_sm100

    return {f.name: f for f in (fwd_sm90.FAMILY, probe_sm90.FAMILY, fwd_sm100.FAMILY, probe_sm100.FAMILY,
                                decode_sm90.FAMILY, bwd_sm90.FAMILY, bwd_sm90_wide.FAMILY)}


def get(name: str) -> Family:
    families = _registry()
    if name not in families:
        raise KeyError(f"no kernel family {name!r}; known: {sorted(families)}")
    return families[name]


FORWARD_BY_ARCH = {"sm_90a": "fwd_sm90", "sm_100a": "fwd_sm100", "sm_103a": "fwd_sm100"}
PROBE_BY_ARCH = {"sm_90a": "probe_sm90", "sm_100a": "probe_sm100", "sm_103a": "probe_sm100"}


def family_for(spec) -> Family:
    """The spec's own family where it names one (a DecodeSpec), else the forward family of its architecture."""
    from codegen.spec import SpecError

    if getattr(spec, "family", None):
        return get(spec.family)

    if spec.arch not in FORWARD_BY_ARCH:
        raise SpecError(f"no forward kernel for {spec.arch} yet: its layouts are derived and verified (`gen.py layout "
                        f"--arch {spec.arch}`) and `gen.py probe --arch {spec.arch}` builds its basis-vector probe")
    return get(FORWARD_BY_ARCH[spec.arch])


def probe_family_for(spec) -> Family:
    return get(PROBE_BY_ARCH[spec.arch])


def resolve(spec):
    """The spec with every default filled, by its forward family (its probe's where there is no forward yet)."""
    name = FORWARD_BY_ARCH.get(spec.arch) or PROBE_BY_ARCH[spec.arch]
    return get(name).resolve(spec)


def make_plan(spec):
    family = family_for(spec)
    return family.make_plan(family.resolve(spec))
