"""Dask arrays of fastmm chunks on one GPU: a chunked product on the threaded scheduler, against the same graph
with plain CuPy chunks (cuBLAS)."""

from __future__ import annotations

import time

from . import common


class DaskChunked:
    """(8192 x 8192) @ (8192 x 8192) in chunks, operands on the GPU, result kept on the GPU."""

    params = ([2048, 4096], ["fastmm", "cupy"])
    param_names = ["chunk", "chunks of"]
    timeout = 300

    def setup(self, chunk, kind):
        cp, _ = common.require_gpu()
        try:
            import dask.array as da

            import fastmm.dask as fd
        except ImportError as e:
            raise common.SkipNotImplemented(f"Dask is not installed: {e}") from None
        self.sync = cp.cuda.Device().synchronize
        a = cp.random.default_rng(0).standard_normal((8192, 8192), dtype=cp.float32)
        x = da.from_array(a, chunks=chunk, asarray=False)
        self.x = fd.from_array(x) if kind == "fastmm" else x
        self.product = self.x @ self.x.T
        self.product.compute(scheduler="threads")  # warm-up: kernels compiled, memory pool filled
        self.sync()

    def time_matmul(self, chunk, kind):
        self.product.compute(scheduler="threads")
        self.sync()

    def track_tflops(self, chunk, kind):
        # Wall clock around the whole graph (the scheduler's own time is part of what a user waits for).
        self.sync()
        t0 = time.perf_counter()
        self.product.compute(scheduler="threads")
        self.sync()
        return 2 * 8192**3 / (time.perf_counter() - t0) / 1e12

    track_tflops.unit = "TFLOP/s"
