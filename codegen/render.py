"""Render a family's plan into CUDA source with Jinja2 (StrictUndefined: a missing plan value is an error)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import jinja2

from layouts import mma as layouts_mma

from .cuda_env import templates_dir


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
    # Hardware limits every family's templates share (macros imported without context see globals).
    env.globals["descriptor_field_limit"] = layouts_mma.FIELD_LIMIT
    return env


@dataclass(frozen=True)
class RenderedKernel:
    kernel_name: str
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def render(plan, family=None) -> RenderedKernel:
    """The source of `plan`'s kernel in `family` (a codegen.families.Family; default: the spec's own)."""
    from . import families

    family = family or families.family_for(plan.spec)
    context = family.context(plan)
    source = environment().get_template(family.template).render(**context)
    return RenderedKernel(kernel_name=context["kernel_name"], source=source)
