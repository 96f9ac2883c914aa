"""Measuring the NumPy hook on this machine: the model's figures (autotune --numpy-hook) and the bench table
(bench --numpy-hook). Both time plain NumPy `a @ b` on host arrays, with NumPy's own loop and through the hook,
in the same run, on fresh random operands, against a float64 reference (see docs/measuring.md).
"""

from __future__ import annotations

import os
import time

import numpy as np

from .._hooks import numpy_hook as hook
from .timing import no_gpu

__all__ = ["measure_model", "bench_rows", "BENCH_SHAPES"]

# (label, batch, m, k, n[, dtype]): float32 squares from 256^3 to 8192^3, shapes where the link or the host decides,
# then NumPy's default dtype and the complex ones (cuBLAS's products, each with its dtype's model).
BENCH_SHAPES = [
    ("256^3", 1, 256, 256, 256), ("512^3", 1, 512, 512, 512), ("1024^3", 1, 1024, 1024, 1024),
    ("2048^3", 1, 2048, 2048, 2048), ("4096^3", 1, 4096, 4096, 4096), ("8192^3", 1, 8192, 8192, 8192),
    ("4096x4096 @ 4096x16", 1, 4096, 4096, 16), ("16x8192 @ 8192x8192", 1, 16, 8192, 8192),
    ("8192x8192 @ 8192 (matvec)", 1, 8192, 8192, 1), ("64 x 512^3 batched", 64, 512, 512, 512),
    ("1024^3 float64", 1, 1024, 1024, 1024, "float64"), ("4096^3 float64", 1, 4096, 4096, 4096, "float64"),
    ("2048^3 complex64", 1, 2048, 2048, 2048, "complex64"), ("2048^3 complex128", 1, 2048, 2048, 2048, "complex128"),
]
_FORCE = hook.HostModel(host=1.0, link=1e30, gpu=1e30, overhead=0.0)  # offloads every product above 0 FLOPs


def _median_seconds(f, repeats: int, least: float = 0.1) -> float:
    """The median of at least `repeats` timed calls and of as many more (up to 100) as fill `least` seconds: three
    calls of a 2 ms product gave medians from 2.2 to 9.0 ms on one host, one run to the next."""
    f()  # warm-up: compiles, allocates the staging buffer, pages the operands in
    ts = []
    while len(ts) < repeats or (sum(ts) < least and len(ts) < 100):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _operands(rng, batch, m, k, n, dtype="float32"):
    def draw(shape):
        x = rng.standard_normal(shape)
        return (x + 1j * rng.standard_normal(shape) if np.dtype(dtype).kind == "c" else x).astype(dtype)

    return draw((batch, m, k) if batch > 1 else (m, k)), draw((k, n) if n > 1 else (k,))


def _rel_error(got, a, b) -> float:
    wide = np.complex128 if np.iscomplexobj(a) else np.float64
    ref = np.matmul(a.astype(wide), b.astype(wide))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _timed(model, a, b, repeats, pinned=True):
    """Seconds per `a @ b` and the result, with NumPy's loop (model None) or through the hook with `model`. With
    `pinned`, the product is that of a script that made its arrays after `accelerate_numpy()`: operands copied
    inside the block (from fastmm's page-locked pool), results from the pool too; without, the arrays are NumPy's."""
    if model is None:
        hook.restore_numpy()
        return _median_seconds(lambda: a @ b, repeats), a @ b
    # The cache off: the same operands again and again would stay on the GPU, and these are the figures of a product
    # whose operands cross the link.
    with hook.accelerate_numpy(model, pinned=pinned, cache_bytes=0):
        if pinned:
            a, b = a.copy(), b.copy()
        return _median_seconds(lambda: a @ b, repeats), a @ b


def measure_model(seed: int = 0) -> tuple[hook.HostModel, list[dict]]:
    """Fit the model's four figures on this machine; return it with the measurements it came from."""
    import cupy as cp

    from .._dispatch import products as _dispatch
    from .._hooks import staged as _staged

    rng = np.random.default_rng(seed)
    rows = []
    # host: NumPy's best float32 rate (being generous to NumPy keeps products home when in doubt).
    host = 0.0
    for s in (512, 1024, 2048):
        a, b = _operands(rng, 1, s, s, s)
        t, _ = _timed(None, a, b, 3)
        host = max(host, 2.0 * s ** 3 / t)
        rows.append({"what": "numpy", "shape": [1, s, s, s], "seconds": t})
    # link: 64 MiB up through the pinned buffer and back down.
    x = rng.standard_normal(16 << 20).astype(np.float32).reshape(4096, 4096)
    up = _median_seconds(lambda: _staged.to_device(x), 5)
    dev = _staged.to_device(x)
    down = _median_seconds(lambda: _staged.to_region(dev, x), 5)
    link = 2 * x.nbytes / (up + down)
    rows.append({"what": "staging", "bytes": x.nbytes, "up_seconds": up, "down_seconds": down})
    # gpu: fastmm's kernels on device operands (the synchronising copy of one element ends each timing).
    da, db = cp.asarray(x), cp.asarray(x)
    dc = cp.empty_like(da)

    def kernel():
        _dispatch.matmul(da, db, out=dc)
        cp.cuda.get_current_stream().synchronize()

    t = _median_seconds(kernel, 5)
    gpu = 2.0 * 4096 ** 3 / t
    rows.append({"what": "gpu", "shape": [1, 4096, 4096, 4096], "seconds": t})
    # overhead: what a tiny offloaded product costs beyond its bytes and FLOPs.
    a, b = _operands(rng, 1, 64, 64, 64)
    t, _ = _timed(_FORCE, a, b, 50)
    nbytes = 4 * 3 * 64 * 64
    overhead = max(0.0, t - nbytes / link - 2.0 * 64 ** 3 / gpu)
    rows.append({"what": "offloaded", "shape": [1, 64, 64, 64], "seconds": t})
    return hook.HostModel(host=host, link=link, gpu=gpu, overhead=overhead), rows


