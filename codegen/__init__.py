"""flashgen code generation: spec -> plan -> rendered CUDA source -> NVRTC cubin -> launch.

`attention` and `prepare` (the tensor API, codegen.api) are imported on first use, so that the generator
itself never needs torch.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("attention", "prepare", "scaled_dot_product_attention", "InputError"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'codegen' has no attribute {name!r}")
