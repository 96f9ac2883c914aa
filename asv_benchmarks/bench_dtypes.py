"""Products of other dtypes on fastmm arrays: they go to CuPy, and must cost what CuPy costs.

`x.dot(y)` on float64 fastmm arrays against the same call on plain CuPy arrays, in the same process: the ratio
is the price of fastmm's shell (NumPy's checks, a Python method call, the result's type), which must stay
near 1.0 (a target of at most 10% on products large enough to time, 1024^2 and up).
"""

import numpy as np

from .common import interleaved_ratio, require_gpu


class OtherDtypeDot:
    params = ([256, 1024, 4096], ["float64", "complex64", "int32"])
    param_names = ["n", "dtype"]

    def setup(self, n, dtype):
        self.cp, fastmm = require_gpu()
        rng = np.random.default_rng(0)
        host = [rng.uniform(-1, 1, (n, n)).astype(dtype) for _ in range(2)]
        self.plain = [self.cp.asarray(x) for x in host]
        self.ours = [fastmm.asarray(x) for x in host]
        for _ in range(3):
            self.run_fastmm(0), self.run_cupy(0)
        self.cp.cuda.Device().synchronize()

    def run_fastmm(self, i):
        a, b = self.ours
        a.dot(b)

    def run_cupy(self, i):
        a, b = self.plain
        a.dot(b)

    def time_dot_fastmm(self, n, dtype):
        self.run_fastmm(0)
        self.cp.cuda.Device().synchronize()

    def track_ratio_to_cupy(self, n, dtype):
        """CuPy's time over fastmm's (1.0: the same; below 1: fastmm slower), interleaved."""
        return interleaved_ratio(self.run_cupy, self.run_fastmm, 1)

    track_ratio_to_cupy.unit = "x CuPy"
