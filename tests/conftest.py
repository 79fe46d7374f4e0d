"""Shared pytest setup: the `gpu` marker and the toolchain report.

    @pytest.mark.gpu                      # needs a CUDA driver + GPU and torch with CUDA
    @pytest.mark.gpu(needs_torch=False)   # needs only the driver + GPU

GPU tests are skipped, with the reason from codegen.cuda_env.driver_status() (or torch's), where
there is no driver or device. Everything else runs on the CPU.

The suite never writes into the user's kernel cache (~/.cache/flashgen, or $FLASHGEN_CACHE_DIR): compiled
kernels go to $FLASHGEN_TEST_CACHE_DIR if set, else to pytest's own cache folder (.pytest_cache/d/, kept
between runs so a second run is warm; `pytest --cache-clear` empties it), else to a temporary folder.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_TEMP_CACHE: list[str] = []


def _test_cache_dir(config) -> Path:
    explicit = os.environ.get("FLASHGEN_TEST_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    if cache is not None:
        return Path(cache.mkdir("flashgen-kernels"))
    _TEMP_CACHE.append(tempfile.mkdtemp(prefix="flashgen-test-cache-"))
    return Path(_TEMP_CACHE[-1])


def pytest_configure(config):
    # Before any test (or a subprocess a test starts) reads it: codegen.cache.default_cache_dir().
    os.environ["FLASHGEN_CACHE_DIR"] = str(_test_cache_dir(config))
    config.addinivalue_line(
        "markers",
        "gpu(needs_torch=True): needs an NVIDIA driver and GPU (and torch with CUDA unless "
        "needs_torch=False); skipped with a reason otherwise",
    )


def pytest_report_header(config):
    try:
        import codegen
        from codegen import cuda_env

        lines = [f"flashgen: codegen from {Path(codegen.__file__).parent}"]
        lines += ["toolchain: " + line for line in cuda_env.toolchain_summary().splitlines()]
        return lines
    except Exception as e:  # never break collection over a report line
        return [f"toolchain: report failed: {type(e).__name__}: {e}"]


@functools.lru_cache(maxsize=None)
def torch_cuda_status() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as e:
        return False, f"torch is not installed ({e})"
    try:
        if not torch.cuda.is_available():
            return False, f"torch {torch.__version__} has no usable CUDA (torch.version.cuda={torch.version.cuda})"
    except Exception as e:  # pragma: no cover
        return False, f"torch.cuda failed: {e}"
    return True, f"torch {torch.__version__} with CUDA {torch.version.cuda}"


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from codegen.cuda_env import driver_status

    ok, why = driver_status()
    for item in gpu_items:
        if not ok:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {why}"))
            continue
        if item.get_closest_marker("gpu").kwargs.get("needs_torch", True):
            tok, twhy = torch_cuda_status()
            if not tok:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {twhy}"))


def pytest_unconfigure(config):
    for path in _TEMP_CACHE:
        shutil.rmtree(path, ignore_errors=True)
