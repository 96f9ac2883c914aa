"""Run every kernel binary once on ragged shapes and check the results: the workload for compute-sanitizer.
Arguments: kernel names, `auto` (the plan's choices) and `padded` (the plan with aligned copies on small shapes).

    compute-sanitizer --tool memcheck  python tests/gpu_sanitize.py
    compute-sanitizer --tool racecheck python tests/gpu_sanitize.py

Ragged shapes put tile edges everywhere (M, N, K not multiples of any tile or vector width), and offsets
by one element force the scalar-load (v1) variants, so out-of-bounds accesses and barrier races show up.
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

import fastmm
from fastmm.kernels.configs import BY_NAME, CONFIGS

# (300, 600, 100) has tiles wholly inside A, B and C for every kernel (the warp-tiled kernels copy those without
# bounds checks) next to ragged ones; with K a multiple of 32, (256, 512, 96) runs the sub-tile loop in every
# block (fewer K-tiles than stages) and (300, 600, 160) in the interior blocks only; (300, 600, 1040) runs the loop
# that sums K in runs of 512 through two flushes to its slots in shared memory, next to edge blocks.
SHAPES = [(1, 1, 1), (7, 9, 5), (129, 131, 17), (33, 257, 130), (200, 67, 9), (300, 600, 100), (256, 512, 96),
          (300, 600, 160), (300, 600, 1040)]
# `auto` also runs long-K shapes, which take the split paths (strided slices, then fastmm's slice sum): split-K, the
# few-column kernel split over K (few columns, few rows), and a ragged matrix-vector product; and split-K over a
# short K where the tiles leave SMs idle (768^3 in 3 slices; 520x700x768, ragged edges, in 3); a large product
# whose last row and column are peeled off, their matrix-vector products split over K = 2049 with a 1-deep remainder;
# few-column products whose K is split over clusters of blocks (2048x1x4100, 900x5x5000).
AUTO_SHAPES = SHAPES + [(40, 72, 4100), (1000, 3, 4100), (5, 700, 4100), (3000, 1, 777), (768, 768, 768),
                        (520, 700, 768), (2049, 2049, 2049), (2048, 1, 4100), (900, 5, 5000)]
# `padded` is `auto` with the aligned-copy rule lowered to every product of 2^20 multiply-adds or more, so that
# small shapes run the copies (pass_repitch.cu) and then their product on the copies.
PADDED_MIN_MACS = 1 << 20


def main(kernels) -> int:
    rng = np.random.default_rng()
    failures = 0
    runs = 0
    for name in kernels:
        if name == "padded":
            fastmm._plan.table._PAD_MIN_MACS = PADDED_MIN_MACS
            fastmm._plan.tuned._memo.clear()
            fastmm._runtime.gemm.replays.clear()
        for m, n, k in (AUTO_SHAPES if name in ("auto", "padded") else SHAPES):
            for a_t in (False, True):
                for b_t in (False, True):
                    for offset in (0, 1):
                        a = rng.uniform(-1, 1, (k + offset, m + offset) if a_t else (m + offset, k + offset))
                        b = rng.uniform(-1, 1, (n + offset, k + offset) if b_t else (k + offset, n + offset))
                        a, b = a.astype(np.float32), b.astype(np.float32)
                        da, db = cp.asarray(a)[offset:, offset:], cp.asarray(b)[offset:, offset:]
                        ha, hb = a[offset:, offset:], b[offset:, offset:]
                        if a_t:
                            da, ha = da.T, ha.T
                        if b_t:
                            db, hb = db.T, hb.T
                        out = cp.full((m, n), cp.nan, cp.float32)
                        fastmm.matmul(da, db, out=out, kernel=None if name == "padded" else name)
                        ref = ha.astype(np.float64) @ hb.astype(np.float64)
                        got = cp.asnumpy(out)
                        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
                        runs += 1
                        medium = name in BY_NAME and BY_NAME[name].precision == "medium"
                        if not err < (3e-3 if medium else 1e-5):  # one TF32 pass: 10-bit mantissas
                            failures += 1
                            print(f"FAIL {name} {m}x{n}x{k} a_t={a_t} b_t={b_t} offset={offset}: {err}")
    cp.cuda.Device().synchronize()
    print(f"gpu_sanitize: {runs} products over {len(kernels)} kernels, {failures} wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["auto", "padded", *(c.name for c in CONFIGS)]))
