"""flashgen code generation: spec -> plan -> rendered CUDA source -> NVRTC cubin -> launch.

`attention`, `prepare` (the tensor API, codegen.api), `attention_with_kvcache` (codegen.decode) and
`attention_backward` (codegen.backward) are imported on first use, so that the generator itself never needs torch.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("attention", "prepare", "scaled_dot_product_attention", "InputError"):
        from . import api

        return getattr(api, name)
    if name == "attention_with_kvcache":
        from . import decode

        return decode.attention_with_kvcache
    if name == "attention_backward":
        from . import backward

        return backward.attention_backward
    raise AttributeError(f"module 'codegen' has no attribute {name!r}")
