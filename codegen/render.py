"""Render a Plan into CUDA source with Jinja2 (StrictUndefined: a missing plan value is an error)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import jinja2

from .cuda_env import templates_dir
from .plan import Plan

TEMPLATE_BY_ARCH = {"sm_90a": "fwd_sm90a.cu.j2"}


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


def render(plan: Plan, *, probe: bool = False) -> RenderedKernel:
    template = environment().get_template(TEMPLATE_BY_ARCH[plan.spec.arch])
    context = plan.template_context(probe=probe)
    return RenderedKernel(kernel_name=context["kernel_name"], source=template.render(**context))
