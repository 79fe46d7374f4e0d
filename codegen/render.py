"""Render a family's plan into CUDA source with Jinja2 (StrictUndefined: a missing plan value is an error)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import jinja2

from .cuda_env import templates_dir


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


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
