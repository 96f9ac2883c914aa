"""Test set-up: GPU tests are marked `gpu` and skipped, with the reason, where no GPU can run them."""

from __future__ import annotations

import functools

import numpy as np
import pytest


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'fastmm[cuda13]')"
    try:
        if not cupy.cuda.is_available():
            return "no CUDA GPU is available (cupy.cuda.is_available() is False)"
    except Exception as e:  # a broken driver install
        return f"CUDA is unusable: {e}"
    try:
        import pycuda.driver  # noqa: F401
    except ImportError as e:
        return f"PyCUDA is not importable: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    # A fresh seed per test run, printed on failure, so every run draws new inputs.
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
