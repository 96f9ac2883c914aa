"""Shapes nobody tuned for: the geometric mean and the 5th percentile of fastmm's speed against cuBLAS (and the
median error ratio) over a fixed random sweep of sizes and layouts (``python -m fastmm bench --sweep``)."""

from . import common


class RandomSweep:
    params = [[0, 1]]
    param_names = ["seed"]
    timeout = 900
    number = 1
    repeat = 1

    def setup(self, seed):
        common.require_gpu()
        from fastmm._tools import sweep

        # A small sweep (1 GiB at most a problem) that asv can afford on every commit; the bench runs 500 and more.
        problems = sweep.draw(60, seed, max_bytes=1 << 30)
        rows = sweep.run(problems, seed=seed, budget_s=600, show_progress=False)
        self.summary = sweep.summarize(rows)

    def track_speed_geomean(self, seed):
        return self.summary["speed"]["geomean"]

    track_speed_geomean.unit = "x cuBLAS"

    def track_speed_p5(self, seed):
        return self.summary["speed"]["p5"]

    track_speed_p5.unit = "x cuBLAS"

    def track_error_ratio_median(self, seed):
        return self.summary["error_ratio"]["median"]

    track_error_ratio_median.unit = "x cuBLAS's error"
