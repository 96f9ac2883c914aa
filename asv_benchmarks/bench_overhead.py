"""Host cost per call of small products: what a NumPy user pays for np.matmul on fastmm arrays."""

import numpy as np

from .common import require_gpu

CALLS = 200


class SmallMatmulOverhead:
    params = ([64, 256], ["fastmm np.matmul", "cupy.matmul"])
    param_names = ["n", "library"]

    def setup(self, n, library):
        self.cp, fastmm = require_gpu()
        a = np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32)
        if library == "cupy.matmul":
            x = self.cp.asarray(a)
            self.call = lambda: self.cp.matmul(x, x)
        else:
            x = fastmm.asarray(a)
            self.call = lambda: np.matmul(x, x)
        for _ in range(20):
            self.call()
        self.cp.cuda.Device().synchronize()

    def time_loop_of_calls(self, n, library):
        """CALLS products, synchronised once at the end (the per-call cost is this over CALLS)."""
        for _ in range(CALLS):
            self.call()
        self.cp.cuda.Device().synchronize()

    def track_microseconds_per_call(self, n, library):
        import time

        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            self.time_loop_of_calls(n, library)
            samples.append((time.perf_counter() - t0) / CALLS * 1e6)
        return sorted(samples)[len(samples) // 2]

    track_microseconds_per_call.unit = "us"
