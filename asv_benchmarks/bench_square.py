"""Square products, one kernel family at a time and `auto`: the kernel ladder over sizes."""

from . import common


class SquareKernels(common.GemmBenchmark):
    params = ([256, 1024, 4096], ["auto", "naive", "smem", "regtile", "warptile", "cublas"])
    param_names = ["n", "kernel"]
    timeout = 300

    def problem(self, n, kernel):
        return n, n, n, 1, False, kernel
