"""Precision modes: `auto` in "highest" (FP32 FMAs), "high" (3xTF32) and "medium" (one TF32 pass), against cuBLAS
SGEMM (track_ratio_to_cublas) and cuBLAS's own TF32 path (track_ratio_to_cublas_tf32), same operands and process."""

from . import common


class PrecisionModes(common.GemmBenchmark):
    params = [["2048^3", "4096^3", "8192^3"], ["highest", "high", "medium"]]
    param_names = ["shape", "precision"]
    timeout = 300

    def problem(self, shape, precision):
        self.precision = precision
        n = int(shape.rstrip("^3"))
        return n, n, n, 1, False, "auto"

    def run(self, i):
        a, b, c = self.sets[i]
        if self.kernel == "cublas":
            self.cp.matmul(a, b, out=c)
        elif self.kernel == "cublas tf32":
            from fastmm._tools.bench import cublas_compute_tf32

            with cublas_compute_tf32():
                self.cp.matmul(a, b, out=c)
        else:
            self.fastmm.matmul(a, b, out=c, kernel=self.kernel, precision=self.precision)

    def track_ratio_to_cublas_tf32(self, *params):
        return self._seconds("cublas tf32") / self._seconds(self.kernel)

    track_ratio_to_cublas_tf32.unit = "x cuBLAS TF32"
