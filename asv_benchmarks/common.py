"""Shared set-up for the GPU benchmarks: skip without a GPU, build operands, time with CUDA events.

The method is fastmm's (docs/measuring.md): `track_` benchmarks use the bench command's timer (CUDA events on
the working stream, after warm-up, median of batches) and its rotation of operand sets that fit in L2.
`track_` results are TFLOP/s (2*M*N*K*batch over the median time per call) and ratios to cuBLAS
(``cupy.matmul``) timed in the same process, on the same operands. Every `time_` function synchronises the GPU
before returning, so asv's wall clock sees the work itself. Results are not checked here: the tests, the
sanitizer workload and ``python -m fastmm bench`` do that.
"""

from __future__ import annotations

import abc
import statistics

import numpy as np

try:
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # older asv
    SkipNotImplemented = NotImplementedError

L2_BYTES = 50 * 2**20


def require_gpu():
    """Import CuPy and fastmm's array layer, or skip the benchmark (asv reports it as skipped, not failed)."""
    try:
        import cupy
    except ImportError:
        raise SkipNotImplemented("CuPy is not installed") from None
    try:
        available = cupy.cuda.is_available()
    except Exception:
        available = False
    if not available:
        raise SkipNotImplemented("no CUDA GPU")
    import fastmm

    return cupy, fastmm


def operands(cp, m, n, k, batch=1, a_t=False, seed=0):
    """Sets of random float32 operands (several when they fit in L2, so repeats do not time a warm cache)."""
    rng = np.random.default_rng(seed)
    set_bytes = 4 * batch * (m * k + k * n + m * n)
    n_sets = max(1, min(8, -(-2 * L2_BYTES // set_bytes)))
    lead = (batch,) if batch > 1 else ()
    sets = []
    for _ in range(n_sets):
        a = cp.asarray(rng.uniform(-1, 1, lead + ((k, m) if a_t else (m, k))).astype(np.float32))
        b = cp.asarray(rng.uniform(-1, 1, lead + (k, n)).astype(np.float32))
        c = cp.empty(lead + (m, n), cp.float32)
        sets.append((a.swapaxes(-1, -2) if a_t else a, b, c))
    return sets


def median_seconds(cp, fn, n_sets):
    """Median per-call seconds of fn(i): fastmm's own CUDA-event timer (the one `python -m fastmm bench` uses)."""
    from fastmm._tools.timing import time_per_call

    return time_per_call(fn, n_sets, min_seconds=0.01)


def interleaved_ratio(reference, ours, n_sets, rounds=8, timer=None):
    """The reference's time per call over ours: the median over `rounds` of the two timed back to back, in
    alternating order, so that a slow drift of the GPU's clocks over the run (heat, power) moves both alike.
    (Timed one after the other, the same cuBLAS dgemm reached both ways read 0.92 at 4096^2 float64, where each
    timed batch holds only four products.) `timer(fn)` gives seconds per call; by default fastmm's."""
    if timer is None:
        def timer(fn):
            return median_seconds(None, fn, n_sets)
    ratios = []
    for r in range(rounds):
        if r % 2 == 0:
            t_ref = timer(reference)
            t_ours = timer(ours)
        else:
            t_ours = timer(ours)
            t_ref = timer(reference)
        ratios.append(t_ref / t_ours)
    return statistics.median(ratios)


class GemmBenchmark(abc.ABC):
    """Base for one product per parameter set: time_, plus TFLOP/s and ratio to cuBLAS as track_ results.

    Abstract, so that asv's discovery (which skips abstract classes) runs only the concrete subclasses.
    """

    @abc.abstractmethod
    def problem(self, *params):
        """(m, n, k, batch, A transposed, kernel) for one parameter set."""

    def setup(self, *params):
        self.cp, self.fastmm = require_gpu()
        m, n, k, batch, a_t, self.kernel = self.problem(*params)
        self.flops = 2 * m * n * k * batch
        self.sets = operands(self.cp, m, n, k, batch, a_t)
        self.run(0)  # compile (or load from the cache) before anything is timed
        self.cp.cuda.Device().synchronize()

    def run(self, i):
        a, b, c = self.sets[i]
        if self.kernel == "cublas":
            self.cp.matmul(a, b, out=c)
        else:
            self.fastmm.matmul(a, b, out=c, kernel=self.kernel)

    def _seconds(self, kernel):
        saved, self.kernel = self.kernel, kernel
        try:
            return median_seconds(self.cp, self.run, len(self.sets))
        finally:
            self.kernel = saved

    def time_matmul(self, *params):
        self.run(0)
        self.cp.cuda.Device().synchronize()

    def track_tflops(self, *params):
        return self.flops / self._seconds(self.kernel) / 1e12

    track_tflops.unit = "TFLOP/s"

    def track_ratio_to_cublas(self, *params):
        return self._seconds("cublas") / self._seconds(self.kernel)

    track_ratio_to_cublas.unit = "x cuBLAS"
