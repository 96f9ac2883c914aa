"""Test set-up: GPU tests are marked `gpu` and skipped, with the reason, where no GPU can run them."""

from __future__ import annotations

import functools
import os

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
    return None


@functools.lru_cache(maxsize=None)
def nvcc_unavailable_reason() -> str | None:
    from fastmm.kernels import build

    try:
        build.find_nvcc()
    except build.NvccNotFoundError as e:
        return f"nvcc not found: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    for mark, reason in (("gpu", gpu_unavailable_reason), ("nvcc", nvcc_unavailable_reason)):
        marked = [item for item in items if item.get_closest_marker(mark) is not None]
        why = reason() if marked else None
        if why is not None:
            skip = pytest.mark.skip(reason=f"GPU test: {why}" if mark == "gpu" else why)
            for item in marked:
                item.add_marker(skip)
    # Tests that time a program against NumPy measure the host's CPUs: beside other test processes (pytest-xdist's
    # -n) they measure those processes (NumPy's subspace iteration took 5 times as long beside three of them).
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        alone = pytest.mark.skip(reason="times programs against NumPy on the host's CPUs: run it in a session of its "
                                        "own, without -n (python -m pytest -m timing)")
        for item in items:
            if item.get_closest_marker("timing") is not None:
                item.add_marker(alone)


@pytest.fixture(autouse=True)
def _gpu_products_wait_for_nvcc(request, monkeypatch):
    """GPU tests that count what went to the GPU must not depend on what the kernel cache holds: their hooks' products
    wait for nvcc (child processes inherit it). The test of the compile thread itself sets its own."""
    if request.node.get_closest_marker("gpu") is not None:
        monkeypatch.setenv("FASTMM_HOOK_COMPILE", "wait")


@pytest.fixture
def rng():
    # A fresh seed per test run, printed on failure, so every run draws new inputs.
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def launches(monkeypatch):
    """Count launches of fastmm's own kernels (to prove a call reached the GEMM path, not cuBLAS)."""
    from fastmm._runtime import cuda as _cuda

    calls = []
    real = _cuda.Launch.__call__

    def spy(self, *args):
        calls.append(self.name)
        return real(self, *args)

    monkeypatch.setattr(_cuda.Launch, "__call__", spy)
    return calls
