"""``python -m fastmm bench --cupy-hook``: scikit-learn on float32 CuPy data, with and without `accelerate_cupy`.

Each workload is a scikit-learn call through its array-API path (``array_api_dispatch=True``), timed three ways in
interleaved rounds of one run: plain CuPy arrays (cuBLAS), fastmm arrays without the hook (what a user who hands
fastmm arrays to scikit-learn gets), and plain CuPy arrays under the hook. Wall-clock time with the device
synchronised (an estimator's time includes its host work), median of the rounds after a warm-up. The hook's
results are checked against CuPy's, and the products fastmm ran, left to cuBLAS by the plan, or saw in a call form
it leaves to CuPy are counted, so the table shows where the time went.

Needs scikit-learn, ``array-api-compat`` and SciPy (``pip install scikit-learn array-api-compat``), and SciPy's
array-API mode, which this command turns on (``SCIPY_ARRAY_API=1``) before SciPy is imported.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

MODES = ("cupy", "fastmm arrays", "hook")


def workloads(n: int, d: int):
    """(name, flops of its main products, call) for each workload: call(X, Y, target, labels) -> an array."""
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge
    from sklearn.metrics.pairwise import cosine_similarity, linear_kernel, rbf_kernel

    m = n // 2
    comps = 256
    return [
        (f"rbf_kernel {n}x{d} . {m}x{d}", 2 * n * m * d, lambda X, Y, t, c: rbf_kernel(X, Y, gamma=1.0 / d)),
        (f"linear_kernel {n}x{d} . {m}x{d}", 2 * n * m * d, lambda X, Y, t, c: linear_kernel(X, Y)),
        (f"cosine_similarity {n}x{d} . {m}x{d}", 2 * n * m * d, lambda X, Y, t, c: cosine_similarity(X, Y)),
        (f"Nystroem rbf {n}x{d}, {comps * 4} components", 2 * n * comps * 4 * d,
         lambda X, Y, t, c: Nystroem(gamma=1.0 / d, n_components=comps * 4, random_state=0).fit_transform(X)),
        (f"PCA randomized {n}x{d}, {comps} components", 2 * 2 * 7 * n * d * (comps + 10),
         # (The explained variances, not the projection: the components of nearly equal singular values may
         # rotate among themselves under rounding differences, and the projection with them.)
         lambda X, Y, t, c: PCA(comps, svd_solver="randomized", random_state=0).fit(X).explained_variance_),
        (f"Ridge {n}x{d}", 2 * n * d * d, lambda X, Y, t, c: Ridge(alpha=1.0).fit(X, t).coef_),
        (f"LinearDiscriminantAnalysis {n}x{d}, 10 classes", 2 * n * d * d,
         lambda X, Y, t, c: LinearDiscriminantAnalysis().fit(X, c).transform(X)),
    ]


def _rel_error(got, want) -> float:
    import cupy as cp

    got, want = cp.asarray(got, cp.float64), cp.asarray(want, cp.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(cp.linalg.norm(got - want) / max(float(cp.linalg.norm(want)), 1e-300))


def run(n: int, d: int, rounds: int, seed: int) -> list[dict]:
    import cupy as cp
    import sklearn

    import fastmm
    from fastmm import _cuda

    rng = cp.random.default_rng(seed)
    X = rng.standard_normal((n, d), dtype=cp.float32)
    Y = rng.standard_normal((n // 2, d), dtype=cp.float32)
    labels = cp.asarray(np.random.default_rng(seed).integers(0, 10, n))
    X += labels[:, None].astype(cp.float32) * 0.1  # classes that differ a little, for LDA
    target = X[:, :8].sum(axis=1) + 0.1 * rng.standard_normal(n, dtype=cp.float32)
    data = {"cupy": (X, Y, target, labels), "hook": (X, Y, target, labels),
            "fastmm arrays": (fastmm.asarray(X), fastmm.asarray(Y), fastmm.asarray(target), fastmm.asarray(labels))}
    launches = []
    real_call = _cuda.Launch.__call__

    def counting(self, *args):
        launches.append(self.name)
        return real_call(self, *args)

    def once(mode, call):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        if mode == "hook":
            with fastmm.accelerate_cupy():
                out = call(*data[mode])
        else:
            out = call(*data[mode])
        cp.cuda.Device().synchronize()
        return time.perf_counter() - t0, out

    rows = []
    with sklearn.config_context(array_api_dispatch=True):
        for name, flops, call in workloads(n, d):
            row = {"workload": name, "gflop": flops / 1e9}
            try:
                results = {mode: once(mode, call)[1] for mode in MODES}  # warm-up: kernels compiled, pools filled
                times = {mode: [] for mode in MODES}
                for _ in range(rounds):
                    for mode in MODES:
                        times[mode].append(once(mode, call)[0])
                before = fastmm.cupy_hook_status()
                launches.clear()
                _cuda.Launch.__call__ = counting
                try:
                    once("hook", call)
                finally:
                    _cuda.Launch.__call__ = real_call
                after = fastmm.cupy_hook_status()
            except Exception as e:  # noqa: BLE001 - a workload this scikit-learn cannot run on CuPy: say so
                row["error"] = f"{type(e).__name__}: {e}"
                rows.append(row)
                continue
            row.update({f"{mode}_s": statistics.median(times[mode]) for mode in MODES})
            row["fastmm_products"] = after["fastmm"] - before["fastmm"]
            row["left_to_cublas"] = after["left_to_cupy"] - before["left_to_cupy"]
            row["after_failure"] = after["declined_after_failure"] - before["declined_after_failure"]
            row["kernel_launches"] = len(launches)
            row["err_hook_vs_cupy"] = _rel_error(results["hook"], results["cupy"])
            row["err_fastmm_vs_cupy"] = _rel_error(results["fastmm arrays"], results["cupy"])
            rows.append(row)
    return rows


def print_table(rows, device: str) -> None:
    print(f"scikit-learn {__import__('sklearn').__version__} (array_api_dispatch=True) on float32 CuPy data, "
          f"{device}; median seconds of interleaved rounds, device synchronised; x = CuPy alone / this column")
    print(f"{'workload':52s} {'cupy ms':>9s} {'fastmm-arr ms':>13s} {'hook ms':>9s} {'hook x':>7s} "
          f"{'fastmm':>6s} {'cuBLAS':>6s} {'failed':>6s} {'err hook':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:52s} not run: {r['error'][:120]}")
            continue
        print(f"{r['workload']:52s} {r['cupy_s'] * 1e3:9.2f} {r['fastmm arrays_s'] * 1e3:13.2f} "
              f"{r['hook_s'] * 1e3:9.2f} {r['cupy_s'] / r['hook_s']:6.2f}x {r['fastmm_products']:6d} "
              f"{r['left_to_cublas']:6d} {r['after_failure']:6d} {r['err_hook_vs_cupy']:9.1e}")
    print("fastmm / cuBLAS / failed: the hook's float32 products in one run of the workload that fastmm computed, "
          "that the plan left to cuBLAS (shapes where cuBLAS is measured ahead), and that CuPy computed after a "
          "fastmm failure")


def main(args) -> int:
    if "scipy" in sys.modules and os.environ.get("SCIPY_ARRAY_API") != "1":
        print("bench --cupy-hook: SciPy was imported before its array-API mode could be turned on", file=sys.stderr)
        return 2
    os.environ["SCIPY_ARRAY_API"] = "1"  # scikit-learn's array-API path needs SciPy's, set before SciPy loads
    try:
        import array_api_compat  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as e:
        print(f"bench --cupy-hook needs scikit-learn and array-api-compat ({e}): "
              "pip install scikit-learn array-api-compat", file=sys.stderr)
        return 2
    import cupy as cp

    from .timing import no_gpu

    if no_gpu("bench --cupy-hook"):
        return 2
    rows = run(args.hook_n, args.hook_d, rounds=5, seed=args.seed)
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print_table(rows, device)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)
    bad = [r["workload"] for r in rows if "error" not in r and not r["err_hook_vs_cupy"] < 1e-3]
    if bad:
        print(f"hook results differ from CuPy's (relative difference >= 1e-3): {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
