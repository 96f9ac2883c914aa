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
    # Bound by memory, and the mid and ragged sizes (the weak shapes of the performance issues).
    "matvec8192x1x8192": (8192, 1, 8192, 1, False),
    "matvec16384x1x16384": (16384, 1, 16384, 1, False),
    "4096x16x4096": (4096, 16, 4096, 1, False),
    "vecmat1x8192x8192": (1, 8192, 8192, 1, False),
    "8x4096x4096": (8, 4096, 4096, 1, False),
    "16x16x1048576": (16, 16, 1 << 20, 1, False),
    "batch64matvec1024": (1024, 1, 1024, 64, False),
    "768^3": (768, 768, 768, 1, False),
    "1536^3": (1536, 1536, 1536, 1, False),
    "512x512x2048": (512, 512, 2048, 1, False),
    "3001^3": (3001, 3001, 3001, 1, False),
    "ATv8192x1x8192": (8192, 1, 8192, 1, True),
    "8192x4x8192": (8192, 4, 8192, 1, False),
    "4096x8x4096": (4096, 8, 4096, 1, False),
    "2048x1x16384": (2048, 1, 16384, 1, False),
    "vecmat1x4096x65536": (1, 4096, 65536, 1, False),
    "65536x16x1024": (65536, 16, 1024, 1, False),
    "64x64x262144": (64, 64, 1 << 18, 1, False),
    "256x256x65536": (256, 256, 65536, 1, False),
    "512x512x32768": (512, 512, 32768, 1, False),
    # Small outputs over a short K: split over 64x64 tile sums (split-k-mid).
    "640x640x1024": (640, 640, 1024, 1, False),
    "512x512x1024": (512, 512, 1024, 1, False),
    "384x384x2048": (384, 384, 2048, 1, False),
    # Found by the random sweep (issue 42): outer products, few columns on a short K, few columns with A m-contiguous.
    "outer10000x10000x3": (10000, 10000, 3, 1, False),
    "16513x5x256": (16513, 5, 256, 1, False),
    "AT6690x10x4071": (6690, 10, 4071, 1, True),
}


class PerformanceShapes(common.GemmBenchmark):
    """`auto` on each shape; track_ratio_to_cublas times cuBLAS on the same operands in the same process."""

    params = [list(SHAPES)]
    param_names = ["shape"]
    timeout = 300

    def problem(self, shape):
        return (*SHAPES[shape], "auto")
