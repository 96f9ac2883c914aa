"""Batched products (a stack of independent matrices in one call), `auto` against cuBLAS."""

from . import common


class Batched(common.GemmBenchmark):
    params = [["64x256^3", "512x64^3", "8x1024^3"]]
    param_names = ["batch_x_size"]

    def problem(self, spec):
        batch, size = spec.split("x")
        n = int(size.rstrip("^3"))
        return n, n, n, int(batch), False, "auto"