def bench_rows(model: hook.HostModel, shapes=BENCH_SHAPES, seed: int = 0, repeats: int = 3) -> list[dict]:
    """One row per shape: NumPy's loop, the hook as the model decides, and the GPU path forced, in one run."""
    rng = np.random.default_rng(seed)
    rows = []
    a, b = _operands(rng, 1, 1024, 1024, 1024)  # the process's first products: BLAS's threads, kernels, the pool
    _timed(_FORCE, a, b, 1)
    _timed(None, a, b, 1)
    time.sleep(0.2)
    # Each dtype's model as accelerate_numpy(model) derives it on this GPU (None: that dtype stays NumPy's).
    models = hook.dtype_models(model, hook.float64_model(model, hook.compute_capability()))
    for label, batch, m, k, n, *dtype in shapes:
        dtype = dtype[0] if dtype else "float32"
        a, b = _operands(rng, batch, m, k, n, dtype)
        flops = (8.0 if np.dtype(dtype).kind == "c" else 2.0) * batch * m * k * n  # (real FLOPs)
        reps = repeats if flops < 1e12 else 2  # (8192^3: NumPy takes a second per product)
        # The GPU paths first: after a product, OpenBLAS's threads spin for a while (about 0.1 s) on every core,
        # and staging right after NumPy's product ran up to twice as slow (H100 host, 4096^3: 23.6 against 12.0 ms).
        t_hook, r_hook = _timed(model, a, b, reps)
        t_staged, r_staged = _timed(model, a, b, reps, pinned=False)
        t_gpu, r_gpu = _timed(_FORCE, a, b, reps)
        t_np, r_np = _timed(None, a, b, reps)
        time.sleep(0.2)
        lane = models[dtype]  # None: the hook leaves this dtype to NumPy on this GPU
        rows.append({"shape": label, "dtype": dtype, "gflop": flops / 1e9, "numpy_s": t_np, "hook_s": t_hook,
                     "staged_s": t_staged, "gpu_s": t_gpu,
                     "offloaded": lane is not None and lane.offloads(batch, m, k, n, batch, 1),
                     "err_numpy": _rel_error(r_np, a, b), "err_hook": _rel_error(r_hook, a, b),
                     "err_gpu": max(_rel_error(r_gpu, a, b), _rel_error(r_staged, a, b))})
    hook.restore_numpy()
    return rows


def print_bench(rows, model) -> None:
    print(f"NumPy {np.__version__} on {hook.blas_name()}; hook: {model.threshold_text()}")
    print("hook ms: arrays made after accelerate_numpy() (fastmm's page-locked pool); staged ms: arrays made before "
          "(NumPy's memory, staged); gpu ms: every product offloaded (pool arrays)")
    print(f"{'shape':28s} {'GFLOP':>8s} {'numpy ms':>9s} {'hook ms':>9s} {'staged ms':>9s} {'gpu ms':>9s} "
          f"{'speed-up':>8s} {'path':>6s} {'err numpy':>9s} {'err hook':>9s}")
    for r in rows:
        print(f"{r['shape']:28s} {r['gflop']:8.2f} {r['numpy_s'] * 1e3:9.2f} {r['hook_s'] * 1e3:9.2f} "
              f"{r['staged_s'] * 1e3:9.2f} {r['gpu_s'] * 1e3:9.2f} {r['numpy_s'] / r['hook_s']:7.2f}x "
              f"{'gpu' if r['offloaded'] else 'numpy':>6s} {r['err_numpy']:9.1e} {r['err_hook']:9.1e}")


def main_autotune(args) -> int:
    """``python -m fastmm autotune --numpy-hook``: measure this machine, save the model, print what it decides."""
    if no_gpu("autotune --numpy-hook"):
        return 2
    model, rows = measure_model(seed=args.seed)
    path = hook.save_model(model, rows)
    print(f"NumPy hook model for this machine ({hook.blas_name()}), saved to {path}:")
    print(f"  host {model.host / 1e12:.2f} TFLOP/s, link {model.link / 1e9:.1f} GB/s, gpu {model.gpu / 1e12:.1f} "
          f"TFLOP/s, overhead {model.overhead * 1e6:.0f} us")
    print(f"  offloads {hook.load_model().threshold_text()}")
    return 0


def main_bench(args) -> int:
    """``python -m fastmm bench --numpy-hook``: the table, with this machine's model (or the defaults)."""
    if no_gpu("bench --numpy-hook"):
        return 2
    # The table times each path in its steady state: its first products wait for their kernels to compile rather
    # than leave them to NumPy (what the hook does in a program; the programs, --programs, show that).
    os.environ.setdefault("FASTMM_HOOK_COMPILE", "wait")
    model = hook.load_model()
    rows = bench_rows(model, seed=args.seed)
    print_bench(rows, model)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"blas": hook.blas_name(), "model": model.threshold_text(), "rows": rows}, f, indent=1)
    # Each dtype at its own precision: float32's products (FP32 kernels) to 1e-4, float64's to 1e-10.
    bad = [r["shape"] for r in rows
           if max(r["err_hook"], r["err_gpu"]) > (1e-10 if r["dtype"] in ("float64", "complex128") else 1e-4)]
    if bad:
        print(f"wrong results (relative error above the dtype's 1e-4 or 1e-10): {', '.join(bad)}")
        return 1
    return 0
