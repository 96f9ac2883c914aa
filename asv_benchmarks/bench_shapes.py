"""The performance issues' shape table, with `auto`: what users get."""

from . import common

# label -> (m, n, k, batch, A transposed)
SHAPES = {
    "1024^3": (1024, 1024, 1024, 1, False),
    "2048^3": (2048, 2048, 2048, 1, False),
    "4096^3": (4096, 4096, 4096, 1, False),
    "8192^3": (8192, 8192, 8192, 1, False),
    "4097^3": (4097, 4097, 4097, 1, False),
    "1000^3": (1000, 1000, 1000, 1, False),
    "128x128x65536": (128, 128, 65536, 1, False),
    "65536x128x128": (65536, 128, 128, 1, False),
    "16384x16384x64": (16384, 16384, 64, 1, False),
    "batch64x256^3": (256, 256, 256, 64, False),
    "AT.B4096^3": (4096, 4096, 4096, 1, True),
}


class PerformanceShapes(common.GemmBenchmark):
    """`auto` on each shape; track_ratio_to_cublas times cuBLAS on the same operands in the same process."""

    params = [list(SHAPES)]
    param_names = ["shape"]
    timeout = 300

    def problem(self, shape):
        return (*SHAPES[shape], "auto")
