"""Dask arrays of fastmm chunks on one GPU: a chunked product on the threaded scheduler, against the same graph
with plain CuPy chunks (cuBLAS)."""

from __future__ import annotations

import time

from . import common


def dask_bench_same(block):
    return block


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


class DaskSeveralGPUs:
    """(16384 x 16384) @ (16384 x 16384)^T in 4096^2 chunks made on the workers, on a local cluster of every GPU
    (one worker each; UCX where installed, TCP otherwise): Dask's own graph and fastmm.dask.matmul's planned graph,
    each on fastmm chunks and on CuPy chunks. Skipped where the machine has fewer than two GPUs or no distributed."""

    params = (["fastmm", "cupy", "planned", "planned-cupy"],)
    param_names = ["graph"]
    timeout = 600
    N, CHUNK = 16384, 4096

    def setup(self, kind):
        cp, _ = common.require_gpu()
        gpus = cp.cuda.runtime.getDeviceCount()
        if gpus < 2:
            raise common.SkipNotImplemented(f"needs two GPUs; this machine has {gpus}")
        try:
            from distributed import Client, wait

            import fastmm.dask as fd
            from fastmm._tools import dask_bench
        except ImportError as e:
            raise common.SkipNotImplemented(f"Dask's distributed is not installed: {e}") from None
        # The set-up docs/dask.md recommends: UCX over NVLink where distributed-ucxx is installed, with the workers
        # waiting for their default stream before a transfer; TCP otherwise.
        protocol = "tcp" if dask_bench.protocol_missing("ucx") else "ucx"
        self.cluster = dask_bench._cluster(gpus, protocol)
        self.client = Client(self.cluster)
        if protocol == "ucx":
            self.client.run(dask_bench._rmm_pool, dask_bench.RMM_POOL_SHARE)
            fd.send_after_default_stream(self.client, finish_tasks=True)
        x = dask_bench._on_gpus(self.N, self.CHUNK, seed=3)
        self.x = (x if kind.endswith("cupy") else fd.from_array(x)).persist()
        wait(self.x)
        self.kind, self.wait, self.fd, self.sync_workers, self.runs = kind, wait, fd, dask_bench._synchronize, 0
        self.product()  # warm-up: kernels compiled on every worker

    def teardown(self, kind):
        self.client.close()
        self.cluster.close()

    def product(self):
        # Keys of its own per run: a second persist of the same graph would be served from the first one's results.
        self.runs += 1
        xi = self.x.map_blocks(dask_bench_same, name=f"asv-several-{self.kind}-{self.runs}", meta=self.x._meta,
                               dtype=self.x.dtype)
        y = (self.fd.matmul(xi, xi.T) if self.kind.startswith("planned") else xi @ xi.T).persist()
        self.wait(y)
        self.client.run(self.sync_workers)  # a task is done when its kernels are queued, not run
        self.client.cancel(y)

    def track_tflops(self, kind):
        t0 = time.perf_counter()
        self.product()
        return 2 * self.N**3 / (time.perf_counter() - t0) / 1e12

    track_tflops.unit = "TFLOP/s"
