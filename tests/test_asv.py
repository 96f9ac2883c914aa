"""The asv suite imports and its benchmarks are well formed (`asv check`), on any machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_asv_check_passes():
    pytest.importorskip("asv", reason="asv is part of the test extra: pip install -e '.[test]'")
    p = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "No problems found" in p.stdout


def test_benchmarks_are_discovered_and_skip_without_gpu():
    pytest.importorskip("asv_runner", reason="asv is part of the test extra")
    from asv_runner.discovery import disc_benchmarks

    names = [b.name for b in disc_benchmarks(str(ROOT / "asv_benchmarks"))]
    for expected in ("bench_square.SquareKernels.track_tflops", "bench_shapes.PerformanceShapes.track_ratio_to_cublas",
                     "bench_overhead.SmallMatmulOverhead.track_microseconds_per_call",
                     "bench_firstcall.FirstCall.track_first_product_seconds", "bench_batched.Batched.time_matmul"):
        assert expected in names
    assert not any("GemmBenchmark" in n for n in names)  # the abstract base is not a benchmark


def test_gpu_benchmarks_skip_cleanly_without_a_gpu():
    pytest.importorskip("asv_runner", reason="asv is part of the test extra")
    sys.path.insert(0, str(ROOT))
    try:
        from asv_benchmarks import common
        from asv_benchmarks.bench_square import SquareKernels
    finally:
        sys.path.remove(str(ROOT))
    try:
        import cupy

        if cupy.cuda.is_available():
            pytest.skip("a GPU is present: the benchmarks run instead of skipping")
    except ImportError:
        pass
    with pytest.raises(common.SkipNotImplemented):
        SquareKernels().setup(256, "auto")


def test_interleaved_ratio_cancels_a_drift_that_sequential_timing_reads_as_a_difference():
    """Two identical products on a GPU whose clocks slow down over the run: timed one after the other, the second
    reads slower; interleaved in alternating order, the ratio stays 1."""
    sys.path.insert(0, str(ROOT))
    try:
        from asv_benchmarks import common
    finally:
        sys.path.pop(0)
    calls = []

    def drifting(fn):  # 1% slower with every timed batch, whichever function it times
        calls.append(fn)
        return 1.0 + 0.01 * len(calls)

    def product():
        pass

    def same_product():
        pass

    sequential = drifting(product) / drifting(same_product)
    assert sequential < 0.995  # 1% of a difference that is not there
    calls.clear()
    assert common.interleaved_ratio(product, same_product, 1, timer=drifting) == pytest.approx(1.0, abs=0.002)
    assert calls[:4] == [product, same_product, same_product, product]


def test_gpu_benchmarks_need_cupy_and_a_gpu_only(monkeypatch):
    """fastmm launches through CuPy's driver bindings: a GPU machine without PyCUDA runs every benchmark."""
    cupy = pytest.importorskip("cupy", reason="CuPy imports without a GPU; install it to run this check")
    sys.path.insert(0, str(ROOT))
    try:
        from asv_benchmarks import common
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setattr(cupy.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "pycuda", None)  # importing it raises ImportError
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    cp, fastmm = common.require_gpu()
    assert cp is cupy and fastmm.__name__ == "fastmm"
